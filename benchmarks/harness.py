"""What the build benchmarks share: megatron-core and megacache run as fresh processes, timed from
outside, alternating; caches compared byte for byte; medians, a JSON line of results, a table."""

from __future__ import annotations

import filecmp
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
from blend_kernel import cpu_model

# argv: JSON of {prefixes, weights, split, seed, seq_length, sizes, vocab_size, cache}. Prints one JSON
# line. A one-process gloo group: megatron-core 0.16.1 cannot cache a blend without a process group.
MCORE = r"""
import json, resource, socket, sys, time, warnings
t0 = time.perf_counter()
a = json.loads(sys.argv[1])
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch.distributed as dist
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.tokenizers import MegatronTokenizer
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null"}, vocab_size=a["vocab_size"])
    config = GPTDatasetConfig(random_seed=a["seed"], sequence_length=a["seq_length"],
                              blend=(a["prefixes"], a["weights"]), split=a["split"], tokenizer=tokenizer,
                              reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                              add_extra_token_to_sequence=True, drop_last_partial_validation_sequence=True,
                              path_to_cache=a["cache"])
    t1 = time.perf_counter()
    BlendedMegatronDatasetBuilder(GPTDataset, a["sizes"], lambda: True, config).build()
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "build_s": t2 - t1,
                  "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

# argv: RSS_PREFIX then megacache's own arguments. Runs ``python -m megacache`` in this process and
# writes this rank's peak RSS (KiB) to RSS_PREFIX.<rank> at exit.
RSS_WRAP = r"""
import atexit, os, resource, runpy, sys
path = sys.argv[1] + "." + os.environ.get("PMI_RANK", "0")
atexit.register(lambda: open(path, "w").write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)))
sys.argv = ["megacache"] + sys.argv[2:]
runpy.run_module("megacache", run_name="__main__", alter_sys=True)
"""


def run_mcore(args: dict, cache: str) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", MCORE, json.dumps({**args, "cache": cache})], check=True,
                         capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, **json.loads(out.stdout.strip().splitlines()[-1])}


def run_megacache(ranks: int, build_args: list[str], cache: str, rss_prefix: str) -> dict:
    cmd = [sys.executable, "-c", RSS_WRAP, rss_prefix, "build", *build_args, "--data-cache-path", cache]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"megacache build at P={ranks} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    phases_line = next(line for line in out.stdout.splitlines() if line.strip().startswith("phases:"))
    phases = {k: float(v) for k, v, _ in (item.split() for item in phases_line.split(":", 1)[1].split(","))}
    rss = []
    for rank in range(ranks):
        with open(f"{rss_prefix}.{rank}") as f:
            rss.append(int(f.read()))
        os.unlink(f"{rss_prefix}.{rank}")
    return {"seconds": seconds, "rss_kb": rss, "phases": phases}


def assert_same_cache(ours: str, theirs: str) -> int:
    """Same file names, same bytes; returns the total bytes compared."""
    names = sorted(os.listdir(theirs))
    if sorted(os.listdir(ours)) != names:
        raise SystemExit(f"cache file names differ:\n  megacache {sorted(os.listdir(ours))}\n  megatron  {names}")
    _, mismatch, errors = filecmp.cmpfiles(ours, theirs, names, shallow=False)
    if mismatch or errors:
        raise SystemExit(f"cache files differ from megatron-core's: {mismatch + errors}")
    return sum(os.path.getsize(os.path.join(theirs, n)) for n in names)


def add_common_args(ap, split: str, results: str) -> None:
    """The flags both build benchmarks take: document shape, Megatron settings, ranks, repeats."""
    ap.add_argument("--mean-length", type=float, default=1000, help="mean document length in tokens")
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal shape of the document lengths")
    ap.add_argument("--seq-length", type=int, default=4096)
    ap.add_argument("--split", default=split)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--ranks", default="1,2", help="megacache rank counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", default=results)


def compare_builds(mcore_args: dict, build_args: list[str], ranks: list[int], repeats: int, work: str):
    """Alternate megatron-core and megacache at each P, ``repeats`` times; every cache must equal
    megatron-core's. Returns (megatron runs, megacache runs per P, cache bytes)."""
    mcore, ours = [], {p: [] for p in ranks}
    cache_bytes = 0
    for rep in range(repeats):  # alternate, so drift in machine load hits every side
        theirs = os.path.join(work, f"mcore-{rep}")
        mcore.append(run_mcore(mcore_args, theirs))
        print(f"[{rep}] megatron-core {mcore[-1]['seconds']:.1f} s "
              f"(build() {mcore[-1]['build_s']:.1f} s), {mcore[-1]['rss_kb'] / 2**20:.2f} GiB", flush=True)
        for p in ranks:
            cache = os.path.join(work, f"megacache-{p}-{rep}")
            ours[p].append(run_megacache(p, build_args, cache, os.path.join(work, "rss")))
            cache_bytes = assert_same_cache(cache, theirs)
            shutil.rmtree(cache)
            r = ours[p][-1]
            print(f"[{rep}] megacache P={p} {r['seconds']:.1f} s, "
                  f"{max(r['rss_kb']) / 2**20:.2f} GiB/rank max; phases "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items()), flush=True)
        shutil.rmtree(theirs)
    return mcore, ours, cache_bytes


