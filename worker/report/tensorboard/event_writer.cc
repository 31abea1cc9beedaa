#include "worker/report/tensorboard/event_writer.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/no_follow.h"
#include "event.pb.h"

namespace ddp::worker::tensorboard {
namespace {

std::array<uint32_t, 256> makeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;  // reflected 0x1EDC6F41
    table[i] = crc;
  }
  return table;
}

double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void appendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = makeTable();
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : data) crc = table[(crc ^ c) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t maskedCrc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string frameRecord(std::string_view data) {
  std::string length;
  appendLittleEndian(length, data.size(), 8);
  std::string record = length;
  appendLittleEndian(record, maskedCrc32c(length), 4);
  record.append(data);
  appendLittleEndian(record, maskedCrc32c(data), 4);
  return record;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const double now = unixSeconds();
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host + "." +
          std::to_string(::getpid());
  // Never through a link planted where the file goes (it would append to whatever it points at).
  const int fd = openForWriting(path_, /*append=*/true);
  file_ = fd >= 0 ? ::fdopen(fd, "ab") : nullptr;
  if (file_ == nullptr) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    DDP_THROW(Error, "tensorboard: cannot create '", path_, "' (", openFailure(error),
              "); make output.dir writable or set output.tensorboard=false");
  }
  Event event;
  event.set_wall_time(now);
  event.set_file_version("brain.Event:2");
  write(event.SerializeAsString());
}

EventWriter::~EventWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventWriter::addScalar(const std::string& tag, double value, int64_t step) {
  Event event;
  event.set_wall_time(unixSeconds());
  event.set_step(step);
  SummaryValue* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write(event.SerializeAsString());
}

void EventWriter::addTrainingStep(int64_t step, double loss, double samplesPerS, double lr) {
  addScalar("train/loss", loss, step);
  addScalar("train/samples_per_s", samplesPerS, step);
  addScalar("train/lr", lr, step);
}

void EventWriter::write(const std::string& serializedEvent) {
  const std::string record = frameRecord(serializedEvent);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0) {
    DDP_THROW(Error, "tensorboard: cannot write '", path_, "' (", std::strerror(errno), ")");
  }
}

}  // namespace ddp::worker::tensorboard
