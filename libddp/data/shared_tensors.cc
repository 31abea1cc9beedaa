#include "libddp/data/shared_tensors.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/sha256.h"

namespace ddp::data {
namespace {

constexpr uint64_t kAlign = 64;
constexpr size_t kNonceBytes = 16;
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

uint64_t alignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string errnoText() { return std::strerror(errno); }

void writeAll(int fd, const void* data, uint64_t bytes, uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) DDP_THROW(Error, "shared data: writing the host's copy failed (", errnoText(), ")");
    p += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

}  // namespace

struct SharedTensors::Mapping {
  void* address = MAP_FAILED;
  size_t bytes = 0;
  int fd = -1;  // kept open by the creator: the others open it through /proc
  ~Mapping() {
    if (address != MAP_FAILED) ::munmap(address, bytes);
    if (fd >= 0) ::close(fd);
  }
};

std::vector<at::Tensor> SharedTensors::views(const std::shared_ptr<Mapping>& mapping,
                                             const SharedTensorsHandle& handle) {
  std::vector<at::Tensor> out;
  for (const auto& t : handle.tensors) {
    auto* data = static_cast<char*>(mapping->address) + t.offset;
    out.push_back(at::from_blob(
        data, t.shape, [keep = mapping](void*) mutable { keep.reset(); },
        at::TensorOptions().dtype(static_cast<c10::ScalarType>(t.dtype))));
  }
  return out;
}

SharedTensors SharedTensors::create(const std::vector<at::Tensor>& tensors) {
  SharedTensors result;
  SharedTensorsHandle& h = result.handle_;
  uint64_t end = alignUp(kNonceBytes);
  for (const auto& t : tensors) {
    DDP_ENFORCE(t.defined() && t.device().is_cpu(), "shared data: only CPU tensors can be shared");
    SharedTensorLayout layout;
    layout.dtype = static_cast<int>(t.scalar_type());
    layout.shape = t.sizes().vec();
    layout.offset = end;
    end = alignUp(end + static_cast<uint64_t>(t.numel()) * t.element_size());
    h.tensors.push_back(std::move(layout));
  }
  h.bytes = end;

  auto mapping = std::make_shared<Mapping>();
  mapping->fd = ::memfd_create("ddp-dataset", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (mapping->fd < 0) {
    DDP_THROW(Error, "shared data: memfd_create failed (", errnoText(), ")");
  }
  if (::ftruncate(mapping->fd, static_cast<off_t>(h.bytes)) != 0) {
    DDP_THROW(Error, "shared data: cannot size the host's copy to ", h.bytes, " bytes (", errnoText(), ")");
  }
  const std::string nonce = crypto::randomBytes(kNonceBytes);
  h.nonce = crypto::toHex(nonce);
  writeAll(mapping->fd, nonce.data(), nonce.size(), 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor t = tensors[i].contiguous();
    writeAll(mapping->fd, t.data_ptr(), static_cast<uint64_t>(t.numel()) * t.element_size(),
             h.tensors[i].offset);
  }
  // Sealed: no process, this one included, can change, grow or shrink it from now on.
  if (::fcntl(mapping->fd, F_ADD_SEALS, kSeals | F_SEAL_SEAL) != 0) {
    DDP_THROW(Error, "shared data: cannot seal the host's copy (", errnoText(), ")");
  }
  mapping->bytes = h.bytes;
  mapping->address = ::mmap(nullptr, h.bytes, PROT_READ, MAP_SHARED, mapping->fd, 0);
  if (mapping->address == MAP_FAILED) {
    DDP_THROW(Error, "shared data: cannot map the host's copy (", errnoText(), ")");
  }
  h.pid = ::getpid();
  h.fd = mapping->fd;
  result.tensors_ = views(mapping, h);
  return result;
}

SharedTensors SharedTensors::attach(const SharedTensorsHandle& handle) {
  const std::string path = "/proc/" + std::to_string(handle.pid) + "/fd/" + std::to_string(handle.fd);
  auto mapping = std::make_shared<Mapping>();
  mapping->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (mapping->fd < 0) {
    DDP_THROW(DataError, "shared data: cannot open the host's copy at ", path, " (", errnoText(),
              "; another pid namespace, or /proc mounted with hidepid?)");
  }
  struct stat st {};
  if (::fstat(mapping->fd, &st) != 0 || st.st_uid != ::geteuid() ||
      static_cast<uint64_t>(st.st_size) != handle.bytes) {
    DDP_THROW(DataError, "shared data: ", path, " is not the host's copy (owner ", st.st_uid, ", ",
              st.st_size, " bytes; expected owner ", ::geteuid(), ", ", handle.bytes, " bytes)");
  }
  const int seals = ::fcntl(mapping->fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals) {
    DDP_THROW(DataError, "shared data: ", path, " is not sealed against writes; not using it");
  }
  mapping->bytes = handle.bytes;
  mapping->address = ::mmap(nullptr, handle.bytes, PROT_READ, MAP_SHARED, mapping->fd, 0);
  if (mapping->address == MAP_FAILED) {
    DDP_THROW(DataError, "shared data: cannot map ", path, " (", errnoText(), ")");
  }
  ::close(mapping->fd);  // the mapping keeps the memory; only the creator's descriptor matters
  mapping->fd = -1;
  const std::string nonce(static_cast<const char*>(mapping->address), kNonceBytes);
  if (!crypto::equalConstantTime(crypto::toHex(nonce), handle.nonce)) {
    DDP_THROW(DataError, "shared data: ", path, " does not start with the job's nonce; not using it");
  }
  for (const auto& t : handle.tensors) {
    if (t.dtype < 0 || t.dtype >= static_cast<int>(c10::ScalarType::NumOptions)) {
      DDP_THROW(DataError, "shared data: unknown element type ", t.dtype, " in the handle");
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || (d > 0 && numel > (int64_t{1} << 48) / d)) {
        DDP_THROW(DataError, "shared data: implausible tensor dimension ", d, " in the handle");
      }
      numel *= d;
    }
    const auto bytes = static_cast<uint64_t>(numel) *
                       c10::elementSize(static_cast<c10::ScalarType>(t.dtype));
    if (t.offset < kNonceBytes || t.offset + bytes > handle.bytes) {
      DDP_THROW(DataError, "shared data: a tensor of ", bytes, " bytes at ", t.offset,
                " lies outside the host's copy of ", handle.bytes, " bytes");
    }
  }
  SharedTensors result;
  result.handle_ = handle;
  result.tensors_ = views(mapping, handle);
  return result;
}

}  // namespace ddp::data
