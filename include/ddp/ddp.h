// ddp-launch's C++ library: DistributedDataParallel for your own LibTorch training loop.
//
//   ddp::ProcessGroup group = ddp::initProcessGroup();     // env contract → rendezvous → Gloo/NCCL
//   Net net;  net->to(group.device());
//   ddp::DistributedDataParallel<Net> model(net, group);  // rank 0's weights everywhere
//   ddp::DistributedSampler sampler(dataset_size, group);  // or ddp::DataLoaderSampler for torch::data
//   for (epoch ...) { for (batch of sampler.epochBatches(epoch, 64)) {
//       optimizer.zero_grad(); loss(model.forward(x), y).backward(); optimizer.step(); } }
//   ddp::saveModel(*net, "model.pt", group);               // rank 0 writes; plain keys, CPU, torch.load
//   group.destroy();                                      // last, on every rank: they leave together
//
// Models: a TORCH_MODULE holder or a std::shared_ptr<YourModule>. Errors: the ddp::Error family,
// one line each; catch ddp::Error at the top of main (docs/library.md: "Your own training loop").
//
// Start the program with `ddp-launch --nproc_per_node=N ./program` (or torchrun, srun, mpirun).
// Every class here is safe to use with world size 1 (a program run on its own).
#pragma once

// One concept per header; this one includes them all.
#include "ddp/activation_checkpoint.h"      // activationCheckpoint (torch.utils.checkpoint)
#include "ddp/amp.h"                        // Autocast, GradScaler
#include "ddp/checkpoint.h"                 // saveModel, loadModel, Checkpointer
#include "ddp/clip_grad.h"                  // clipGradNorm
#include "ddp/collectives.h"                // ReduceOp, AllReduceOptions, ... (per-call options)
#include "ddp/comm_hook.h"                  // CommHook, fp16CompressHook, powerSgdHook
#include "ddp/cuda.h"                       // cudaDeviceCount, gpuReport, setCudaSyncDebugMode
#include "ddp/cuda_graph.h"                 // CudaGraph (capture and replay a step)
#include "ddp/data.h"                       // loadOncePerHost
#include "ddp/data_loader.h"                // DataLoaderSampler (torch::data)
#include "ddp/ddp_options.h"                // DdpOptions, GradientCompression, GradientReducer
#include "ddp/distributed_data_parallel.h"  // DistributedDataParallel, DdpEngine
#include "ddp/files.h"                      // writeFileAtomic, makeDirectories
#include "ddp/fused_optim.h"                // FusedAdamW, FusedSGD
#include "ddp/join.h"                       // Join (uneven inputs)
#include "ddp/launch_env.h"                 // launchEnv (rank, world size before the group)
#include "ddp/error.h"                      // Error, ConfigError, CommError, ...
#include "ddp/sync_batch_norm.h"            // SyncBatchNorm, convertSyncBatchNorm
#include "ddp/zero_redundancy_optimizer.h"  // ZeroRedundancyOptimizer (ZeRO stage 1)
#include "ddp/lr_schedule.h"                // LrSchedule
#include "ddp/process_group.h"              // initProcessGroup, ProcessGroup
#include "ddp/profiler.h"                   // Profiler (torch.profiler, Chrome traces)
#include "ddp/sampler.h"                    // DistributedSampler
#include "ddp/state_dict.h"                 // stateDict, saveStateDict, loadTensors
#include "ddp/straggler.h"                  // StragglerMonitor (who arrives last)
#include "ddp/fully_shard.h"                // fullyShard, FullyShardedUnit (FSDP2: sharded parameters)
#include "ddp/image_data.h"                 // ImageDataset, ImageLoader (streamed image folders, tar shards)
#include "ddp/token_data.h"                 // TokenData, TokenSampler (token shards, LM windows)
#include "ddp/version.h"
