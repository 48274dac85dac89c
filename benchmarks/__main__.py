"""``python -m benchmarks run|report|project`` (see the package docstring)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def _ranks(text: str) -> list[int]:
    try:
        ranks = sorted({int(r) for r in text.split(",") if r.strip()})
    except ValueError:
        ranks = []
    if not ranks or ranks[0] < 1:
        raise argparse.ArgumentTypeError(f"--ranks wants positive rank counts such as 1,2,4,8, got {text!r}")
    return ranks


def main(argv: list[str] | None = None) -> int:
    from .harness import DEFAULT_RESULTS, SCALE_RESULTS, BenchmarkFailure, shown
    from .workloads import SUITES, WORKLOADS

    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="measure, append to the results file, write the report")
    p.add_argument("--suite", choices=list(SUITES), default="quick",
                   help="; ".join(f"{name}: factor {','.join(f'{f:g}' for f in s.factors or [s.factor])}, P {','.join(map(str, s.ranks))}, {s.repeats} "
                                  f"repeat(s)" for name, s in SUITES.items())
                        + " (quick: a few minutes here, full: 20-40 min, smoke: under a minute)")
    p.add_argument("--ranks", type=_ranks, help="megacache rank counts (default: the suite's)")
    p.add_argument("--factor", type=float, nargs="+",
                   help="size factor(s), 1 = the issue's sizes (default: the suite's)")
    p.add_argument("--repeats", type=int, help="runs per side; medians are reported (default: the suite's)")
    p.add_argument("--only", nargs="+", choices=list(WORKLOADS), metavar="WORKLOAD",
                   help=f"some of: {', '.join(WORKLOADS)} (default: the suite's)")
    p.add_argument("--configs", nargs="+", metavar="CONFIG",
                   help="start suites: some of a (no cache), b (cache, default flags), c (cache, fast load), api "
                        "(megacache's prepare_cache), c-noseq ((c) without the sequences file) (default: a b c api)")
    p.add_argument("--results", help=f"JSON-lines file to append to (default {shown(DEFAULT_RESULTS)}, the scale "
                                     f"suite's {shown(SCALE_RESULTS)}, the start suite's "
                                     "benchmarks/results/start.jsonl; the smoke suites' default is a new temporary "
                                     "directory)")
    p = sub.add_parser("report", help="plots and TABLE.md next to the results file, from the file alone")
    p.add_argument("--results", default=DEFAULT_RESULTS)
    p.add_argument("--suite", help="only this suite's records (default: each workload's latest)")
    p.add_argument("--readme", metavar="PATH", help="also rewrite the summary table between the benchmark markers "
                                                    "of this README")
    p = sub.add_parser("scale-report", help="SCALE.md next to the results file (and the scale table of "
                                            "docs/benchmarks.md): time, phases and memory against the size, "
                                            "fitted growth")
    p.add_argument("--results", default=SCALE_RESULTS)
    p.add_argument("--doc", metavar="PATH", help="also rewrite the scale table between the scale markers of this "
                                                 "Markdown file (docs/benchmarks.md)")
    p = sub.add_parser("start-report", help="START.md next to the start suite's results file (and the start table "
                                            "of the README): training's start with and without megacache's cache")
    p.add_argument("--results", default=os.path.join("benchmarks", "results", "start.jsonl"))
    p.add_argument("--readme", metavar="PATH", help="also rewrite the start table between the start markers of this "
                                                    "README")
    p = sub.add_parser("prepare", help="megacache build against Megatron-LM's tools/prepare_cache.py on the same "
                                       "training command (see benchmarks/prepare.py)")
    p.add_argument("--megatron-lm", nargs="+", required=True, metavar="VERSION=TREE",
                   help="Megatron-LM checkouts and the version each is (0.19=/src/mlm-0.19 0.20=/src/mlm-main)")
    p.add_argument("--python", required=True, help="the interpreter prepare_cache.py runs in (Python 3.12 with "
                                                   "Megatron-LM's requirements and pybind11)")
    p.add_argument("--only", nargs="+", choices=("build_blend", "build_gpt"), default=["build_blend", "build_gpt"],
                   metavar="WORKLOAD")
    p.add_argument("--factor", type=float, nargs="+", default=[1.0])
    p.add_argument("--ranks", type=int, default=2, help="megacache ranks (default 2)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--results", default=os.path.join("benchmarks", "results", "prepare.jsonl"))
    p.add_argument("--readme", metavar="PATH", help="also rewrite the table between the prepare markers of this README")
    p = sub.add_parser("project", help="write the 5e12-token projection from the measured phase costs")
    p.add_argument("--results", default=DEFAULT_RESULTS)
    p.add_argument("--scale-results", default=SCALE_RESULTS,
                   help="the scale suite's results: its largest build_blend is used when the file exists")
    p.add_argument("--seed-results", default=os.path.join("benchmarks", "results", "seed.jsonl"),
                   help="the seed suite's results: its largest run is the case projected, and gives megacache's "
                        "1000-dataset and blend constants, when the file exists ('' for none)")
    p.add_argument("--suite", help="only this suite's records (default: each workload's largest factor)")
    p.add_argument("--output", default=os.path.join("docs", "benchmarks-projection.md"))
    p = sub.add_parser("floor", help="megatron-core and megacache building the 1000-dataset blend, beside "
                                     "megacache's start-up alone and its files alone: what this machine costs any "
                                     "build of that cache (see benchmarks/floor.py)")
    p.add_argument("--suite", choices=list(SUITES), default="scale", help="whose blend (its number of datasets)")
    p.add_argument("--factor", type=float, default=1.0, help="size factor, 1 = the issue's sizes")
    p.add_argument("--ranks", type=int, default=2, help="megacache ranks (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each; medians are reported (default 3)")
    p.add_argument("--results", help="JSON-lines file to append to (default benchmarks/results/floor.jsonl)")
    p = sub.add_parser("ab", help="two commits of megacache on one build, alternating: whether a change made it "
                                  "faster (see benchmarks/ab.py)")
    p.add_argument("revisions", nargs=2, metavar="REV", help="two commits of this checkout (hash, branch, tag): A, "
                                                             "then B")
    p.add_argument("--workload", choices=("build_blend", "build_gpt"), default="build_blend")
    p.add_argument("--suite", choices=list(SUITES), default="full", help="whose workload sizes (default full)")
    p.add_argument("--factor", type=float, default=1.0, help="size factor, 1 = the issue's sizes")
    p.add_argument("--ranks", type=int, default=2, help="megacache ranks (default 2)")
    p.add_argument("--pairs", type=int, default=6, help="pairs of runs; medians are reported (default 6)")
    p.add_argument("--results", default=os.path.join("benchmarks", "results", "ab.jsonl"))
    args = ap.parse_args(argv)

    try:
        if args.command == "run":
            from . import report, suite

            chosen = SUITES[args.suite]
            smoke = args.suite.endswith("smoke")
            results = args.results or (os.path.join(tempfile.mkdtemp(prefix="megacache-bench-smoke-"),
                                                    f"{args.suite}.jsonl") if smoke
                                       else SCALE_RESULTS if args.suite == "scale"
                                       else os.path.join(os.path.dirname(DEFAULT_RESULTS), "start.jsonl")
                                       if chosen.start else DEFAULT_RESULTS)
            repeats = args.repeats or chosen.repeats
            if repeats < 1:
                ap.error("--repeats must be at least 1")
            factors = args.factor or list(chosen.factors or [chosen.factor])
            t = time.perf_counter()
            if chosen.start:
                from . import start

                unknown = sorted(set(args.configs or ()) - set(start.CONFIGS))
                if unknown or args.only or args.ranks:
                    ap.error(f"the start suites take --configs from {', '.join(start.CONFIGS)} (got {unknown}), "
                             "and neither --only nor --ranks (2 ranks, as a training job's)")
                start.run(args.suite, chosen, factors, repeats, results, args.configs)
                written = report.write_start_report(results)
                print(f"suite {args.suite} done in {time.perf_counter() - t:.0f} s; results appended to "
                      f"{shown(results)}; wrote {', '.join(written)} (the README's table: python -m benchmarks "
                      f"start-report --results {shown(results)} --readme README.md)")
                return 0
            if args.configs:
                ap.error("--configs is for the start suites")
            if chosen.seed_case:
                from . import seed

                ranks = args.ranks or list(chosen.ranks)
                if len(ranks) != 1 or len(factors) != 1 or repeats != 1 or args.only:
                    ap.error("the seed suites run build_blend once, at one --ranks P and one --factor")
                results = args.results or (results if smoke else seed.SEED_RESULTS)
                seed.run(args.suite, chosen, factors[0], ranks[0], results)
                print(f"suite {args.suite} done in {time.perf_counter() - t:.0f} s; results appended to "
                      f"{shown(results)}; wrote {', '.join(seed.write_report(results))}")
                return 0
            suite.run(args.suite, chosen, factors, args.ranks or list(chosen.ranks), repeats,
                      args.only or list(chosen.workloads or WORKLOADS), results)
            # a scale suite's file holds sizes, whatever this run added: TABLE.md is the other suites'
            written = (report.write_scale_report(results) if chosen.factors or len(factors) > 1
                       else report.write_report(results, suite=args.suite))
            print(f"suite {args.suite} done in {time.perf_counter() - t:.0f} s; results appended to {shown(results)}; "
                  f"wrote {', '.join(written)}")
        elif args.command == "report":
            from . import report

            print("wrote " + ", ".join(report.write_report(args.results, suite=args.suite, readme=args.readme)))
        elif args.command == "floor":
            from . import floor

            if args.repeats < 1 or args.ranks < 1:
                ap.error("--repeats and --ranks must be at least 1")
            floor.measure_floor(args.suite, args.factor, args.ranks, args.repeats, args.results or floor.FLOOR_RESULTS)
        elif args.command == "prepare":
            from . import prepare

            trees = dict(t.split("=", 1) for t in args.megatron_lm if "=" in t)
            if len(trees) != len(args.megatron_lm) or args.repeats < 1 or args.ranks < 1:
                ap.error("--megatron-lm takes VERSION=TREE words; --repeats and --ranks must be at least 1")
            prepare.run(trees, args.python, args.only, args.factor, args.ranks, args.repeats, args.results)
            print("wrote " + ", ".join(prepare.write_report(args.results, args.readme)))
        elif args.command == "ab":
            from . import ab

            if args.pairs < 1 or args.ranks < 1:
                ap.error("--pairs and --ranks must be at least 1")
            print(ab.summary(ab.compare(tuple(args.revisions), args.workload, args.suite, args.factor, args.ranks,
                                        args.pairs, args.results)))
        elif args.command == "start-report":
            from . import report

            print("wrote " + ", ".join(report.write_start_report(args.results, readme=args.readme)))
        elif args.command == "scale-report":
            from . import report

            print("wrote " + ", ".join(report.write_scale_report(args.results, doc=args.doc)))
        else:
            from . import project

            project.write_projection(args.results, args.output, suite=args.suite, scale_results=args.scale_results,
                                     seed_results=args.seed_results)
            print(f"wrote {args.output}")
    except BenchmarkFailure as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
