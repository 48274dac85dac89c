#!/usr/bin/env bash
# Install megacache with its test dependencies and run the whole suite: the MPI tests under
# 2 and 3 ranks, then the serial tests (which also launch real mpiexec jobs of 1-4 ranks).
# megatron-core 0.16.1 is the oracle in this interpreter; 0.17.1, 0.18.2 and 0.19.2 (Python 3.12
# wheels only) in the environment tests/megatron_oracles.sh builds once and reuses.
set -euo pipefail
cd "$(dirname "$0")/.."
# torch first, pinned: a looser requirement with no torch installed pulls GBs of CUDA wheels.
python -m pip install -q --disable-pip-version-check torch==2.13.0
python -m pip install -q --disable-pip-version-check -e '.[test]'
# The .pbin oracle, without its training stack (wandb, omegaconf, ...): its packer and readers need
# only what .[test] installed.
python -m pip install -q --disable-pip-version-check --no-deps modalities==0.5.0
# A one-node Slurm for tests/system/test_slurm.py (installs slurm-wlm + munge; needs root, else that test skips).
# A failed start does not fail the run: the test then skips, saying why.
if [ "$(id -u)" = 0 ]; then
  bash slurm/start_single_node.sh || echo "Slurm did not start: tests/system/test_slurm.py will skip"
else
  echo "not root: Slurm not started, tests/system/test_slurm.py will skip"
fi
# The newer oracles (a few minutes the first time; reused afterwards).
bash tests/megatron_oracles.sh
# The Megatron-Bridge oracle (tests/conformance/test_bridge.py): Bridge 0.6.2 on that environment's
# megatron-core 0.19.2; a few minutes the first time, reused afterwards. Its tests skip without it.
bash tests/bridge_oracle.sh || echo "Megatron-Bridge oracle not built: tests/conformance/test_bridge.py will skip"
export PYTHONWARNINGS=ignore
for n in 2 3; do
  echo "=== MPI tests on $n ranks"
  mpiexec -n "$n" python -m pytest -q -p no:cacheprovider --only-mpi tests
done
echo "=== serial tests"
# the slowest tests listed: CI's time is a budget
python -m pytest -q -p no:cacheprovider --durations=25 tests "$@"
