#include "libddp/checkpoint/torch_file.h"

#include <sys/stat.h>

#include <ATen/ops/empty.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <unordered_map>

#include "common/error.h"

namespace ddp::checkpoint {
namespace {

using Kind = PyValue::Kind;

PyValuePtr make(Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

/// A GLOBAL ("module name") or a persistent storage reference on the stack.
struct Marker {
  std::string global;  // "module.name"
};

c10::ScalarType dtypeOfStorage(const std::string& name, const std::string& path) {
  static const std::unordered_map<std::string, c10::ScalarType> kTypes = {
      {"FloatStorage", c10::kFloat},   {"DoubleStorage", c10::kDouble}, {"HalfStorage", c10::kHalf},
      {"BFloat16Storage", c10::kBFloat16}, {"LongStorage", c10::kLong}, {"IntStorage", c10::kInt},
      {"ShortStorage", c10::kShort},   {"CharStorage", c10::kChar},     {"ByteStorage", c10::kByte},
      {"BoolStorage", c10::kBool}};
  auto it = kTypes.find(name);
  if (it == kTypes.end()) DDP_THROW(CheckpointError, "'", path, "' holds a tensor of unsupported storage type ", name);
  return it->second;
}

class Unpickler {
 public:
  // `reader`: the zip archive the tensors' storages are in; nullptr for a plain pickle (no tensors).
  Unpickler(const std::string& path, caffe2::serialize::PyTorchStreamReader* reader, const char* data, size_t size)
      : path_(path), reader_(reader), data_(data), size_(size) {}

  PyValuePtr run() {
    while (true) {
      const uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;                       // PROTO
        case 0x95: bytes(8); break;                     // FRAME
        case '.': return pop();                         // STOP
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case 'N': push(make(Kind::kNone)); break;
        case 0x88: pushBool(true); break;               // NEWTRUE
        case 0x89: pushBool(false); break;              // NEWFALSE
        case 'J': pushInt(static_cast<int32_t>(uint32le())); break;  // BININT
        case 'K': pushInt(byte()); break;               // BININT1
        case 'M': pushInt(uint16le()); break;           // BININT2
        case 0x8a: pushLong(byte()); break;             // LONG1
        case 'G': pushFloat(); break;                   // BINFLOAT
        case 'X': pushString(uint32le()); break;        // BINUNICODE
        case 0x8c: pushString(byte()); break;           // SHORT_BINUNICODE
        case 'T': pushString(uint32le()); break;        // BINSTRING
        case 'U': pushString(byte()); break;            // SHORT_BINSTRING
        case 'B': pushString(uint32le()); break;        // BINBYTES
        case 'C': pushString(byte()); break;            // SHORT_BINBYTES
        case '}': push(make(Kind::kDict)); break;       // EMPTY_DICT
        case ']': push(make(Kind::kList)); break;       // EMPTY_LIST
        case ')': push(make(Kind::kTuple)); break;      // EMPTY_TUPLE
        case 't': tupleFromMark(); break;               // TUPLE
        case 0x85: tupleOf(1); break;                   // TUPLE1
        case 0x86: tupleOf(2); break;                   // TUPLE2
        case 0x87: tupleOf(3); break;                   // TUPLE3
        case 'l': listFromMark(); break;                // LIST
        case 'd': dictFromMark(); break;                // DICT
        case 'a': append(1); break;                     // APPEND
        case 'e': append(0); break;                     // APPENDS
        case 's': setItems(1); break;                   // SETITEM
        case 'u': setItems(0); break;                   // SETITEMS
        case 'q': memo_[byte()] = top(); break;         // BINPUT
        case 'r': memo_[uint32le()] = top(); break;     // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = top(); break;  // MEMOIZE
        case 'h': push(memoGet(byte())); break;         // BINGET
        case 'j': push(memoGet(uint32le())); break;     // LONG_BINGET
        case 'c': global(); break;                      // GLOBAL
        case 0x93: stackGlobal(); break;                // STACK_GLOBAL
        case 'R': reduce(); break;                      // REDUCE
        case 0x81: reduce(); break;                     // NEWOBJ (cls, args)
        case 'b': pop(); break;                         // BUILD: OrderedDict _metadata etc., not needed
        case 'Q': persistentLoad(); break;              // BINPERSID
        case '0': pop(); break;                         // POP
        default:
          DDP_THROW(CheckpointError, "'", path_, "' uses pickle opcode 0x", std::hex, int(op),
                    " this reader does not support; save plain state_dicts/dicts of tensors");
      }
    }
  }

 private:
  [[noreturn]] void truncated() const {
    DDP_THROW(CheckpointError, "'", path_, "' is corrupt: its pickle ends early");
  }
  uint8_t byte() {
    if (pos_ >= size_) truncated();
    return static_cast<uint8_t>(data_[pos_++]);
  }
  const char* bytes(size_t n) {
    if (pos_ + n > size_) truncated();
    const char* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  uint16_t uint16le() { uint16_t v; std::memcpy(&v, bytes(2), 2); return v; }
  uint32_t uint32le() { uint32_t v; std::memcpy(&v, bytes(4), 4); return v; }

  void push(PyValuePtr v) { stack_.push_back(std::move(v)); }
  PyValuePtr pop() {
    if (stack_.empty()) corrupt("stack underflow");
    auto v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PyValuePtr top() {
    if (stack_.empty()) corrupt("stack underflow");
    return stack_.back();
  }
  std::vector<PyValuePtr> popToMark() {
    if (marks_.empty()) corrupt("missing MARK");
    const size_t mark = marks_.back();
    marks_.pop_back();
    if (mark > stack_.size()) corrupt("bad MARK");
    std::vector<PyValuePtr> out(stack_.begin() + static_cast<long>(mark), stack_.end());
    stack_.resize(mark);
    return out;
  }
  [[noreturn]] void corrupt(const char* what) const {
    DDP_THROW(CheckpointError, "'", path_, "' is corrupt (", what, " at byte ", pos_, ")");
  }
  PyValuePtr memoGet(uint32_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) corrupt("unknown memo key");
    return it->second;
  }

  void pushBool(bool b) { auto v = make(Kind::kBool); v->boolean = b; push(v); }
  void pushInt(int64_t i) { auto v = make(Kind::kInt); v->integer = i; push(v); }
  void pushLong(size_t n) {
    if (n > 8) corrupt("integer wider than 64 bits");
    const char* p = bytes(n);
    uint64_t u = 0;
    for (size_t k = 0; k < n; ++k) u |= static_cast<uint64_t>(static_cast<uint8_t>(p[k])) << (8 * k);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(p[n - 1]) & 0x80)) u |= ~uint64_t{0} << (8 * n);
    pushInt(static_cast<int64_t>(u));
  }
  void pushFloat() {
    const char* p = bytes(8);
    uint64_t u = 0;
    for (int k = 0; k < 8; ++k) u = (u << 8) | static_cast<uint8_t>(p[k]);  // big-endian
    double d;
    std::memcpy(&d, &u, 8);
    auto v = make(Kind::kFloat);
    v->real = d;
    push(v);
  }
  void pushString(size_t n) {
    auto v = make(Kind::kString);
    v->text.assign(bytes(n), n);
    push(v);
  }
  void tupleFromMark() { auto v = make(Kind::kTuple); v->items = popToMark(); push(v); }
  void tupleOf(size_t n) {
    auto v = make(Kind::kTuple);
    if (stack_.size() < n) corrupt("stack underflow");
    v->items.assign(stack_.end() - static_cast<long>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    push(v);
  }
  void listFromMark() { auto v = make(Kind::kList); v->items = popToMark(); push(v); }
  void dictFromMark() {
    auto items = popToMark();
    auto v = make(Kind::kDict);
    for (size_t k = 0; k + 1 < items.size(); k += 2) v->entries.emplace_back(items[k], items[k + 1]);
    push(v);
  }
  void append(size_t one) {
    std::vector<PyValuePtr> items = one ? std::vector<PyValuePtr>{pop()} : popToMark();
    auto list = top();
    if (list->kind != Kind::kList) corrupt("APPEND to a non-list");
    list->items.insert(list->items.end(), items.begin(), items.end());
  }
  void setItems(size_t one) {
    std::vector<PyValuePtr> items;
    if (one) {
      auto value = pop();
      auto key = pop();
      items = {key, value};
    } else {
      items = popToMark();
    }
    auto dict = top();
    if (dict->kind != Kind::kDict) corrupt("SETITEM on a non-dict");
    for (size_t k = 0; k + 1 < items.size(); k += 2) dict->entries.emplace_back(items[k], items[k + 1]);
  }
  void pushGlobal(const std::string& module, const std::string& name) {
    auto v = make(Kind::kOther);
    v->text = module + "." + name;
    push(v);
  }
  void global() {
    auto line = [&] {
      std::string s;
      for (char c; (c = static_cast<char>(byte())) != '\n';) s += c;
      return s;
    };
    const std::string module = line();
    pushGlobal(module, line());
  }
  void stackGlobal() {
    auto name = pop();
    auto module = pop();
    pushGlobal(module->text, name->text);
  }

  void persistentLoad() {
    auto pid = pop();
    if (reader_ == nullptr) corrupt("a tensor in a plain pickle");
    // ('storage', <torch.XStorage>, key, location, numel)
    if (pid->kind != Kind::kTuple || pid->items.size() < 5 || pid->items[0]->text != "storage") {
      corrupt("unknown persistent id");
    }
    const std::string type = pid->items[1]->text;
    const std::string key = pid->items[2]->text;
    const int64_t numel = pid->items[4]->integer;
    auto cached = storages_.find(key);
    if (cached == storages_.end()) {
      const auto dtype = dtypeOfStorage(type.substr(type.rfind('.') + 1), path_);
      at::Tensor storage = at::empty({numel}, at::TensorOptions().dtype(dtype));
      const std::string record = "data/" + key;
      if (!reader_->hasRecord(record)) DDP_THROW(CheckpointError, "'", path_, "' is missing tensor data ", record, " (truncated?)");
      auto [ptr, bytes] = reader_->getRecord(record);
      if (bytes != static_cast<size_t>(storage.nbytes())) {
        DDP_THROW(CheckpointError, "'", path_, "' is corrupt: tensor data ", record, " has ", bytes,
                  " bytes, expected ", storage.nbytes());
      }
      std::memcpy(storage.data_ptr(), ptr.get(), bytes);
      cached = storages_.emplace(key, storage).first;
    }
    auto v = make(Kind::kTensor);
    v->tensor = cached->second;  // the whole storage; _rebuild_tensor_v2 views it
    push(v);
  }

  static std::vector<int64_t> ints(const PyValue& tuple) {
    std::vector<int64_t> out;
    for (const auto& i : tuple.items) out.push_back(i->integer);
    return out;
  }

  void reduce() {
    auto args = pop();
    auto func = pop();
    const std::string& f = func->text;
    if (f == "torch._utils._rebuild_tensor_v2" || f == "torch._utils._rebuild_tensor") {
      if (args->items.size() < 4 || args->items[0]->kind != Kind::kTensor) corrupt("bad tensor record");
      const at::Tensor& storage = args->items[0]->tensor;
      auto v = make(Kind::kTensor);
      v->tensor = storage.as_strided(ints(*args->items[2]), ints(*args->items[3]), args->items[1]->integer).clone();
      push(v);
    } else if (f == "torch._utils._rebuild_parameter" || f == "torch.jit._pickle.restore_type_tag") {
      push(args->items.at(0));  // a Parameter's data; a typed container's value
    } else if (f == "collections.OrderedDict") {
      auto v = make(Kind::kDict);
      v->ordered = true;
      push(v);
    } else if (f.rfind("torch.jit._pickle.build_", 0) == 0) {
      auto v = make(Kind::kList);
      v->items = args->items.at(0)->items;
      push(v);
    } else if (f == "torch.device") {
      auto v = make(Kind::kString);
      v->text = args->items.empty() ? "" : args->items[0]->text;
      push(v);
    } else {
      // Kept as an opaque value: readers of state_dicts skip what is not a tensor.
      auto v = make(Kind::kOther);
      v->text = f;
      push(v);
    }
  }

  const std::string& path_;
  caffe2::serialize::PyTorchStreamReader* reader_;
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  std::vector<PyValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, PyValuePtr> memo_;
  std::unordered_map<std::string, at::Tensor> storages_;
};

}  // namespace

const PyValue* PyValue::get(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : entries) {
    if (k->kind == Kind::kString && k->text == key) return v.get();
  }
  return nullptr;
}

