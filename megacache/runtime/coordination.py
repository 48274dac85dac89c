"""Who is building what, and whether they are still alive: locks, heartbeats, post-mortems.

All this module keeps lives on the shared filesystem beside the outputs, in a hidden ``.megacache/``
directory that Megatron never looks at, and relies only on what every shared filesystem offers:
exclusive create, rename, and modification times. ``fcntl`` locks are not used (they are unreliable
or disabled on many network filesystems).

- ``Lock``: one job at a time builds into a directory (or a dataset prefix). The holder refreshes
  the lock file's mtime every few seconds; a lock whose holder is gone (same machine: its process
  no longer exists; elsewhere: no heartbeat for ``MEGACACHE_STALE_S`` seconds) is broken by the
  next job. Correctness never depends on the lock: every output is deterministic and appears by an
  atomic rename, so two builders (a lock broken too early) only ever duplicate work.
- ``Monitor``: every rank records its phase in ``<key>.job-<tag>/rank-<r>`` and refreshes it;
  each rank watches the next one in a ring, so a rank that dies without its launcher noticing
  (srun without --kill-on-bad-exit, a hung node) stops the job within ``MEGACACHE_STALE_S``
  seconds, with the dead rank and its phase named, instead of a barrier waiting forever.
- ``post_mortem``: a job that was killed outright (``mpiexec`` kills every rank when one dies)
  leaves its rank records behind; the next job to take the lock reports where each rank was.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import JobFailed, MegacacheError
from .fsio import (PROGRESS_MARK, STATE_DIR, TMP_MARK, WORK_MARK, gone, make_directories, names, remove_quietly,
                   remove_tree, write_json_atomic)
from . import preemption
from .environment import heartbeat_s, stale_s
from .log import LOG, byte_amount


#: how long a rank stopped by a signal waits for rank 0 to have stopped before it ends
STOP_WAIT_S = 5.0
#: ``temporaries`` for a lock that covers its whole directory (a cache directory)
ALL = ("",)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, it names one process even
    after the pid is reused. None when no such process runs (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    try:
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (IndexError, ValueError):
        return None


def this_process() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot": _boot_id(), "pid": pid, "start": _start_ticks(pid)}


def process_gone(record: dict) -> bool:
    """True when ``record`` names a process on this machine that no longer exists. A process on
    another machine is never judged by this function (only by its heartbeat)."""
    if record.get("boot") != _boot_id() or record.get("host") != socket.gethostname():
        return False
    start = _start_ticks(int(record.get("pid", -1)))
    return start is None or start != record.get("start")


def _read_record(path: str) -> tuple[dict | None, float | None]:
    """A JSON record and its age in seconds (by mtime); (None, None) when it does not exist."""
    try:
        age = time.time() - os.stat(path).st_mtime
        with open(path, "rb") as f:
            return json.loads(f.read() or b"{}"), age
    except FileNotFoundError:
        return None, None
    except ValueError:  # torn or foreign content: judged by its age only
        return {}, age


def _who(record: dict) -> str:
    return f"pid {record.get('pid', '?')} on {record.get('host', '?')}"


def death(record: dict, age: float) -> str | None:
    """Why the process ``record`` names counts as dead, or None while it lives."""
    if process_gone(record):
        return "its process is gone"
    if age > stale_s():
        return f"no heartbeat for {age:.0f} s"
    return None


def state_dir(directory: str) -> str:
    return os.path.join(directory, STATE_DIR)


class _Beat:
    """A daemon thread calling ``fn`` every heartbeat until stopped."""

    def __init__(self, fn, name: str):
        self._stop = threading.Event()
        self._fn = fn
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(heartbeat_s()):
            self._fn()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def lock_path(directory: str, key: str) -> str:
    return os.path.join(state_dir(directory), f"{key}.lock")


def held_by(path: str, job: str) -> bool:
    """Whether the lock file at ``path`` is ``job``'s (also when it cannot be read now)."""
    try:
        record, _ = _read_record(path)
    except OSError:
        return True
    return record is not None and record.get("job") == job


