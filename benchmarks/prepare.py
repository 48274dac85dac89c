"""megacache against what Megatron-LM users run to prebuild their caches, Megatron-LM's own
``tools/prepare_cache.py``::

    python -m benchmarks prepare --megatron-lm VERSION=TREE [VERSION=TREE ...] [--python PY]
                                 [--only build_blend build_gpt] [--factor F ...] [--ranks P] [--repeats N]
    python -m benchmarks.prepare report [--results FILE] [--readme README.md]

Each workload (``workloads.build_blend``: 1000 datasets; ``build_gpt``: one prefix) at each factor
becomes one training command: its data flags amid the model, parallelism and optimizer flags of a
Megatron-LM example script (``COMMAND``). The same words go to ``megacache build`` (under ``mpiexec
-n P``, with ``--megatron-version VERSION``) and to each tree's ``tools/prepare_cache.py`` (run by
``tests/support/oracles/prepare_cache_cpu.py``, which only answers its one GPU query, in the interpreter
``--python``, with ``--num-dataset-builder-threads`` as many as the cores), alternating, each after a
sync and timed from outside until its output is durable (its process, then a sync). Every output is
compared byte for byte with megacache's (megacache's sequences file aside: prepare_cache.py reads
that file but does not write it). A tree is a Megatron-LM checkout (``git archive`` of a tag or of
main); its C++ dataset helpers are compiled once before the timed runs, as prepare_cache.py would
(with pybind11, which ``--python`` needs beside Megatron-LM's requirements).

One JSON line per workload, factor and tree in ``benchmarks/results/prepare.jsonl``; ``report``
writes ``PREPARE.md`` beside it and, with ``--readme``, the table between the prepare markers.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from .harness import (ROOT, BenchmarkFailure, append_record, describe_outputs, kept_on_failure, machine_info, quiet_filesystem,
                      run_program, same_outputs, shown, summarize)

PREPARE_RESULTS = os.path.join(ROOT, "benchmarks", "results", "prepare.jsonl")
CPU_RUNNER = os.path.join(ROOT, "tests", "support", "oracles", "prepare_cache_cpu.py")
WORKLOADS = ("build_blend", "build_gpt")
#: the rest of the training command, in the style of Megatron-LM's example scripts; every flag of it
#: is one Megatron-LM 0.19 and main both know, and none changes the caches
COMMAND = shlex.split("""
--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention
--num-query-groups 8 --max-position-embeddings 8192 --position-embedding-type rope --normalization RMSNorm
--swiglu --untie-embeddings-and-output-weights --disable-bias-linear --micro-batch-size 1 --lr 3.0e-4
--min-lr 3.0e-5 --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0 --bf16
--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel
--use-distributed-optimizer --log-interval 10 --save-interval 1000 --num-workers 2
--prepare-cache-world-size 4
""")
MARKERS = ("<!-- prepare table: start -->", "<!-- prepare table: end -->")


def training_command(case) -> list[str]:
    """The words both sides are given: the workload's data flags amid the rest of a training command."""
    return [*case.data_flags, *case.flags, *COMMAND]


def megacache_build(command: list[str], version: str, out: str) -> list[str]:
    """``megacache build`` of a training command for Megatron ``version``, its caches in ``out``."""
    return ["megacache", "build", *command, "--megatron-version", version, "--data-cache-path", out]


def helpers_env(python: str) -> dict:
    """What prepare_cache.py's own ``make`` of the C++ dataset helpers needs for ``python``: its
    ``python3`` first on the path (pybind11's includes) and its extension suffix (the Makefile asks
    ``python3-config``, which a virtual environment does not have)."""
    suffix = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    return {"PATH": f"{os.path.dirname(python)}{os.pathsep}{os.environ['PATH']}", "MAKEFLAGS": f"LIBEXT={suffix}"}


