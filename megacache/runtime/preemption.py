"""Stopping on request: SIGTERM (what Slurm sends every task before SIGKILL, on ``scancel``, on
preemption and at the time limit) and SIGINT (Ctrl-C).

On either signal every rank stops at once. Rank 0 first says which phase the job was in and that a
rerun resumes. Then each rank releases the locks it holds (the next job starts at once instead of
waiting ``MEGACACHE_STALE_S``), marks its rank record with the signal (the next job's post-mortem
says so), leaves its temporaries for that job to remove, and ends by the signal itself, as a
process without a handler would: a shell reports status ``128 + signal`` (143 for SIGTERM), mpiexec
the signal's number (15), Slurm a task terminated by it. Nothing is published after the signal: the
process ends without returning to the code that publishes.

A Python signal handler runs only when the main thread next runs Python code, which a rank waiting
in an MPI collective, or in a long kernel, may not do for minutes. So the handler's C half wakes a
thread of its own (``signal.set_wakeup_fd``), and that thread stops the process. The command line
installs this once MPI has started (``MPI_Init`` holds the interpreter, so no handler could run
during it); before that a signal ends the process as usual, with nothing written.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
from contextlib import contextmanager

from .log import LOG

#: the signals that stop a job on purpose
SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: this process's running jobs, as ``coordination.guarded`` registers each: ``(where, leaves, halt)``,
#: where ``where()`` says where the job was (from memory), ``leaves()`` what it leaves on the
#: filesystem (bounded in time; may be empty) and ``halt(signal_name)`` releases its locks and marks
#: its rank record
_jobs: list = []
#: held by the thread stopping the process; reentrant, so that the same signal arriving again in
#: that thread (Slurm repeats it, a rank's monitor relays a peer's) runs the handler nested and
#: returns at once instead of waiting on itself
_stopping = threading.RLock()
_under_way = False
_installed = 0
_identity: dict = {}


def stoppable_now() -> bool:
    """Whether a signal would stop this process as described (within ``stoppable``, and not
    stopping already)."""
    return _installed > 0 and not _under_way


def register(job: tuple) -> None:
    """A running job, as ``(where, leaves, halt)``: see ``_jobs``."""
    _jobs.append(job)


def unregister(job: tuple) -> None:
    if job in _jobs:
        _jobs.remove(job)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _stop(signum: int) -> None:
    global _under_way
    if not _stopping.acquire(blocking=False):
        threading.Event().wait()  # the other thread is stopping the process: do nothing more meanwhile
    if _under_way:
        return  # a signal again, handled within this thread's stopping: that goes on
    _under_way = True
    name = signal.Signals(signum).name
    # Rank 0 speaks first: the launcher may kill it once another rank has ended.
    # Where it was, from memory, before anything that touches the filesystem (which may be what
    # hangs); then what it leaves there.
    if _identity["rank"] == 0:
        where = "; ".join(w for w in (where() for where, _, _ in reversed(_jobs)) if w) or "while it held no lock"
        LOG.error(f"megacache {_identity['command']}: stopped by {name}: {where}. Nothing partial is "
                  f"published and the lock is released: rerun the same command to resume.")
        _flush()
        for _, leaves, _ in reversed(_jobs):
            left = leaves()
            if left:
                LOG.error(f"megacache {_identity['command']}: {left}")
    _flush()
    for _, _, halt in reversed(_jobs):
        try:
            halt(name)
        except Exception:  # a filesystem gone bad: the next job judges this rank by its heartbeat
            pass
    # End by the signal itself, as a process without a handler would: the launcher and the shell
    # then report it as such. Only the main thread may change a handler through Python.
    ctypes.CDLL(None).signal(signum, ctypes.c_void_p(0))  # SIG_DFL
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached


@contextmanager
def stoppable(command: str, rank: int):
    """Within this block, SIGTERM and SIGINT stop the process as the module says; ``command`` and
    ``rank`` are for the message. Only the main thread can install signal handlers; elsewhere the
    block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _identity.update(command=command, rank=rank)
    wake, woken = socket.socketpair()
    wake.setblocking(False)

    def watch() -> None:
        try:
            signum = woken.recv(1)
        except OSError:
            return
        if signum:
            _stop(signum[0])

    def in_main_thread(signum, _frame) -> None:
        _stop(signum)  # the watcher usually got there first: then this waits for the end

    previous_fd = signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)
    previous = {s: signal.signal(s, in_main_thread) for s in SIGNALS}
    watcher = threading.Thread(target=watch, name="megacache-signals", daemon=True)
    watcher.start()
    global _installed
    _installed += 1
    try:
        yield
    finally:
        _installed -= 1
        for s, handler in previous.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(previous_fd)
        wake.close()  # ends the watcher's recv
        watcher.join()
        woken.close()
