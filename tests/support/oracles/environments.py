"""Every supported megatron-core as an oracle, each in its own interpreter: 0.16.1 is the test
environment's own (Python 3.11); 0.17.1, 0.18.2 and 0.19.2 live in the Python 3.12 environment that
tests/megatron_oracles.sh builds (run_all.sh runs it). ``ask(version, request)`` runs
tests/support/oracles/megatron_worker.py there.

0.20 is Megatron-LM main, which has no wheel: its oracle is the data tests/support/oracles/record_megatron_main.py
recorded from a checkout (tests/data/megatron-main, ``recorded_main``). A live main oracle runs only
where MEGACACHE_MEGATRON_MAIN is a Megatron-LM main checkout (its datasets helpers compiled), in the
Python 3.12 environment (with gigatoken installed there for --use-gigatoken). The variable is a
PYTHONPATH, the checkout first; megacache's own process gets it too in test_megatron_python.py, so
it must not hold packages built for Python 3.12 only."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys

import pytest

from megacache.megatron.versions import SUPPORTED, UNRELEASED

#: the release each released version is tested against
RELEASES = {"0.16": "0.16.1", "0.17": "0.17.1", "0.18": "0.18.2", "0.19": "0.19.2"}
assert tuple(RELEASES) + UNRELEASED == SUPPORTED
ROOT = os.environ.get("MEGACACHE_ORACLES", os.path.expanduser("~/.cache/megacache/megatron-oracles"))
#: the Megatron-Bridge 0.6.2 oracle that tests/bridge_oracle.sh builds (its interpreter: ``venv/bin/python``)
BRIDGE_ROOT = os.environ.get("MEGACACHE_BRIDGE_ORACLE", os.path.expanduser("~/.cache/megacache/bridge-oracle"))
#: the sweeps' oracle runs (the caches megatron-core and Megatron-Bridge built for them), made once
#: per machine and kept: each is keyed by what it was asked, and outlives the tests' temporary files
ORACLE_RUNS = os.path.expanduser("~/.cache/megacache/oracle-runs")
#: this folder: the scripts each oracle runs (megatron_worker.py, megatron_rank.py) live in it
SCRIPTS = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(SCRIPTS, "megatron_worker.py")
#: what record_megatron_main.py recorded from Megatron-LM main (the unreleased version)
MAIN_DATA = os.path.join(os.path.dirname(os.path.dirname(SCRIPTS)), "data", "megatron-main")
MAIN_PATH = os.environ.get("MEGACACHE_MEGATRON_MAIN")


def recorded_main(name: str) -> dict:
    """tests/data/megatron-main/``name``: what Megatron-LM main answered, and the commit it ran at."""
    with open(os.path.join(MAIN_DATA, name), encoding="utf-8") as f:
        return json.load(f)


def run_key(asked, release: str, *workers: str) -> str:
    """The name an oracle run is kept under in ORACLE_RUNS: a digest of what it was asked, the
    oracle's release and the source of the workers that asked it (a script and those it imports),
    so that a change to any of them makes the run again."""
    code = []
    for worker in workers:
        with open(worker, "rb") as f:
            code.append(hashlib.sha256(f.read()).hexdigest())
    return hashlib.sha256(json.dumps([asked, release, *code]).encode()).hexdigest()[:16]


def built(root: str) -> bool:
    """Whether the oracle environment at ``root`` is built (its stamp ``spec.txt`` written last),
    once its build script, which holds ``root.lock`` while it checks and builds, has let go:
    tests/run_all.sh starts the scripts in the background."""
    lock = root.rstrip("/") + ".lock"
    if os.path.exists(lock):
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
    return os.path.isfile(os.path.join(root, "spec.txt"))


def bridge_answer(worker: str, name: str, request: dict, asked: dict | None = None) -> dict:
    """Megatron-Bridge 0.6.2's answer, ``worker`` run in its interpreter, to ``asked`` (default:
    ``request``), asked once per machine: kept in ORACLE_RUNS as ``name-<key>.json``, keyed by
    ``request`` and the worker (skips the test where the Bridge oracle is not built)."""
    from megacache.runtime.fsio import write_atomic

    if not built(BRIDGE_ROOT):
        pytest.skip("Megatron-Bridge oracle not built: run bash tests/bridge_oracle.sh")
    path = os.path.join(ORACLE_RUNS, f"{name}-{run_key(request, '0.6.2', worker)}.json")
    if not os.path.exists(path):
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        env.pop("PYTHONPATH", None)
        done = subprocess.run([os.path.join(BRIDGE_ROOT, "venv", "bin", "python"), worker],
                              input=json.dumps(request if asked is None else asked), capture_output=True, text=True,
                              env=env, timeout=1800)
        if done.returncode != 0:
            raise AssertionError(f"Bridge oracle failed:\n{done.stderr[-4000:]}")
        answer = json.loads(done.stdout.rsplit("\n", 2)[-2])
        assert answer["bridge"] == "0.6.2", answer["bridge"]
        os.makedirs(ORACLE_RUNS, exist_ok=True)
        write_atomic(path, json.dumps(answer).encode())
    with open(path) as f:
        return json.load(f)


def interpreter(version: str) -> tuple[str, dict]:
    """The Python that imports megatron-core ``RELEASES[version]``, and its environment (skips the
    test when that environment was not built)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    if version == "0.16":
        return sys.executable, env
    if version in UNRELEASED and not MAIN_PATH:
        pytest.skip(f"no live megatron-core {version} (Megatron-LM main) oracle: set MEGACACHE_MEGATRON_MAIN to a "
                    f"checkout (the recorded data in tests/data/megatron-main is checked without it)")
    python = os.path.join(ROOT, "py312", "bin", "python")
    if not built(ROOT):
        pytest.skip(f"megatron-core {RELEASES.get(version, version)} oracle not built: run bash "
                    f"tests/megatron_oracles.sh")
    if version in UNRELEASED:
        env["PYTHONPATH"] = MAIN_PATH
    elif version != "0.19":
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
    if version in UNRELEASED:  # a checkout's version carries its commit: 0.20.0+d98e8a64dd
        assert answer["version"].startswith(f"{version}."), answer["version"]
    else:
        assert answer["version"] == RELEASES[version], answer["version"]
    return answer["results"]
