#!/usr/bin/env bash
# Install (if missing) and start a one-node Slurm cluster on this Debian machine, for running and
# testing slurm/prebuild.sbatch. Idempotent: a second run leaves running daemons alone and only waits
# for the node to be idle. Needs root. Daemons are started directly (no systemd in containers).
set -euo pipefail

SLURM_CONF=/etc/slurm/slurm.conf      # where Debian's slurm-wlm (bookworm) reads its configuration
STATE_DIR=/var/spool/slurmctld
SPOOL_DIR=/var/spool/slurmd
LOG_DIR=/var/log/slurm
WAIT_S=${SLURM_START_TIMEOUT:-60}

die() { echo "start_single_node.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  echo "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q || die "apt-get update failed"
  apt-get install -y -q slurm-wlm munge || die "apt-get install slurm-wlm munge failed"
fi

# munge: every Slurm message is signed with this key; the package normally creates it.
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile /etc/munge/munge.key || die "could not create /etc/munge/munge.key"
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- munged || die "munged did not start (see /var/log/munge/munged.log)"
  munge -n | unmunge >/dev/null || die "munged is running but cannot encode/decode a credential"
fi

# This node as slurmd sees it: CPUs, sockets, cores, threads and RealMemory in one line.
node_name=$(hostname -s)
hardware=$(slurmd -C | head -n 1) || die "slurmd -C could not describe this node"
case "$hardware" in NodeName=*) ;; *) die "unexpected 'slurmd -C' output: $hardware" ;; esac
hardware="NodeName=$node_name ${hardware#NodeName=* }"

install -d -m 0755 "$(dirname "$SLURM_CONF")" "$STATE_DIR" "$SPOOL_DIR" "$LOG_DIR"
new_conf=$(cat <<EOF
# Written by megacache slurm/start_single_node.sh: one node, one partition.
ClusterName=megacache
SlurmctldHost=$node_name
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=pmi2
ReturnToService=2
$hardware State=UNKNOWN
PartitionName=debug Nodes=$node_name Default=YES MaxTime=INFINITE State=UP
EOF
)
conf_changed=0
if [ ! -f "$SLURM_CONF" ] || [ "$(cat "$SLURM_CONF")" != "$new_conf" ]; then
  printf '%s\n' "$new_conf" > "$SLURM_CONF"
  conf_changed=1
fi

# A daemon already running with an older configuration is restarted so the new one takes effect;
# it is found by its pid file, so nothing but the daemon this script started is ever signalled.
start_daemon() {  # name
  local name=$1 pidfile=/run/$1.pid pid
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    [ "$conf_changed" = 0 ] && return 0
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  "$name" || die "$name did not start (see $LOG_DIR/$name.log)"
}
start_daemon slurmctld
start_daemon slurmd

deadline=$((SECONDS + WAIT_S))
while :; do
  state=$(sinfo -h -n "$node_name" -o %T 2>/dev/null | head -n 1 || true)
  case "$state" in
    idle|mixed|allocated) break ;;  # responding ("*" marks a node that is not) and able to run jobs
    down*|drain*)  # a node left down by an earlier run: give it back to service
      scontrol update NodeName="$node_name" State=RESUME 2>/dev/null || true ;;
  esac
  [ "$SECONDS" -lt "$deadline" ] ||
    die "node $node_name not up after ${WAIT_S}s (state: '${state:-no answer}'); see $LOG_DIR/slurm*.log"
  sleep 1
done
echo "Slurm is up: node $node_name is $state"
sinfo
