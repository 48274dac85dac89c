"""megacache build vs megatron-core's BlendedMegatronDatasetBuilder on the same GPTDataset caches.

One synthetic dataset (one sequence per document, lognormal lengths, a sparse ``.bin``: the index
caches depend on lengths only), split "969, 30, 1", seed 1234, train samples forcing ``--epochs``
epochs of the train split. Every repeat runs, alternating, as fresh processes:
* megatron-core: ``BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()``
  with a null tokenizer and a fresh ``path_to_cache``;
* megacache at each P in ``--ranks``: ``python -m megacache build`` (P = 1 plainly, else under
  ``mpiexec -n P``) into its own fresh cache directory.
Wall seconds are timed from outside (interpreter start and imports included on both sides);
megatron's ``build()`` call and megacache's phases are reported too. Peak RSS is each process's
(each rank's) own ``getrusage`` maximum. Every megacache cache must equal megatron-core's file for
file, byte for byte. Bars at P = 2: >= 3x faster, peak RSS per rank <= half of megatron-core's.
Results are appended as a JSON line to ``benchmarks/results/build_gpt.jsonl``.

    python benchmarks/build_gpt.py                  # 2e7 documents, L = 4096, a few minutes per repeat here
    python benchmarks/build_gpt.py --scale 0.01     # quick check
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time

import numpy as np
from harness import add_common_args, compare_builds, machine_before, record_and_report

HERE = os.path.dirname(os.path.abspath(__file__))

def write_dataset(prefix: str, documents: int, mean: float, sigma: float, seed: int) -> np.ndarray:
    """One sequence per document, lognormal lengths of this mean (>= 1); returns the lengths."""
    from megacache.formats.indexed import IndexLayout, IndexWriter

    rng = np.random.default_rng(seed)
    mu = math.log(mean) - sigma**2 / 2  # the lognormal's mean is exp(mu + sigma^2 / 2)
    lengths = np.maximum(1, np.rint(rng.lognormal(mu, sigma, documents))).astype(np.int32)
    layout = IndexLayout(np.dtype(np.uint16), documents, documents + 1)
    IndexWriter.create(prefix + ".idx", prefix + ".bin", layout, 2 * int(lengths.sum(dtype=np.int64)))
    with IndexWriter.open(prefix + ".idx", prefix + ".bin", layout) as w:
        w.write_sequences(0, lengths, 0)
        w.write_documents(0, np.arange(documents + 1, dtype=np.int64))
    return lengths


def train_samples_for(lengths: np.ndarray, split: str, seq_length: int, epochs: float) -> tuple[int, int]:
    """(train samples for ``epochs`` epochs of the train split, samples in one epoch)."""
    from megacache.algorithms.splits import split_matrix, split_ranges

    a, b = split_ranges(split_matrix(split), len(lengths))[0]
    per_epoch = (int(lengths[a:b].sum(dtype=np.int64)) - 1) // seq_length  # add_extra_token_to_sequence
    return int(epochs * per_epoch), per_epoch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--documents", type=float, default=2e7)
    ap.add_argument("--epochs", type=float, default=2.5, help="train samples as epochs of the train split")
    ap.add_argument("--global-batch-size", type=int, default=512)
    ap.add_argument("--eval-iters", type=int, default=100)
    ap.add_argument("--eval-interval", type=int, default=1000)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply --documents (quick runs)")
    add_common_args(ap, "969, 30, 1", os.path.join(HERE, "results", "build_gpt.jsonl"))
    args = ap.parse_args()
    documents = int(args.documents * args.scale)
    ranks = [int(r) for r in args.ranks.split(",")]

    from megacache.builders.build import megatron_split_sizes

    before = machine_before()
    work = tempfile.mkdtemp(prefix="megacache-bench-")
    try:
        prefix = os.path.join(work, "synthetic_text_document")
        t = time.perf_counter()
        lengths = write_dataset(prefix, documents, args.mean_length, args.sigma, args.seed)
        write_s = time.perf_counter() - t
        train_samples, per_epoch = train_samples_for(lengths, args.split, args.seq_length, args.epochs)
        sizes = megatron_split_sizes(train_samples, None, args.global_batch_size, args.eval_iters,
                                     args.eval_interval)
        mcore_args = {"prefixes": [prefix], "weights": None, "split": args.split, "seed": args.seed, "seq_length": args.seq_length,
                      "sizes": list(sizes), "vocab_size": args.vocab_size}
        build_args = ["--data-path", prefix, "--split", args.split, "--seed", str(args.seed),
                      "--seq-length", str(args.seq_length), "--train-samples", str(train_samples),
                      "--global-batch-size", str(args.global_batch_size), "--eval-iters", str(args.eval_iters),
                      "--eval-interval", str(args.eval_interval), "--tokenizer-type", "NullTokenizer",
                      "--vocab-size", str(args.vocab_size)]
        print(f"{documents:,} documents, {int(lengths.sum(dtype=np.int64)):,} tokens "
              f"(mean {lengths.mean():.0f}, max {lengths.max():,}), written in {write_s:.1f} s; "
              f"L={args.seq_length}, sizes {sizes} ({args.epochs} x {per_epoch:,} train samples/epoch)", flush=True)

        mcore, ours, cache_bytes = compare_builds(mcore_args, build_args, ranks, args.repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    params = {"documents": documents, "tokens": int(lengths.sum(dtype=np.int64)), "mean_length": args.mean_length,
              "sigma": args.sigma, "seq_length": args.seq_length, "split": args.split, "seed": args.seed,
              "epochs": args.epochs, "sizes": list(sizes), "dataset_write_s": write_s}
    record_and_report("build_gpt", {"speedup": 3, "rss_ratio": 0.5}, mcore, ours, cache_bytes, params,
                      args.results, before)


if __name__ == "__main__":
    main()
