"""How much of a build's wall time this machine leaves megacache to cut: ``python -m benchmarks floor``.

Per repeat, one after another, each a fresh ``mpiexec -n P`` timed from outside after a sync
(``harness.run_program``):

* the reference: megatron-core building the same cache, one process (as in the suite);
* the build: ``megacache build`` of the 1000-dataset blend (``workloads.build_blend``), its files
  compared with the reference's byte for byte;
* start-up alone: P ranks that import what a build's ranks import (numpy, MPI, the compiled
  kernels, or numba's JIT without them), meet once, run one tiny kernel, and exit;
* the files alone: P ranks that write the build's output files (the same names and sizes,
  round-robin over the ranks) the way a build makes them durable and visible, through the same
  functions: each held by a ``fsio.Staging`` (unnamed where the filesystem allows), then one sync,
  then the links or renames. Nothing is computed.

Start-up and the files are costs any build of that cache pays here however fast its algorithms,
so their sum against the build's time, and against the CPU time the cores give in a tenth of
megatron-core's, is what megacache's own work can still gain. One JSON line per run in
``benchmarks/results/floor.jsonl``.

The ranks' side runs as ``python -m benchmarks.floor start`` and ``… files SOURCE DEST``.

``direct_rates`` are the disk's own sequential write rate (O_DIRECT, then fsync) and read rate
(O_DIRECT), which the seed suite (``seed.py``) measures beside its build and its verify: the bytes
they write and read at those rates are the seconds the disk alone needs for them.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import time

from .harness import (append_record, describe_outputs, machine_info, output_names, run_program, same_outputs,
                      summarize)

FLOOR_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "floor.jsonl")


def start() -> None:
    """A build rank's start-up and nothing else."""
    gc.disable()  # as a build's rank imports (megacache.interfaces.cli._cmd_build)
    import numpy as np

    from megacache.runtime.startup import load_kernels

    load_kernels()
    from megacache.algorithms.gpt_index import length_stats
    from megacache.runtime.comm import get_comm

    comm = get_comm()
    comm.barrier()
    t = time.perf_counter()
    length_stats(np.zeros(1, np.int32), 0)  # from the library, or through the JIT (numba sets up, loads it)
    kernel = time.perf_counter() - t
    comm.barrier()
    if comm.rank == 0:
        print(f"  phases: first_kernel {kernel:.3f} s")


def files(source: str, dest: str) -> None:
    """``source``'s outputs written anew into ``dest``, this rank every P-th by name, as a build
    writes and publishes its own: held by a ``fsio.Staging``, one sync, then ``Staging.publish``."""
    from megacache.runtime.comm import get_comm
    from megacache.runtime.fsio import Staging, sync_filesystems

    comm = get_comm()
    names = output_names(source)[comm.rank::comm.size]
    sizes = [os.path.getsize(os.path.join(source, n)) for n in names]
    data = memoryview(bytes(max(sizes, default=0)))
    finals = [os.path.join(dest, n) for n in names]
    staging = Staging("floor")
    comm.barrier()
    marks = [time.perf_counter()]
    for final, size in zip(finals, sizes):
        staging.write(final, [data[:size]])
    marks.append(time.perf_counter())
    sync_filesystems([dest])
    comm.barrier()
    marks.append(time.perf_counter())
    staging.publish(finals)
    comm.barrier()
    marks.append(time.perf_counter())
    if comm.rank == 0:
        write, sync, publish = (b - a for a, b in zip(marks, marks[1:]))
        print(f"  phases: write {write:.3f} s, sync {sync:.3f} s, publish {publish:.3f} s")


#: bytes per O_DIRECT write and read of ``direct_rates``
DIRECT_CHUNK = 64 << 20


