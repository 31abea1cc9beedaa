// Compiled only by the test api_model_static_assert, which expects it NOT to compile: a model type
// DistributedDataParallel cannot wrap must stop the build with the static_assert's text (what to
// pass instead), not with an error deep inside the template ("has no member named 'ptr'").
#include <ddp/distributed_data_parallel.h>

#include <torch/nn/modules/linear.h>

#include <memory>

struct NotAModule {
  int forward(int x) { return x; }
};

// A module held by unique_ptr and a plain struct: both refused.
static_assert(sizeof(ddp::DistributedDataParallel<std::unique_ptr<torch::nn::LinearImpl>>) > 0);
static_assert(sizeof(ddp::DistributedDataParallel<std::shared_ptr<NotAModule>>) > 0);
