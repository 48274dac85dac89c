"""An MPI tier of tests/run_all.sh cannot pass without running its MPI tests: where mpiexec and
mpi4py's MPI library disagree, every process sees a world of one and pytest-mpi would skip them all
(exit 0). tests/conftest.py stops a tier whose world is not the ranks it launched, and fails one in
which an MPI test skipped."""

from __future__ import annotations

import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpi_tier(ranks: str) -> subprocess.CompletedProcess:
    """tests/unit/test_comm.py as an MPI tier launched as ``ranks`` ranks would run it, in one process."""
    env = dict(os.environ, MEGACACHE_TEST_RANKS=ranks)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--only-mpi",
                           os.path.join(TESTS, "unit", "test_comm.py")],
                          cwd=os.path.dirname(TESTS), env=env, capture_output=True, text=True, timeout=300)


def test_a_world_smaller_than_launched_stops_the_tier():
    done = mpi_tier("2")
    assert done.returncode == 3, done.stdout[-2000:]
    assert "launched as 2 MPI ranks, this process sees a world of 1" in done.stdout


def test_a_skipped_mpi_test_fails_the_tier():
    done = mpi_tier("1")  # the world is as launched; the tests that need 2 ranks skip
    assert done.returncode == 1, done.stdout[-2000:]
    assert "MPI tests skipped in an MPI tier:" in done.stdout
    assert "test_comm.py::" in done.stdout.split("MPI tests skipped in an MPI tier:")[1]
