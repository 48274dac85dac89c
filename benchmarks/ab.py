"""Two commits of megacache on one build, alternating: whether a change made it faster.

    python -m benchmarks ab REV_A REV_B [--workload build_blend] [--factor F] [--suite full]
                                        [--ranks P] [--pairs N] [--results FILE]

Each commit's ``megacache`` package (``git archive``) is unpacked into a directory of its own, its
bytecode written and its kernels compiled for this CPU, as an installed copy runs, and warmed up
once on the smoke size (``suite.warm_up``). The workload (``workloads``) becomes the training
command of ``prepare.COMMAND`` given to ``megacache build --megatron-version 0.20``, as the
comparison with prepare_cache.py runs it, and each side runs it in turn as whole processes under
``mpiexec -n P``, each after a sync and timed until its output is durable (``harness.run_program``).

The order alternates, A B then B A: run in one fixed order, the second of each pair was a few
percent faster on this project's VM in runs of one tree against itself. Before the timed pairs,
one untimed run of each side: the first runs after the inputs are written run slow, and in the
order A B B A the second and third of them are both B's. The two untimed runs' outputs are
compared byte for byte: a change that alters the caches is not judged by its speed. Every output
is kept until the end (``suite._release`` says why), so the free space is checked after them.

One JSON line per comparison in ``benchmarks/results/ab.jsonl``: both commits, every run (the
untimed ones apart), the medians, B's median wall and CPU time over A's, and B's wall time over
A's in each pair: their spread is the noise a difference must stand out of.
"""

from __future__ import annotations

import compileall
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time

from .harness import (ROOT, BenchmarkFailure, append_record, describe_outputs, kept_on_failure, machine_info,
                      quiet_filesystem, run_program, same_outputs, summarize)

AB_RESULTS = os.path.join(ROOT, "benchmarks", "results", "ab.jsonl")
SIDES = ("a", "b")


def resolve(rev: str) -> str:
    """The full hash of the commit ``rev`` names in this checkout."""
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=ROOT,
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise BenchmarkFailure(f"{rev!r} names no commit of {ROOT}: give a commit, branch or tag (git rev-parse)")
    return found.stdout.strip()


def unpack(commit: str, into: str) -> None:
    """The commit's ``megacache`` package unpacked into the new directory ``into``, compiled to
    bytecode and its kernels for this CPU."""
    archive = subprocess.run(["git", "archive", commit, "megacache"], cwd=ROOT, capture_output=True, check=True)
    os.makedirs(into)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    compileall.compile_dir(os.path.join(into, "megacache"), quiet=1)
    # What the runs will import (``run_program``'s path and directory): this copy, not an installed one.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([into, ROOT])}
    imported = subprocess.run([sys.executable, "-c", "import megacache; print(megacache.__file__)"], cwd=into,
                              capture_output=True, text=True, env=env).stdout.strip()
    if os.path.dirname(os.path.dirname(imported)) != into:
        raise BenchmarkFailure(f"{commit[:12]}: the runs would import megacache from {imported or 'nowhere'}, not "
                               f"from its copy in {into}")
    kernels = subprocess.run([sys.executable, "-m", "megacache", "kernels"], cwd=into, capture_output=True,
                             text=True, env=env)
    if kernels.returncode != 0:
        raise BenchmarkFailure(f"megacache kernels of {commit[:12]} failed:\n{kernels.stderr[-2000:]}")


def compare(revs: tuple[str, str], workload: str, suite_name: str, factor: float, ranks: int, pairs: int,
            results: str) -> dict:
    """``pairs`` pairs of runs of the two commits, alternating; the record appended to ``results``."""
    from .prepare import megacache_build, training_command
    from .suite import check_space, warm_up
    from .workloads import SUITES, WORKLOADS as CASES

    machine = machine_info()
    commits = {side: resolve(rev) for side, rev in zip(SIDES, revs)}
    with kept_on_failure(tempfile.mkdtemp(prefix="megacache-bench-ab-"), "the trees and the outputs") as base:
        trees = {side: os.path.join(base, f"tree-{side}") for side in SIDES}
        for side in SIDES:
            unpack(commits[side], trees[side])
        for side in SIDES:
            warm_up(workload, trees[side])
        work = os.path.join(base, "work")
        os.makedirs(work)
        case = CASES[workload](work, SUITES[suite_name], factor)
        filesystem = quiet_filesystem(work)
        command = training_command(case)

        def run(side: str, name: str) -> dict:
            out = os.path.join(work, name)
            os.makedirs(out)
            return run_program(megacache_build(command, "0.20", out), ranks, work, tree=trees[side], durable=True)

        untimed = {side: run(side, f"{side}-untimed") for side in SIDES}
        compared = same_outputs(os.path.join(work, "b-untimed"), os.path.join(work, "a-untimed"))
        check_space(work, describe_outputs(os.path.join(work, "a-untimed")), 2 * pairs)
        runs: dict[str, list[dict]] = {side: [] for side in SIDES}
        sequence: list[str] = []
        for pair in range(pairs):
            for side in SIDES if pair % 2 == 0 else SIDES[::-1]:
                sequence.append(side)
                runs[side].append(run(side, f"{side}-{pair}"))
                r = runs[side][-1]
                print(f"  pair {pair + 1} {side.upper()} {commits[side][:12]}: {r['wall_s']:.2f} s, "
                      f"CPU {sum(r['cpu_s']):.2f} s", flush=True)
    medians = {side: summarize(runs[side]) for side in SIDES}
    ratios = [b["wall_s"] / a["wall_s"] for a, b in zip(runs["a"], runs["b"])]
    record = {
        "benchmark": "ab", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine, "workload": workload,
        "suite": suite_name, "factor": factor, "params": case.params, "ranks": ranks, "pairs": pairs,
        "sequence": sequence, "compared_bytes": compared, "filesystem": filesystem,
        **{side: {"rev": rev, "commit": commits[side], "runs": runs[side], "median": medians[side]}
           for side, rev in zip(SIDES, revs)},
        "b_over_a_wall": medians["b"]["wall_s"] / medians["a"]["wall_s"],
        "b_over_a_cpu": medians["b"]["cpu_s"] / medians["a"]["cpu_s"],
        "b_over_a_wall_per_pair": ratios,
        "pairs_b_faster": sum(r < 1 for r in ratios),
        "untimed": untimed,
    }
    append_record(results, record)
    return record


def summary(record: dict) -> str:
    """What one comparison found, for the terminal."""
    lines = [f"{record['workload']} factor {record['factor']:g}, P = {record['ranks']}, {record['pairs']} pairs "
             f"alternating, outputs identical ({record['compared_bytes'] / 2**20:.1f} MiB):"]
    for side in SIDES:
        s = record[side]
        walls = ", ".join(f"{r['wall_s']:.2f}" for r in s["runs"])
        lines.append(f"  {side.upper()} {s['rev']} ({s['commit'][:12]}): median {s['median']['wall_s']:.3f} s, "
                     f"CPU {s['median']['cpu_s']:.2f} s (runs {walls})")
    ratios = record["b_over_a_wall_per_pair"]
    lines.append(f"  B/A: wall {record['b_over_a_wall']:.3f}, CPU {record['b_over_a_cpu']:.3f}; per pair "
                 f"{min(ratios):.3f} to {max(ratios):.3f}, B faster in {record['pairs_b_faster']} of "
                 f"{record['pairs']}")
    return "\n".join(lines)
