"""The communicator's collectives, for real under mpiexec (pytest-mpi) and in a single process."""

import numpy as np
import pytest

from megacache.runtime.comm import SingleComm, get_comm, launched_under_mpi
from megacache.errors import JobCrashed, JobFailed, MegacacheError


def test_single_process_collectives():
    comm = SingleComm()
    assert (comm.rank, comm.size) == (0, 1)
    assert comm.allgather(5) == [5]
    assert comm.exscan(7) == 0
    assert comm.allreduce(3) == 3
    with pytest.raises(JobFailed, match="rank 0: boom"):
        comm.check(OSError("boom"), "testing")
    with pytest.raises(JobFailed, match="during agreeing:\n  rank 0: bang"):
        with comm.agreed("agreeing"):
            raise MegacacheError("bang")
    # a bug stays a bug: not the user's error, its traceback carried along
    with pytest.raises(JobCrashed, match="(?s)during agreeing:\n  rank 0: Traceback .*ValueError: bang") as caught:
        with comm.agreed("agreeing"):
            raise ValueError("bang")
    assert not isinstance(caught.value, MegacacheError)
    with pytest.raises(KeyError):  # the root re-raises its own error as it was
        comm.on_root(lambda: {}["x"], "looking up")


def test_launcher_detection():
    assert launched_under_mpi({"PMI_RANK": "0"})
    assert launched_under_mpi({"OMPI_COMM_WORLD_SIZE": "4"})
    assert not launched_under_mpi({"HOME": "/root"})
    with pytest.raises(ValueError, match="MEGACACHE_COMM"):
        get_comm("carrier-pigeon")


@pytest.mark.mpi(min_size=2)
def test_mpi_collectives():
    comm = get_comm()
    assert comm.name == "mpi" and comm.size >= 2
    assert comm.allgather(comm.rank) == list(range(comm.size))
    assert comm.exscan(comm.rank + 1) == sum(range(1, comm.rank + 1))
    arr = comm.exscan(np.array([comm.rank, 1]))
    assert arr.tolist() == [sum(range(comm.rank)), comm.rank]
    assert comm.allreduce(comm.rank, max) == comm.size - 1
    assert comm.bcast("hello" if comm.rank == 0 else None) == "hello"


@pytest.mark.mpi(min_size=2)
def test_mpi_failure_on_one_rank_stops_every_rank():
    comm = get_comm()
    with pytest.raises(JobFailed) as exc:
        comm.check(OSError("disk full") if comm.rank == 1 else None, "writing")
    assert "rank 1: disk full" in str(exc.value) and "during writing" in str(exc.value)
    with pytest.raises(JobCrashed) as exc:
        comm.check(RuntimeError("a bug") if comm.rank == 1 else None, "writing")
    assert "rank 1: RuntimeError: a bug" in str(exc.value)  # never raised, so no frames to show


@pytest.mark.mpi(min_size=2)
def test_mpi_on_root_shares_result_and_error():
    comm = get_comm()
    assert comm.on_root(lambda: ["planned"], "planning") == ["planned"]

    def fail():
        raise FileNotFoundError("no inputs match 'x*'")

    with pytest.raises(Exception, match="no inputs match") as exc:
        comm.on_root(fail, "planning")
    assert isinstance(exc.value, FileNotFoundError if comm.rank == 0 else JobFailed)
    with pytest.raises(Exception) as exc:
        comm.on_root(lambda: 1 / 0, "planning")
    assert isinstance(exc.value, ZeroDivisionError if comm.rank == 0 else JobCrashed)


@pytest.mark.mpi(min_size=2)
def test_mpi_agreed_block_fails_on_every_rank_when_one_raises():
    comm = get_comm()
    with comm.agreed("reading"):
        value = comm.rank  # nothing raised anywhere: the block's effects stand
    assert value == comm.rank
    with pytest.raises(JobFailed) as exc:
        with comm.agreed("writing"):
            if comm.rank == 1:
                raise OSError("disk full")
    assert "rank 1: disk full" in str(exc.value) and "during writing" in str(exc.value)
    assert comm.allgather("in step") == ["in step"] * comm.size  # and no rank is left behind
