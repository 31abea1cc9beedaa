// SharedTensors: one sealed memfd per host copy; checks that attach() trusts nothing else.
#include "libddp/data/shared_tensors.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "common/error.h"

namespace ddp::data {
namespace {

bool fdOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

std::string expectDataError(const SharedTensorsHandle& h) {
  try {
    SharedTensors::attach(h);
  } catch (const DataError& e) {
    return e.what();
  }
  ADD_FAILURE() << "attach accepted a handle it should refuse";
  return "";
}

TEST(SharedTensors, AttachSeesTheSameTensorsThroughANewMapping) {
  const at::Tensor bytes = at::arange(1000, at::kLong).remainder(251).to(at::kByte).reshape({10, 1, 10, 10});
  const at::Tensor labels = at::arange(10, at::kLong);
  const at::Tensor floats = at::randn({6, 4}).t();  // not contiguous
  const SharedTensors made = SharedTensors::create({bytes, labels, floats});
  const SharedTensorsHandle& h = made.handle();
  EXPECT_EQ(h.pid, ::getpid());
  EXPECT_EQ(h.nonce.size(), 32u);
  ASSERT_EQ(h.tensors.size(), 3u);
  for (const auto& t : h.tensors) EXPECT_EQ(t.offset % 64, 0u) << "tensors start 64-byte aligned";

  const SharedTensors mapped = SharedTensors::attach(h);
  const std::vector<at::Tensor> originals = {bytes, labels, floats};
  for (size_t i = 0; i < originals.size(); ++i) {
    for (const auto& side : {made.tensors()[i], mapped.tensors()[i]}) {
      EXPECT_EQ(side.scalar_type(), originals[i].scalar_type()) << i;
      EXPECT_EQ(side.sizes(), originals[i].sizes()) << i;
      EXPECT_TRUE(side.equal(originals[i])) << i;
    }
    // Two mappings of one copy: different addresses, same pages.
    EXPECT_NE(made.tensors()[i].data_ptr(), mapped.tensors()[i].data_ptr());
  }
}

TEST(SharedTensors, TheCopyIsSealedAgainstWritingGrowingAndShrinking) {
  const SharedTensors made = SharedTensors::create({at::arange(16, at::kLong)});
  const int seals = ::fcntl(made.handle().fd, F_GET_SEALS);
  ASSERT_GE(seals, 0);
  EXPECT_TRUE(seals & F_SEAL_WRITE);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_SEAL);  // and nobody can lift them
  EXPECT_EQ(::pwrite(made.handle().fd, "x", 1, 100), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(made.handle().fd, 0), 0);
  // Not even this process can map it writable.
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, made.handle().fd, 0), MAP_FAILED);
}

TEST(SharedTensors, NothingOutlivesTheLastTensor) {
  int fd = -1;
  std::string link;
  {
    SharedTensors made = SharedTensors::create({at::arange(4, at::kLong)});
    fd = made.handle().fd;
    ASSERT_TRUE(fdOpen(fd));
    char target[256] = {};
    ASSERT_GT(::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), target, sizeof target - 1), 0);
    link = target;
    EXPECT_EQ(link.rfind("/memfd:ddp-dataset", 0), 0u) << link << ": an anonymous memory file, in no directory";
    const at::Tensor kept = made.tensors()[0];
    made = SharedTensors();
    EXPECT_TRUE(fdOpen(fd)) << "a tensor still uses it";
    EXPECT_EQ(kept[3].item<int64_t>(), 3);
  }
  EXPECT_FALSE(fdOpen(fd)) << "closed with the last tensor";
}

TEST(SharedTensors, RefusesWhatIsNotTheCopyItWasToldOf) {
  const SharedTensors made = SharedTensors::create({at::arange(32, at::kLong)});

  SharedTensorsHandle wrongNonce = made.handle();
  wrongNonce.nonce = std::string(32, '0');
  EXPECT_NE(expectDataError(wrongNonce).find("nonce"), std::string::npos);

  SharedTensorsHandle wrongSize = made.handle();
  wrongSize.bytes += 64;
  EXPECT_NE(expectDataError(wrongSize).find("is not the host's copy"), std::string::npos);

  SharedTensorsHandle outside = made.handle();
  outside.tensors[0].shape = {1000};
  EXPECT_NE(expectDataError(outside).find("lies outside"), std::string::npos);

  SharedTensorsHandle gone = made.handle();
  gone.fd = 100000;
  EXPECT_NE(expectDataError(gone).find("cannot open the host's copy"), std::string::npos);

  // A memory file of the right size and content that is not sealed: someone could still change it.
  const int fd = ::memfd_create("not-sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(made.handle().bytes)), 0);
  SharedTensorsHandle unsealed = made.handle();
  unsealed.fd = fd;
  EXPECT_NE(expectDataError(unsealed).find("not sealed"), std::string::npos);
  ::close(fd);
}

}  // namespace
}  // namespace ddp::data
