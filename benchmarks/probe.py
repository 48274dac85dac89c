"""Run ``python -m MODULE ARGS…`` in this process; at exit write this rank's resource use to
``STATS.<rank>`` as JSON: peak RSS (KiB), CPU seconds (user + system, threads and children
included) and bytes written (``/proc/self/io``'s ``write_bytes``: what reached the block layer,
memory-mapped writes included).

    python -m benchmarks.probe STATS MODULE [ARGS…]
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import runpy
import sys


def _write_bytes() -> int | None:
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split(":")[1]) for line in f if line.startswith("write_bytes:"))
    except (OSError, StopIteration):  # not Linux, or /proc hidden: recorded as unknown
        return None


def _write_stats(path: str) -> None:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    stats = {"rss_kb": me.ru_maxrss, "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
             "write_bytes": _write_bytes()}
    with open(path, "w") as f:
        json.dump(stats, f)


def main() -> None:
    stats, module, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    # MPICH's hydra and srun --mpi=pmi2 name the rank PMI_RANK; a plain process is rank 0.
    atexit.register(_write_stats, f"{stats}.{os.environ.get('PMI_RANK', '0')}")
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
