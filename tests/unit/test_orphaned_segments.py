"""The suite removes the shared-memory segments of the MPI jobs its crash tests kill (tests/conftest.py):
only those no live process maps, and only those older than a job's start."""

from __future__ import annotations

import mmap
import os
import time

from conftest import remove_orphaned_segments


def test_only_old_unmapped_segments_are_removed(tmp_path):
    old, new, mapped = (tmp_path / f"mpich_shm_{name}" for name in ("old", "new", "mapped"))
    for path in (old, new, mapped):
        path.write_bytes(b"\0" * 4096)
    past = time.time() - 3600
    os.utime(old, (past, past))
    os.utime(mapped, (past, past))
    (tmp_path / "other").write_bytes(b"x")
    os.utime(tmp_path / "other", (past, past))
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        assert remove_orphaned_segments(str(tmp_path)) == [str(old)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mpich_shm_mapped", "mpich_shm_new", "other"]
