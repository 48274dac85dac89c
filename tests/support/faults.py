"""What a fault test looks at: the files a reader would load, and the phases a job's ranks record."""

from __future__ import annotations

import json
import os
import subprocess
import time

from megacache.runtime.fsio import STATE_DIR, TMP_MARK


def final_files(directory: str) -> dict[str, bytes]:
    """What a reader can load: the files under their final names (temporaries and megacache's
    state directory are never read by megatron-core or megacache's reader)."""
    return {e.name: open(e.path, "rb").read() for e in os.scandir(directory)
            if e.is_file() and TMP_MARK not in e.name and not e.name.startswith(".")}


#: short heartbeats and stale times for fault tests, so that a hang ends in seconds
FAST = {"MEGACACHE_HEARTBEAT_S": "0.25", "MEGACACHE_STALE_S": "3"}


def current_phases(directory: str) -> set[str]:
    """The phases the ranks' records in ``directory`` show now (records are JSON, rewritten by rename)."""
    phases = set()
    state = os.path.join(directory, STATE_DIR)
    try:
        jobs = [os.path.join(state, n) for n in os.listdir(state) if ".job-" in n]
        for job in jobs:
            for rank in os.listdir(job):
                if rank.startswith("rank-"):
                    with open(os.path.join(job, rank)) as f:
                        phases.add(json.load(f)["phase"])
    except (OSError, ValueError):
        pass
    return phases


def leftovers(directory: str) -> list[str]:
    """What a finished job must not leave in ``directory``: temporaries, work directories, locks,
    rank records (megacache's manifest stays)."""
    found = [e.name for e in os.scandir(directory) if TMP_MARK in e.name or ".megacache-work" in e.name]
    state = os.path.join(directory, STATE_DIR)
    found += [n for n in (os.listdir(state) if os.path.isdir(state) else []) if n != "manifest.json"]
    return found


def wait_for_phase(directory: str, phase: str, job: subprocess.Popen, timeout: float = 60) -> None:
    """Return once a rank of ``job`` records ``phase`` in ``directory``; fail if the job ends first."""
    deadline = time.monotonic() + timeout
    while phase not in current_phases(directory):
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, f"no rank reached phase {phase!r} in {timeout:.0f} s"
        time.sleep(0.002)


def lock_held(directory: str) -> bool:
    """Whether a lock file is in ``directory``'s state directory."""
    state = os.path.join(directory, STATE_DIR)
    return any(n.endswith(".lock") for n in (os.listdir(state) if os.path.isdir(state) else []))
