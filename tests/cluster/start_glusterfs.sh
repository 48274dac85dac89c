#!/usr/bin/env bash
# GlusterFS for the cluster tier (tests/cluster): Debian's server and FUSE client installed with
# apt-get, and glusterd started, once per machine. Needs root on Debian; the tier's volumes and nodes
# are made by the tests themselves (tests/support/systems/cluster.py).
set -euo pipefail
die() { echo "start_glusterfs.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root"
if ! command -v glusterd > /dev/null || ! command -v mount.glusterfs > /dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q glusterfs-server glusterfs-client > /dev/null ||
    { apt-get update -q > /dev/null && apt-get install -y -q glusterfs-server glusterfs-client > /dev/null; } ||
    die "apt-get install glusterfs-server glusterfs-client failed"
fi
[ -e /dev/fuse ] || modprobe fuse 2> /dev/null || die "no /dev/fuse: the GlusterFS client cannot mount"
if ! gluster --mode=script volume list > /dev/null 2>&1; then
  glusterd || die "glusterd did not start"
  for _ in $(seq 100); do
    gluster --mode=script volume list > /dev/null 2>&1 && break
    sleep 0.1
  done
  gluster --mode=script volume list > /dev/null || die "glusterd started but does not answer"
fi
echo "GlusterFS $(glusterd --version | head -n 1 | awk '{print $2}') ready"