PyValuePtr readTorchFile(const std::string& path) {
  // A named pipe without a writer would block the open for ever (and a device has no end).
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode) && !S_ISDIR(info.st_mode)) {
    DDP_THROW(CheckpointError, "'", path, "' is not a regular file (",
              S_ISFIFO(info.st_mode) ? "a named pipe" : S_ISSOCK(info.st_mode) ? "a socket" : "a device",
              "); give the path of a file torch.save wrote");
  }
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    DDP_THROW(CheckpointError, "'", path, "' is a directory, not a file torch.save wrote; give the file in it (e.g. ",
              (std::filesystem::path(path) / "model.pt").string(), ")");
  }
  std::ifstream probe(path, std::ios::binary);
  if (!probe) DDP_THROW(CheckpointError, "cannot open '", path, "': no such file or not readable");
  char magic[4] = {0, 0, 0, 0};
  probe.read(magic, 4);
  if (probe.gcount() == 0) DDP_THROW(CheckpointError, "'", path, "' is empty (an interrupted save?)");
  if (std::memcmp(magic, "PK\x03\x04", 4) != 0) {
    if (static_cast<uint8_t>(magic[0]) == 0x80) {
      DDP_THROW(CheckpointError, "'", path, "' is in PyTorch's legacy (pre-1.6) format; re-save it with "
                "torch.save(obj, path) from PyTorch >= 1.6");
    }
    DDP_THROW(CheckpointError, "'", path, "' is not a PyTorch file (no zip header)");
  }
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (!reader.hasRecord("data.pkl")) DDP_THROW(CheckpointError, "'", path, "' has no data.pkl record");
    auto [ptr, size] = reader.getRecord("data.pkl");
    Unpickler unpickler(path, &reader, static_cast<const char*>(ptr.get()), size);
    return unpickler.run();
  } catch (const ddp::Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    DDP_THROW(CheckpointError, "'", path, "' is truncated or corrupt (", what.substr(0, what.find('\n')), ")");
  }
}

PyValuePtr readPickleFile(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) {
    DDP_THROW(CheckpointError, "cannot open '", path, "': no such file or not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) DDP_THROW(CheckpointError, "cannot read '", path, "'");
  if (bytes.size() < 2 || static_cast<uint8_t>(bytes[0]) != 0x80 || static_cast<uint8_t>(bytes[1]) < 2) {
    DDP_THROW(CheckpointError, "'", path, "' is not a pickle of protocol 2 or later (what pickle.dump writes)");
  }
  Unpickler unpickler(path, nullptr, bytes.data(), bytes.size());
  return unpickler.run();
}

std::vector<std::pair<std::string, at::Tensor>> tensorEntries(const PyValue& dict) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [k, v] : dict.entries) {
    if (k->kind == PyValue::Kind::kString && v->kind == PyValue::Kind::kTensor) out.emplace_back(k->text, v->tensor);
  }
  return out;
}

}  // namespace ddp::checkpoint
