// The name the ranks of one host meet at for ddp::loadOncePerHost: hostname and boot id.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <string>

#include "libddp/data/host_copy.h"

namespace ddp::data {
namespace {

TEST(HostIdentity, NamesThisMachineAndBoot) {
  const std::string id = hostIdentity();
  const auto slash = id.find('/');
  ASSERT_NE(slash, std::string::npos);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  EXPECT_EQ(id.substr(0, slash), host);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  EXPECT_EQ(boot.size(), 36u) << "boot id is a UUID: " << boot;
  EXPECT_EQ(id.substr(slash + 1), boot);
}

}  // namespace
}  // namespace ddp::data
