// The environment and arguments each worker starts with (the torchrun contract).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/launch_options.h"

namespace ddp::launcher {

/// Environment variables by name; ordered so tests and logs are deterministic.
using EnvMap = std::map<std::string, std::string>;

/// The launcher's own environment (environ), which workers inherit.
EnvMap currentEnvironment();

/// True when OMP_NUM_THREADS should default to 1: unset and several workers share the node.
bool shouldDefaultOmpThreads(const LaunchOptions& options, const EnvMap& inherited);

/// `inherited` plus RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK,
/// ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT and DDP_RESTART_COUNT
/// (0: the first attempt), TORCHELASTIC_MAX_RESTARTS, DDP_LAUNCH_PREFIXED, and OMP_NUM_THREADS=1
/// when shouldDefaultOmpThreads(). The contract's variables override inherited ones.
EnvMap workerEnvironment(const LaunchOptions& options, int localRank, int masterPort, const EnvMap& inherited);

/// The worker's argv after argv[0]: the user's worker arguments untouched, plus `--local_rank=N`
/// when !useEnv (torch.distributed.launch's legacy contract): first for a program, and right
/// after the script (or `-m module`, `-c command`) when WORKER is a Python interpreter, where the
/// script reads it (an option before the script would be the interpreter's, and rejected).
std::vector<std::string> workerArguments(const LaunchOptions& options, int localRank);

/// True for python, python3, python3.11, ... (any directory): WORKER runs a script.
bool isPythonInterpreter(const std::string& worker);

/// Whether the worker runs Python, so its rank 0 binds MASTER_PORT itself (torch.distributed's
/// TCPStore; a socket handed over would only block it) and it gets torchrun's environment: a
/// Python interpreter, a .py file, a wrapper given one (env python3 x.py, nsys profile python ...,
/// uv run x.py), or a script whose first 64 KiB name python (#!/usr/bin/env python3, a shell
/// entrypoint that execs python). `resolvedPath` is the worker as it will be executed.
bool workerRunsPython(const LaunchOptions& options, const std::string& resolvedPath);

}  // namespace ddp::launcher
