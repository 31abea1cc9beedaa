// Tensors that every process on a host maps from one copy: a sealed memfd.
//
// The process that loaded a data set copies its tensors into an anonymous memory file
// (memfd_create), seals it against writing, growing and shrinking, and keeps it open; the other
// processes of the job on that host open it through /proc/<pid>/fd/<fd> (the kernel allows that
// only to the same user) and map it read-only. Nothing has a name in a file system: when the last
// process holding it ends, crashed or not, the memory is gone, so no later job can find, let alone
// trust, a half-written copy.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp::data {

/// Where one tensor lies in a shared copy.
struct SharedTensorLayout {
  int dtype = 0;                 // c10::ScalarType as int (every rank runs the same binary)
  std::vector<int64_t> shape;
  uint64_t offset = 0;           // bytes from the start of the copy
};

/// What another process on the host needs to map a copy: pass it through the job's store.
struct SharedTensorsHandle {
  int64_t pid = 0;       // process holding the memfd open
  int fd = -1;           // its descriptor there
  uint64_t bytes = 0;    // size of the copy
  std::string nonce;     // 32 hex digits, also the copy's first 16 bytes: the copy is the one meant
  std::vector<SharedTensorLayout> tensors;
};

class SharedTensors {
 public:
  /// Copies `tensors` (CPU, any dtype, any strides) into a new sealed memfd and maps it
  /// read-only; tensors() are views of that mapping. Throws ddp::Error when the kernel refuses
  /// (no memfd, no memory).
  static SharedTensors create(const std::vector<at::Tensor>& tensors);

  /// Maps the copy `handle` describes, after checking that it is a memfd of this user, sealed,
  /// of the stated size, and starts with the nonce. Throws ddp::DataError saying which check
  /// failed (e.g. /proc/<pid>/fd not openable: another pid namespace, or hidepid).
  static SharedTensors attach(const SharedTensorsHandle& handle);

  /// Views of the read-only mapping, in the order given to create(); each keeps the mapping
  /// alive. Writing into them is a segmentation fault.
  const std::vector<at::Tensor>& tensors() const { return tensors_; }
  const SharedTensorsHandle& handle() const { return handle_; }

 private:
  struct Mapping;
  static std::vector<at::Tensor> views(const std::shared_ptr<Mapping>& mapping, const SharedTensorsHandle& handle);

  SharedTensorsHandle handle_;
  std::vector<at::Tensor> tensors_;
};

}  // namespace ddp::data