class Lock:
    """An exclusive, heartbeat-refreshed lock file ``<directory>/.megacache/<key>.lock``."""

    def __init__(self, directory: str, key: str, job: str, describe: str):
        self.path = lock_path(directory, key)
        self.directory, self.job = directory, job
        self.record = {**this_process(), "job": job, "token": uuid.uuid4().hex, "what": describe,
                       "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.lost = False
        self._beat: _Beat | None = None

    def acquire(self, say=print, wait: bool = True) -> bool:
        """Wait for the lock (or, ``wait=False``, give up at once if a live job holds it), breaking
        it if its holder is dead; then heartbeat it."""
        make_directories(os.path.dirname(self.path))
        waited_since = time.monotonic()
        last_said = None
        delay = 0.05
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                try:
                    holder, age = _read_record(self.path)
                except OSError as exc:  # replaced by another node since this client looked it up
                    if exc.errno != errno.ESTALE:
                        raise
                    holder, age = None, None
                    time.sleep(delay)
                if holder is None:
                    continue  # released just now
                if death(holder, age):
                    say(f"megacache: breaking the stale lock {self.path} (held by {_who(holder)}, job "
                        f"{holder.get('job', '?')}, last heartbeat {age:.0f} s ago)")
                    self._break(holder)
                    continue
                if not wait:
                    return False
                now = time.monotonic()
                if last_said is None or now - last_said > 60:
                    say(f"megacache: waiting for {self.path}: {holder.get('what', 'another job')} by "
                        f"{_who(holder)} (job {holder.get('job', '?')}, since {holder.get('since', '?')}), "
                        f"waited {now - waited_since:.0f} s")
                    last_said = now
                time.sleep(delay)
                delay = min(2 * delay, 1.0)
                continue
            except OSError as exc:
                if not gone(exc):
                    raise
                # The last job removed the empty state directory after it was made or seen (on
                # another node, or through this client's cached entry): made again. A client that
                # still shows it for its entry timeout is asked again after a pause.
                make_directories(os.path.dirname(self.path))
                time.sleep(delay)
                delay = min(2 * delay, 1.0)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self.record))
            self._beat = _Beat(self._refresh, "megacache-lock")
            return True

    def _break(self, holder: dict) -> None:
        """Rename the stale lock aside (only one breaker wins the rename) and delete it. If what
        was renamed is not the lock judged stale (a new holder took it meanwhile), put it back."""
        aside = f"{self.path}.broken-{self.record['token']}"
        try:
            os.rename(self.path, aside)
        except OSError as exc:  # another breaker won, or the holder released it
            if not gone(exc):
                raise
            return
        taken, _ = _read_record(aside)
        if taken is not None and taken.get("token") != holder.get("token"):
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
        remove_quietly(aside)

    def _refresh(self) -> None:
        try:
            record, _ = _read_record(self.path)
            if record is None or record.get("token") != self.record["token"]:
                self.lost = True
                return
            os.utime(self.path)
        except OSError:  # gone, or the shared filesystem is gone from this node: never publish
            self.lost = True

    def release(self) -> None:
        if self._beat is not None:
            self._beat.stop()
            self._beat = None
        record, _ = _read_record(self.path)
        if record is not None and record.get("token") == self.record["token"]:
            remove_quietly(self.path)

    def check_held(self) -> None:
        """Before publishing: refuse if another job judged this one dead and took the lock."""
        if self.lost:
            raise MegacacheError(f"{self.path}: this job lost its lock (another job judged it dead after "
                                 f"{stale_s():.0f} s without a heartbeat); nothing was published. Rerun; "
                                 f"raise $MEGACACHE_STALE_S on a filesystem with slow metadata updates")


def job_dir(directory: str, key: str, job: str) -> str:
    return os.path.join(state_dir(directory), f"{key}.job-{job}")


