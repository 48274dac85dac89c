"""megacache's blend alone on every rank of the job, through the code a build runs
(``megacache.builders.blend.BlendFiles``): ``OUT/dataset_index.npy`` and
``OUT/dataset_sample_index.npy`` made at their full size, each rank blending its even chunk into
them from guessed start counts, the chunks then confirmed or repaired in order, the files made
durable as a build makes them; with COUNTS.npy, the blend's samples per dataset saved there.

    mpiexec -n P python -m benchmarks.kernel WEIGHTS.npy SIZE OUT [COUNTS.npy]
"""

from __future__ import annotations

import os
import sys
import time

def main(weights_path: str, size: int, out: str, counts_path: str | None = None) -> None:
    from megacache.runtime.startup import load_kernels, single_threaded_blas

    single_threaded_blas()  # as a build's rank does, before numpy loads
    import numpy as np

    from megacache.algorithms.blend_chunks import DEFAULT_WARMUP
    from megacache.builders.blend import BLEND_ARRAYS, BlendFiles
    from megacache.builders.config import BLEND_BLOCK
    from megacache.builders.gpt import PhaseTimer
    from megacache.formats.npy import NpyWriter, load_npy
    from megacache.runtime.comm import get_comm
    from megacache.runtime.fsio import sync_filesystems

    comm = get_comm()
    t0 = time.monotonic()
    timer = PhaseTimer()
    load_kernels()
    weights = load_npy(weights_path, mmap=False)
    timer.mark("jit")
    paths = {name: os.path.join(out, name) for name in BLEND_ARRAYS}

    def create() -> None:
        for name, dtype in BLEND_ARRAYS.items():
            NpyWriter.create(paths[name], dtype, (size,))

    comm.on_root(create, "creating the outputs")
    timer.mark("create")
    files = BlendFiles(weights, size, paths, BLEND_BLOCK, DEFAULT_WARMUP)
    mine = files.speculate(comm)
    timer.mark("blend")
    comm.wait_quietly()
    timer.mark("wait")
    counts, recomputed = files.confirm(comm, mine, "the blend")
    timer.mark("repair")
    sync_filesystems([out])
    comm.wait_quietly()
    timer.mark("sync")
    if comm.rank == 0 and counts_path is not None:
        np.save(counts_path, np.asarray(counts, dtype=np.int64))
    if comm.rank == 0:
        print(f"megacache blend: {size:,} samples x {len(weights)} datasets in {time.monotonic() - t0:.1f} s "
              f"on {comm.size} rank(s); {recomputed:,} samples recomputed by repairs", flush=True)
        print("  phases: " + ", ".join(f"{k} {v:.3f} s" for k, v in timer.phases.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:5])
