"""Progress of long work, aggregated over ranks and printed by rank 0.

Ranks do uneven amounts of work, so progress cannot ride on collectives (a rank that finished early
would block the others). Instead each rank publishes its counters to a small file in the job's
work directory, and a thread on rank 0 sums them and prints: a bar on a terminal, a log line
otherwise. Counters are cumulative, so a lost update only delays the display.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import TextIO

from .fsio import make_directories, write_atomic

_WRITE_EVERY_S = 1.0


def _fmt_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{int(n)}"


def _fmt_seconds(s: float) -> str:
    s = int(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """Counters of one rank (``bytes``, ``docs``, ``tokens``), shown aggregated by rank 0."""

    def __init__(self, directory: str, rank: int, size: int, total_bytes: int, label: str,
                 interval_s: float | None = None, stream: TextIO | None = None):
        self.directory, self.rank, self.size = directory, rank, size
        self.total_bytes, self.label = total_bytes, label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval_s = interval_s if interval_s is not None else (0.5 if self.tty else 30.0)
        self.counts = {"bytes": 0, "docs": 0, "tokens": 0}
        self._last_write = 0.0
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        make_directories(directory)

    def _path(self, rank: int) -> str:
        return os.path.join(self.directory, f"progress.rank{rank}.json")

    def _write(self) -> None:
        """This rank's counters into its file, for rank 0 to read (no fsync: they describe a live job)."""
        write_atomic(self._path(self.rank), json.dumps(self.counts).encode(), durable=False)

    def add(self, bytes: int = 0, docs: int = 0, tokens: int = 0) -> None:
        self.counts["bytes"] += bytes
        self.counts["docs"] += docs
        self.counts["tokens"] += tokens
        now = time.monotonic()
        if now - self._last_write >= _WRITE_EVERY_S:
            self._last_write = now
            self._write()

    def totals(self) -> dict[str, int]:
        total = {"bytes": 0, "docs": 0, "tokens": 0}
        for r in range(self.size):
            if r == self.rank:
                counts = self.counts
            else:
                try:
                    with open(self._path(r), "rb") as f:
                        counts = json.loads(f.read())
                except (OSError, ValueError):
                    continue
            for k in total:
                total[k] += counts[k]
        return total

    def line(self) -> str:
        t = self.totals()
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = t["bytes"] / elapsed
        frac = min(t["bytes"] / self.total_bytes, 1.0) if self.total_bytes else 1.0
        eta = (self.total_bytes - t["bytes"]) / rate if rate > 0 else float("inf")
        eta_s = _fmt_seconds(eta) if eta != float("inf") else "?"
        return (f"{self.label}: {100 * frac:5.1f}% | {_fmt_count(t['docs'])} docs | "
                f"{_fmt_count(t['tokens'])} tokens | {rate / 1e6:.1f} MB/s | "
                f"{_fmt_seconds(elapsed)} elapsed | ETA {eta_s}")

    def _show(self, final: bool = False) -> None:
        text = self.line()
        if self.tty:
            width = 24
            t = self.totals()
            frac = min(t["bytes"] / self.total_bytes, 1.0) if self.total_bytes else 1.0
            bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
            self.stream.write(f"\r[{bar}] {text}" + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._show()

    def __enter__(self) -> "Progress":
        if self.rank == 0 and self.interval_s > 0:
            self._thread = threading.Thread(target=self._run, name="megacache-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        # Final counters always reach the file, so rank 0's last line is complete.
        self._write()
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def finish(self) -> None:
        """Print the final aggregated line (rank 0, after every rank has exited its context)."""
        if self.rank == 0 and self.interval_s > 0:
            self._show(final=True)
