"""Measure workloads: per repeat, the reference once, then megacache at each P, alternating so
drift in the machine's load hits every side; every megacache output equal to that repeat's
reference output byte for byte; medians, scaling and one JSON line per workload."""

from __future__ import annotations

import compileall
import os
import shutil
import tempfile
import time

from .harness import (
    ROOT,
    BenchmarkFailure,
    append_record,
    describe_outputs,
    kept_on_failure,
    machine_info,
    quiet_filesystem,
    run_program,
    same_outputs,
    summarize,
)
from .workloads import WORKLOADS, Suite


def scaling(rows: dict[int, dict]) -> dict[int, dict]:
    """Against the smallest P (P0, normally 1): wall speed-up and efficiency; CPU efficiency
    (CPU summed over ranks at P0 / at P: 1.0 when no work is added by splitting it); and the
    CPU speed-up (the busiest rank's CPU at P0 / at P: the speed-up with a core per rank)."""
    p0 = min(rows)
    base = rows[p0]
    out = {}
    for p, r in rows.items():
        speedup = base["wall_s"] / r["wall_s"]
        out[p] = {"speedup_wall": speedup, "efficiency_wall": speedup * p0 / p,
                  "efficiency_cpu": base["cpu_s"] / r["cpu_s"],
                  "speedup_cpu": base["cpu_max_rank_s"] / r["cpu_max_rank_s"]}
    return out


#: a run's output of at least this many files is kept until its workload ends (see _release)
MANY_FILES = 1000


def _release(path: str) -> None:
    """Delete a run's output now when it is a few files, or leave it for the end of the workload
    when it is many. On ext4 without a journal (this VM's root filesystem) the inode allocator
    skips, and checks one by one, every inode freed in the last 1 to 6 minutes
    (``recently_deleted()`` in fs/ext4/ialloc.c), so each file created shortly after deleting
    12,000 costs O(12,000): the side measured after such a delete paid seconds for the harness's
    own clean-up (perf: ``find_inode_bit``/``recently_deleted`` the top kernel symbols). Every run
    writes into a new directory, and work directories are deleted when the whole run ends, so no
    run follows a mass delete."""
    with os.scandir(path) as entries:
        many = sum(1 for _ in entries) >= MANY_FILES
    if not many:
        shutil.rmtree(path)


def installed() -> None:
    """megacache as a user's installed copy runs: its kernels compiled for this CPU where they are
    not yet (``megacache kernels``, the setup a user runs once), and its and this package's
    bytecode written. An installed package (megatron-core) has its modules compiled at install,
    while a checkout run where PYTHONDONTWRITEBYTECODE is set (as on this project's machines) would
    compile megacache's and this package's sources in every process, 40 ms or more of each rank's
    start. ``MEGACACHE_KERNEL_DIR=jit`` measures megacache without the compiled kernels."""
    from megacache.runtime.environment import kernel_dir
    from megacache.runtime.kernels import compile_library, compiled_library

    if kernel_dir() is not None and compiled_library() is None:
        compile_library()
    for package in ("megacache", "benchmarks"):
        compileall.compile_dir(os.path.join(ROOT, package), quiet=1)


def warm_up(name: str, tree: str | None = None) -> None:
    """``installed``, then megacache run once on the smoke-sized case of workload ``name``,
    unmeasured: numba compiles a kernel on its first call after a change and caches it, and that
    compile (seconds) belongs to no measurement (megatron-core's helpers come prebuilt). With
    ``tree``, the copy of megacache there (``ab.unpack`` installs it) instead of this checkout's."""
    from .workloads import SUITES

    if tree is None:
        installed()
    work = tempfile.mkdtemp(prefix=f"megacache-warm-{name}-")
    try:
        smoke = SUITES["smoke"]
        case = WORKLOADS[name](work, smoke, smoke.factor)
        out = os.path.join(work, "out")
        os.makedirs(out)
        run_program(case.megacache(out), 1, work, tree=tree)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(name: str, suite: Suite, factor: float, ranks: list[int], repeats: int, leftovers: list[str]) -> dict:
    """One workload at one factor; its work directory is appended to ``leftovers`` for the caller
    to delete once nothing else is measured (see ``_release``)."""
    work = tempfile.mkdtemp(prefix=f"megacache-bench-{name}-")
    with kept_on_failure(work, "inputs and outputs", f"{name}: ", leftovers.append):
        t = time.perf_counter()
        case = WORKLOADS[name](work, suite, factor)
        prepare_s = time.perf_counter() - t
        print(f"{name}: {case.params} (inputs written in {prepare_s:.1f} s)", flush=True)
        filesystem = quiet_filesystem(work)
        reference, ours, outputs = [], {p: [] for p in ranks}, None
        compared = {"outputs": 0, "bytes": 0}  # megacache's outputs found byte-identical to the reference's
        for rep in range(repeats):
            theirs = os.path.join(work, f"reference-out-{rep}")
            os.makedirs(theirs)
            reference.append(run_program(case.reference(theirs), None, work))
            if outputs is None:  # the same files every repeat
                outputs = describe_outputs(theirs)
                # outputs of many files are kept until the workload ends (_release), the others one at a time
                left = (repeats - 1) * (1 + len(ranks)) + len(ranks)
                check_space(work, outputs, left if outputs["files"] >= MANY_FILES else 1)
            _progress(rep, "reference", reference[-1])
            for p in ranks:
                mine = os.path.join(work, f"megacache-out-{rep}-{p}")
                os.makedirs(mine)
                ours[p].append(run_program(case.megacache(mine), p, work))
                compared["bytes"] += same_outputs(mine, theirs)
                compared["outputs"] += 1
                _release(mine)
                _progress(rep, f"megacache P={p}", ours[p][-1])
            _release(theirs)
    rows = {p: summarize(runs) for p, runs in ours.items()}
    ref = summarize(reference)
    for p, s in scaling(rows).items():
        rows[p]["scaling"] = s
        rows[p]["vs_reference"] = {"speedup_wall": ref["wall_s"] / rows[p]["wall_s"],
                                   # None where megacache's timed phases took no measurable time (a smoke size)
                                   "speedup_work": ref["work_s"] / rows[p]["work_s"] if rows[p]["work_s"] else None,
                                   "rss_ratio": rows[p]["rss_max_kb"] / ref["rss_max_kb"]}
    return {"workload": name, "params": case.params, "prepare_s": prepare_s, "outputs": outputs,
            "compared": compared, "filesystem": filesystem, "reference_name": case.reference_name,
            "reference": {"runs": reference, "median": ref},
            "megacache": {str(p): {"runs": ours[p], "median": rows[p]} for p in ranks}}


