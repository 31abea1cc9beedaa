// Training progress for people: `epoch 1/2 step 450/938 (48%) loss 0.4428 5308 samples/s
// elapsed 0:11 ETA epoch 0:00 job 0:12` every train.log_every steps, and on a terminal a live bar
// redrawn in place between those lines (tqdm's habit). Rank 0 only; no LibTorch here.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ddp::worker {

/// Where the job stands after an optimizer step.
struct ProgressPoint {
  int64_t step = 0;        // optimizer steps done in the job (resumed ones included)
  int64_t totalSteps = 0;  // of the whole job (epochs × steps per epoch, capped by train.max_steps)
  int64_t epoch = 0;       // 0-based
  int64_t epochs = 1;
  int64_t epochStep = 0;   // steps done in this epoch
  int64_t epochSteps = 0;  // steps this epoch has
  double loss = 0;
  double samplesPerS = 0;
  double elapsedS = 0;     // since this process started training
  int64_t runSteps = 0;    // steps this process took in elapsedS (a resumed run did not take the others)
};

/// "0:07", "12:03", "1:02:03"; "?" for a negative or not finite value.
std::string formatDuration(double seconds);

/// The periodic line (without timestamp): epoch e/E step k/K (p%) loss samples/s elapsed ETA.
/// ETAs assume the mean seconds per step of this run so far; the epoch's never exceeds the job's.
std::string progressLine(const ProgressPoint& p);

/// The terminal's live bar, `width` characters of bar: `[#####.....] 48% 450/938 ...`.
std::string progressBar(const ProgressPoint& p, int width);

/// Steps per epoch of `batchesPerEpoch` micro-batches taken `accumulate` at a time, and the
/// job's total (0 maxSteps = no cap).
int64_t stepsPerEpoch(int64_t batchesPerEpoch, int64_t accumulate);
int64_t totalSteps(int64_t epochs, int64_t stepsPerEpoch, int64_t maxSteps);

/// Shows the bar or not: DDP_PROGRESS=bar|lines (ddp-launch sets it: bar for rank 0 when its own
/// stdout is a terminal), else a bar when stdout is a terminal.
bool progressBarWanted();

/// Whether Open MPI's mpirun started this process: its stdout is a pseudo-terminal even when
/// mpirun's output goes to a file, so neither the live bar nor colours belong there.
bool underMpirun();

/// Draws the bar on `out` at most 10 times a second, and clears it before a log line. On a
/// terminal it writes "\r<bar>\033[K"; under ddp-launch (`relayed`) it writes "<bar>\r" and the
/// launcher's relay draws it in place and clears it before the next line of any rank.
class ProgressBar {
 public:
  ProgressBar(bool enabled, bool relayed, std::FILE* out = stdout) : enabled_(enabled), relayed_(relayed), out_(out) {}
  ~ProgressBar() { clear(); }
  void update(const ProgressPoint& p);
  /// Before a log line: removes the bar so the line starts at the left margin.
  void clear();

 private:
  bool enabled_;
  bool relayed_;
  std::FILE* out_;
  bool shown_ = false;
  double lastDrawS_ = -1;
};

}  // namespace ddp::worker
