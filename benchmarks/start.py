"""Training's start with and without megacache's cache: ``python -m benchmarks run --suite start``.

The 1000-dataset blend of the ``build_blend`` workload (``workloads.build_blend``: its inputs, sizes
and flags) started the way a training job starts it: two gloo ranks, launched together with
torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, GLOO_SOCKET_IFNAME=lo,
OMP_NUM_THREADS=1), each running ``start_rank.py`` up to having read sample 0 of the train split.
Configurations, alternating within each repeat:

* ``a``: megatron-core 0.19.2 without a cache (``--data-args-path``, ``--split``, an empty
  ``--data-cache-path``): rank 0 builds every index while rank 1 waits at the builder's barriers,
  then loads what rank 0 wrote. Its files are compared byte for byte with megacache's cache.
* ``b``: megatron-core 0.19.2 with megacache's cache of the same flags, training's default flags.
* ``c``: megatron-core 0.19.2 with megacache's cache and ``--dataloader-fast-cache-load``,
  ``--dataloader-defer-npy-index-mmap``, the data per split (``--per-split-data-args-path``: train,
  valid and test each the same weighted blend of all the datasets; megatron-core allows fast load only
  with per-split data) and the ``--per-dataset-sequences-path`` file megacache wrote.
* ``api``: megacache's own API on the flags of ``b``: ``BuildConfig.from_megatron_flags``,
  ``prepare_cache`` (which opens the splits with ``open_cache``), sample 0.

megacache builds both caches first (``mpiexec -n 2 megacache build --megatron-version 0.19``),
unmeasured here (the suite measures builds). Every rank of every run must read the same sample 0
(dataset, its sample, documents) as megacache's ``open_cache`` reads from its cache, and runs with
a cache must leave it as it was. One JSON line per factor in ``benchmarks/results/start.jsonl``;
``python -m benchmarks start-report`` writes the table from it.

``c-noseq`` ((c) without the sequences file) runs only when asked (``--configs``). Each rank's data
start under cProfile, one run of each configuration::

    python -m benchmarks.start profile --factor 1 [--configs b c ...] [--out DIR] [--results FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .harness import (ROOT, BenchmarkFailure, append_record, kept_on_failure, machine_info, run_program,
                      same_outputs, shown)
from .workloads import SUITES, Suite, build_blend

START_RESULTS = os.path.join(ROOT, "benchmarks", "results", "start.jsonl")
RANK_SCRIPT = os.path.join(ROOT, "benchmarks", "start_rank.py")
ORACLES = os.environ.get("MEGACACHE_ORACLES", os.path.expanduser("~/.cache/megacache/megatron-oracles"))
MEGATRON_VERSION = "0.19"  # measured with megatron-core 0.19.2, the oracle environment's
RANKS = 2
SPLITS = ("train", "valid", "test")
#: disk a run needs at factor 1 (1000 datasets): 1.0 GB of inputs (the .idx files; the .bin files are
#: sparse), megacache's two caches (0.63 and 1.32 GB) and one of megatron-core's builds in (a) (0.63
#: GB), measured 2026-11-28; it grows in proportion to the factor
BYTES_AT_FACTOR_1 = 3.6e9


@dataclass(frozen=True)
class Config:
    label: str
    text: str
    mode: str      # "megatron" (megatron-core's builder) or "megacache" (its API)
    layout: str    # "split": --data-args-path + --split; "per_split": --per-split-data-args-path
    cache: str     # "empty" (a new directory each run), or the layout whose megacache cache it reads
    fast: bool = False
    #: with fast load: give megatron-core megacache's --per-dataset-sequences-path file
    sequences: bool = True


CONFIGS = {
    "a": Config("(a) no cache", "megatron-core 0.19.2, no cache: rank 0 builds, rank 1 waits", "megatron",
                "split", "empty"),
    "b": Config("(b) megacache's cache, default flags",
                "megatron-core 0.19.2, megacache's cache, training's default flags", "megatron", "split", "split"),
    "c": Config("(c) megacache's cache, fast load",
                "megatron-core 0.19.2, megacache's cache, --dataloader-fast-cache-load, "
                "--dataloader-defer-npy-index-mmap, per-split blends, megacache's --per-dataset-sequences-path file",
                "megatron", "per_split", "per_split", fast=True),
    # Not run unless asked (--configs): what the sequences file saves (c).
    "c-noseq": Config("(c) without the sequences file", "as (c), without --per-dataset-sequences-path", "megatron",
                      "per_split", "per_split", fast=True, sequences=False),
    "api": Config("megacache `prepare_cache`",
                  "megacache prepare_cache + open_cache on the flags of (b), megacache's cache", "megacache", "split",
                  "split"),
}

DEFAULT_CONFIGS = ("a", "b", "c", "api")

#: per rank, the medians reported
RANK_FIELDS = ("whole_s", "data_s", "build_s", "sample_s", "rss_kb")


def megatron_python() -> str:
    """The Python 3.12 environment with megatron-core 0.19.2 that tests/megatron_oracles.sh builds
    (``$MEGACACHE_ORACLES``, default ``~/.cache/megacache/megatron-oracles``)."""
    python = os.path.join(ORACLES, "py312", "bin", "python")
    if not (os.path.isfile(os.path.join(ORACLES, "spec.txt")) and os.access(python, os.X_OK)):
        raise BenchmarkFailure(f"no megatron-core 0.19.2 environment in {ORACLES} (its py312/bin/python and "
                               "spec.txt): build it with `bash tests/megatron_oracles.sh`, or point "
                               "MEGACACHE_ORACLES at one")
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _snapshot(directory: str) -> dict:
    """A cache directory's entries with their sizes and modification times: a run that only reads
    it leaves this as it was."""
    with os.scandir(directory) as entries:
        return {e.name: (e.stat().st_size, e.stat().st_mtime_ns) if e.is_file() else "dir" for e in entries}


def _tree_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(directory) for n in names)


# ------------------------------------------------------------------------------------------------
# Inputs, caches and the rank specs


@dataclass
class Setup:
    work: str
    params: dict
    prepare_s: float
    specs: dict          # layout -> the rank spec's common fields
    caches: dict         # layout -> megacache's cache directory
    builds: dict         # layout -> megacache build run (harness.run_program)
    expected: dict       # layout -> sample 0 as megacache's open_cache reads it
    python: str


def prepare(work: str, suite: Suite, factor: float) -> Setup:
    """The blend's inputs (``workloads.build_blend``), its per-split form, megacache's two caches,
    and what sample 0 must be."""
    from megacache.megatron.training import split_sizes

    from .start_rank import megacache_config

    python = megatron_python()
    t = time.perf_counter()
    case = build_blend(work, suite, factor)
    prepare_s = time.perf_counter() - t
    spec = case.spec
    flags = dict(zip(case.flags[0::2], case.flags[1::2]))
    training = {k[2:].replace("-", "_"): int(flags[k]) for k in ("--train-samples", "--global-batch-size",
                                                                   "--eval-iters", "--eval-interval")}
    sizes = list(split_sizes(MEGATRON_VERSION, **training))
    if sizes != list(spec["sizes"]):
        raise BenchmarkFailure(f"megatron-core {MEGATRON_VERSION}'s sizes {sizes} differ from the workload's "
                               f"{spec['sizes']}")
    words = [w for weight, prefix in zip(spec["weights"], spec["prefixes"]) for w in (repr(weight), prefix)]
    per_split = os.path.join(work, "per_split_data_args.json")
    with open(per_split, "w") as f:
        json.dump({s: words for s in SPLITS}, f)
    data_args = case.data_flags[case.data_flags.index("--data-args-path") + 1]
    caches = {"split": os.path.join(work, "cache-split"), "per_split": os.path.join(work, "cache-per-split")}
    # The split layout's cache without a sequences file, so that its files are exactly those
    # megatron-core writes in (a); the per-split one with it, for (c).
    argv = {"split": ["megacache", "build", *case.data_flags, *case.flags, "--megatron-version", MEGATRON_VERSION,
                      "--data-cache-path", caches["split"], "--per-dataset-sequences-path", ""],
            "per_split": ["megacache", "build", "--per-split-data-args-path", per_split, *case.flags,
                          "--megatron-version", MEGATRON_VERSION, "--data-cache-path", caches["per_split"],
                          "--dataloader-fast-cache-load"]}
    builds = {}
    for layout in ("split", "per_split"):
        builds[layout] = run_program(argv[layout], RANKS, work)
        builds[layout]["argv"] = argv[layout]
        builds[layout]["bytes"] = _tree_bytes(caches[layout])
        print(f"  megacache build ({layout}): {builds[layout]['wall_s']:.1f} s, "
              f"{builds[layout]['bytes'] / 2**20:,.1f} MiB", flush=True)
    sequences = os.path.join(caches["per_split"], "sequences_per_dataset.json")
    if not os.path.isfile(sequences):
        raise BenchmarkFailure(f"megacache build wrote no {sequences}")
    common = {"seed": spec["seed"], "seq_length": spec["seq_length"], "sizes": sizes, "vocab_size": spec["vocab_size"],
              "surplus": spec["surplus"], "split": spec["split"], "training": training,
              "megatron_version": MEGATRON_VERSION, "data_args_path": data_args, "per_split_data_args_path": per_split}
    specs = {"split": dict(common, layout="split"), "per_split": dict(common, layout="per_split",
                                                                       sequences_path=sequences)}
    expected = {}
    from megacache.interfaces.api import open_cache

    for layout in ("split", "per_split"):
        train = open_cache(megacache_config(dict(specs[layout], cache=caches[layout])))["train"]
        dataset, sample = train.source(0)
        expected[layout] = {"dataset": dataset, "sample": sample, "documents": train.document_ids(0).tolist()}
    params = {**case.params, "sizes": sizes, "training": training,
              "per_split": "train, valid and test each the same weighted blend of all the datasets"}
    return Setup(work, params, prepare_s, specs, caches, builds, expected, python)


def _spec(setup: Setup, name: str, cache: str, profile: bool = False) -> dict:
    c = CONFIGS[name]
    spec = dict(setup.specs[c.layout], config=name, mode=c.mode, cache=cache, fast=c.fast, profile=profile)
    if not (c.fast and c.sequences):
        spec.pop("sequences_path", None)
    return spec


# ------------------------------------------------------------------------------------------------
# One start: two ranks


def launch(setup: Setup, name: str, cache: str, tag: str, profile: bool = False) -> dict:
    """Both ranks of configuration ``name`` started at once; their records, and the wall time from
    launching them to both having exited."""
    c = CONFIGS[name]
    spec = _spec(setup, name, cache, profile)
    spec_path = os.path.join(setup.work, f"spec-{tag}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(RANKS),
               LOCAL_WORLD_SIZE=str(RANKS), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    if c.mode == "megatron":
        python, cwd = setup.python, setup.work
        env.pop("PYTHONPATH", None)  # the oracle environment's own packages only
    else:
        python, cwd = sys.executable, ROOT
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    outs = [os.path.join(setup.work, f"rank-{tag}.{r}.json") for r in range(RANKS)]
    logs = [os.path.join(setup.work, f"rank-{tag}.{r}.log") for r in range(RANKS)]
    os.sync()  # nothing left to write back from what ran before
    t0 = time.perf_counter()
    procs = []
    for r in range(RANKS):
        with open(logs[r], "w") as log:
            # -P: the script's folder (this package) stays off sys.path
            procs.append(subprocess.Popen([python, "-P", RANK_SCRIPT, spec_path, outs[r]], cwd=cwd, stdout=log,
                                          stderr=subprocess.STDOUT, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))))
    # A rank that fails leaves the other waiting at a barrier for gloo's 30 minutes: stop it.
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs) or time.perf_counter() - t0 > 7200:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    codes = [p.returncode for p in procs]
    if any(codes):
        tails = "\n".join(f"--- rank {r} exited {code}:\n{open(logs[r]).read()[-3000:]}"
                          for r, code in enumerate(codes))
        raise BenchmarkFailure(f"configuration {name} ({c.text}) failed:\n{tails}")
    ranks = []
    for r in range(RANKS):
        with open(outs[r]) as f:
            ranks.append(json.load(f))
    return {"wall_s": wall, "ranks": ranks}


def _check_sample(setup: Setup, name: str, run: dict) -> None:
    want = setup.expected[CONFIGS[name].layout]
    for rank in run["ranks"]:
        if rank.get("built"):
            raise BenchmarkFailure(f"configuration {name}, rank {rank['rank']}: prepare_cache built the cache "
                                   "instead of opening megacache's")
        if rank["sample"] != want:
            raise BenchmarkFailure(f"configuration {name}, rank {rank['rank']} read sample 0 as {rank['sample']}, "
                                   f"megacache's open_cache as {want}")


def _rank_line(rank: dict) -> str:
    return (f"rank {rank['rank']}: data {rank['data_s']:6.2f} s, whole {rank['whole_s']:6.2f} s, "
            f"{rank['opens']['data']['calls']:,} opens, {rank['rss_kb'] / 2**20:.2f} GiB")


# ------------------------------------------------------------------------------------------------
# Measure


def _median_rank(ranks: list[dict]) -> dict:
    med = statistics.median
    out = {k: med(r[k] for r in ranks) for k in RANK_FIELDS}
    out["opens_data"] = med(r["opens"]["data"]["calls"] for r in ranks)
    out["files_data"] = med(r["opens"]["data"]["files"] for r in ranks)
    out["opens_process"] = med(r["opens"]["process"]["calls"] for r in ranks)
    out["mmaps_data"] = med(r["opens"]["data_mmaps"] for r in ranks)
    out["marks"] = {k: med(r["marks"][k] for r in ranks) for k in ranks[0]["marks"]}
    return out


def measure(setup: Setup, repeats: int, configs: list[str]) -> dict:
    runs: dict = {name: [] for name in configs}
    compared = {"outputs": 0, "bytes": 0}
    deleted = False
    for rep in range(repeats):
        for name in configs:
            c = CONFIGS[name]
            if c.cache == "empty":
                cache = os.path.join(setup.work, f"megatron-cache-{rep}")
                os.makedirs(cache)
            else:
                cache = setup.caches[c.cache]
                before = _snapshot(cache)
            run = launch(setup, name, cache, f"{name}-{rep}")
            _check_sample(setup, name, run)
            if c.cache == "empty":
                # megatron-core's own build, byte for byte megacache's cache of the same flags
                compared["bytes"] += same_outputs(setup.caches["split"], cache)
                compared["outputs"] += 1
                # Keep every build's files until the end (on this VM's ext4, files created soon after a mass
                # delete are slow: suite._release), unless the next builds would not fit.
                left = repeats - 1 - rep
                if left and _tree_bytes(cache) * left * 1.1 + 2**31 > shutil.disk_usage(cache).free:
                    shutil.rmtree(cache)
                    deleted = True
            elif _snapshot(cache) != before:
                raise BenchmarkFailure(f"configuration {name} changed the cache {cache}: megatron-core built "
                                       "instead of loading megacache's files")
            runs[name].append(run)
            print(f"  [{rep}] {name:<4} {run['wall_s']:7.2f} s  " + "; ".join(map(_rank_line, run["ranks"])),
                  flush=True)
    out = {}
    for name in configs:
        c = CONFIGS[name]
        out[name] = {"label": c.label, "text": c.text, "mode": c.mode, "layout": c.layout, "fast": c.fast,
                     "runs": runs[name],
                     "median": {"wall_s": statistics.median(r["wall_s"] for r in runs[name]),
                                "ranks": [_median_rank([r["ranks"][k] for r in runs[name]]) for k in range(RANKS)]}}
    return {"configs": out, "compared": compared, "megatron_outputs_deleted_between_repeats": deleted}


def run(suite_name: str, suite: Suite, factors: list[float], repeats: int, results: str,
        configs: list[str] | None = None) -> str:
    """Each factor (smallest first) measured and appended to ``results``; returns the run's id."""
    from .suite import warm_up

    configs = configs or [n for n in CONFIGS if n in DEFAULT_CONFIGS]
    run_id = time.strftime("%Y%m%dT%H%M%S")
    machine = machine_info()
    megatron_python()  # fail before writing inputs
    for factor in factors:
        need = BYTES_AT_FACTOR_1 * factor * suite.blend_datasets / 1000
        free = shutil.disk_usage(tempfile.gettempdir()).free
        if need > free:
            raise BenchmarkFailure(f"factor {factor:g} needs about {need / 1e9:.0f} GB of disk in "
                                   f"{tempfile.gettempdir()} (inputs, two caches, one megatron-core build) and "
                                   f"{free / 1e9:.0f} GB are free: free some, or point TMPDIR elsewhere")
    warm_up("build_blend")  # the kernels compiled, bytecode written: as a user's installed megacache
    for factor in sorted(factors):
        t = time.perf_counter()
        work = tempfile.mkdtemp(prefix="megacache-start-")
        with kept_on_failure(work, "inputs, caches and logs", f"start suite, factor {factor:g}: "):
            setup = prepare(work, suite, factor)
            print(f"start: factor {factor:g}, {setup.params['datasets']} datasets, sizes {setup.params['sizes']} "
                  f"(inputs written in {setup.prepare_s:.1f} s)", flush=True)
            measured = measure(setup, repeats, configs)
        versions = measured["configs"][configs[0]]["runs"][0]["ranks"][0]["versions"]
        megatron = next((c["runs"][0]["ranks"][0]["versions"] for c in measured["configs"].values()
                         if c["mode"] == "megatron"), None)
        record = {"benchmark": "start", "run_id": run_id, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "suite": suite_name, "factor": factor, "ranks": RANKS, "repeats": repeats,
                  "seconds": time.perf_counter() - t, "machine": machine, "loadavg_after": list(os.getloadavg()),
                  "megatron": {"python": setup.python, "versions": megatron or versions},
                  "params": setup.params, "prepare_s": setup.prepare_s,
                  "builds": {k: {f: v[f] for f in ("argv", "wall_s", "phases", "rss_kb", "cpu_s", "bytes")}
                             for k, v in setup.builds.items()},
                  "expected_sample": setup.expected, "order": configs, **measured}
        append_record(results, record)
        _summary(record)
    return run_id


