// ddp::Profiler over LibTorch's Kineto profiler (torch/csrc/autograd/profiler_kineto.h), the one
// torch.profiler.profile drives from Python.
#include "ddp/profiler.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include "common/error.h"
#include "libddp/torch_compat.h"
#if DDP_TORCH_2
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

namespace ddp {

bool Profiler::available() { return DDP_TORCH_2; }

Profiler::Profiler(ProfilerOptions options) : options_(options) {}

Profiler::~Profiler() {
#if DDP_TORCH_2
  if (running_) {
    try {
      torch::autograd::profiler::disableProfiler();
    } catch (...) {
    }
  }
#endif
}

void Profiler::start() {
  if (!available()) {
    DDP_THROW(ConfigError, "ddp::Profiler needs LibTorch 2.x (1.13's C++ profiler API differs); profile with "
              "LibTorch 2.x or perf");
  }
  if (running_) DDP_THROW(Error, "ddp::Profiler::start: already running; stop() it first");
#if DDP_TORCH_2
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                     options_.recordShapes, /*profile_memory=*/false,
                                                     options_.withStack);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (options_.cuda) activities.insert(ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  running_ = true;
  steps_ = 0;
#endif
}

std::unique_ptr<at::RecordFunction> Profiler::step() {
  auto span = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (running_ && span->isActive()) span->before("ProfilerStep#" + std::to_string(steps_++));
  return span;
}

int64_t Profiler::stop(const std::string& path) {
  if (!running_) DDP_THROW(Error, "ddp::Profiler::stop: not running; start() it first");
#if DDP_TORCH_2
  running_ = false;
  const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
      torch::autograd::profiler::disableProfiler();
  const auto events = static_cast<int64_t>(result->events().size());
  // The profiler writes by name and follows a link there: into a directory of our own (mode 0700),
  // then renamed into place (a link planted at `path` is replaced, never written through).
  std::string scratch = path + ".partial-XXXXXX";
  if (::mkdtemp(scratch.data()) == nullptr) {
    DDP_THROW(Error, "ddp::Profiler::stop: cannot write the trace to '", path, "': cannot make ", scratch, " (",
              std::strerror(errno), ")");
  }
  const std::string partial = scratch + "/trace.json";
  std::error_code ec;
  try {
    result->save(partial);
  } catch (const std::exception& e) {
    std::filesystem::remove_all(scratch, ec);
    DDP_THROW(Error, "ddp::Profiler::stop: cannot write the trace to '", path, "': ", e.what());
  }
  std::filesystem::rename(partial, path, ec);
  std::error_code ignored;
  const bool written = !ec && std::filesystem::exists(path, ignored);
  std::filesystem::remove_all(scratch, ignored);
  if (!written) {
    DDP_THROW(Error, "ddp::Profiler::stop: cannot write the trace to '", path, "'",
              ec ? ": " + ec.message() : std::string(" (nothing was written)"));
  }
  return events;
#else
  (void)path;
  return 0;
#endif
}

}  // namespace ddp
