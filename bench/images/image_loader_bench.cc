// Our side of bench/images: ddp::ImageLoader (<ddp/image_data.h>) over an ImageFolder root or tar
// shards, the ImageNet training transform (RandomResizedCrop(size) + flip + ToTensor + Normalize),
// shuffled batches as a DataLoader(shuffle=True) reads them. One JSON line, as
// torchvision_loader.py prints: images/s over the timed batches, the time from start (indexing
// included) to the first batch, the peak RSS.
//
//   image_loader_bench ROOT|'SHARDS*.tar' --threads N [--batch 64] [--size 224] [--batches 100]
//                      [--warmup 5] [--transform train|eval] [--no-dct]
#include <ddp/image_data.h>
#include <ddp/sampler.h>

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "image_loader_bench: %s\nusage: image_loader_bench ROOT|GLOB.tar --threads N [--batch 64] "
               "[--size 224] [--batches 100] [--warmup 5] [--transform train|eval] [--no-dct]\n", why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  const auto start = Clock::now();
  if (argc < 2) usage("no data set given");
  const std::string source = argv[1];
  int threads = -1;
  long batch = 64, size = 224, batches = 100, warmup = 5;
  std::string transform = "train";
  bool dct = true;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(("no value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(value());
    else if (a == "--batch") batch = std::atol(value());
    else if (a == "--size") size = std::atol(value());
    else if (a == "--batches") batches = std::atol(value());
    else if (a == "--warmup") warmup = std::atol(value());
    else if (a == "--transform") transform = value();
    else if (a == "--no-dct") dct = false;
    else usage(("unknown argument " + a).c_str());
  }
  if (threads < 1 || batch < 1 || size < 8 || batches < 1 || warmup < 0) usage("bad numbers");
  const bool tar = source.size() > 4 && source.compare(source.size() - 4, 4, ".tar") == 0;
  auto data = std::make_shared<const ddp::ImageDataset>(tar ? ddp::ImageDataset::tarShards(source)
                                                            : ddp::ImageDataset::folder(source));
  ddp::DistributedSampler sampler(data->size(), 1, 0, ddp::SamplerOptions{true, 0, true, true});
  auto plan = sampler.epochBatches(0, batch, /*dropLast=*/true);
  const long need = warmup + batches;
  if (static_cast<long>(plan.size()) < need) {
    std::fprintf(stderr, "image_loader_bench: %ld batches asked, the data set has %zu\n", need, plan.size());
    return 2;
  }
  plan.resize(static_cast<size_t>(need));
  ddp::ImageLoaderOptions o;
  o.threads = threads;
  o.transform.kind = transform == "eval" ? ddp::ImageTransformKind::kEval : ddp::ImageTransformKind::kTrain;
  o.transform.size = size;
  o.transform.dctScaling = dct;
  ddp::ImageLoader loader(data, o);
  loader.start(plan, 0);
  double first = 0;
  Clock::time_point t0;
  long images = 0;
  for (long i = 0; i < need; ++i) {
    const auto b = loader.next();
    if (!b) break;
    if (i == 0) first = secondsSince(start);
    if (i == warmup) t0 = Clock::now();
    if (i >= warmup) images += b->images.size(0);
  }
  const double seconds = secondsSince(t0);
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  std::printf("{\"side\": \"ours\", \"threads\": %d, \"images_per_s\": %.1f, \"first_batch_s\": %.3f, "
              "\"peak_rss_mb\": %.1f, \"images\": %ld, \"dataset\": %ld}\n",
              threads, static_cast<double>(images) / seconds, first, static_cast<double>(usage.ru_maxrss) / 1024.0,
              images, static_cast<long>(data->size()));
  return 0;
}
