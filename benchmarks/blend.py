"""The blend kernel alone: ns per step of megacache's exact greedy blend against megatron-core's
``helpers_cpp.build_blending_indices`` on the same weights (1000 uniformly random ones, normalised
twice as Megatron does), alternating, medians of ``REPEATS``; the results are checked equal.

    python -m benchmarks.blend [STEPS] [DATASETS] [REPEATS]
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

import numpy as np

from megacache.algorithms.blend_kernels import blend_chunk
from megacache.algorithms.blend_sizes import normalize


def main(n: int = 4_000_000, datasets: int = 1000, repeats: int = 3) -> None:
    with warnings.catch_warnings():  # megatron-core warns about optional training packages
        warnings.simplefilter("ignore")
        from megatron.core.datasets import helpers_cpp

    weights = normalize(normalize(np.random.default_rng(0).random(datasets)))
    ours = np.empty(n, np.int16), np.empty(n, np.int64)
    theirs = np.zeros(n, np.int16), np.zeros(n, np.int64)
    blend_chunk(weights, 0, None, ours[0][:1000], ours[1][:1000])  # loaded (or compiled) outside the timing
    times = {"megacache": [], "megatron-core": []}
    for _ in range(repeats):
        t = time.perf_counter()
        blend_chunk(weights, 0, None, *ours)
        times["megacache"].append(time.perf_counter() - t)
        t = time.perf_counter()
        helpers_cpp.build_blending_indices(*theirs, weights, datasets, n, False)
        times["megatron-core"].append(time.perf_counter() - t)
        if not (np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])):
            raise SystemExit("megacache's blend differs from megatron-core's")
    per = {k: statistics.median(v) / n * 1e9 for k, v in times.items()}
    print(f"blend of {n:,} steps over {datasets} datasets, medians of {repeats}: megacache "
          f"{per['megacache']:.1f} ns/step, megatron-core {per['megatron-core']:.1f} ns/step "
          f"({per['megatron-core'] / per['megacache']:.1f}x)")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