def build_helpers(tree: str, python: str) -> None:
    """The tree's C++ dataset helpers, compiled as prepare_cache.py would on its first run; a failure
    says make's last words and, where ``python`` lacks pybind11 (what the helpers compile against,
    and not among Megatron-LM's requirements), how to add it."""
    directory = os.path.join(tree, "megatron", "core", "datasets")
    done = subprocess.run(["make", "-C", directory], capture_output=True, text=True,
                          env={**os.environ, **helpers_env(python)})
    if done.returncode == 0:
        return
    message = f"make -C {directory} exited {done.returncode}:\n{(done.stdout + done.stderr)[-2000:]}"
    if subprocess.run([python, "-m", "pybind11", "--includes"], capture_output=True).returncode != 0:
        message += (f"\n{python} has no pybind11, which prepare_cache.py compiles its dataset helpers with: "
                    f"{python} -m pip install pybind11")
    raise BenchmarkFailure(message)


def measure(name: str, factor: float, trees: dict[str, str], python: str, ranks: int, repeats: int,
            results: str, leftovers: list[str]) -> list[dict]:
    """One workload at one factor against every tree, alternating; a record per tree appended to
    ``results``. Its work directory goes to ``leftovers``, for the caller to delete once nothing
    more is measured (``suite._release`` says why)."""
    from megacache.megatron.sequences import FILE_NAME

    from .suite import check_space, warm_up
    from .workloads import SUITES, WORKLOADS as CASES

    machine = machine_info()
    threads = os.cpu_count() or 1
    warm_up(name)
    for tree in trees.values():  # its helpers built once, unmeasured, as megacache's kernels are
        build_helpers(tree, python)
    work = tempfile.mkdtemp(prefix=f"megacache-bench-prepare-{name}-")
    with kept_on_failure(work, "inputs and outputs", f"{name}: ", leftovers.append):
        case = CASES[name](work, SUITES["full"], factor)
        filesystem = quiet_filesystem(work)
        command = training_command(case)
        env = {**helpers_env(python), "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        runs = {version: {"reference": [], "megacache": []} for version in trees}
        compared = {version: 0 for version in trees}
        outputs = None
        for rep in range(repeats):
            for version, tree in trees.items():
                theirs = os.path.join(work, f"prepare-cache-{version}-{rep}")
                mine = os.path.join(work, f"megacache-{version}-{rep}")
                runs[version]["reference"].append(run_program(
                    [CPU_RUNNER, os.path.join(tree, "tools", "prepare_cache.py"), *command, "--data-cache-path",
                     theirs, "--num-dataset-builder-threads", str(threads)], None, work, phases=False,
                    python=python, env={**env, "PYTHONPATH": tree}, durable=True))
                if outputs is None:
                    outputs = describe_outputs(theirs)
                    # every run's outputs stay until the end: fail now if the rest will not fit
                    check_space(work, outputs, 2 * repeats * len(trees) - 1)
                runs[version]["megacache"].append(run_program(
                    megacache_build(command, version, mine),
                    ranks, work, durable=True))
                compared[version] += same_outputs(mine, theirs, extra=(FILE_NAME,))
                said = {side: r[-1]["wall_s"] for side, r in runs[version].items()}
                print(f"{name} factor {factor:g}, repeat {rep + 1}, {version}: prepare_cache.py "
                      f"{said['reference']:.2f} s, megacache P={ranks} {said['megacache']:.2f} s", flush=True)
    records = []
    for version, tree in trees.items():
        ref, ours = summarize(runs[version]["reference"]), summarize(runs[version]["megacache"])
        record = {"benchmark": "prepare", "workload": name, "factor": factor, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "machine": machine, "params": case.params, "command": command, "version": version,
                  "tree": _commit(tree), "threads": threads, "ranks": ranks, "repeats": repeats, "outputs": outputs,
                  "filesystem": filesystem,
                  "compared_bytes": compared[version],
                  "reference": {"runs": runs[version]["reference"], "median": ref},
                  "megacache": {"runs": runs[version]["megacache"], "median": ours},
                  "speedup_wall": ref["wall_s"] / ours["wall_s"], "rss_ratio": ours["rss_max_kb"] / ref["rss_max_kb"]}
        append_record(results, record)
        records.append(record)
    return records


def _commit(tree: str) -> str:
    """What the tree is: the commit ``git archive`` wrote into it, else its path."""
    try:
        with open(os.path.join(tree, ".commit")) as f:
            return f.read().strip()
    except OSError:
        return tree


def table(records: list[dict]) -> str:
    """The latest record of each workload, factor and version, as a Markdown table."""
    latest = {}
    for r in records:
        latest[r["workload"], r["factor"], r["version"]] = r
    rows = ["| workload | Megatron-LM | `prepare_cache.py`, threads | megacache build, ranks | speed-up | peak RSS "
            "(megacache / prepare_cache.py) | outputs, identical |", "|---|---|---|---|---|---|---|"]
    for (name, factor, version), r in sorted(latest.items()):
        what = {"build_blend": f"{r['params']['datasets']}-dataset blend", "build_gpt": "one prefix"}[name]
        ref, ours = r["reference"]["median"], r["megacache"]["median"]
        rows.append(f"| {what}, factor {factor:g} | {version} ({r['tree'][:10]}) | {ref['wall_s']:.1f} s, "
                    f"{r['threads']} | {ours['wall_s']:.2f} s, {r['ranks']} | **{r['speedup_wall']:.1f}x** | "
                    f"{ours['rss_max_kb'] / 2**20:.2f} / {ref['rss_max_kb'] / 2**20:.2f} GiB | "
                    f"{r['outputs']['files']:,} files, {r['outputs']['bytes'] / 1e9:.2f} GB |")
    dates = sorted({r["time"][:10] for r in latest.values()})
    return ("\n".join(rows) + f"\n\nMedians of {', '.join(sorted({str(r['repeats']) for r in latest.values()}))} "
            f"alternating runs, each timed from outside until its output is durable, measured {', '.join(dates)} "
            f"(benchmarks/results/prepare.jsonl).\n")


def write_report(results: str, readme: str | None = None) -> list[str]:
    with open(results) as f:
        records = [r for r in map(json.loads, filter(str.strip, f)) if r.get("benchmark") == "prepare"]
    text = table(records)
    out = os.path.join(os.path.dirname(results), "PREPARE.md")
    with open(out, "w") as f:
        f.write("# megacache against Megatron-LM's tools/prepare_cache.py\n\n" + text)
    written = [shown(out)]
    if readme:
        with open(readme) as f:
            doc = f.read()
        start, end = doc.index(MARKERS[0]) + len(MARKERS[0]), doc.index(MARKERS[1])
        note = ("<!-- written by `python -m benchmarks.prepare report --readme README.md` from "
                "benchmarks/results/prepare.jsonl; edits here are overwritten -->")
        with open(readme, "w") as f:
            f.write(f"{doc[:start]}\n{note}\n\n{text}{doc[end:]}")
        written.append(shown(readme))
    return written


def run(trees: dict[str, str], python: str, workloads: list[str], factors: list[float], ranks: int, repeats: int,
        results: str) -> None:
    """Every workload at every factor (``measure``), the work directories deleted at the end."""
    leftovers: list[str] = []
    try:
        for name in workloads:
            for factor in factors:
                for r in measure(name, factor, trees, python, ranks, repeats, results, leftovers):
                    print(f"{name} factor {factor:g} against prepare_cache.py of {r['version']}: "
                          f"{r['speedup_wall']:.1f}x, peak RSS {r['rss_ratio']:.2f}x of its", flush=True)
    finally:
        for work in leftovers:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.prepare")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("report")
    p.add_argument("--results", default=PREPARE_RESULTS)
    p.add_argument("--readme", metavar="PATH")
    args = ap.parse_args(argv)
    print("wrote " + ", ".join(write_report(args.results, args.readme)))


if __name__ == "__main__":
    main(sys.argv[1:])
