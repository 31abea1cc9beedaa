// TensorBoard event files (`output.tensorboard: true`): the scalars torch.utils.tensorboard's
// SummaryWriter.add_scalar writes, in TFRecord framing, readable by TensorBoard. No LibTorch here;
// the protobuf types stay inside event_writer.cc.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace ddp::worker::tensorboard {

/// CRC-32C (Castagnoli), and TFRecord's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(std::string_view data);
uint32_t maskedCrc32c(std::string_view data);

/// One TFRecord: length (u64 LE), masked CRC of the length, the data, masked CRC of the data.
std::string frameRecord(std::string_view data);

/// Appends events to DIR/events.out.tfevents.<unix time>.<host>.<pid> (DIR created). The first
/// record is the file_version event "brain.Event:2"; each add is flushed, so TensorBoard sees a
/// live run. Throws ddp::Error naming the file when it cannot be written.
class EventWriter {
 public:
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void addScalar(const std::string& tag, double value, int64_t step);
  /// What every training mode logs at a logged step: train/loss, train/samples_per_s, train/lr.
  void addTrainingStep(int64_t step, double loss, double samplesPerS, double lr);
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& serializedEvent);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace ddp::worker::tensorboard