def record_and_report(name: str, bars: dict, mcore: list, ours: dict, cache_bytes: int, params: dict,
                      results: str, machine_before: tuple) -> None:
    """Medians, the bars at P = 2 (``{"label": (speedup at least, RSS ratio at most)}``), one JSON
    line appended to ``results``, and the table."""
    import numba

    mcore_s = statistics.median(r["seconds"] for r in mcore)
    mcore_rss = statistics.median(r["rss_kb"] for r in mcore)
    rows = {}
    for p, runs in ours.items():
        rows[p] = {
            "seconds": [r["seconds"] for r in runs],
            "rss_kb": [r["rss_kb"] for r in runs],
            "phases": [r["phases"] for r in runs],
            "seconds_median": statistics.median(r["seconds"] for r in runs),
            "rss_kb_per_rank_max_median": statistics.median(max(r["rss_kb"]) for r in runs),
            "phases_median": {k: statistics.median(r["phases"][k] for r in runs) for k in runs[0]["phases"]},
        }
        rows[p]["speedup"] = mcore_s / rows[p]["seconds_median"]
        rows[p]["rss_ratio"] = rows[p]["rss_kb_per_rank_max_median"] / mcore_rss
    speedup_bar, rss_bar = bars["speedup"], bars["rss_ratio"]
    verdict = None
    if 2 in rows:
        verdict = {f"speedup_p2_ge_{speedup_bar}": rows[2]["speedup"] >= speedup_bar,
                   f"rss_ratio_p2_le_{rss_bar}": rows[2]["rss_ratio"] <= rss_bar}
    uptime_before, load_before = machine_before
    record = {
        "benchmark": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "platform": platform.platform(),
                    "uptime_before": uptime_before, "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "numba": numba.__version__,
                     "megatron_core": importlib.metadata.version("megatron-core")},
        **params,
        "cache_bytes": cache_bytes, "repeats": len(mcore), "identical_caches": True,
        "megatron": {"seconds": [r["seconds"] for r in mcore], "build_s": [r["build_s"] for r in mcore],
                     "import_s": [r["import_s"] for r in mcore], "rss_kb": [r["rss_kb"] for r in mcore],
                     "seconds_median": mcore_s, "build_s_median": statistics.median(r["build_s"] for r in mcore),
                     "rss_kb_median": mcore_rss},
        "megacache": {str(p): row for p, row in rows.items()},
        "bars": verdict,
    }
    os.makedirs(os.path.dirname(results), exist_ok=True)
    with open(results, "a") as f:
        f.write(json.dumps(record) + "\n")

    print(f"\nmedians of {len(mcore)}: wall seconds from outside (imports included), peak RSS per rank; "
          f"caches identical ({cache_bytes / 2**20:.0f} MiB)")
    print(f"{'side':<18}{'wall s':>9}{'peak RSS GiB':>14}{'speedup':>9}{'RSS ratio':>11}")
    print(f"{'megatron-core':<18}{mcore_s:>9.1f}{mcore_rss / 2**20:>14.2f}{'1.0x':>9}{'1.00':>11}   "
          f"(build() {record['megatron']['build_s_median']:.1f} s)")
    for p, row in rows.items():
        print(f"{f'megacache P={p}':<18}{row['seconds_median']:>9.1f}{row['rss_kb_per_rank_max_median'] / 2**20:>14.2f}"
              f"{row['speedup']:>8.1f}x{row['rss_ratio']:>11.2f}   phases "
              + ", ".join(f"{k} {v:.2f}" for k, v in row["phases_median"].items()))
    if verdict:
        print("bars at P=2: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in verdict.items()))
    print(f"load average {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs ({cpu_model()})")


def machine_before() -> tuple:
    uptime = subprocess.run(["uptime"], check=True, capture_output=True, text=True).stdout.strip()
    return uptime, os.getloadavg()
