"""The communicator: the one interface every distributed job talks through.

Three backends share it: mpi4py (``mpiexec``/``srun``), torch.distributed (a ``torchrun`` job whose
process group is already initialised; collectives run on a gloo group so CPU work never touches
NCCL), and a single process. ``get_comm()`` picks one from the environment.

Collectives carry small Python objects (counts, plans, error messages), never bulk data: bulk
data goes to the shared filesystem, written in place by its owner.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Sequence

from .environment import comm_kind
from ..errors import JobCrashed, JobFailed, is_bug

# Environment variables that launchers set in every rank they start.
MPI_LAUNCHER_VARS = (
    "PMI_RANK", "PMI_SIZE", "PMI_FD",           # MPICH hydra, srun --mpi=pmi2
    "OMPI_COMM_WORLD_SIZE",                     # Open MPI
    "PMIX_RANK",                                # PMIx (Open MPI 5, srun --mpi=pmix)
    "MPI_LOCALNRANKS",                          # Intel MPI / MPICH
)


class Comm:
    """rank/size plus the handful of collectives the builders need."""

    rank: int = 0
    size: int = 1
    #: ranks sharing this node; used to size per-rank thread pools
    local_size: int = 1
    name: str = "single"

    def barrier(self) -> None:
        pass

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def allgather(self, obj: Any) -> list:
        return [obj]

    def abort(self, code: int = 1) -> None:
        os._exit(code)

    def wait_quietly(self) -> None:
        """Barrier that sleeps while it waits, for phase ends where ranks arrive far apart."""

    # Derived collectives: defined once in this class on top of allgather, so every backend agrees.
    def allreduce(self, value: Any, op: Callable[[Sequence[Any]], Any] = sum) -> Any:
        return op(self.allgather(value))

    def exscan(self, value: Any) -> Any:
        """Sum of ``value`` over ranks below this one (zero-like on rank 0)."""
        values = self.allgather(value)
        total = values[0] * 0
        for v in values[: self.rank]:
            total = total + v
        return total

    def check(self, error: BaseException | str | None, phase: str) -> None:
        """Collective error agreement at a phase boundary.

        Every rank calls this with its own error (or None). If any rank failed, every rank raises
        the same ``JobFailed`` naming the failed ranks and the phase, so the job stops together
        instead of leaving healthy ranks waiting at the next collective; or, when some rank's error
        was a bug (``is_bug``), the same ``JobCrashed`` carrying its traceback.
        """
        message, bug = _described(error)
        self.wait_quietly()
        gathered = self.allgather((phase, message, bug))
        phases = {p for p, _, _ in gathered}
        if len(phases) > 1:
            # Ranks are at different collectives: a bug that would otherwise pair wrong calls silently.
            raise RuntimeError(f"ranks disagree on the phase ({sorted(phases)}); the job is out of step")
        failed = [(r, m) for r, (_, m, _) in enumerate(gathered) if m is not None]
        if failed:
            raise (JobCrashed if any(b for _, _, b in gathered) else JobFailed)(phase, failed)

    @contextmanager
    def agreed(self, phase: str) -> Iterator[None]:
        """The body's outcome agreed by every rank at its end (``check``): a rank whose body raised
        takes part in the agreement, and every rank then raises the same ``JobFailed`` (or
        ``JobCrashed``, for a bug).

            with comm.agreed("opening the datasets"):
                datasets = open_all(...)
        """
        error = None
        try:
            yield
        except Exception as exc:  # reported collectively below
            error = exc
        self.check(error, phase)

    def on_root(self, fn: Callable[[], Any], phase: str, root: int = 0) -> Any:
        """Run ``fn`` on rank ``root`` only and broadcast its result (or its error) to every rank.

        For metadata work (globbing, listing, reading a manifest) that would be a storm on a shared
        filesystem if every rank did it, and for steps only one rank can take.
        """
        result = error = None
        if self.rank == root:
            try:
                result = fn()
            except Exception as exc:  # re-raised on every rank below
                error = exc
        self.wait_quietly()
        message, bug = _described(error)
        ok, payload, bug = self.bcast((error is None, result if error is None else message, bug), root=root)
        if not ok:
            if error is not None:
                raise error
            raise (JobCrashed if bug else JobFailed)(phase, [(root, payload)])
        return payload

    def is_root(self) -> bool:
        return self.rank == 0


#: seconds a rank gives the launcher to forward its last output before MPI_Abort
ABORT_GRACE_S = 0.2


def _described(error: BaseException | str | None) -> tuple[str | None, bool]:
    """What the other ranks learn of an error: its message (a bug's whole traceback), and whether it
    is a bug."""
    if error is None or isinstance(error, str):
        return error, False
    if is_bug(error):
        return "".join(traceback.format_exception(error)).rstrip(), True
    return str(error), False


class SingleComm(Comm):
    pass


class MPIComm(Comm):
    name = "mpi"

    def __init__(self, comm: Any = None):
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        local = self._comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_size = local.Get_size()
        local.Free()

    def barrier(self) -> None:
        self._comm.barrier()

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self._comm.bcast(obj, root=root)

    def allgather(self, obj: Any) -> list:
        return self._comm.allgather(obj)

    def wait_quietly(self) -> None:
        # MPICH polls at full speed inside blocking calls: a rank that finished early would take a
        # core from the ranks still working. A non-blocking barrier polled with a short sleep does not.
        # The sleep stays short: the last one runs on past the others' arrival, by up to the cap,
        # and a build meets at dozens of these.
        request = self._comm.Ibarrier()
        delay = 5e-5
        while not request.Test():
            time.sleep(delay)
            delay = min(2 * delay, 1e-3)

    def abort(self, code: int = 1) -> None:
        # The launcher forwards a rank's output on its own schedule and tears the job down on
        # Abort, possibly before it forwarded the last lines (the message saying why): a moment
        # between the two lets that message out.
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(ABORT_GRACE_S)
        self._comm.Abort(code)


class TorchComm(Comm):
    """Collectives over a torch.distributed gloo group (created if the default group is not gloo)."""

    name = "torch"

    def __init__(self, group: Any = None, timeout_s: float | None = None):
        import datetime

        import torch.distributed as dist

        self._dist = dist
        # A group of our own when the default one is not gloo (CPU collectives) or when the caller
        # wants a timeout separate from the training collectives'.
        if group is None and (dist.get_backend() != "gloo" or timeout_s is not None):
            kwargs = {}
            if timeout_s is not None:
                kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
            group = dist.new_group(backend="gloo", **kwargs)
        self._group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    def barrier(self) -> None:
        self._dist.barrier(group=self._group)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=root, group=self._group)
        return box[0]

    def allgather(self, obj: Any) -> list:
        out: list = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self._group)
        return out


def launched_under_mpi(environ: dict | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(v in env for v in MPI_LAUNCHER_VARS)


def get_comm(kind: str | None = None) -> Comm:
    """The communicator for this process.

    ``kind`` (or ``$MEGACACHE_COMM``) forces one of ``mpi``, ``torch``, ``single``; otherwise an
    initialised torch process group wins, then an MPI launcher's environment, then a single process.
    """
    kind = kind or comm_kind()
    if kind is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            kind = "torch"
        elif launched_under_mpi():
            kind = "mpi"
        else:
            kind = "single"
    if kind == "mpi":
        return MPIComm()
    if kind == "torch":
        return TorchComm()
    if kind == "single":
        return SingleComm()
    raise ValueError(f"MEGACACHE_COMM={kind!r}: expected one of mpi, torch, single")