def direct_rates(directory: str, nbytes: int) -> dict:
    """The disk's own sequential rates: ``nbytes`` (whole chunks of DIRECT_CHUNK, at least one)
    written into a new file in ``directory`` through O_DIRECT, one chunk after another from one
    page-aligned buffer of random bytes (a virtual disk may make zeros cheap), then fsync'd, then
    read back the same way; the file is removed. Nothing passes through the page cache, so this is
    what the device takes. ``{"bytes", "write_s", "fsync_s", "seconds", "bytes_per_s", "read_s",
    "read_bytes_per_s"}`` (``seconds`` and ``bytes_per_s``: writing, fsync included); None where
    the filesystem refuses O_DIRECT (tmpfs)."""
    import mmap

    import numpy as np

    chunks = max(1, -(-nbytes // DIRECT_CHUNK))
    buffer = mmap.mmap(-1, DIRECT_CHUNK)  # anonymous maps are page-aligned, as O_DIRECT needs
    buffer[:] = np.random.default_rng(0).integers(0, 256, DIRECT_CHUNK, dtype=np.uint8).tobytes()
    view = memoryview(buffer)
    path = os.path.join(directory, "direct-rates.tmp")
    direct = getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | direct, 0o644)
    except OSError:
        return None
    try:
        t0 = time.perf_counter()
        try:
            for k in range(chunks):
                done = 0
                while done < DIRECT_CHUNK:
                    done += os.pwrite(fd, view[done:], k * DIRECT_CHUNK + done)
        except OSError:
            return None  # EINVAL: the filesystem opened it but takes no direct write
        t1 = time.perf_counter()
        os.fsync(fd)
        t2 = time.perf_counter()
        for k in range(chunks):
            done = 0
            while done < DIRECT_CHUNK:
                got = os.preadv(fd, [view[done:]], k * DIRECT_CHUNK + done)
                if got == 0:
                    raise OSError(f"{path}: ended at byte {k * DIRECT_CHUNK + done} while reading back")
                done += got
        t3 = time.perf_counter()
    finally:
        os.close(fd)
        os.unlink(path)
        view.release()
        buffer.close()
    written = chunks * DIRECT_CHUNK
    return {"bytes": written, "write_s": t1 - t0, "fsync_s": t2 - t1, "seconds": t2 - t0,
            "bytes_per_s": written / (t2 - t0), "read_s": t3 - t2, "read_bytes_per_s": written / (t3 - t2)}


def measure_floor(suite_name: str, factor: float, ranks: int, repeats: int, results: str) -> dict:
    """The four runs ``repeats`` times (megacache's at ``ranks``); their medians appended to ``results``."""
    from .suite import warm_up
    from .workloads import SUITES, build_blend

    warm_up("build_blend")
    work = tempfile.mkdtemp(prefix="megacache-floor-")
    try:
        case = build_blend(work, SUITES[suite_name], factor)
        runs: dict[str, list[dict]] = {"reference": [], "build": [], "start": [], "files": []}
        for rep in range(repeats):
            # new directories every time: a create right after a mass delete is slow here (suite._release)
            theirs, out, copy = (os.path.join(work, f"{side}-{rep}") for side in ("reference", "build", "files"))
            for d in (theirs, out, copy):
                os.makedirs(d)
            runs["reference"].append(run_program(case.reference(theirs), None, work))
            runs["build"].append(run_program(case.megacache(out), ranks, work))
            same_outputs(out, theirs)
            runs["start"].append(run_program(["benchmarks.floor", "start"], ranks, work))
            runs["files"].append(run_program(["benchmarks.floor", "files", out, copy], ranks, work))
            print(f"  repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]['wall_s']:.2f} s" for k, v in runs.items()),
                  flush=True)
        outputs = describe_outputs(theirs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {"benchmark": "floor", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "suite": suite_name,
              "factor": factor, "ranks": ranks, "repeats": repeats, "params": case.params, "outputs": outputs,
              "machine": machine_info(),
              **{k: {"runs": v, "median": summarize(v)} for k, v in runs.items()}}
    append_record(results, record)
    print(summary(record))
    return record


def summary(record: dict) -> str:
    m = {k: record[k]["median"] for k in ("reference", "build", "start", "files")}
    outputs, cores = record["outputs"], record["machine"]["cpus_usable"]
    floor_wall = m["start"]["wall_s"] + m["files"]["wall_s"]
    floor_cpu = m["start"]["cpu_s"] + m["files"]["cpu_s"]
    tenth = m["reference"]["wall_s"] / 10
    phases = ", ".join(f"{k} {v:.2f}" for k, v in m["files"]["phases"].items() if k != "other")
    return "\n".join([
        f"floor of the {record['params']['datasets']}-dataset build, factor {record['factor']:g}, P = {record['ranks']}, "
        f"medians of {record['repeats']} ({cores} cores; wall, CPU summed over ranks):",
        f"  megatron-core:     {m['reference']['wall_s']:.2f} s, {m['reference']['cpu_s']:.2f} CPU s",
        f"  the build:         {m['build']['wall_s']:.2f} s ({m['reference']['wall_s'] / m['build']['wall_s']:.1f}x), "
        f"{m['build']['cpu_s']:.2f} CPU s",
        f"  start-up alone:    {m['start']['wall_s']:.2f} s, {m['start']['cpu_s']:.2f} CPU s "
        f"(first kernel {m['start']['phases']['first_kernel']:.2f} s)",
        f"  its files alone:   {m['files']['wall_s']:.2f} s, {m['files']['cpu_s']:.2f} CPU s "
        f"({outputs['files']:,} files, {outputs['bytes'] / 1e6:,.0f} MB: {phases})",
        f"  the two together:  {floor_wall:.2f} s ({floor_wall / m['build']['wall_s']:.0%} of the build), "
        f"{floor_cpu:.2f} CPU s ({floor_cpu / m['build']['cpu_s']:.0%})",
        f"  10x megatron-core: {tenth:.2f} s, in which {cores} cores give at most {tenth * cores:.2f} CPU s, "
        f"{tenth * cores - floor_cpu:.2f} of them left once start-up and the files are paid",
    ])


def main(argv: list[str]) -> None:
    from megacache.runtime.startup import single_threaded_blas

    single_threaded_blas()  # as a build's rank does, before numpy loads
    if argv[:1] == ["start"] and len(argv) == 1:
        start()
    elif argv[:1] == ["files"] and len(argv) == 3:
        files(argv[1], argv[2])
    else:
        sys.exit("usage: python -m benchmarks.floor start | files SOURCE DEST (a rank's side of `python -m "
                 "benchmarks floor`)")
    gc.freeze()  # and exit as a build's rank does (megacache.interfaces.cli.run)


if __name__ == "__main__":
    main(sys.argv[1:])