class Monitor:
    """This rank's phase record, refreshed every heartbeat, and a watch on the next rank's."""

    def __init__(self, directory: str, key: str, job: str, rank: int, size: int, abort):
        self.dir = job_dir(directory, key, job)
        self.rank, self.size, self._abort = rank, size, abort
        self.path = os.path.join(self.dir, f"rank-{rank}")
        self.phase = "starting"
        self._started = time.time()
        self._failing_since: float | None = None
        self._peer_seen = False
        # Removed only when empty: rank 0's lock file is in it before any rank creates a monitor.
        make_directories(self.dir)
        self._write()
        self._beat = _Beat(self._tick, "megacache-monitor")

    def _write(self) -> None:
        write_json_atomic(self.path, {**this_process(), "rank": self.rank, "ranks": self.size,
                                      "phase": self.phase}, durable=False)

    def enter(self, phase: str) -> None:
        self.phase = phase
        self._write()

    def stopped(self, signal_name: str) -> None:
        """This rank stops on ``signal_name``: no more heartbeats, and its record says so."""
        self._beat.stop()
        try:
            write_json_atomic(self.path, {**this_process(), "rank": self.rank, "ranks": self.size,
                                          "phase": self.phase, "stopped": signal_name}, durable=False)
        except FileNotFoundError:
            pass  # the job had finished and removed its records

    def await_stopped(self, rank: int, timeout: float, released: Callable[[], bool]) -> None:
        """Wait, at most ``timeout`` seconds, until ``rank``'s record says it stopped, or it is gone
        and ``released()``: a finished job removes its records before its locks, and a client
        caching entries may not show a record another node has just replaced."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                record, _ = _read_record(os.path.join(self.dir, f"rank-{rank}"))
            except OSError:
                record = {}
            if (record is not None and record.get("stopped")) or (record is None and released()):
                return
            time.sleep(0.01)

    def _tick(self) -> None:
        try:
            self._watch()
            self._failing_since = None
        except OSError as exc:
            # A network filesystem answers ESTALE for a while after another node replaced a
            # directory: looked up anew at the next heartbeat. Anything else, or ESTALE for as long
            # as a rank may go without a heartbeat: the shared filesystem is gone from this node.
            now = time.monotonic()
            if exc.errno == errno.ESTALE and now - (self._failing_since or now) < stale_s():
                self._failing_since = self._failing_since or now
                return
            self._stop(f"cannot reach the shared filesystem at {exc.filename or self.dir} "
                       f"({exc.strerror or exc})")

    def _watch(self) -> None:
        try:
            os.utime(self.path)
        except FileNotFoundError:
            self._write()
        if self.size == 1:
            return
        peer = (self.rank + 1) % self.size
        record, age = _read_record(os.path.join(self.dir, f"rank-{peer}"))
        if record is None:
            # A rank whose job failed removes its record and leaves; one never seen never started.
            if not self._peer_seen and time.time() - self._started > stale_s():
                self._stop(f"rank {peer} never started (no record in {self.dir} after {stale_s():.0f} s)")
            return
        self._peer_seen = True
        if record.get("stopped") and preemption.stoppable_now():
            # A rank stopped on purpose (Slurm signals the tasks one by one): so does this one.
            os.kill(os.getpid(), signal.Signals[record["stopped"]])
            return
        how = death(record, age)
        if how:
            self._stop(f"rank {peer} ({_who(record)}) died during phase '{record.get('phase', '?')}' ({how})")

    def dead_ranks(self) -> list[tuple[int, str, str]]:
        """``(rank, phase, how)`` of every rank whose record shows it dead (read after a
        collective failed, to say who brought the job down)."""
        dead = []
        for rank in range(self.size):
            record, age = _read_record(os.path.join(self.dir, f"rank-{rank}"))
            how = death(record, age) if record and rank != self.rank else None
            if how:
                dead.append((rank, record.get("phase", "?"), f"{_who(record)}: {how}"))
        return dead

    def _stop(self, why: str) -> None:
        LOG.error(f"megacache: rank {self.rank}: {why}; stopping the whole job. Rerun it: finished work is kept, "
                  f"partial files are removed.")
        self._abort()

    def close(self) -> None:
        self._beat.stop()


@dataclass
class Leftovers:
    """What megacache jobs left in a directory: temporaries (files being written, directories being
    deleted), work directories (tokenize's finished units, which a rerun resumes from) and the
    records of jobs that did not finish, with what a post-mortem of those records says."""

    directory: str
    temporaries: int = 0
    temporary_bytes: int = 0
    work: int = 0
    work_bytes: int = 0
    records: int = 0
    reports: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.temporaries or self.work or self.records)

    def describe(self) -> str:
        """What is there, in a few words: ``3 temporary file(s) (3.6 GB), 1 record(s) of jobs ...``."""
        parts = []
        if self.temporaries:
            parts.append(f"{self.temporaries} temporary file(s) ({byte_amount(self.temporary_bytes)})")
        if self.work:
            parts.append(f"{self.work} work directory(ies) of finished units ({byte_amount(self.work_bytes)})")
        if self.records:
            parts.append(f"{self.records} record(s) of jobs that did not finish")
        return ", ".join(parts)


def _entries(directory: str) -> list[os.DirEntry]:
    try:
        return list(os.scandir(directory))
    except NotADirectoryError:
        return []
    except OSError as exc:
        if gone(exc):
            return []
        raise


def _bytes_under(entry: os.DirEntry) -> int:
    """A file's size, or what a directory's files hold; 0 for what went meanwhile."""
    try:
        if not entry.is_dir(follow_symlinks=False):
            return entry.stat(follow_symlinks=False).st_size
    except OSError:
        return 0
    return sum(_bytes_under(e) for e in _entries(entry.path))


def _temporary_entries(directory: str, temporaries: tuple[str, ...] = ALL) -> list[os.DirEntry]:
    """The temporaries in ``directory`` and its state directory (a manifest being rewritten) whose
    names start with one of ``temporaries``."""
    return [e for d in (directory, state_dir(directory)) for e in _entries(d)
            if e.name.startswith(temporaries) and TMP_MARK in e.name]


def leftovers(directory: str) -> Leftovers:
    """What megacache jobs, live or dead, have left in ``directory`` (one listing of it and of its
    state directory, and the sizes of what those hold)."""
    left = Leftovers(directory)
    for e in _temporary_entries(directory):
        left.temporaries += 1
        left.temporary_bytes += _bytes_under(e)
    for e in _entries(directory):
        if e.name.endswith(WORK_MARK) and TMP_MARK not in e.name:
            left.work += 1
            left.work_bytes += _bytes_under(e)
    left.records = sum(".job-" in n for n in names(state_dir(directory)))
    return left


def post_mortem(directory: str, key: str, own_job: str, temporaries: tuple[str, ...]) -> Leftovers:
    """Report and remove the rank records of jobs that did not finish, and every temporary (file, or
    directory being deleted) in ``directory`` or its state directory whose name starts with one of
    ``temporaries`` (the lock's outputs; ``ALL`` for every one): with the lock held, none belongs to
    a live job."""
    left = Leftovers(directory)
    state = state_dir(directory)
    prefix = f"{key}.job-"
    for name in sorted(names(state)):
        if not name.startswith(prefix) or name == f"{prefix}{own_job}":
            continue
        path = os.path.join(state, name)
        ranks = []
        # none where its job, judged dead but alive, finished and removed its records meanwhile
        rank_files = [n for n in names(path) if n.startswith("rank-") and n[5:].isdigit()]
        for rank_file in sorted(rank_files, key=lambda n: int(n[5:])):
            record, _ = _read_record(os.path.join(path, rank_file))
            if record:
                stopped = f" (stopped by {record['stopped']})" if record.get("stopped") else ""
                ranks.append(f"rank {record.get('rank', '?')} ({_who(record)}) was in phase "
                             f"'{record.get('phase', '?')}'{stopped}")
        if ranks:  # a job whose ranks all failed cleanly removed its records and reported its error
            left.reports.append(f"an earlier job ({name[len(prefix):]}) did not finish: " + "; ".join(ranks))
        left.records += 1
        shutil.rmtree(path, ignore_errors=True)
    for entry in _temporary_entries(directory, temporaries):
        left.temporaries += 1
        left.temporary_bytes += _bytes_under(entry)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            remove_quietly(entry.path)
    return left


def clean(directory: str) -> Leftovers:
    """Remove what megacache jobs that are no longer running left in ``directory`` (temporaries,
    work directories, records, the progress of jobs without a lock left alone for ``stale_s``),
    holding the lock of every job that has one there, and say what went. A live job's lock: an
    error naming it, and nothing removed."""
    state = state_dir(directory)
    keys = sorted({n[:-len(".lock")] for n in names(state) if n.endswith(".lock")}
                  | {n.split(".job-")[0] for n in names(state) if ".job-" in n})
    job = uuid.uuid4().hex[:12]
    locks = []
    try:
        for key in keys:
            lock = Lock(directory, key, job, "megacache clean")
            if not lock.acquire(_say, wait=False):
                holder, _ = _read_record(lock.path)
                holder = holder or {}
                raise MegacacheError(f"{directory}: {holder.get('what', 'a job')} by {_who(holder)} (job "
                                     f"{holder.get('job', '?')}, since {holder.get('since', '?')}) is running "
                                     f"there; nothing was removed. Clean once it has ended")
            locks.append(lock)
        removed = Leftovers(directory)
        for key in keys or [""]:
            left = post_mortem(directory, key, job, ALL)
            removed.reports += left.reports
            removed.records += left.records
            removed.temporaries += left.temporaries
            removed.temporary_bytes += left.temporary_bytes
        for e in _entries(directory):
            if e.name.endswith(WORK_MARK) and TMP_MARK not in e.name:
                removed.work += 1
                removed.work_bytes += _bytes_under(e)
                remove_tree(e.path, job)
        for e in _entries(state):  # the progress of jobs that hold no lock: dead once left alone
            if e.name.startswith(PROGRESS_MARK) and e.is_dir(follow_symlinks=False):
                idle = time.time() - e.stat(follow_symlinks=False).st_mtime
                if idle > stale_s():
                    removed.records += 1
                    remove_tree(e.path, job)
                else:
                    removed.reports.append(f"kept {STATE_DIR}/{e.name}: a verify or convert that may still be running "
                                           f"updated it {idle:.0f} s ago; clean removes it once it is {stale_s():.0f} "
                                           f"s old")
        return removed
    finally:
        for lock in locks:
            lock.release()
        _remove_state_dir_if_empty(directory)


@dataclass
class Guard:
    """A job holding its locks, with this rank's monitor."""

    job: str
    locks: list[Lock]
    monitor: Monitor

    @property
    def directory(self) -> str:
        """The job's own directory: its ranks' records and progress files."""
        return self.monitor.dir

    def enter(self, phase: str) -> None:
        self.monitor.enter(phase)

    def check_held(self) -> None:
        for lock in self.locks:
            lock.check_held()


def _say(message: str) -> None:
    LOG.warning(message)


def _clear(directory: str, key: str, job: str, temporaries: tuple[str, ...]) -> None:
    left = post_mortem(directory, key, job, temporaries)
    for report in left.reports:
        _say(f"megacache: {directory}: {report}")
    if left.temporaries:
        _say(f"megacache: {directory}: removed {left.temporaries} temporary file(s) "
             f"({byte_amount(left.temporary_bytes)}) left by jobs that did not finish")


def _remove_state_dir_if_empty(directory: str) -> None:
    try:
        os.rmdir(state_dir(directory))
    except OSError:
        pass


def tidy(directories, key: str, temporaries: tuple[str, ...]) -> None:
    """What dead jobs left where there is nothing to build (a job killed after its last rename):
    cleared when no live job holds the lock. One listing per directory when there is nothing."""
    for d in sorted(set(directories)):
        if not any(n == f"{key}.lock" or n.startswith(f"{key}.job-") for n in names(state_dir(d))):
            continue
        lock = Lock(d, key, "tidy", "clearing what dead jobs left")
        if lock.acquire(_say, wait=False):
            try:
                _clear(d, key, lock.job, temporaries)
            finally:
                lock.release()
                _remove_state_dir_if_empty(d)


def _within(seconds: float, fn):
    """``fn()``, or None if it takes longer than ``seconds`` (a filesystem that hangs)."""
    result = []
    worker = threading.Thread(target=lambda: result.append(fn()), name="megacache-measure", daemon=True)
    worker.start()
    worker.join(seconds)
    return result[0] if result else None


def _left_behind(directories) -> str:
    """What jobs have left in ``directories``, and what removes it, in one sentence (or ``""``)."""
    def measure() -> list[Leftovers]:
        try:
            return list(map(leftovers, directories))
        except OSError:  # unreadable: the error, or the next job's post-mortem, says more
            return []

    found = _within(STOP_WAIT_S / 2, measure)
    if found is None:
        return "what it leaves could not be measured (the filesystem did not answer)"
    said = []
    for left in found:
        left.records = 0  # a few bytes, which a rerun reports and removes
        if left:
            rerun = {(1, 0): "a rerun removes them", (0, 1): "a rerun of the same command resumes from them",
                     (1, 1): "a rerun of the same command removes the temporaries and resumes from the finished "
                             "units"}[bool(left.temporaries), bool(left.work)]
            said.append(f"it leaves {left.describe()} in {left.directory}: {rerun}, and `megacache clean "
                        f"{left.directory}` removes it all")
    return "; ".join(said)


@contextmanager
def guarded(comm, directories, key: str, temporaries: tuple[str, ...], what: str):
    """Run a job's body holding the ``key`` lock of every directory (taken by rank 0, in sorted
    order, so jobs never deadlock), after clearing what dead jobs left there, with every rank
    monitored. Rank records are removed when the body succeeds on every rank; a failed body's
    ranks remove their own, and rank 0 notes on the error what the job leaves behind."""
    directories = sorted(set(directories))
    try:
        with _guarded(comm, directories, key, temporaries, what) as guard:
            yield guard
    except Exception as exc:
        if comm.rank == 0:
            left = _left_behind(directories)
            if left:
                exc.add_note(left[0].upper() + left[1:])
        raise


@contextmanager
def _guarded(comm, directories: list[str], key: str, temporaries: tuple[str, ...], what: str):
    job = comm.bcast(uuid.uuid4().hex[:12] if comm.rank == 0 else None)
    locks: list[Lock] = []

    def take() -> None:
        try:
            for d in directories:
                lock = Lock(d, key, job, what)
                try:
                    lock.acquire(_say)
                except OSError as exc:
                    raise MegacacheError(f"{d}: cannot write there ({exc.strerror or exc}); the output must go to a "
                                         f"writable directory") from None
                locks.append(lock)
                _clear(d, key, job, temporaries)
        except BaseException:
            for lock in locks:
                lock.release()
            raise

    comm.on_root(take, "taking the lock")
    monitor = None
    ok = False

    def where() -> str:
        """On SIGTERM or SIGINT (``preemption``), before anything else: where the job was, from
        memory (the filesystem may be what hangs)."""
        return f"{what} was in phase '{monitor.phase}' on rank {comm.rank}" if monitor is not None else ""

    def leaves() -> str:
        """Next: what the job leaves, found within a bounded time."""
        return _left_behind(directories) if monitor is not None else ""

    def halt(signal_name: str) -> None:
        """Then: release the locks, and mark this rank's record stopped. mpiexec kills every rank
        once one ends, so the others end only once rank 0's record says it stopped too, or, the
        job having finished, its records are gone and its locks released."""
        for lock in locks:
            lock.release()
        if monitor is None:
            return
        monitor.stopped(signal_name)
        if comm.rank != 0:
            paths = [lock_path(d, key) for d in directories]
            monitor.await_stopped(0, STOP_WAIT_S, lambda: not any(held_by(p, job) for p in paths))

    registered = (where, leaves, halt)
    preemption.register(registered)
    try:
        monitor = Monitor(directories[0], key, job, comm.rank, comm.size, comm.abort)
        try:
            yield Guard(job, locks, monitor)
        except Exception as exc:
            # A collective that failed because a peer died (a closed connection, a timeout) says
            # nothing of who; the records do.
            dead = [] if isinstance(exc, MegacacheError) else monitor.dead_ranks()
            if dead:
                raise JobFailed(dead[0][1], [(r, f"died during phase '{p}' ({how})") for r, p, how in dead]) from exc
            raise
        ok = True
    finally:
        if ok:
            comm.barrier()  # still watched: a rank that hangs before this barrier is seen
        if monitor is not None:
            monitor.close()
        if ok:
            comm.barrier()  # every rank stopped watching before the records go
            if comm.rank == 0:
                shutil.rmtree(job_dir(directories[0], key, job), ignore_errors=True)
        elif monitor is not None:
            remove_quietly(monitor.path)
            try:  # the job's folder, once its last rank's record is gone
                os.rmdir(os.path.dirname(monitor.path))
            except OSError:
                pass
        for lock in locks:
            lock.release()
            _remove_state_dir_if_empty(lock.directory)
        preemption.unregister(registered)
