#!/usr/bin/env bash
# Install megacache with its test dependencies and run the whole suite: the serial tests (which also
# launch real mpiexec jobs of 1-4 ranks), the slow tests, the MPI tests under 2 and 3 ranks, then the
# cluster tier (a GlusterFS volume and emulated nodes, as root). The output ends on one line: each
# tier's pytest summary.
# megatron-core 0.16.1 is the oracle in this interpreter; 0.17.1, 0.18.2 and 0.19.2 (Python 3.12
# wheels only) and Megatron-Bridge 0.6.2 in the environments tests/megatron_oracles.sh and
# tests/bridge_oracle.sh build once and reuse.
set -euo pipefail
cd "$(dirname "$0")/.."
# The oracle environments, and the venvs of the other Pythons the README's first command is tried
# in, are made in the background (downloads, mostly: minutes the first time, nothing later) while
# the rest installs and the first tests run. A test that needs one waits for it
# (tests/support/oracles/environments.py, tests/support/systems/venvs.py); the oracles' tests run last in each tier.
oracle_log=$(mktemp)
venv_log=$(mktemp)
bash tests/bridge_oracle.sh > "$oracle_log" 2>&1 &
oracles=$!
(cd tests && python -m support.systems.venvs) > "$venv_log" 2>&1 &
venvs=$!
trap 'kill "$oracles" "$venvs" 2>/dev/null || true; rm -f "$oracle_log" "$venv_log"' EXIT
# torch first, pinned: a looser requirement with no torch installed pulls GBs of CUDA wheels.
# This machine kind's pip configuration names local package folders that may not exist: pip says
# so for every package, and nothing else is wrong.
pip_install() {
  python -m pip install -q --disable-pip-version-check --no-warn-script-location --root-user-action=ignore "$@" 2>&1 |
    { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
pip_install torch==2.13.0
pip_install -e '.[test]'
# The .pbin oracle, without its training stack (wandb, omegaconf, ...): its packer and readers need
# only what .[test] installed.
pip_install --no-deps modalities==0.5.0
# The .ds oracle, the same way: its tokenizer step and reader need tokenizers, numpy, torch, fsspec
# and huggingface-hub (all above) and loguru and humanize (the test extra), not its processing stack.
pip_install --no-deps datatrove==0.10.1
# The OLMo oracle, the same way: its numpy datasets need torch (pinned above), cached-path (whose pins
# of rich, filelock and huggingface-hub would downgrade them; the schemes it loads need only
# google-cloud-storage and boto3, in the test extra) and what that extra adds, not its training stack.
pip_install --no-deps ai2-olmo-core==3.0.0 cached-path==1.8.10
# A one-node Slurm for tests/system/test_slurm.py (installs slurm-wlm + munge with apt-get). Where
# that is possible (root, Debian) a failed start fails the run; elsewhere the test skips, saying why.
# GlusterFS for the cluster tier (tests/cluster): the same rule.
if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
  bash slurm/start_single_node.sh
  bash tests/cluster/start_glusterfs.sh
else
  echo "not root on Debian: Slurm and GlusterFS not started, tests/system/test_slurm.py and tests/cluster will skip"
fi
export PYTHONWARNINGS=ignore
# The tests' files on tmpfs where there is room: the sweeps create and delete hundreds of thousands
# of small files, which a disk makes slow after mass deletes; the bytes compared are the same.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -gt $((8 << 20)) ]; then
  TMPDIR=$(mktemp -d /dev/shm/megacache-tests.XXXXXX)
  export TMPDIR
  trap 'kill "$oracles" "$venvs" 2>/dev/null || true; rm -f "$oracle_log" "$venv_log"; rm -rf "$TMPDIR"' EXIT
fi
started=$SECONDS
summary=()
tier() {  # tier NAME COMMAND...: run one tier, keep pytest's last line for the summary
  local name=$1 log
  shift
  echo "=== $name"
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  # pytest's counts and time (under mpiexec every rank prints them, their lines sometimes joined)
  summary+=("$name: $(grep -oE '[0-9]+ passed[^()]* in [0-9.]+s \([0-9:]+\)' "$log" | tail -n 1 || true)")
  rm -f "$log"
}
# Two pytest-xdist workers, whole files to each (a file's module fixtures, often oracle runs, are
# made once); the slowest tests listed: CI's time is a budget.
tier "serial tests" python -m pytest -q -rs -p no:cacheprovider -n 2 --dist loadfile --durations=25 \
  --ignore=tests/cluster tests "$@"
# The slow tier, as users run the kernels: the 3,000-configuration index sweep and the blends of up
# to 10^7 samples, through the compiled library, test by test over both workers; a build longer
# than the default progress interval, which must print its progress lines; and the builds from
# buckets on a real S3 API server (moto's, on loopback) against megatron-core's own.
# The same tests through numba's JIT, which the fast tier already compares on smaller sweeps, and a
# timing test that a busy machine fails by chance, run on request: pytest -m slow.
tier "slow tests, compiled kernels" python -m pytest -q -rs -p no:cacheprovider -n 2 --dist load -m slow \
  -k "native or default_interval or object_storage" \
  --ignore=tests/cluster tests "$@"
# Each MPI tier checks that its world has the ranks launched, and fails on a skipped MPI test.
for n in 2 3; do
  export MEGACACHE_TEST_RANKS=$n
  # each rank's pytest under a temporary root of its own: in a shared one, every rank's end tidies
  # the same numbered directories and links, and one rank's cleanup removes what another's is
  # removing (FileNotFoundError after every test passed)
  tier "MPI tests on $n ranks" mpiexec -n "$n" sh -c 'exec python -m pytest -q -p no:cacheprovider \
    --basetemp "${TMPDIR:-/tmp}/megacache-pytest-rank-${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}" \
    --only-mpi --ignore=tests/cluster tests'
done
unset MEGACACHE_TEST_RANKS
# The cluster tier: a GlusterFS volume and two emulated nodes (Linux namespaces), 2 MPI ranks on
# each; every command against one local process, then node loss, hangs, SIGTERM, shared locks, a
# dead filesystem client, a full volume, and a two-node torchrun job; the whole tier with GlusterFS's
# default client caching, then with it raised (tests/support/systems/cluster.py).
tier "cluster tests (GlusterFS, 2 emulated nodes)" python -m pytest -q -rs -p no:cacheprovider --durations=10 \
  tests/cluster "$@"
if ! wait "$venvs"; then
  echo "Making the venvs ahead of their tests failed (the tests made them, or said why):"
  tail -n 20 "$venv_log"
fi
if ! wait "$oracles"; then
  echo "The oracle environments were not built, and the tests that need them skipped:"
  grep -v "is ignored: it is neither" "$oracle_log" | tail -n 20
  summary+=("oracle environments not built")
fi
echo "megacache tests passed in $(( (SECONDS - started) / 60 )) min: $(IFS=';'; echo "${summary[*]}" | sed 's/;/; /g')"
