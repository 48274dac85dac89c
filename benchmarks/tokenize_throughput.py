"""megacache tokenize vs the tokenizer's own encode_batch, on the same text and the same cores.

Both sides run as fresh processes, alternating, in one run:
* raw: one process, the corpus already in memory, ``Tokenizer.encode_batch`` over it in batches
  with the tokenizer's thread pool sized to ``--ranks`` cores; only the encode calls are timed.
  Also ``encode_batch_fast`` (ids without offsets), the stricter baseline: megacache encodes with it;
* megacache: ``mpiexec -n RANKS megacache tokenize`` timed from outside (start-up, reading, JSON
  parsing, writing, merge and publish included).
Throughput is tokens per second; the ratio megacache/raw is the figure of merit (bar: >= 0.90 at
P = 2). Results are appended as a JSON line to ``benchmarks/results/tokenize.jsonl``.

    python benchmarks/tokenize_throughput.py --megabytes 100 --ranks 2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from megacache.sample import train_sample_tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))

RAW = r"""
import json, os, sys, time
os.environ["RAYON_NUM_THREADS"] = sys.argv[3]
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = [json.loads(line)["text"] for path in sorted(os.listdir(sys.argv[2]))
        for line in open(os.path.join(sys.argv[2], path), encoding="utf-8")]
encode = getattr(tok, sys.argv[4])
tokens, t0 = 0, time.perf_counter()
for i in range(0, len(docs), 1024):
    tokens += sum(len(e.ids) for e in encode(docs[i:i + 1024], add_special_tokens=False))
print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": tokens}))
"""


def make_corpus(directory: str, megabytes: float) -> int:
    from megacache.sample import sample_documents

    os.makedirs(directory, exist_ok=True)
    written, shard = 0, 0
    while written < megabytes * 1e6:
        with open(os.path.join(directory, f"shard_{shard}.jsonl"), "w", encoding="utf-8") as f:
            for text in sample_documents(4000, seed=shard):
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                f.write(line)
                written += len(line.encode())
        shard += 1
    return written


def run_raw(tokenizer: str, corpus: str, ranks: int, method: str) -> dict:
    out = subprocess.run([sys.executable, "-c", RAW, tokenizer, corpus, str(ranks), method], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


def run_megacache(tokenizer: str, corpus: str, ranks: int, workdir: str) -> dict:
    prefix = os.path.join(workdir, "out")
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "megacache", "tokenize", "--input", corpus,
           "--output-prefix", prefix, "--tokenizer", tokenizer, "--log-interval", "0"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    from megacache.formats.indexed import IndexedDataset

    ds = IndexedDataset(prefix + "_text_document")
    tokens = int(ds.sequence_lengths.sum(dtype="int64"))
    for ext in (".bin", ".idx"):
        os.unlink(prefix + "_text_document" + ext)
    return {"seconds": seconds, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--megabytes", type=float, default=100)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--results", default=os.path.join(HERE, "results", "tokenize.jsonl"))
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="megacache-bench-")
    try:
        corpus = os.path.join(work, "corpus")
        nbytes = make_corpus(corpus, args.megabytes)
        tokenizer = os.path.join(work, "tokenizer.json")
        train_sample_tokenizer(tokenizer, args.vocab_size, documents=20000, seed=12345)
        raw, fast, ours = [], [], []
        for _ in range(args.repeats):  # alternate, so drift in machine load hits every side
            raw.append(run_raw(tokenizer, corpus, args.ranks, "encode_batch"))
            fast.append(run_raw(tokenizer, corpus, args.ranks, "encode_batch_fast"))
            ours.append(run_megacache(tokenizer, corpus, args.ranks, work))
        assert all(r["tokens"] == f["tokens"] == o["tokens"] for r, f, o in zip(raw, fast, ours)), (raw, ours)
        raw_tps = statistics.median(r["tokens"] / r["seconds"] for r in raw)
        fast_tps = statistics.median(r["tokens"] / r["seconds"] for r in fast)
        our_tps = statistics.median(o["tokens"] / o["seconds"] for o in ours)
        record = {
            "benchmark": "tokenize_throughput", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "processor": platform.processor() or platform.machine()},
            "ranks": args.ranks, "corpus_bytes": nbytes, "tokens": raw[0]["tokens"], "vocab_size": args.vocab_size,
            "raw_seconds": [r["seconds"] for r in raw], "fast_seconds": [r["seconds"] for r in fast],
            "megacache_seconds": [o["seconds"] for o in ours],
            "raw_tokens_per_s_median": raw_tps, "fast_tokens_per_s_median": fast_tps,
            "megacache_tokens_per_s_median": our_tps, "ratio": our_tps / raw_tps, "ratio_fast": our_tps / fast_tps,
            "load_before": os.getloadavg()[0],
        }
        os.makedirs(os.path.dirname(args.results), exist_ok=True)
        with open(args.results, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"corpus {nbytes / 1e6:.0f} MB, {raw[0]['tokens']:,} tokens, P={args.ranks}")
        print(f"raw encode_batch:   {raw_tps:,.0f} tokens/s (median of {args.repeats})")
        print(f"raw encode_batch_fast: {fast_tps:,.0f} tokens/s (median of {args.repeats})")
        print(f"megacache tokenize: {our_tps:,.0f} tokens/s (median of {args.repeats}, wall time incl. start-up)")
        print(f"ratio vs encode_batch: {our_tps / raw_tps:.3f}; vs encode_batch_fast: {our_tps / fast_tps:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
