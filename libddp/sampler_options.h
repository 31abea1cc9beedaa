// The public ddp::SamplerOptions as the sampler layer's options, for DistributedSampler and
// DataLoaderSampler alike. Not installed.
#pragma once

#include "ddp/sampler.h"
#include "sampler/distributed_sampler.h"

namespace ddp::internal {

inline sampler::DistributedSamplerOptions samplerOptions(int numReplicas, int rank, const SamplerOptions& o) {
  sampler::DistributedSamplerOptions out;
  out.numReplicas = numReplicas;
  out.rank = rank;
  out.shuffle = o.shuffle;
  out.seed = o.seed;
  out.dropLast = o.dropLast;
  out.pad = o.pad;
  return out;
}

}  // namespace ddp::internal
