"""megacache build vs megatron-core's BlendedMegatronDatasetBuilder on a 1000-dataset weighted blend.

``--datasets`` synthetic prefixes (one sequence per document, lognormal lengths, sparse ``.bin``s)
totalling ``--tokens`` tokens, each prefix's share and weight drawn at random (lognormal), blended
as ``--data-path W1 P1 W2 P2 …`` with sizes train/valid/test as given (default 1.2e7 / 1.2e5 /
1.2e4), L = 4096, split "969,30,1". Every repeat runs, alternating, as fresh processes: megatron-core
(``BlendedMegatronDatasetBuilder(...).build()`` with ``path_to_cache``) and ``megacache build`` at
each P in ``--ranks`` (P > 1 under ``mpiexec``). Wall seconds from outside (imports included), peak
RSS per process/rank; every megacache cache directory must equal megatron-core's file for file, byte
for byte. Bars at P = 2: >= 10x faster, peak RSS per rank <= half of megatron-core's.
Results are appended to ``benchmarks/results/build_blend.jsonl``.

    python benchmarks/build_blend.py                 # 1000 datasets, 5e10 tokens
    python benchmarks/build_blend.py --scale 0.05    # quick check (sizes and tokens scaled)
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
from build_gpt import write_dataset
from harness import add_common_args, compare_builds, machine_before, record_and_report

HERE = os.path.dirname(os.path.abspath(__file__))


def write_blend(work: str, datasets: int, tokens: float, mean_length: float, sigma: float,
                seed: int) -> tuple[list[str], list[float], int, int]:
    """The prefixes, their weights, and the total documents and tokens written."""
    rng = np.random.default_rng(seed)
    share = rng.lognormal(0, 0.5, datasets)
    share /= share.sum()
    # Weights follow the sizes loosely, so some datasets repeat for several epochs, others for less than one.
    weights = [float(f"{w:.6g}") for w in share * rng.lognormal(0, 0.5, datasets)]
    prefixes, documents, total = [], 0, 0
    for i in range(datasets):
        prefix = os.path.join(work, f"source_{i:04d}_text_document")
        n = max(50, int(tokens * share[i] / mean_length))
        lengths = write_dataset(prefix, n, mean_length, sigma, seed + 1 + i)
        prefixes.append(prefix)
        documents += n
        total += int(lengths.sum(dtype=np.int64))
    return prefixes, weights, documents, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", type=int, default=1000)
    ap.add_argument("--tokens", type=float, default=5e10)
    ap.add_argument("--sizes", default="12000000,120000,12000", help="train,valid,test samples")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply --tokens and --sizes (quick runs)")
    add_common_args(ap, "969,30,1", os.path.join(HERE, "results", "build_blend.jsonl"))
    args = ap.parse_args()
    sizes = [int(int(s) * args.scale) for s in args.sizes.split(",")]
    ranks = [int(r) for r in args.ranks.split(",")]
    # train, valid, test as Megatron-LM's loop derives them: valid = (iters // interval + 1) * eval_iters * gbs.
    gbs, eval_iters = 1, sizes[2]
    if sizes[1] % sizes[2] or sizes[0] < 1:
        raise SystemExit("--sizes: valid must be a multiple of test (Megatron-LM derives both from eval-iters)")
    eval_interval = max(1, sizes[0] // (sizes[1] // sizes[2] - 1)) if sizes[1] > sizes[2] else sizes[0] + 1
    while sizes[0] // eval_interval + 1 > sizes[1] // sizes[2]:
        eval_interval += 1

    before = machine_before()
    work = tempfile.mkdtemp(prefix="megacache-bench-blend-")
    try:
        t = time.perf_counter()
        prefixes, weights, documents, tokens = write_blend(work, args.datasets, args.tokens * args.scale,
                                                           args.mean_length, args.sigma, args.seed)
        write_s = time.perf_counter() - t
        from megacache.builders.build import megatron_split_sizes

        derived = megatron_split_sizes(sizes[0], None, gbs, eval_iters, eval_interval)
        assert list(derived) == sizes, (derived, sizes)
        data_args = os.path.join(work, "data_args.txt")
        with open(data_args, "w") as f:
            f.write("\n".join(f"{w!r} {p}" for w, p in zip(weights, prefixes)) + "\n")
        mcore_args = {"prefixes": prefixes, "weights": weights, "split": args.split, "seed": args.seed,
                      "seq_length": args.seq_length, "sizes": sizes, "vocab_size": args.vocab_size}
        build_args = ["--data-args-path", data_args, "--split", args.split, "--seed", str(args.seed),
                      "--seq-length", str(args.seq_length), "--train-samples", str(sizes[0]),
                      "--global-batch-size", str(gbs), "--eval-iters", str(eval_iters),
                      "--eval-interval", str(eval_interval), "--tokenizer-type", "NullTokenizer",
                      "--vocab-size", str(args.vocab_size)]
        print(f"{args.datasets} datasets, {documents:,} documents, {tokens:,} tokens, written in {write_s:.1f} s; "
              f"L={args.seq_length}, sizes {sizes}", flush=True)

        mcore, ours, cache_bytes = compare_builds(mcore_args, build_args, ranks, args.repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    params = {"datasets": args.datasets, "documents": documents, "tokens": tokens, "mean_length": args.mean_length,
              "sigma": args.sigma, "seq_length": args.seq_length, "split": args.split, "seed": args.seed,
              "sizes": sizes, "scale": args.scale, "dataset_write_s": write_s}
    record_and_report("build_blend", {"speedup": 10, "rss_ratio": 0.5}, mcore, ours, cache_bytes, params,
                      args.results, before)


if __name__ == "__main__":
    main()
