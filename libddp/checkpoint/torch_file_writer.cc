#include "libddp/checkpoint/torch_file_writer.h"

#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <vector>

#include "common/error.h"
#include "ddp/files.h"

namespace ddp::checkpoint {
namespace {

using Kind = PyValue::Kind;

PyValuePtr make(Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

// The legacy typed-storage class torch.save names in a tensor's persistent id.
const char* storageClass(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return "FloatStorage";
    case c10::kDouble: return "DoubleStorage";
    case c10::kHalf: return "HalfStorage";
    case c10::kBFloat16: return "BFloat16Storage";
    case c10::kLong: return "LongStorage";
    case c10::kInt: return "IntStorage";
    case c10::kShort: return "ShortStorage";
    case c10::kChar: return "CharStorage";
    case c10::kByte: return "ByteStorage";
    case c10::kBool: return "BoolStorage";
    default: return nullptr;
  }
}

// Pickle protocol 2, the opcodes Python's weights_only unpickler accepts.
class Pickler {
 public:
  std::string out;
  std::vector<at::Tensor> storages;  // data/<index>, contiguous CPU

  void value(const PyValue& v) {
    switch (v.kind) {
      case Kind::kNone: op('N'); break;
      case Kind::kBool: op(v.boolean ? '\x88' : '\x89'); break;
      case Kind::kInt: integer(v.integer); break;
      case Kind::kFloat: real(v.real); break;
      case Kind::kString: string(v.text); break;
      case Kind::kTuple: tuple(v.items); break;
      case Kind::kList:
        op(']');
        if (!v.items.empty()) {
          op('(');
          for (const auto& item : v.items) value(*item);
          op('e');  // APPENDS
        }
        break;
      case Kind::kDict:
        if (v.ordered) {
          global("collections", "OrderedDict");  // OrderedDict(): allowed by the weights_only unpickler
          op(')');
          op('R');
        } else {
          op('}');
        }
        if (!v.entries.empty()) {
          op('(');
          for (const auto& [key, item] : v.entries) {
            value(*key);
            value(*item);
          }
          op('u');  // SETITEMS
        }
        break;
      case Kind::kTensor: tensor(v.tensor); break;
      case Kind::kOther:
        DDP_THROW(CheckpointError, "cannot write a '", v.text, "' object into a torch file");
    }
  }

 private:
  void op(char c) { out.push_back(c); }
  void le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');  // BININT1
      le(static_cast<uint64_t>(v), 1);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');  // BININT, signed 32-bit little-endian
      le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      op('\x8a');  // LONG1: 8 bytes of two's complement, little-endian
      out.push_back(8);
      le(static_cast<uint64_t>(v), 8);
    }
  }
  void real(double v) {
    op('G');  // BINFLOAT: big-endian IEEE 754
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  }
  void string(const std::string& s) {
    op('X');  // BINUNICODE
    le(s.size(), 4);
    out += s;
  }
  void global(const char* module, const char* name) {
    op('c');
    out += module;
    out += '\n';
    out += name;
    out += '\n';
  }
  void tuple(const std::vector<PyValuePtr>& items) {
    if (items.empty()) return op(')');
    op('(');
    for (const auto& item : items) value(*item);
    op('t');
  }
  void ints(at::IntArrayRef values) {
    if (values.empty()) return op(')');
    op('(');
    for (int64_t v : values) integer(v);
    op('t');
  }
  void tensor(const at::Tensor& t) {
    DDP_ENFORCE(t.defined(), "cannot write an undefined tensor into a torch file");
    if (t.layout() != c10::kStrided) {
      DDP_THROW(CheckpointError, "cannot write a tensor with layout ", t.layout(),
                " into a torch file; convert it with .to_dense() first");
    }
    const char* cls = storageClass(t.scalar_type());
    if (cls == nullptr) DDP_THROW(CheckpointError, "cannot write a tensor of dtype ", t.scalar_type(), " into a torch file");
    at::Tensor data = t.detach().to(at::kCPU).contiguous();  // written before the caller gets control back
    const std::string key = std::to_string(storages.size());
    storages.push_back(data);
    // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks)
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    op('(');  // persistent id: ('storage', torch.XStorage, key, location, numel)
    string("storage");
    global("torch", cls);
    string(key);
    string("cpu");
    integer(data.numel());
    op('t');
    op('Q');  // BINPERSID
    integer(0);
    ints(data.sizes());
    ints(data.strides());
    op('\x89');  // requires_grad=False
    global("collections", "OrderedDict");
    op(')');
    op('R');
    op('t');
    op('R');
  }
};

}  // namespace

PyValuePtr pyString(std::string text) {
  auto v = make(Kind::kString);
  v->text = std::move(text);
  return v;
}
PyValuePtr pyInt(int64_t value) {
  auto v = make(Kind::kInt);
  v->integer = value;
  return v;
}
PyValuePtr pyFloat(double value) {
  auto v = make(Kind::kFloat);
  v->real = value;
  return v;
}
PyValuePtr pyBool(bool value) {
  auto v = make(Kind::kBool);
  v->boolean = value;
  return v;
}
PyValuePtr pyNone() { return make(Kind::kNone); }
PyValuePtr pyTensor(const at::Tensor& tensor) {
  auto v = make(Kind::kTensor);
  v->tensor = tensor;
  return v;
}
PyValuePtr pyDict() { return make(Kind::kDict); }
PyValuePtr pyOrderedDict() {
  auto v = make(Kind::kDict);
  v->ordered = true;
  return v;
}
PyValuePtr pyList() { return make(Kind::kList); }
PyValuePtr pyTuple() { return make(Kind::kTuple); }

void pySet(PyValue& dict, const std::string& key, PyValuePtr value) {
  DDP_ENFORCE(dict.kind == Kind::kDict, "pySet on a value that is not a dict (key '", key, "')");
  dict.entries.emplace_back(pyString(key), std::move(value));
}

std::string torchFileBytes(const PyValue& root) {
  Pickler pickler;
  pickler.out = "\x80\x02";  // PROTO 2, as torch.save
  pickler.value(root);
  pickler.out.push_back('.');  // STOP

  std::string bytes;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&bytes](const void* data, size_t size) {
      bytes.append(static_cast<const char*>(data), size);
      return size;
    });
    writer.writeRecord("data.pkl", pickler.out.data(), pickler.out.size());
    static const std::string kByteOrder = "little";
    writer.writeRecord("byteorder", kByteOrder.data(), kByteOrder.size());
    for (size_t i = 0; i < pickler.storages.size(); ++i) {
      const at::Tensor& s = pickler.storages[i];
      writer.writeRecord("data/" + std::to_string(i), s.data_ptr(), s.nbytes());
    }
    writer.writeEndOfFile();
  }
  return bytes;
}

void writeTorchFile(const PyValue& root, const std::string& path) {
  const std::string bytes = torchFileBytes(root);
  writeFileAtomic(path, bytes);
}

}  // namespace ddp::checkpoint
