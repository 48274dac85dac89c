"""What checking existing entries for damage costs a build that rebuilds nothing: the 1000-dataset
blend (``workloads.build_blend``) built once, then ``megacache build`` of it again (every entry
reused, a whole process on ``RANKS`` ranks, after a ``sync``) against the damage check alone
(``builders.build.damages_since`` of every entry against its manifest record, in one process; a
build deals it over its ranks), alternating, medians of ``REPEATS``.
Appends a line to benchmarks/results/reuse.jsonl.

    python -m benchmarks.reuse [FACTOR] [REPEATS] [RANKS]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date

from benchmarks.harness import git_commit
from benchmarks.workloads import SUITES, build_blend
from megacache.builders.build import damages_since, plan
from megacache.builders.publish import read_manifest
from megacache.interfaces import cli
from megacache.runtime.comm import SingleComm

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "reuse.jsonl")


def main(factor: float = 0.01, repeats: int = 3, ranks: int = 2) -> None:
    with tempfile.TemporaryDirectory(prefix="megacache-reuse-") as work:
        case = build_blend(work, SUITES["quick"], factor)
        out = os.path.join(work, "cache")
        words = case.megacache(out)[1:]  # after "megacache"
        command = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "megacache", *words]
        subprocess.run(command, check=True, capture_output=True)
        cfg = cli.build_config(cli.build_parser().parse_args(words), SingleComm())
        items = plan(cfg, SingleComm()).items
        assert all(item.reused for item in items), "the first build left entries to build"
        files = sum(len(item.entry.names) for item in items)
        manifests = {d: read_manifest(d) for d in {item.entry.directory for item in items}}
        recorded = [manifests[item.entry.directory][item.entry.stem].get("files") for item in items]
        times = {"rebuild nothing": [], "damage check": []}
        for _ in range(repeats):
            os.sync()
            t = time.perf_counter()
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            times["rebuild nothing"].append(time.perf_counter() - t)
            assert f"(0 built, {len(items)} already there)" in done.stdout, done.stdout
            os.sync()
            t = time.perf_counter()
            damaged = [problems for problems in damages_since(items, recorded) if problems]
            times["damage check"].append(time.perf_counter() - t)
            assert not damaged
    medians = {k: statistics.median(v) for k, v in times.items()}
    share = medians["damage check"] / medians["rebuild nothing"]
    record = {"date": date.today().isoformat(), "factor": factor, "ranks": ranks, "repeats": repeats,
              "datasets": case.params["datasets"], "entries": len(items), "files": files,
              "rebuild_nothing_s": round(medians["rebuild nothing"], 3),
              "damage_check_s": round(medians["damage check"], 4), "share": round(share, 4),
              "share_per_rank": round(share / ranks, 4), "commit": git_commit()}
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(f"{len(items):,} entries ({files:,} files) of a {case.params['datasets']}-dataset blend, medians of "
          f"{repeats}: rebuild nothing {medians['rebuild nothing']:.2f} s on {ranks} ranks, damage check "
          f"{medians['damage check'] * 1000:.0f} ms in one process ({share:.1%}; dealt over the build's {ranks} "
          f"ranks, {share / ranks:.1%} each)")


if __name__ == "__main__":
    main(*(float(a) if i == 0 else int(a) for i, a in enumerate(sys.argv[1:4])))
