"""Merging per-task shards: ``megacache merge --input-list`` of SHARDS generated Megatron datasets at each
of RANKS, beside Megatron-LM's ``tools/merge_datasets.py`` (megatron-core's ``IndexedDatasetBuilder.add_index``
over each input in one process) on the first REFERENCE of them, megacache merging those same ones in
the same run; the outputs of the same inputs compared byte for byte. Wall time from outside (each run
after a ``sync``, until its output is durable), peak RSS per rank, medians of REPEATS. The reference
takes about a third of a second per input here (the ``gc.collect()`` its ``add_index`` calls, with torch
imported), so it is run on fewer inputs. Appends a record to benchmarks/results/shards.jsonl.

    python -m benchmarks.shards [--shards 10000] [--reference 1000] [--ranks 1 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from .harness import append_record, machine_info, run_program, same_outputs, shown

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "shards.jsonl")
SEED = 38
#: documents per shard and tokens per document (lognormal mean): a small per-task output
DOCUMENTS, MEAN_LENGTH = 50, 200.0


def write_shards(folder: str, count: int) -> tuple[list[str], int]:
    """``count`` Megatron datasets of DOCUMENTS documents each (sparse ``.bin``: the merge copies its
    bytes whatever they are); returns the prefixes and their tokens."""
    from megacache.formats.indexed import IndexLayout, IndexWriter

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(SEED)
    lengths = np.maximum(1, rng.lognormal(np.log(MEAN_LENGTH) - 0.5, 1.0, (count, DOCUMENTS))).astype(np.int32)
    layout = IndexLayout(np.dtype(np.uint16), DOCUMENTS, DOCUMENTS + 1)
    prefixes = []
    for k in range(count):
        prefix = os.path.join(folder, f"shard_{k:05d}")
        IndexWriter.create(prefix + ".idx", prefix + ".bin", layout, 2 * int(lengths[k].sum()))
        with IndexWriter.open(prefix + ".idx", prefix + ".bin", layout) as w:
            w.write_sequences(0, lengths[k], 0)
            w.write_documents(0, np.arange(DOCUMENTS + 1, dtype=np.int64))
        prefixes.append(prefix)
    return prefixes, int(lengths.sum(dtype=np.int64))


def reference(listed: str, out: str) -> None:
    """Megatron-LM's tools/merge_datasets.py, as it merges: one builder, ``add_index`` per input."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    with open(listed) as f:
        prefixes = f.read().split()
    builder = IndexedDatasetBuilder(out + ".bin", dtype=np.uint16)
    for prefix in prefixes:
        builder.add_index(prefix)
    builder.finalize(out + ".idx")
    subprocess.run(["sync"], check=True)  # durable, as megacache's output is when it returns


def _listed(work: str, prefixes: list[str]) -> str:
    path = os.path.join(work, f"inputs-{len(prefixes)}.txt")
    with open(path, "w") as f:
        f.write("".join(p + "\n" for p in prefixes))
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.shards", description=__doc__)
    ap.add_argument("--shards", type=int, default=10_000)
    ap.add_argument("--reference", type=int, default=1_000, help="inputs the reference merges (the first ones; "
                    "all of them: about an hour here)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", default=RESULTS)
    args = ap.parse_args(argv)
    start = datetime.datetime.now().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(args.results))) as work:
        prefixes, tokens = write_shards(os.path.join(work, "shards"), args.shards)
        reference = min(args.reference, args.shards)
        every, few = _listed(work, prefixes), _listed(work, prefixes[:reference])
        runs: dict[str, list[dict]] = {}
        for r in range(args.repeats):
            out = os.path.join(work, f"out{r}")  # a folder per output, compared whole
            sides = [("reference", ["benchmarks.shards", "reference", few, f"{out}/theirs/merged"], None)]
            for p in args.ranks:
                if reference < args.shards:
                    sides.append((f"megacache P={p} ({reference})", ["megacache", "merge", "--input-list", few,
                                  "--output-prefix", f"{out}/ours_{p}_few/merged"], p))
                sides.append((f"megacache P={p} ({args.shards})", ["megacache", "merge", "--input-list", every,
                              "--output-prefix", f"{out}/ours_{p}{'_few' if reference == args.shards else ''}/merged"],
                              p))
            for name, module_args, ranks in sides:
                os.makedirs(os.path.dirname(module_args[-1]))
                run = run_program(module_args, ranks, work, phases=False)
                runs.setdefault(name, []).append(run)
                print(f"  [{r}] {name:28s} {run['wall_s']:8.2f} s  RSS {max(run['rss_kb']) / 2**20:.2f} GiB/rank",
                      flush=True)
            for p in args.ranks:
                same_outputs(f"{out}/ours_{p}_few", f"{out}/theirs")  # raises, naming the files, if not
        summary = {name: {"wall_s": statistics.median(r["wall_s"] for r in rs),
                          "rss_gib": max(max(r["rss_kb"]) for r in rs) / 2**20,
                          "walls": [r["wall_s"] for r in rs]} for name, rs in runs.items()}
    record = {"workload": "merge_shards", "started": start, "shards": args.shards, "reference_shards": reference,
              "documents_per_shard": DOCUMENTS, "tokens": tokens, "repeats": args.repeats, "results": summary,
              "identical": True, "machine": machine_info()}
    append_record(args.results, record)
    for name, s in summary.items():
        print(f"{name:28s} median {s['wall_s']:8.2f} s  peak RSS {s['rss_gib']:.2f} GiB/rank")
    print(f"appended to {shown(args.results)}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "reference":
        reference(*sys.argv[2:4])
    else:
        main()
