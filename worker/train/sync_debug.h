// cuda.sync_debug: LibTorch's sync-debug mode (torch.cuda.set_sync_debug_mode) is on between log
// steps, where nothing should make the host wait for the GPU, and off where the loop reads results.
#pragma once

#include <string>

namespace ddp::worker {

class SyncDebug {
 public:
  /// `mode`: cuda.sync_debug (off | warn | error).
  explicit SyncDebug(const std::string& mode);
  ~SyncDebug() { pause(); }
  SyncDebug(const SyncDebug&) = delete;
  SyncDebug& operator=(const SyncDebug&) = delete;

  bool enabled() const { return level_ != 0; }
  bool on() const { return on_; }
  /// Off (the loop is about to read the device); no-op when already off.
  void pause();
  /// On again (between log steps); no-op when cuda.sync_debug is off or it is on.
  void resume();

  /// Off for a scope that reads the device in the middle of the steps (a checkpoint, a capture, a
  /// trace), then as it was.
  class Paused {
   public:
    explicit Paused(SyncDebug& s) : s_(s), wasOn_(s.on_) { s_.pause(); }
    ~Paused() {
      if (wasOn_) s_.resume();
    }
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    SyncDebug& s_;
    bool wasOn_;
  };

 private:
  int level_ = 0;  // torch.cuda.set_sync_debug_mode's: 0 off, 1 warn, 2 error
  bool on_ = false;
};

}  // namespace ddp::worker
