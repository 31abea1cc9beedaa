#include "worker/report/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include <spdlog/fmt/fmt.h>

namespace ddp::worker {
namespace {

double secondsPerStep(const ProgressPoint& p) {
  return p.runSteps > 0 ? p.elapsedS / static_cast<double>(p.runSteps) : NAN;
}

double percent(const ProgressPoint& p) {
  return p.totalSteps > 0 ? 100.0 * static_cast<double>(p.step) / static_cast<double>(p.totalSteps) : 0.0;
}

double monotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = total / 3600;
  const int64_t m = (total / 60) % 60;
  const int64_t s = total % 60;
  return h > 0 ? fmt::format("{}:{:02}:{:02}", h, m, s) : fmt::format("{}:{:02}", m, s);
}

std::string progressLine(const ProgressPoint& p) {
  const double perStep = secondsPerStep(p);
  const int64_t jobLeft = std::max<int64_t>(0, p.totalSteps - p.step);
  // train.max_steps may end the job inside this epoch.
  const int64_t epochLeft = std::min(jobLeft, std::max<int64_t>(0, p.epochSteps - p.epochStep));
  return fmt::format("epoch {}/{} step {}/{} ({:.0f}%) loss {:.4f} {:.0f} samples/s elapsed {} ETA epoch {} job {}",
                     p.epoch + 1, p.epochs, p.step, p.totalSteps, percent(p), p.loss, p.samplesPerS,
                     formatDuration(p.elapsedS),
                     formatDuration(perStep * static_cast<double>(epochLeft)),
                     formatDuration(perStep * static_cast<double>(jobLeft)));
}

std::string progressBar(const ProgressPoint& p, int width) {
  const double fraction = p.totalSteps > 0 ? std::clamp(static_cast<double>(p.step) / p.totalSteps, 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(fraction * width);
  const double perStep = secondsPerStep(p);
  return fmt::format("[{}{}] {:3.0f}% {}/{} epoch {}/{} loss {:.4f} {:.0f} samples/s {}<{}",
                     std::string(static_cast<std::size_t>(filled), '#'),
                     std::string(static_cast<std::size_t>(width - filled), '.'), 100.0 * fraction, p.step,
                     p.totalSteps, p.epoch + 1, p.epochs, p.loss, p.samplesPerS, formatDuration(p.elapsedS),
                     formatDuration(perStep * static_cast<double>(std::max<int64_t>(0, p.totalSteps - p.step))));
}

int64_t stepsPerEpoch(int64_t batchesPerEpoch, int64_t accumulate) {
  const int64_t a = std::max<int64_t>(1, accumulate);
  return (batchesPerEpoch + a - 1) / a;
}

int64_t totalSteps(int64_t epochs, int64_t perEpoch, int64_t maxSteps) {
  const int64_t all = epochs * perEpoch;
  return maxSteps > 0 ? std::min(all, maxSteps) : all;
}

bool progressBarWanted() {
  if (const char* v = std::getenv("DDP_PROGRESS"); v != nullptr && *v != '\0') return std::string(v) == "bar";
  // Open MPI gives its ranks a pseudo-terminal whatever mpirun's own output is (a file, a pipe).
  if (underMpirun()) return false;
  return ::isatty(STDOUT_FILENO) == 1;
}

bool underMpirun() { return std::getenv("OMPI_COMM_WORLD_RANK") != nullptr; }

void ProgressBar::update(const ProgressPoint& p) {
  if (!enabled_) return;
  const double now = monotonicSeconds();
  if (shown_ && now - lastDrawS_ < 0.1 && p.step < p.totalSteps) return;
  lastDrawS_ = now;
  // '\r' without '\n': the line is redrawn in place.
  std::fprintf(out_, relayed_ ? "%s\r" : "\r%s\033[K", progressBar(p, 30).c_str());
  std::fflush(out_);
  shown_ = true;
}

void ProgressBar::clear() {
  if (!enabled_ || !shown_) return;
  if (!relayed_) std::fputs("\r\033[K", out_);  // the relay clears it itself before the next line
  std::fflush(out_);
  shown_ = false;
}

}  // namespace ddp::worker
