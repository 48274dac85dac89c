"""Every supported megatron-core as an oracle, each in its own interpreter: 0.16.1 is the test
environment's own (Python 3.11); 0.17.1, 0.18.2 and 0.19.2 live in the Python 3.12 environment that
tests/megatron_oracles.sh builds (run_all.sh runs it). ``ask(version, request)`` runs
tests/support/oracle_worker.py there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megacache.megatron.versions import SUPPORTED

#: the release each supported version is tested against
RELEASES = {"0.16": "0.16.1", "0.17": "0.17.1", "0.18": "0.18.2", "0.19": "0.19.2"}
assert tuple(RELEASES) == SUPPORTED
ROOT = os.environ.get("MEGACACHE_ORACLES", os.path.expanduser("~/.cache/megacache/megatron-oracles"))
#: this folder: the scripts each oracle runs (oracle_worker.py, megatron_rank.py) live here
SUPPORT = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(SUPPORT, "oracle_worker.py")


def interpreter(version: str) -> tuple[str, dict]:
    """The Python that imports megatron-core ``RELEASES[version]``, and its environment (skips the
    test when that environment was not built)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    if version == "0.16":
        return sys.executable, env
    python = os.path.join(ROOT, "py312", "bin", "python")
    if not os.path.isfile(os.path.join(ROOT, "spec.txt")):
        pytest.skip(f"megatron-core {RELEASES[version]} oracle not built: run bash tests/megatron_oracles.sh")
    if version != "0.19":
        env["PYTHONPATH"] = os.path.join(ROOT, f"mcore-{RELEASES[version]}")
    return python, env


def ask(version: str, request: dict, timeout: float = 1200) -> list:
    """The worker's answer to ``request`` under megatron-core ``version``."""
    python, env = interpreter(version)
    done = subprocess.run([python, WORKER], input=json.dumps(request), capture_output=True, text=True, env=env,
                          timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"megatron-core {version} oracle failed:\n{done.stderr[-4000:]}")
    answer = json.loads(done.stdout.rsplit("\n", 1)[-1])
    assert answer["version"] == RELEASES[version], answer["version"]
    return answer["results"]