def check_space(work: str, outputs: dict, kept: int) -> None:
    """Fail now, not minutes into a later run, when the ``kept`` outputs still to come, each the
    size of ``outputs``, will not fit beside one another."""
    size = outputs["bytes"]
    need = size * kept
    free = shutil.disk_usage(work).free
    if need > 0.95 * free:
        raise BenchmarkFailure(
            f"the runs still to come need {need / 2**30:.1f} GiB for their outputs ({size / 2**30:.1f} GiB "
            f"each), and {work}'s filesystem has {free / 2**30:.1f} GiB free: free some "
            f"space, run fewer repeats or ranks, or point TMPDIR at a larger filesystem")


def _progress(rep: int, side: str, run: dict) -> None:
    phases = ", ".join(f"{k} {v:.2f}" for k, v in run["phases"].items())
    print(f"  [{rep}] {side:<15} {run['wall_s']:7.2f} s  CPU {sum(run['cpu_s']):6.2f} s  "
          f"RSS {max(run['rss_kb']) / 2**20:5.2f} GiB/rank  ({phases})", flush=True)


def run(suite_name: str, suite: Suite, factors: list[float], ranks: list[int], repeats: int, only: list[str],
        results: str) -> str:
    """Every selected workload measured at each factor (smallest first) and appended to
    ``results``; returns the run's id."""
    run_id = time.strftime("%Y%m%dT%H%M%S")
    machine = machine_info()
    leftovers: list[str] = []
    try:
        for name in only:
            warm_up(name)
            for factor in sorted(factors):
                t = time.perf_counter()
                record = measure(name, suite, factor, ranks, repeats, leftovers)
                append_record(results, {"benchmark": "suite", "run_id": run_id,
                                        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "suite": suite_name,
                                        "factor": factor, "ranks": ranks, "repeats": repeats,
                                        "seconds": time.perf_counter() - t, "machine": machine,
                                        "loadavg_after": list(os.getloadavg()), **record})
                _summary(record)
    finally:
        for work in leftovers:
            shutil.rmtree(work, ignore_errors=True)
    return run_id


def _summary(record: dict) -> None:
    ref = record["reference"]["median"]
    print(f"{record['workload']}: medians; outputs identical ({record['outputs']['bytes'] / 2**20:.1f} MiB)")
    print(f"  {'side':<16}{'wall s':>8}{'work s':>8}{'CPU s':>8}{'RSS GiB':>9}{'speed-up':>10}{'eff wall':>10}"
          f"{'eff CPU':>9}{'vs ref':>8}")
    print(f"  {'reference':<16}{ref['wall_s']:>8.2f}{ref['work_s']:>8.2f}{ref['cpu_s']:>8.2f}"
          f"{ref['rss_max_kb'] / 2**20:>9.2f}")
    for p, side in record["megacache"].items():
        m, s = side["median"], side["median"]["scaling"]
        print(f"  {'megacache P=' + p:<16}{m['wall_s']:>8.2f}{m['work_s']:>8.2f}{m['cpu_s']:>8.2f}"
              f"{m['rss_max_kb'] / 2**20:>9.2f}{s['speedup_wall']:>9.2f}x{s['efficiency_wall']:>10.2f}"
              f"{s['efficiency_cpu']:>9.2f}{m['vs_reference']['speedup_wall']:>7.2f}x", flush=True)
