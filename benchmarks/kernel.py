"""megacache's blend alone, on every rank of the job: the chunk protocol of
``megacache.algorithms.blend_chunks`` (each rank blends its even share from guessed start counts, the
chunks are then confirmed or repaired in order), each rank writing its rows into
``OUT/dataset_index.npy`` and ``OUT/dataset_sample_index.npy`` (``numpy.save``'s bytes).
``megacache build`` runs the same protocol on cache entries; this drives it on bare arrays.

    mpiexec -n P python -m benchmarks.kernel WEIGHTS.npy SIZE OUT
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext

import numpy as np

from megacache.algorithms.blend_chunks import guess_counts
from megacache.algorithms.blend_kernels import blend_chunk
from megacache.builders.blend import BLEND_ARRAYS, confirm_chunks
from megacache.builders.gpt import PhaseTimer
from megacache.builders.scheduling import even_slice
from megacache.runtime.comm import get_comm
from megacache.formats.npy import NpyWriter, load_npy

def main(weights_path: str, size: int, out: str) -> None:
    comm = get_comm()
    t0 = time.monotonic()
    timer = PhaseTimer()
    mark, phases = timer.mark, timer.phases

    weights = load_npy(weights_path, mmap=False)
    blend_chunk(weights, 0, None, np.empty(1000, np.int16), np.empty(1000, np.int64))
    mark("jit")  # numba's kernels loaded (or compiled) by a first tiny call, as megatron-core's are prebuilt
    s0, s1 = even_slice(size, comm.rank, comm.size)
    dataset_index = np.empty(s1 - s0, dtype=np.int16)
    dataset_sample_index = np.empty(s1 - s0, dtype=np.int64)
    guess = guess_counts(weights, s0)
    mark("guess")
    end = blend_chunk(weights, s0, guess, dataset_index, dataset_sample_index)
    mark("blend")

    comm.wait_quietly()
    confirm_chunks(comm, weights, s0, (guess, end), lambda: nullcontext((dataset_index, dataset_sample_index)),
                   "the blend")
    mark("repair")

    def create() -> None:
        for name, dtype in BLEND_ARRAYS.items():
            NpyWriter.create(os.path.join(out, name), dtype, (size,))

    comm.on_root(create, "creating the outputs")
    for (name, dtype), rows in zip(BLEND_ARRAYS.items(), (dataset_index, dataset_sample_index)):
        with NpyWriter(os.path.join(out, name), dtype, (size,)) as w:
            w.write_rows(s0, rows)
    comm.wait_quietly()
    mark("write")
    if comm.rank == 0:
        print(f"megacache blend: {size:,} samples x {len(weights)} datasets in {time.monotonic() - t0:.1f} s "
              f"on {comm.size} rank(s)", flush=True)
        print("  phases: " + ", ".join(f"{k} {v:.3f} s" for k, v in phases.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
