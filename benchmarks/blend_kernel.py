"""megacache's blending kernel vs megatron-core's ``helpers_cpp.build_blending_indices``, one core each.

For every weight family, both build the same blend in the same process, alternating, ``--repeats``
times; every run's two arrays are checked identical to the helper's. Times are medians of the
wall-clock seconds of the calls (the output allocation included for both). The figure of merit is
helper/megacache (bar: >= 8 at 1e8 samples x 1000 datasets, uniform random weights). Results are
appended as a JSON line to ``benchmarks/results/blend_kernel.jsonl``.

    python benchmarks/blend_kernel.py                                  # 1e8 x 1000, ~10 min here
    python benchmarks/blend_kernel.py --samples 1e6 --datasets 100 --families random,lognormal,equal
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ("random", "lognormal", "dirichlet", "equal", "decimal", "near-equal")


def family_weights(name: str, datasets: int, seed: int) -> np.ndarray:
    """Raw weights of a family (uniform random is the headline case)."""
    rng = np.random.default_rng(seed)
    return {
        "random": lambda: rng.random(datasets),
        "lognormal": lambda: rng.lognormal(0.0, 2.0, datasets),
        "dirichlet": lambda: rng.dirichlet(np.full(datasets, 0.3)) + 1e-12,
        "equal": lambda: np.ones(datasets),
        "decimal": lambda: rng.choice([0.1, 0.2, 0.7], datasets),
        "near-equal": lambda: 1.0 + 1e-6 * rng.random(datasets),
    }[name]()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=float, default=1e8, help="blend size (default 1e8)")
    ap.add_argument("--datasets", type=int, default=1000)
    ap.add_argument("--families", default="random", help=f"comma-separated, from {','.join(FAMILIES)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    ap.add_argument("--results", default=os.path.join(HERE, "results", "blend_kernel.jsonl"))
    args = ap.parse_args()
    size, datasets = int(args.samples), args.datasets
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core
        from megatron.core.datasets import helpers_cpp
    import numba

    from megacache.algorithms.blend import build_blending_indices, normalize

    build_blending_indices(np.full(300, 1 / 300), 1000)  # compile (or load) the kernels first

    def helper(weights):
        idx = np.zeros(size, dtype=np.int16)
        sidx = np.zeros(size, dtype=np.int64)
        helpers_cpp.build_blending_indices(idx, sidx, weights, len(weights), size, False)
        return idx, sidx

    load_before = os.getloadavg()
    rows = []
    for family in families:
        # BlendedMegatronDatasetBuilder normalizes, BlendedDataset normalizes again
        weights = normalize(normalize(family_weights(family, datasets, args.seed)))
        theirs, ours = [], []
        for _ in range(args.repeats):  # alternate, so drift in machine load hits both sides
            t = time.perf_counter()
            expected = helper(weights)
            theirs.append(time.perf_counter() - t)
            t = time.perf_counter()
            actual = build_blending_indices(weights, size)
            ours.append(time.perf_counter() - t)
            if not (np.array_equal(actual[0], expected[0]) and np.array_equal(actual[1], expected[1])):
                raise SystemExit(f"{family}: megacache's arrays differ from megatron-core's")
            del expected, actual
        row = {
            "family": family,
            "helper_seconds": theirs,
            "megacache_seconds": ours,
            "helper_median": statistics.median(theirs),
            "megacache_median": statistics.median(ours),
        }
        row["speedup"] = row["helper_median"] / row["megacache_median"]
        rows.append(row)

    record = {
        "benchmark": "blend_kernel",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": cpu_model(),
            "platform": platform.platform(),
            "pinned_cpu": args.cpu,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "versions": {
            "numpy": np.__version__,
            "numba": numba.__version__,
            "megatron_core": megatron.core.__version__,
        },
        "samples": size,
        "datasets": datasets,
        "repeats": args.repeats,
        "seed": args.seed,
        "rows": rows,
    }
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "a") as f:
        f.write(json.dumps(record) + "\n")

    print(
        f"{size:.3g} samples x {datasets} datasets, "
        f"medians of {args.repeats} (wall seconds, identical arrays)"
    )
    print(f"{'weights':<12}{'helpers_cpp':>14}{'megacache':>12}{'speedup':>10}")
    for row in rows:
        print(
            f"{row['family']:<12}{row['helper_median']:>14.2f}{row['megacache_median']:>12.2f}{row['speedup']:>9.1f}x"
        )
    print(
        f"load average {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f} "
        f"on {os.cpu_count()} CPUs ({cpu_model()})"
    )


if __name__ == "__main__":
    main()
