"""Run ``python -m MODULE ARGS…`` (or the script ``SCRIPT.py ARGS…``) in this process; at exit write this rank's resource use to
``STATS.<rank>`` as JSON: peak RSS (KiB), CPU seconds (user + system, threads and children
included) and bytes read and written (``/proc/self/io``'s ``read_bytes`` and ``write_bytes``: what
the block layer read and wrote, memory-mapped writes included).

    python -m benchmarks.probe STATS MODULE|SCRIPT.py [ARGS…]
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import runpy
import sys


def _io() -> dict:
    """``/proc/self/io``'s ``read_bytes`` and ``write_bytes``: what the block layer read and wrote
    for this process (page-cache hits not read, memory-mapped writes included)."""
    wanted = ("read_bytes", "write_bytes")
    try:
        with open("/proc/self/io") as f:
            pairs = dict(line.split(":") for line in f if line.startswith(wanted))
        return {k: int(pairs[k]) for k in wanted}
    except (OSError, KeyError, ValueError):  # not Linux, or /proc hidden: recorded as unknown
        return dict.fromkeys(wanted)


def _write_stats(path: str) -> None:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    stats = {"rss_kb": me.ru_maxrss, "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
             **_io()}
    with open(path, "w") as f:
        json.dump(stats, f)


def main() -> None:
    stats, module, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    # MPICH's hydra and srun --mpi=pmi2 name the rank PMI_RANK; a plain process is rank 0.
    atexit.register(_write_stats, f"{stats}.{os.environ.get('PMI_RANK', '0')}")
    sys.argv = [module, *args]
    if module.endswith(".py"):
        runpy.run_path(module, run_name="__main__")
    else:
        runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
