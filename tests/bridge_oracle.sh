#!/usr/bin/env bash
# The Megatron-Bridge oracle (tests/conformance/test_bridge.py): Megatron-Bridge 0.6.2 (Python 3.12
# only) on the megatron-core 0.19.2 and torch of tests/megatron_oracles.sh's environment, which it
# reuses read-only: a virtual environment of its own whose .pth file appends that environment's
# site-packages, so only Bridge and the pure-Python packages it imports eagerly are downloaded
# (Bridge pins no megatron-core; pip resolves the newest, 0.19.2). Transformer Engine (CUDA only)
# gets a stand-in (tests/support/oracles/bridge_standins.py). Built once, reused while the specification
# below, the stand-in and the megatron-core environment are unchanged. Prints its directory last.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${MEGACACHE_BRIDGE_ORACLE:-$HOME/.cache/megacache/bridge-oracle}"
# Held while this checks and builds: a test that needs the environment waits for it
# (tests/support/oracles/environments.py), and two runs never build it at once.
mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock 9
MCORE_ROOT="$(bash tests/megatron_oracles.sh | tail -n 1)"
BASE_SITE="$MCORE_ROOT/py312/lib/python3.12/site-packages"
# Bridge without its dependency list (GPU kernels, loggers, VLM stacks); then what its configuration,
# tokenizer, data and setup modules import, unpinned where Bridge leaves them unpinned (setup's
# checkpointing imports Model Optimizer, a pure-Python wheel, pinned to the release tried).
PACKAGES='megatron-bridge==0.6.2 --no-deps
transformers>=5.8,<=5.12.1 omegaconf>=2.3.0 einops datasets matplotlib ipython megatron-energon tensorboard pyyaml
nvidia-modelopt==0.47.0'
SPEC="$PACKAGES
standins: $(sha256sum tests/support/oracles/bridge_standins.py | cut -c1-16)
base: $(cat "$MCORE_ROOT/spec.txt" | sha256sum | cut -c1-16)"
STAMP="$ROOT/spec.txt"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC" ]; then
  echo "$ROOT"
  exit 0
fi
BASE_PY="$(sed -n 's/^executable = //p' "$MCORE_ROOT/py312/pyvenv.cfg")"
rm -rf "$ROOT"
mkdir -p "$ROOT/standins"
"$BASE_PY" -m venv "$ROOT/venv"
SITE="$ROOT/venv/lib/python3.12/site-packages"
# .pth files run in name order: the stand-ins' folder, megatron-core's environment, then the hook.
echo "$ROOT/standins" > "$SITE/a-megacache-standins-path.pth"
echo "$BASE_SITE" > "$SITE/b-megatron-oracles.pth"
echo "import bridge_standins" > "$SITE/c-megacache-standins.pth"
cp tests/support/oracles/bridge_standins.py "$ROOT/standins/bridge_standins.py"
PIP=("$ROOT/venv/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --no-deps megatron-bridge==0.6.2
# pip sees the base environment's packages through the .pth file and installs into $ROOT/venv only what
# they do not satisfy (e.g. transformers, which Bridge caps at 5.12.1); the base is never written to.
"${PIP[@]}" "transformers>=5.8,<=5.12.1" "omegaconf>=2.3.0" einops datasets matplotlib ipython \
  megatron-energon tensorboard pyyaml nvidia-modelopt==0.47.0 2>&1 | grep -v -e "requires .*, which is not installed" \
  -e "dependency resolver does not currently" -e "is ignored: it is neither" || true
if ! "$ROOT/venv/bin/python" -W ignore - >"$ROOT/check.log" 2>&1 <<'PY'
import megatron.bridge.data.loaders, megatron.bridge.data.utils, megatron.bridge.training.config  # noqa
import megatron.bridge.training.setup  # noqa
import megatron.core
assert megatron.core.__version__ == "0.19.2", megatron.core.__version__
PY
then
  tail -n 20 "$ROOT/check.log" >&2
  echo "bridge_oracle.sh: Megatron-Bridge does not import in $ROOT (see above)" >&2
  exit 1
fi
printf '%s' "$SPEC" > "$STAMP"
echo "$ROOT"
