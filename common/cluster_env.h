// What the cluster's own launchers (srun, mpirun) tell a process in its environment, shared by
// the launcher and the worker: Slurm's hostlists ("node[01-03,07],gpu7") and the job's port.
#pragma once

#include <string>
#include <vector>

namespace ddp {

/// Expands a Slurm hostlist as `scontrol show hostnames` does: "a[01-03,7],b[1-2]-x[3-4]" is
/// a01 a02 a03 a7 b1-x3 b1-x4 b2-x3 b2-x4 (each range keeps the width of its first number).
/// Throws ConfigError naming `name` when `value` is malformed or expands to more than 1<<20 hosts.
std::vector<std::string> expandHostlist(const std::string& name, const std::string& value);

/// The first host of a Slurm hostlist, without expanding the rest.
std::string firstHost(const std::string& name, const std::string& value);

/// The port a job launched by Slurm or Open MPI uses when MASTER_PORT is not given: the same on
/// every node of the job step (it depends only on the job's and the step's ids), different for the
/// steps of one job (two srun steps running at once would otherwise meet at one store) and for jobs
/// whose ids differ by less than 10000 (step 0), and below Linux's ephemeral range (32768-60999), so
/// outgoing connections do not take it: 20000 + (job + 1009 * step) % 10000. (Step s of job J
/// shares a port with step 0 of job J + 1009 s: the price of a port per step in 10000 ports.)
int clusterJobPort(unsigned long long jobId, unsigned long long stepId = 0);

/// Whether SLURM_STEP_ID names one of Slurm's special steps, not an srun step: the batch script's,
/// the extern and the interactive step (4294967290..4294967295 over Slurm's versions, or their names).
bool slurmSpecialStep(const std::string& stepId);

/// Whether a process is a task of an srun step, from its SLURM_STEP_ID and SLURM_STEP_TASKS_PER_NODE
/// (srun sets them for its tasks): one of them set, and no special step. The shell of an sbatch
/// script (the batch step) has SLURM_PROCID=0 and the job's SLURM_NTASKS too, but what it runs
/// directly is one process: Slurm's task counts hold inside an srun step only.
bool inSrunStep(const std::string& stepId, const std::string& stepTasksPerNode);

/// A Slurm step id (SLURM_STEP_ID) as a number for clusterJobPort: 0 when empty, not a number, or a
/// special step.
unsigned long long slurmStepNumber(const std::string& stepId);

}  // namespace ddp
