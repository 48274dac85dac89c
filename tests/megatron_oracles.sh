#!/usr/bin/env bash
# The newer megatron-core oracles (0.17-0.19 ship Python 3.12 wheels only): one Python 3.12 virtual
# environment with torch and megatron-core 0.19.2, and 0.17.1 / 0.18.2 beside it as package folders
# that tests/mcore_versions.py puts first on PYTHONPATH. Built once, reused while this file's
# specification is unchanged. Prints the environment's directory on its last line.
set -euo pipefail
ROOT="${MEGACACHE_ORACLES:-$HOME/.cache/megacache/megatron-oracles}"
SPEC="torch==2.13.0 megatron-core==0.19.2 transformers tokenizers sentencepiece tiktoken numpy boto3 multi-storage-client
extra: 0.17.1 0.18.2"
STAMP="$ROOT/spec.txt"
# Held while this checks and builds: a test that needs the environment waits for it
# (tests/support/oracles/environments.py), and two runs never build it at once.
mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock 9
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC" ]; then
  echo "$ROOT"
  exit 0
fi
PY312="${PYTHON312:-}"
if [ -z "$PY312" ]; then
  for candidate in python3.12 "$HOME/.pyenv/versions/3.12"*/bin/python3.12; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      PY312="$candidate"; break
    fi
  done
fi
if [ -z "$PY312" ]; then
  echo "megatron_oracles.sh: no Python 3.12 found (set PYTHON312): the 0.17-0.19 oracle tests will skip" >&2
  exit 1
fi
# Built in place (a virtual environment is not relocatable); the stamp, written last, marks it whole.
rm -rf "$ROOT"
mkdir -p "$ROOT"
"$PY312" -m venv "$ROOT/py312"
PIP=("$ROOT/py312/bin/python" -m pip install -q --disable-pip-version-check)
# torch first and pinned: on Python 3.12 the registry serves its CUDA build (about 3 GB), which runs on the CPU.
"${PIP[@]}" torch==2.13.0
# boto3 and multi-storage-client: megatron-core reads s3:// and msc:// data paths with them
"${PIP[@]}" megatron-core==0.19.2 transformers tokenizers sentencepiece tiktoken numpy boto3 multi-storage-client
for v in 0.17.1 0.18.2; do
  "${PIP[@]}" --no-deps --target "$ROOT/mcore-$v" "megatron-core==$v"
done
printf '%s' "$SPEC" > "$STAMP"
echo "$ROOT"
