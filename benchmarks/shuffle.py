"""The shuffle kernel alone: ns per element of megacache's exact ``RandomState.shuffle`` against
numpy's own, on the same int64 array, alternating, medians of ``REPEATS``; the results are checked
equal. An array far larger than the caches (the default, 1e8 elements, 800 MB) measures what
Megatron's document and shuffle indices cost at scale.

    python -m benchmarks.shuffle [ELEMENTS] [REPEATS]
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from megacache.algorithms.permutation import MT19937, shuffle


def main(n: int = 100_000_000, repeats: int = 3) -> None:
    ours, theirs = np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)
    shuffle(np.arange(10), MT19937.from_seed(0))  # the kernel loaded (or compiled) outside the timing
    times = {"megacache": [], "numpy": []}
    for r in range(repeats):
        t = time.perf_counter()
        shuffle(ours, MT19937.from_seed(r))
        times["megacache"].append(time.perf_counter() - t)
        t = time.perf_counter()
        np.random.RandomState(r).shuffle(theirs)
        times["numpy"].append(time.perf_counter() - t)
        if not np.array_equal(ours, theirs):
            raise SystemExit("megacache's shuffle differs from numpy's")
    per = {k: statistics.median(v) / n * 1e9 for k, v in times.items()}
    print(f"shuffle of {n:,} int64, medians of {repeats}: megacache {per['megacache']:.1f} ns/element, "
          f"numpy {per['numpy']:.1f} ns/element ({per['numpy'] / per['megacache']:.1f}x)")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
