"""What every workload shares: a program run as a fresh process (under ``mpiexec -n P`` for
megacache) timed from outside, with its phases and each rank's resource use; outputs compared byte
for byte; the machine; medians; the results file (one JSON line per workload and run)."""

from __future__ import annotations

import filecmp
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

from megacache.runtime.environment import usable_cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_RESULTS = os.path.join(ROOT, "benchmarks", "results", "suite.jsonl")
SCALE_RESULTS = os.path.join(ROOT, "benchmarks", "results", "scale.jsonl")

# What neither side times itself: launcher, interpreter start-up, imports not timed, exit.
OTHER = "other"
# Phases that are start-up rather than work, in either side's own accounting ("jit": loading or
# compiling numba kernels before the first call).
STARTUP_PHASES = (OTHER, "import", "jit")


class BenchmarkFailure(Exception):
    """A run that failed or an output that differs from the reference: the suite stops."""


def _delete(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def kept_on_failure(work: str, kept: str, context: str = "", dispose: Callable[[str], None] = _delete):
    """A block working in ``work``: a ``BenchmarkFailure`` from it keeps the directory, to look at,
    and is raised again saying what is kept where (``kept``; ``context`` leads the message);
    otherwise, however the block ends, ``dispose(work)``: deleted now, or handed on (a list's
    ``append``) for the caller to delete once nothing more is measured."""
    try:
        yield work
    except BenchmarkFailure as exc:
        raise BenchmarkFailure(f"{context}{exc}\n({kept} kept in {work})") from None
    except BaseException:
        dispose(work)
        raise
    dispose(work)


# ------------------------------------------------------------------------------------------------
# One run


def _phases(stdout: str) -> dict[str, float]:
    """``  phases: plan 0.12 s, …`` (megacache build and this package's programs), or the
    ``megacache tokenize: done in X s`` summary as one phase named after the command."""
    for line in stdout.splitlines():
        if line.strip().startswith("phases:"):
            items = (item.split() for item in line.split(":", 1)[1].split(","))
            return {name: float(value) for name, value, _unit in items}
    m = re.search(r"^megacache (\w+): done in ([0-9.]+) s", stdout, re.MULTILINE)
    if m:
        return {m.group(1): float(m.group(2))}
    raise BenchmarkFailure(f"no phases in the program's output:\n{stdout[-2000:]}")


def run_program(module_args: list[str], ranks: int | None, work: str, phases: bool = True,
                python: str = sys.executable, env: dict | None = None, durable: bool = False,
                tree: str | None = None) -> dict:
    """``python -m MODULE ARGS`` (or ``python SCRIPT.py ARGS``) through the probe, under ``mpiexec -n
    ranks`` (None: plainly, one process), after a ``sync``; ``env`` added to the environment; with
    ``tree``, the ``megacache`` package in that directory instead of this checkout's. Wall
    seconds from outside, with ``durable`` until a ``sync`` after the process has made its output
    durable; ``phases`` as the program reports them plus ``other`` (the wall time they do not cover;
    all of it for a program that reports none, ``phases=False``); per-rank peak RSS, CPU seconds and
    bytes written."""
    stats = os.path.join(work, "probe-stats")
    cmd = [python, "-m", "benchmarks.probe", stats, *module_args]
    if ranks is not None:
        # MPICH's hydra starts more ranks than cores without a flag; megacache's own waits sleep,
        # so oversubscribed ranks do not spin against each other.
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    env = {**os.environ, **(env or {})}
    # ``python -m`` puts its working directory first on the path: the tree's, where there is one.
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [tree, ROOT, env.get("PYTHONPATH")])), PYTHONWARNINGS="ignore")
    # Each side starts with nothing left to write back: megacache syncs its outputs before it
    # publishes them, and would otherwise also flush what the run before it left dirty.
    os.sync()
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree or ROOT, check=False)
    if durable:
        os.sync()
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise BenchmarkFailure(f"{' '.join(cmd)}\nexited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    per_rank = []
    for rank in range(ranks or 1):
        with open(f"{stats}.{rank}") as f:
            per_rank.append(json.load(f))
        os.unlink(f"{stats}.{rank}")
    reported = _phases(out.stdout) if phases else {}
    reported[OTHER] = max(0.0, wall - sum(reported.values()))
    return {"wall_s": wall, "phases": reported, "rss_kb": [r["rss_kb"] for r in per_rank],
            "cpu_s": [r["cpu_s"] for r in per_rank], "write_bytes": [r["write_bytes"] for r in per_rank],
            "read_bytes": [r["read_bytes"] for r in per_rank]}


#: CPU a file's creation costs, above which the filesystem is still paying for deletes made before
#: the benchmark began (``suite._release`` says why; docs/benchmarks.md has the costs measured)
QUIET_CREATE_S = 100e-6
#: files a probe creates; they stay in the work directory, since deleting them is what it waits out
QUIET_PROBE_FILES = 200
QUIET_POLL_S = 15.0
#: the longest wait before measuring anyway (MEGACACHE_BENCH_QUIET_WAIT_S overrides it; 0: no wait)
QUIET_WAIT_S = 480.0


def quiet_filesystem(work: str, threshold_s: float = QUIET_CREATE_S, limit_s: float | None = None,
                     poll_s: float = QUIET_POLL_S) -> dict:
    """Before a workload's timed runs, wait until creating files in ``work`` costs what it costs at
    rest: the harness never deletes before a run, but whatever ran before the benchmark may have,
    and every build here creates thousands of files, the shorter side's time the most inflated.
    Probes of ``QUIET_PROBE_FILES`` creates (CPU per file) every ``poll_s`` until one costs at most
    ``threshold_s`` a file or ``limit_s`` have passed. What it saw goes into the record."""
    if limit_s is None:
        limit_s = float(os.environ.get("MEGACACHE_BENCH_QUIET_WAIT_S", QUIET_WAIT_S))
    probes = os.path.join(work, "filesystem-probes")
    os.makedirs(probes, exist_ok=True)
    started = time.monotonic()
    costs: list[float] = []
    while True:
        cpu = time.process_time()
        for i in range(QUIET_PROBE_FILES):
            os.close(os.open(os.path.join(probes, f"{len(costs)}-{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        costs.append((time.process_time() - cpu) / QUIET_PROBE_FILES)
        waited = time.monotonic() - started
        if costs[-1] <= threshold_s or waited + poll_s > limit_s:
            break
        if len(costs) == 1:
            print(f"filesystem: a file's creation costs {costs[-1] * 1e6:.0f} us of CPU in {work} (at most "
                  f"{threshold_s * 1e6:g} at rest): waiting up to {limit_s:g} s for the deletes made before this "
                  f"benchmark to age out", flush=True)
        time.sleep(poll_s)
    quiet = costs[-1] <= threshold_s
    if not quiet:
        print(f"filesystem: still {costs[-1] * 1e6:.0f} us a file after {waited:.0f} s; measuring anyway", flush=True)
    return {"create_us": [round(c * 1e6, 1) for c in costs], "waited_s": round(waited, 1), "quiet": quiet}


def summarize(runs: list[dict]) -> dict:
    """Medians over repeats: wall, work (the program's own phases, start-up excluded), each phase,
    CPU summed over ranks and of the busiest rank, the largest rank's peak RSS, bytes written."""
    med = statistics.median
    names = list(dict.fromkeys(k for r in runs for k in r["phases"]))
    written = [sum(r["write_bytes"]) if None not in r["write_bytes"] else None for r in runs]
    return {
        "wall_s": med(r["wall_s"] for r in runs),
        "work_s": med(sum(v for k, v in r["phases"].items() if k not in STARTUP_PHASES) for r in runs),
        "phases": {k: med(r["phases"].get(k, 0.0) for r in runs) for k in names},
        "cpu_s": med(sum(r["cpu_s"]) for r in runs),
        "cpu_max_rank_s": med(max(r["cpu_s"]) for r in runs),
        "rss_max_kb": med(max(r["rss_kb"]) for r in runs),
        "write_bytes": None if None in written else med(written),
    }


# ------------------------------------------------------------------------------------------------
# Outputs


def output_names(directory: str) -> list[str]:
    """The directory's entries, sorted, but megacache's state directory (locks, manifest), which is
    its own and no output."""
    from megacache.runtime.fsio import STATE_DIR

    return sorted(n for n in os.listdir(directory) if n != STATE_DIR)


def same_outputs(ours: str, theirs: str, extra: tuple[str, ...] = ()) -> int:
    """Same file names, same bytes, or a failure naming the files; the bytes compared. megacache's
    state directory beside either side's outputs is no output, and ``extra`` files are those
    megacache writes where the reference does not; any other extra file is a failure, and so is a
    reference that wrote nothing."""
    names = output_names(theirs)
    mine = [n for n in output_names(ours) if n not in extra]
    if mine != names:
        raise BenchmarkFailure(f"output file names differ:\n  megacache {mine}\n  reference {names}")
    if not names:
        raise BenchmarkFailure(f"the reference wrote nothing in {theirs}")
    _, mismatch, errors = filecmp.cmpfiles(ours, theirs, names, shallow=False)
    if mismatch or errors:
        raise BenchmarkFailure(f"{ours}: files differ from the reference's in {theirs}: {mismatch + errors}")
    return sum(os.path.getsize(os.path.join(theirs, name)) for name in names)


def describe_outputs(directory: str) -> dict:
    """Files and bytes (in all and per file suffix), and for each kind of ``.npy`` array (the
    name after the last ``-``, e.g. ``sample_index``) its elements and bytes: what the
    projection scales by. megacache's state directory is not an output."""
    from megacache.formats.npy import read_npy_layout

    kinds: dict[str, dict[str, int]] = {}
    names = output_names(directory)
    for name in names:
        if name.endswith(".npy"):
            dtype, shape = read_npy_layout(os.path.join(directory, name))[:2]
            kind = kinds.setdefault(name[:-4].rsplit("-", 1)[-1], {"files": 0, "elements": 0, "bytes": 0})
            elements = 1
            for s in shape:
                elements *= s
            kind["files"] += 1
            kind["elements"] += elements
            kind["bytes"] += elements * dtype.itemsize
    by_suffix: dict[str, int] = {}
    for name in names:
        suffix = os.path.splitext(name)[1]
        by_suffix[suffix] = by_suffix.get(suffix, 0) + os.path.getsize(os.path.join(directory, name))
    return {"files": len(names), "bytes": sum(by_suffix.values()), "bytes_by_suffix": by_suffix, "arrays": kinds}


# ------------------------------------------------------------------------------------------------
# Machine and results


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def git_commit() -> str | None:
    """HEAD's commit, read from ``.git`` directly (no git process), or None outside a checkout. In a
    worktree ``.git`` is a file naming the worktree's own folder (its HEAD), whose ``commondir``
    holds the branches."""
    git = os.path.join(ROOT, ".git")
    try:
        if os.path.isfile(git):
            with open(git) as f:
                git = os.path.join(ROOT, f.read().strip().removeprefix("gitdir: "))
        with open(os.path.join(git, "HEAD")) as f:
            head = f.read().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if os.path.exists(os.path.join(git, "commondir")):
            with open(os.path.join(git, "commondir")) as f:
                git = os.path.join(git, f.read().strip())
        if os.path.exists(os.path.join(git, ref)):
            with open(os.path.join(git, ref)) as f:
                return f.read().strip()
        with open(os.path.join(git, "packed-refs")) as f:
            for line in f:
                if line.rstrip().endswith(" " + ref):
                    return line.split()[0]
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _mpiexec_version() -> str | None:
    try:
        out = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Version:\s*(\S+)", out)
    return f"hydra {m.group(1)}" if m else out.strip().splitlines()[0] if out.strip() else None


def machine_info() -> dict:
    return {
        "cpu": cpu_model(), "cpus": os.cpu_count(), "cpus_usable": usable_cores(),
        "ram_gib": _mem_total_gib(), "platform": platform.platform(), "loadavg": list(os.getloadavg()),
        "versions": {"python": platform.python_version(), "numpy": _version("numpy"), "numba": _version("numba"),
                     "megacache": _version("megacache"), "megatron_core": _version("megatron-core"),
                     "tokenizers": _version("tokenizers"), "mpi4py": _version("mpi4py"),
                     "mpiexec": _mpiexec_version()},
        "git_commit": git_commit(),
    }


def shown(path: str) -> str:
    """A path as printed: relative to the working directory when inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def append_record(path: str, record: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def load_records(path: str) -> list[dict]:
    """The suite's records in file order (lines of the older per-script files are skipped)."""
    with open(path) as f:
        return [r for r in map(json.loads, filter(str.strip, f)) if r.get("benchmark") == "suite"]


def latest_per_workload(records: list[dict], suite: str | None = None, prefer_large: bool = False) -> dict:
    """``{workload: record}``: the last record of each workload (of ``suite`` if given); with
    ``prefer_large``, the last among those of the largest factor."""
    chosen: dict[str, dict] = {}
    for r in records:
        if suite is not None and r["suite"] != suite:
            continue
        old = chosen.get(r["workload"])
        if old is None or not prefer_large or r["factor"] >= old["factor"]:
            chosen[r["workload"]] = r
    return chosen