def _summary(record: dict) -> None:
    print(f"start, factor {record['factor']:g}: medians of {record['repeats']} (data = data flags read to sample 0; "
          "whole = process start to sample 0)")
    for name, c in record["configs"].items():
        ranks = "; ".join(f"rank {k}: data {r['data_s']:.2f} s, whole {r['whole_s']:.2f} s, "
                          f"{r['opens_data']:,.0f} opens, {r['rss_kb'] / 2**20:.2f} GiB"
                          for k, r in enumerate(c["median"]["ranks"]))
        print(f"  {name:<4} {ranks}", flush=True)


def load_records(path: str) -> list[dict]:
    with open(path) as f:
        return [r for r in map(json.loads, filter(str.strip, f)) if r.get("benchmark") == "start"]


# ------------------------------------------------------------------------------------------------
# Profile


PROFILE_RESULTS = os.path.join(ROOT, "benchmarks", "results", "start-profile.jsonl")
PROFILE_DIR = os.path.join(ROOT, "benchmarks", "results", "start-profile")


def profile(suite_name: str, factor: float, configs: list[str], out: str, results: str) -> None:
    """Each configuration once with each rank's data window under cProfile: the top functions by
    cumulative and by own time in ``OUT/<config>.<rank>.prof.txt``, and one JSON line in ``results``
    with every rank's record (its marks, opens and RSS: profiled, so slower than the suite's)."""
    from .suite import warm_up

    os.makedirs(out, exist_ok=True)
    machine = machine_info()
    warm_up("build_blend")
    work = tempfile.mkdtemp(prefix="megacache-start-profile-")
    runs = {}
    try:
        setup = prepare(work, SUITES[suite_name], factor)
        for name in configs:
            c = CONFIGS[name]
            cache = setup.caches[c.cache] if c.cache != "empty" else os.path.join(work, "megatron-cache")
            os.makedirs(cache, exist_ok=True)
            runs[name] = launch(setup, name, cache, name, profile=True)
            _check_sample(setup, name, runs[name])
            for r in range(RANKS):
                shutil.copy(os.path.join(work, f"rank-{name}.{r}.json.prof.txt"),
                            os.path.join(out, f"{name}.{r}.prof.txt"))
            print(f"{name}: " + "; ".join(map(_rank_line, runs[name]["ranks"])), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    append_record(results, {"benchmark": "start-profile", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                            "suite": suite_name, "factor": factor, "machine": machine, "params": setup.params,
                            "profiles": shown(out), "configs": runs})
    print(f"profiles in {shown(out)}, records appended to {shown(results)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.start")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="each configuration once, each rank's data start under cProfile")
    p.add_argument("--suite", default="start", choices=[n for n, s in SUITES.items() if s.start])
    p.add_argument("--factor", type=float, default=1.0)
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=["b", "c"])
    p.add_argument("--out", default=PROFILE_DIR, help=f"where the text summaries go (default {shown(PROFILE_DIR)})")
    p.add_argument("--results", default=PROFILE_RESULTS, help=f"default {shown(PROFILE_RESULTS)}")
    args = ap.parse_args(argv)
    try:
        profile(args.suite, args.factor, args.configs, args.out, args.results)
    except BenchmarkFailure as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
