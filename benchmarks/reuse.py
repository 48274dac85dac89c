"""What checking existing entries for damage costs a build that rebuilds nothing: the 1000-dataset
blend (``workloads.build_blend``) built once, then ``megacache build`` of it again on ``RANKS``
ranks, every entry reused, ``REPEATS`` times. The build reports its damage check as a phase of its
own (``damage_check``: each rank's share of the check and the gather of every rank's verdicts, so
the slowest rank's time), timed inside the very build whose whole process, timed from outside
after a ``sync``, it is set against; medians. Appends a line to benchmarks/results/reuse.jsonl.

    python -m benchmarks.reuse [FACTOR] [REPEATS] [RANKS]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from datetime import date

from benchmarks.harness import git_commit, run_program
from benchmarks.workloads import SUITES, build_blend

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "reuse.jsonl")


def main(factor: float = 0.01, repeats: int = 3, ranks: int = 2) -> None:
    with tempfile.TemporaryDirectory(prefix="megacache-reuse-") as work:
        case = build_blend(work, SUITES["quick"], factor)
        out = os.path.join(work, "cache")
        command = case.megacache(out)
        run_program(command, ranks, work)
        runs = [run_program(command, ranks, work) for _ in range(repeats)]
        files = sum(len(names) for _, _, names in os.walk(out))
    for run in runs:
        assert set(run["phases"]) == {"plan", "drift_check", "damage_check", "other"}, \
            f"the second build built something: {run['phases']}"
    wall = statistics.median(run["wall_s"] for run in runs)
    phases = {k: statistics.median(run["phases"][k] for run in runs) for k in ("plan", "drift_check", "damage_check")}
    share = phases["damage_check"] / wall
    record = {"date": date.today().isoformat(), "factor": factor, "ranks": ranks, "repeats": repeats,
              "datasets": case.params["datasets"], "files": files, "rebuild_nothing_s": round(wall, 3),
              **{f"{k}_s": round(v, 4) for k, v in phases.items()}, "share": round(share, 4),
              "commit": git_commit()}
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(f"a {case.params['datasets']}-dataset blend ({files:,} files) rebuilt with nothing to build on {ranks} ranks, medians of "
          f"{repeats}: {wall:.2f} s the whole process, of which the damage check {phases['damage_check'] * 1000:.0f} "
          f"ms ({share:.1%}; the drift check {phases['drift_check'] * 1000:.0f} ms, planning "
          f"{phases['plan'] * 1000:.0f} ms)")


if __name__ == "__main__":
    main(*(float(a) if i == 0 else int(a) for i, a in enumerate(sys.argv[1:4])))
