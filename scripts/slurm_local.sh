#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for the launcher's tests and for
# trying a grid as a job array without a cluster (docs/cluster.md):
#   bash scripts/slurm_local.sh install   # Debian's slurm-wlm and munge (root, apt)
#   bash scripts/slurm_local.sh start     # munged, slurmctld and slurmd on localhost
#   bash scripts/slurm_local.sh status    # sinfo; exit 0 once the node takes jobs
#   bash scripts/slurm_local.sh stop      # the daemons down, the state folder removed
# The daemons run as root with their configuration, state and logs in one folder,
# SLURM_LOCAL_DIR (default /tmp/attention_jax_slurm); `start` prints the line to
# export (SLURM_CONF) so that sbatch, squeue and submitit reach this cluster. One
# node of this machine's cores and memory (less 1 GiB), one partition `local`.
# The plugins are the ones that need no cgroup or accounting database:
# proctrack/linuxproc, task/none, select/cons_tres, no accounting.
set -euo pipefail
DIR="${SLURM_LOCAL_DIR:-/tmp/attention_jax_slurm}"
CONF="$DIR/slurm.conf"

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "error: scripts/slurm_local.sh $1 runs SLURM's daemons as root; run it as root" >&2
    exit 77
  fi
}

have_slurm() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
               && command -v munged >/dev/null && command -v sbatch >/dev/null; }

write_conf() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ {print int($2 / 1024) - 1024}' /proc/meminfo)
  cat > "$CONF" <<EOF
ClusterName=attention_jax_local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${SLURM_LOCAL_CTLD_PORT:-6917}
SlurmdPort=${SLURM_LOCAL_D_PORT:-6918}
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge=300
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start_munge() {
  if pgrep -x munged >/dev/null; then return 0; fi
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key 2>/dev/null || true
  chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  if id munge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
  else
    /usr/sbin/munged --force
  fi
}

case "${1:-}" in
  install)
    need_root install
    if have_slurm; then echo "slurm-wlm and munge are installed"; exit 0; fi
    command -v apt-get >/dev/null || { echo "error: no apt-get: install slurm-wlm and munge" \
                                            "with this system's package manager" >&2; exit 77; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge ;;
  start)
    need_root start
    have_slurm || { echo "error: SLURM is not installed: bash scripts/slurm_local.sh install" >&2
                    exit 77; }
    mkdir -p "$DIR/state" "$DIR/spool"
    write_conf
    start_munge
    if [ ! -f "$DIR/slurmctld.pid" ] || ! kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
      slurmctld -f "$CONF"
    fi
    if [ ! -f "$DIR/slurmd.pid" ] || ! kill -0 "$(cat "$DIR/slurmd.pid")" 2>/dev/null; then
      slurmd -f "$CONF"
    fi
    for _ in $(seq 60); do
      if SLURM_CONF="$CONF" sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
        echo "export SLURM_CONF=$CONF"
        exit 0
      fi
      SLURM_CONF="$CONF" scontrol update nodename="$(hostname -s)" state=resume \
          >/dev/null 2>&1 || true
      sleep 1
    done
    echo "error: the node did not come up within 60 s; see $DIR/slurmctld.log and" \
         "$DIR/slurmd.log" >&2
    exit 1 ;;
  status)
    SLURM_CONF="$CONF" sinfo -h -o '%P %t %c %m' && \
      SLURM_CONF="$CONF" sinfo -h -o %t | grep -qE '^(idle|mix|alloc)' ;;
  stop)
    for daemon in slurmd slurmctld; do
      if [ -f "$DIR/$daemon.pid" ]; then
        kill "$(cat "$DIR/$daemon.pid")" 2>/dev/null || true
      fi
    done
    sleep 1
    rm -rf "$DIR" ;;
  *) echo "usage: $0 install|start|status|stop" >&2; exit 2 ;;
esac
