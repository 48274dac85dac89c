"""What a fault test looks at: the files a reader would load, and the phases a job's ranks record."""

from __future__ import annotations

import json
import os
import subprocess
import time

from megacache.builders.publish import RECORD_SUFFIX
from megacache.runtime.fsio import STATE_DIR, TMP_MARK, gone, names


def final_files(directory: str) -> dict[str, bytes]:
    """What a reader can load: the files under their final names (temporaries and megacache's
    state directory are never read by megatron-core or megacache's reader)."""
    found = {}
    for name in names(directory):
        if TMP_MARK in name or name.startswith("."):
            continue
        try:
            with open(os.path.join(directory, name), "rb") as f:
                found[name] = f.read()
        except IsADirectoryError:
            continue  # nothing a reader loads
        except OSError as exc:
            if not gone(exc):
                raise
    return found


def settled_files(directory: str, caching_s: float) -> dict[str, bytes]:
    """``final_files`` as this client sees them once what it cached before another node changed
    them has expired (its clients cache entries and attributes for ``caching_s``)."""
    time.sleep(caching_s + 0.5)
    return final_files(directory)


def current_phases(directory: str, rank: int | None = None) -> set[str]:
    """The phases the ranks' records in ``directory`` show now (records are JSON, rewritten by
    rename): every rank's, or ``rank``'s alone."""
    phases = set()
    state = os.path.join(directory, STATE_DIR)
    wanted = (lambda n: n.startswith("rank-")) if rank is None else (lambda n: n == f"rank-{rank}")
    for job in (os.path.join(state, n) for n in names(state) if ".job-" in n):
        for rank_file in filter(wanted, names(job)):
            try:
                with open(os.path.join(job, rank_file)) as f:
                    phases.add(json.load(f)["phase"])
            except (OSError, ValueError, KeyError):
                continue  # replaced or removed since the listing, or half-written: read at the next look
    return phases


def leftovers(directory: str) -> list[str]:
    """What a finished job must not leave in ``directory``: temporaries, work directories, locks,
    rank records (megacache's manifest and its datasets' records stay)."""
    found = [n for n in names(directory) if TMP_MARK in n or ".megacache-work" in n]
    return found + [n for n in names(os.path.join(directory, STATE_DIR))
                    if n != "manifest.json" and not n.endswith(RECORD_SUFFIX)]


def wait_for_phase(directory: str, phase: str, job: subprocess.Popen, timeout: float = 60) -> None:
    """Return once rank 0 of ``job`` records ``phase`` in ``directory`` (the rank whose phase a job
    reports when it stops; another rank may be a phase ahead); fail if the job ends first."""
    deadline = time.monotonic() + timeout
    while phase not in current_phases(directory, rank=0):
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, f"rank 0 did not reach phase {phase!r} in {timeout:.0f} s"
        time.sleep(0.002)


def lock_held(directory: str) -> bool:
    """Whether a lock file is in ``directory``'s state directory."""
    return any(n.endswith(".lock") for n in names(os.path.join(directory, STATE_DIR)))
