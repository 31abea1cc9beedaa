// TFRecord framing of TensorBoard event files (worker/report/tensorboard/event_writer.h), against the
// published CRC-32C check value and TFRecord's layout (tensorflow/core/lib/io/record_writer.cc).
#include "worker/report/tensorboard/event_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/error.h"

namespace ddp::worker::tensorboard {
namespace {

TEST(TensorBoardRecord, Crc32cMatchesTheCheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xe3069283u);  // CRC-32C's check value (RFC 3720 B.4 polynomial)
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 B.4: 32 bytes of zeros.
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8a9136aau);
  const uint32_t crc = crc32c("abc");
  EXPECT_EQ(maskedCrc32c("abc"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(TensorBoardRecord, FrameIsLengthCrcDataCrc) {
  const std::string record = frameRecord("hello");
  ASSERT_EQ(record.size(), 8u + 4u + 5u + 4u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x05\0\0\0\0\0\0\0", 8));
  const auto u32 = [&](std::size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(record[at + i]);
    return v;
  };
  EXPECT_EQ(u32(8), maskedCrc32c(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, 5), "hello");
  EXPECT_EQ(u32(17), maskedCrc32c("hello"));
}

// The event file's name is known in advance (time, host, pid): a link planted there by someone who
// can write output.dir/tensorboard must not make the job append to what it points at (found by a
// security review: a root job appended its records to another file).
TEST(TensorBoardEventWriter, NeverWritesThroughALinkPlantedWhereItsFileGoes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tb_link_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path victim = dir / "victim";
  std::ofstream(victim) << "keep";
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  for (int64_t t = now; t < now + 5; ++t) {  // the seconds the writer may take its name from
    fs::create_symlink(victim, dir / ("events.out.tfevents." + std::to_string(t) + "." + host + "." +
                                      std::to_string(::getpid())));
  }
  try {
    EventWriter writer(dir.string());
    ADD_FAILURE() << "wrote through a planted link";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a symbolic link"), std::string::npos) << e.what();
  }
  std::ifstream in(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "keep");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ddp::worker::tensorboard
