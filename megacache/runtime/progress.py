"""Progress of long work, aggregated over ranks and printed by rank 0.

A command's work runs through phases (``Progress.phase``), each with a total known up front in its
unit (bytes, documents, samples, ...), the same on every rank; ranks add what they finish, a chunk at
a time, and phases may overlap (a background thread's work beside the main one's).

Ranks do uneven amounts of work, so progress cannot ride on collectives (a rank that finished early
would block the others). Instead every rank but 0 publishes its counters to a small file in the
job's directory once a second, and a thread on rank 0 sums them and prints, every interval, the
phases under way: a bar on a terminal, a log line otherwise. Counters are cumulative, so a lost
update only delays the display. The first line comes after one interval and the last, with every
rank's final counts, only if one came before: short work prints nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, TextIO

from .comm import Comm, SingleComm
from .fsio import PROGRESS_MARK, STATE_DIR, remove_quietly, write_atomic
from .log import byte_amount

_WRITE_EVERY_S = 1.0
#: a phase's rate is computed over this many intervals (at least ``_RATE_WINDOW_S``), and from no
#: earlier than its first chunk's end: phases are declared before their work begins, and overlap
_RATE_INTERVALS = 2
_RATE_WINDOW_S = 10.0
#: the unit whose amounts are shown as sizes (MB, MB/s)
BYTES = "bytes"


def default_interval(tty: bool) -> float:
    return 0.5 if tty else 30.0


def _fmt_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.1f}" if 0 < n < 10 and n != int(n) else f"{int(n)}"


def _fmt_seconds(s: float) -> str:
    s = int(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


@dataclass
class _Phase:
    total: int
    unit: str
    extras: tuple[str, ...]  # further counters shown beside the main one (tokenize's docs, tokens)
    started: float           # on rank 0's clock
    finished: float | None = None
    #: ``(time, done)`` at each line, oldest first, within the rate's window
    seen: deque = field(default_factory=deque)

    def amounts(self, done: int) -> str:
        if self.unit == BYTES:
            return f"{byte_amount(done)}/{byte_amount(self.total)}"
        return f"{_fmt_count(done)}/{_fmt_count(self.total)} {self.unit}"

    def rate(self, per_s: float) -> str:
        return f"{byte_amount(per_s)}/s" if self.unit == BYTES else f"{_fmt_count(per_s)} {self.unit}/s"


class Progress:
    """One command's progress over the ranks of ``comm``: its phases and this rank's counters.
    ``directory`` holds the ranks' files (the job's directory; None with one rank). ``interval_s``:
    seconds between lines (default ``default_interval``), 0 for none (nothing is then written or
    printed). A context: leaving it, with every rank, prints the last line."""

    def __init__(self, comm: Comm, directory: str | None, label: str, interval_s: float | None = None,
                 stream: TextIO | None = None, owned: bool = False):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval_s = interval_s if interval_s is not None else default_interval(self.tty)
        self.comm, self.label, self.owned = comm, label, owned
        self.directory = directory if self.interval_s > 0 else None  # nothing shown, nothing to write
        self.phases: dict[str, _Phase] = {}
        self.counts: dict[str, list[int]] = {}
        #: per phase, when this rank counted its first chunk (wall clock: machines share it), that
        #: chunk's size, and when it counted its last
        self.spans: dict[str, list] = {}
        self.printed = False
        self._lock = threading.Lock()
        self._changed = False
        self._width = 0
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def beside(cls, comm: Comm, directory: str | None, label: str, interval_s: float | None = None) -> "Progress":
        """The progress of a job that holds no lock (and so has no job directory): its files in a
        directory of its own in the state directory of ``directory`` (an existing one), made by
        rank 0 and removed at the end. None is needed with one rank; where none can be made (a
        read-only filesystem, or ``directory`` None), rank 0 shows its own counts until the last
        line."""
        path = None
        if comm.size > 1 and interval_s != 0 and directory is not None:
            tag = comm.bcast(uuid.uuid4().hex[:12] if comm.rank == 0 else None)
            state = os.path.join(directory, STATE_DIR)
            path = os.path.join(state, PROGRESS_MARK + tag)

            def make() -> bool:
                try:
                    try:
                        os.mkdir(state)
                    except FileExistsError:
                        pass
                    os.mkdir(path)
                    return True
                except OSError:
                    return False

            if not comm.bcast(make() if comm.rank == 0 else None):
                path = None
        return cls(comm, path, label, interval_s, owned=path is not None)

    def _path(self, rank: int) -> str:
        return os.path.join(self.directory, f"progress.rank{rank}.json")

    # -- counting (every rank)

    def phase(self, name: str, total: int, unit: str, extras: tuple[str, ...] = ()) -> None:
        """Declare a phase with its total (every rank alike), or add to the total of one declared."""
        with self._lock:
            if name in self.phases:
                self.phases[name].total += int(total)
                self.phases[name].finished = None
            else:
                self.phases[name] = _Phase(int(total), unit, tuple(extras), time.monotonic())
                self.counts[name] = [0] * (1 + len(extras))

    def add(self, name: str, done: int = 0, **extras: int) -> None:
        """Count work this rank finished in phase ``name``: once per chunk, never per item."""
        with self._lock:
            counts = self.counts[name]
            if done > 0:
                now = time.time()
                self.spans.setdefault(name, [now, int(done), now])[2] = now
            counts[0] += int(done)
            for i, extra in enumerate(self.phases[name].extras, 1):
                counts[i] += int(extras.get(extra, 0))
            self._changed = True

    def counter(self, name: str) -> Callable[[int], None]:
        """``add`` for phase ``name``, as a callback for work that reports its chunks."""
        return lambda done: self.add(name, done)

    def _snapshot(self) -> dict:
        with self._lock:
            self._changed = False
            return {"counts": {name: list(c) for name, c in self.counts.items()},
                    "spans": {name: list(b) for name, b in self.spans.items()}}

    def _write(self) -> None:
        """This rank's counters into its file, for rank 0 to read (no fsync: they describe a live
        job). A file that cannot be written only leaves rank 0's sum short."""
        try:
            write_atomic(self._path(self.comm.rank), json.dumps(self._snapshot()).encode(), durable=False)
        except OSError:
            pass

    # -- showing (rank 0)

    def _totals(self) -> dict:
        """Every rank's counters and spans (``_combined``), as far as their files say."""
        parts = [self._snapshot()]
        for r in range(1, self.comm.size if self.directory is not None else 1):
            try:
                with open(self._path(r), "rb") as f:
                    parts.append(json.loads(f.read()))
            except (OSError, ValueError):
                continue
        return _combined(parts)

    def _shown(self, totals: dict[str, list[int]], final: bool) -> list[str]:
        """The phases to show (of those ``totals`` counts: one declared since is left for the next
        line): at the end every one with work; else those under way and the first not done, or the
        last one when every phase is done."""
        now = time.monotonic()
        phases = {name: p for name, p in self.phases.items() if name in totals}
        for name, p in phases.items():
            if p.finished is None and (final or totals[name][0] >= p.total):
                p.finished = now
        if final:
            return [name for name, p in phases.items() if p.total]
        open_ = [name for name, p in phases.items() if p.finished is None]
        shown = [name for name in open_ if totals[name][0] > 0 or name == open_[0]]
        return shown or list(phases)[-1:]

    def _rate(self, p: _Phase, done: int, span: list | None, final: bool) -> float:
        """Per second, from the end of the first chunk counted (``span``: how long that one took is
        not known) on: at the end to the last one; while the phase runs over the last few intervals."""
        now = time.monotonic()
        if span is None:
            return 0.0
        first, size, last = span
        if final:
            if done > size and last > first:
                return (done - size) / (last - first)
            return done / max(p.finished - p.started, 1e-9)  # one chunk per rank: from the declaration
        then, before = now - (time.time() - first), size
        window = max(_RATE_INTERVALS * self.interval_s, _RATE_WINDOW_S)
        while len(p.seen) > 1 and p.seen[1][0] <= now - window:
            p.seen.popleft()
        if p.seen and p.seen[0][0] > then:
            then, before = p.seen[0]
        p.seen.append((now, done))
        return (done - before) / max(now - then, 1e-9)

    def _part(self, name: str, counts: list[int], span: list | None, final: bool) -> tuple[str, float]:
        p = self.phases[name]
        done = counts[0]
        frac = min(done / p.total, 1.0) if p.total else 1.0
        rate = self._rate(p, done, span, final)
        left = max(p.total - done, 0)
        eta = _fmt_seconds(left / rate) if rate > 0 else "0s" if not left else "?"
        extras = "".join(f", {_fmt_count(v)} {e}" for e, v in zip(p.extras, counts[1:]))
        return (f"{name} {100 * frac:.1f}%: {p.amounts(done)}{extras}, {p.rate(rate)}, ETA {eta}", frac)

    def _line(self, final: bool, totals: dict) -> tuple[str, float] | None:
        """The line to show and the fraction of its first phase done; None before any phase."""
        counts, spans = totals["counts"], totals["spans"]
        with self._lock:
            shown = self._shown(counts, final)
            if not shown:
                return None
            parts = [self._part(name, counts[name], spans.get(name), final) for name in shown]
        elapsed = _fmt_seconds(time.monotonic() - self._start)
        return f"{self.label}: {'; '.join(t for t, _ in parts)} | {elapsed} elapsed", parts[0][1]

    def _show(self, final: bool, totals: dict) -> None:
        shown = self._line(final, totals)
        if shown is None:
            return
        text, frac = shown
        if self.tty:
            width = 24
            bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
            text = f"[{bar}] {text}"
            padded = text.ljust(self._width)  # covers the longer line before it
            self._width = len(text)
            self.stream.write(f"\r{padded}" + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.printed = True

    # -- the job's span

    def _run(self) -> None:
        if self.comm.rank == 0:
            try:
                while not self._stop.wait(self.interval_s):
                    if self.owned:
                        self._touch()
                    self._show(False, self._totals())
            except OSError:  # stderr's reader is gone: nothing more to show
                pass
        else:
            while not self._stop.wait(_WRITE_EVERY_S):
                if self._changed:
                    self._write()

    def _touch(self) -> None:
        """Show the directory as a live job's: ``megacache clean`` removes only those left alone
        longer than a dead job's heartbeat (``stale_s``)."""
        try:
            os.utime(self.directory)
        except OSError:  # removed meanwhile: the other ranks' counts go unseen
            pass

    def __enter__(self) -> "Progress":
        self._start = time.monotonic()
        if self.interval_s > 0 and (self.comm.rank == 0 or self.directory is not None):
            self._thread = threading.Thread(target=self._run, name="megacache-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, *_) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        # Every rank reaches this line together only when the work succeeded: a failure agreed by the ranks
        # raises on all of them, and any other ends the job.
        if exc_type is None and self.interval_s > 0:
            totals = _combined(self.comm.allgather(self._snapshot()))
            if self.comm.rank == 0 and self.printed:
                self._show(True, totals)
        if self.directory is not None:
            if self.owned and self.comm.rank == 0:
                shutil.rmtree(self.directory, ignore_errors=True)
                try:
                    os.rmdir(os.path.dirname(self.directory))  # the state directory, when nothing else is
                except OSError:
                    pass
            else:
                remove_quietly(self._path(self.comm.rank))


def _combined(parts: list[dict]) -> dict:
    """Ranks' snapshots as one, keyed by the first's phases: counters summed; per phase the first
    chunk counted by any rank, the sizes of every rank's first chunk, the last chunk counted."""
    counts = {name: list(c) for name, c in parts[0]["counts"].items()}
    spans = {name: list(s) for name, s in parts[0]["spans"].items()}
    for part in parts[1:]:
        for name, c in part["counts"].items():
            if name in counts and len(c) == len(counts[name]):
                counts[name] = [a + b for a, b in zip(counts[name], c)]
        for name, (first, size, last) in part["spans"].items():
            ours = spans.get(name)
            spans[name] = [min(first, ours[0]), ours[1] + size, max(last, ours[2])] if ours else [first, size, last]
    return {"counts": counts, "spans": spans}


def quiet() -> Progress:
    """A progress that counts and shows nothing: for work run without one."""
    return Progress(SingleComm(), None, "", interval_s=0)
