#!/usr/bin/env bash
# A real Slurm cluster for the tests (Debian's slurmctld + slurmd + munged) on this one machine,
# private to a directory: its own munge key and socket, its own slurm.conf, state, spool, logs and
# ports, so it neither needs nor touches /etc/slurm, /etc/munge or a cluster this machine may
# belong to. It has two nodes, each a slurmd of its own (slurmd -N): this host's short name and
# "localhost", both names of this machine, so `srun -N2` runs a real two-node step whose node list
# resolves here.
#
#   scripts/slurm_cluster.sh start DIR [OWNER_PID]  # prints SLURM_CONF=DIR/slurm.conf once the nodes are idle
#   scripts/slurm_cluster.sh stop DIR
#
# With OWNER_PID (the test process), a watcher stops the daemons when that process is gone, so a
# test killed by a timeout leaves no daemon behind.
#
# Clients use it with SLURM_CONF=DIR/slurm.conf (srun, sbatch, scontrol read that variable).
# start exits 3 with one line saying why when this machine cannot run the daemons (no packages,
# not root), and 1 when they were started but did not come up (the logs in DIR say why).
set -euo pipefail

action=${1:-}
dir=${2:-}
owner=${3:-}
if [[ -z $action || -z $dir ]]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi

stop() {
  for pidfile in "$dir"/slurmd-*.pid "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [[ -s $pidfile ]] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    # Gone, or a zombie waiting for its parent to reap it.
    for _ in $(seq 100); do
      [[ -r /proc/$pid/stat && $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

if [[ $action == stop ]]; then
  stop
  exit 0
fi
[[ $action == start ]] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

for tool in munged mungekey slurmctld slurmd srun sbatch scontrol sinfo; do
  if ! command -v "$tool" >/dev/null 2>&1 && [[ ! -x /usr/sbin/$tool ]]; then
    echo "cannot start Slurm: '$tool' is not installed (scripts/setup.sh --tests installs slurm-wlm and munge)" >&2
    exit 3
  fi
done
if [[ $(id -u) -ne 0 ]]; then
  # slurmd must start job steps as their user, which needs root.
  echo "cannot start Slurm: slurmd has to run as root and this is uid $(id -u)" >&2
  exit 3
fi
export PATH=$PATH:/usr/sbin

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
chmod 700 "$dir"
mkdir -p "$dir/state"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

host=$(hostname -s)
cpus=$(nproc)
memory_mb=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
ctld_port=$(free_port)
nodes=("$host" localhost)
if [[ $host == localhost ]]; then nodes=(localhost); fi

# munge: a key of its own (mode 0400, owned by the daemon's user) and a socket in DIR.
[[ -s $dir/munge.key ]] || mungekey --create --keyfile="$dir/munge.key" >/dev/null
chmod 400 "$dir/munge.key"

cat >"$dir/slurm.conf" <<EOF
ClusterName=ddptest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
for node in "${nodes[@]}"; do
  echo "NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 Port=$(free_port) CPUs=$cpus RealMemory=$memory_mb" \
    "State=UNKNOWN" >>"$dir/slurm.conf"
done
# slurmd reads cgroup.conf beside slurm.conf even with task/none and proctrack/linuxproc.
echo "CgroupPlugin=cgroup/v1" >"$dir/cgroup.conf"
export SLURM_CONF=$dir/slurm.conf

started() {
  munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" 2>>"$dir/start.log" || return 1
  slurmctld -i -f "$dir/slurm.conf" 2>>"$dir/start.log" || return 1
  for node in "${nodes[@]}"; do
    mkdir -p "$dir/spool-$node"
    slurmd -f "$dir/slurm.conf" -N "$node" 2>>"$dir/start.log" || return 1
  done
  # The nodes are usable once slurmctld has heard from their slurmd: each is idle.
  for _ in $(seq 300); do
    states=$(sinfo -h -N -o %t 2>/dev/null | sort -u | tr '\n' ' ')
    [[ $states == "idle " ]] && return 0
    sleep 0.1
  done
  return 1
}

if ! started; then
  stop
  echo "Slurm did not come up in $dir: $(tail -n 3 "$dir"/start.log "$dir"/*.log 2>/dev/null | tr '\n' ' ' | cut -c1-600)" >&2
  exit 1
fi
if [[ -n $owner ]]; then
  # Polls the owner once a second: it has no other way to learn of a SIGKILL.
  (
    trap '' HUP
    while kill -0 "$owner" 2>/dev/null; do sleep 1; done
    stop
  ) </dev/null >/dev/null 2>&1 &
  disown
fi
echo "SLURM_CONF=$dir/slurm.conf"
