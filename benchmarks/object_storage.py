"""megacache on a bucket beside the same work on local disk: ``megacache tokenize`` of generated
text local -> local against bucket -> bucket, then ``megacache build`` of the tokenized dataset (one
prefix, and a blend of two copies of it) from local disk against from the bucket (the ``.idx``
copied into ``--object-storage-cache-path``), each under ``mpiexec -n RANKS``.

The bucket is moto's S3 server on loopback behind the tests' counting proxy
(tests/support/systems/s3server.py), so the bucket's times show the overhead of going through the
S3 API (requests, signing, the proxy's copies), not a network or a real store's latency. The
corpus is ``workloads.make_corpus`` (seeded generated prose) of MEGABYTES, tokenized with a 32k
byte-level BPE trained on the sample corpus; it is uploaded straight to moto, not counted.

Each run is a fresh process after a ``sync``, timed from outside until its output is durable; the
local and bucket runs alternate (local first in even repeats). The bucket's outputs are compared
byte for byte with the local ones (the tokenized ``.bin``/``.idx``; the build's ``.npy`` arrays,
whose names differ only in the hash of the dataset's path). One JSON line per run in
benchmarks/results/object_storage.jsonl: wall seconds, phases, CPU, peak RSS, and for the bucket's
runs the requests by kind and the body bytes uploaded and downloaded, as the proxy counts them.

    python -m benchmarks.object_storage [--megabytes 20] [--ranks 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import filecmp
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
from collections import Counter

from .harness import BenchmarkFailure, append_record, git_commit, kept_on_failure, machine_info, run_program, shown
from .suite import installed
from .workloads import VOCAB_SIZE, make_corpus

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "object_storage.jsonl")
TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
DATASET = "corpus_text_document"
TOKENIZE_FLAGS = ["--append-eod", "--log-interval", "0"]
BUILD_FLAGS = ["--split", "969,30,1", "--seq-length", "1024", "--train-samples", "20000", "--global-batch-size", "32",
               "--eval-iters", "4", "--eval-interval", "200", "--tokenizer-type", "NullTokenizer", "--vocab-size",
               str(VOCAB_SIZE), "--megatron-version", "0.19"]
STEPS = ("tokenize", "build", "build_blend")


def request_kind(method: str, path: str) -> str:
    """The S3 operation a request through the proxy is."""
    query = {item.partition("=")[0] for item in path.partition("?")[2].split("&")}
    if method == "GET":
        return "LIST" if "list-type" in query else "LIST_uploads" if "uploads" in query else "GET"
    if method == "POST":
        return ("DELETE_objects" if "delete" in query else "multipart_complete" if "uploadId" in query
                else "multipart_create")
    if "uploadId" in query:
        return {"PUT": "multipart_part", "DELETE": "multipart_abort"}.get(method, method)
    return method


def traffic(proxy) -> dict:
    """The proxy's requests by kind and body bytes since its last reset."""
    kinds = Counter(request_kind(method, path) for method, path, _ in proxy.requests)
    return {"requests": sum(kinds.values()), "requests_by_kind": dict(sorted(kinds.items())),
            "bytes_uploaded": proxy.uploaded, "bytes_downloaded": proxy.downloaded}


def download(client, bucket: str, key: str, path: str) -> str:
    client.download_file(bucket, key, path)
    return path


def same_files(pairs: list[tuple[str, str]]) -> int:
    """Equal bytes in each pair of files, or a failure naming them; the bytes compared."""
    differ = [a for a, b in pairs if not filecmp.cmp(a, b, shallow=False)]
    if differ:
        raise BenchmarkFailure(f"the bucket's outputs differ from the local ones: {differ}")
    return sum(os.path.getsize(a) for a, _ in pairs)


def cache_arrays(directory: str) -> Counter:
    """The build's ``.npy`` files as (name without the hash, which covers the dataset's path; sha256
    of the bytes; size): a blend's datasets share those names."""
    found = Counter()
    for name in os.listdir(directory):
        if name.endswith(".npy"):
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
            found[(name.split("-", 1)[1], hashlib.sha256(data).hexdigest(), len(data))] += 1
    return found


def same_caches(local: str, bucket: str) -> int:
    """The same arrays under the same names but for the hash, or a failure; the bytes compared."""
    ours, theirs = cache_arrays(local), cache_arrays(bucket)
    if ours != theirs or not ours:
        raise BenchmarkFailure(f"the cache arrays built from the bucket ({bucket}) differ from the local ones "
                               f"({local})")
    return sum(size * n for (_, _, size), n in ours.items())


def measure(megabytes: float, ranks: int, repeats: int, results: str) -> list[dict]:
    from megacache.text.sample_corpus import train_sample_tokenizer

    sys.path.insert(0, TESTS)
    from support.systems.s3server import S3Server

    with kept_on_failure(tempfile.mkdtemp(prefix="megacache-bench-s3-"), "inputs and outputs") as work:
        server = S3Server(work)
        try:
            installed()
            corpus = os.path.join(work, "corpus")
            nbytes, documents = make_corpus(corpus, megabytes)
            tokenizer = train_sample_tokenizer(os.path.join(work, "tokenizer.json"), VOCAB_SIZE, documents=5000,
                                               seed=12345, natural=True)
            unit_bytes = max(1 << 16, nbytes // 16)
            bucket, client = server.bucket(), server.client()
            for name in sorted(os.listdir(corpus)):
                client.upload_file(os.path.join(corpus, name), bucket, f"corpus/{name}")
            env = server.environment()
            tokenize = ["megacache", "tokenize", "--tokenizer", tokenizer, "--unit-bytes", str(unit_bytes),
                        *TOKENIZE_FLAGS]
            machine, commit = machine_info(), git_commit()
            params = {"corpus_bytes": nbytes, "documents": documents, "vocab_size": VOCAB_SIZE, "unit_bytes": unit_bytes,
                      "ranks": ranks, "build_flags": BUILD_FLAGS}
            # megacache's kernels loaded and its code read once, unmeasured (the S3 client's are not)
            run_program([*tokenize, "--input", corpus, "--output-prefix", os.path.join(work, "warm", "corpus")], ranks,
                        work, env=env)
            records = []

            def run(step: str, side: str, repeat: int, first: bool, command: list[str]) -> dict:
                server.proxy.reset()
                load = [round(v, 2) for v in os.getloadavg()]
                done = run_program(command, ranks, work, env=env, durable=True)
                record = {"benchmark": "object_storage", "date": datetime.date.today().isoformat(),
                          "time": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit,
                          "cores": machine["cpus_usable"], "machine": machine, **params, "step": step, "side": side,
                          "repeat": repeat, "first": first, "loadavg_before": load, "wall_s": round(done["wall_s"], 3),
                          "phases": {k: round(v, 3) for k, v in done["phases"].items()},
                          "cpu_s": [round(c, 2) for c in done["cpu_s"]], "rss_kb": done["rss_kb"],
                          **(traffic(server.proxy) if side == "bucket" else {})}
                records.append(record)
                return record

            def order(repeat: int) -> tuple[str, str]:
                return ("local", "bucket") if repeat % 2 == 0 else ("bucket", "local")

            local_prefixes, bucket_prefixes = [], []
            for repeat in range(repeats):
                for side in order(repeat):
                    if side == "local":
                        out = os.path.join(work, f"tok-{repeat}", "corpus")
                        run("tokenize", side, repeat, side == order(repeat)[0],
                            [*tokenize, "--input", corpus, "--output-prefix", out])
                        local_prefixes.append(os.path.join(work, f"tok-{repeat}", DATASET))
                    else:
                        out = f"s3://{bucket}/tok-{repeat}/corpus"
                        run("tokenize", side, repeat, side == order(repeat)[0],
                            [*tokenize, "--input", f"s3://{bucket}/corpus/", "--output-prefix", out])
                        bucket_prefixes.append(f"s3://{bucket}/tok-{repeat}/{DATASET}")
                fetched = os.path.join(work, f"fetched-{repeat}")
                os.makedirs(fetched)
                compared = same_files([(download(client, bucket, f"tok-{repeat}/{DATASET}{suffix}",
                                                 os.path.join(fetched, DATASET + suffix)),
                                        os.path.join(work, f"tok-{repeat}", DATASET + suffix))
                                       for suffix in (".bin", ".idx")])
                for r in records[-2:]:
                    r["identical_bytes"] = compared
                shutil.rmtree(fetched)
                print(f"tokenize {repeat + 1}: " + ", ".join(f"{r['side']} {r['wall_s']:.2f} s" for r in records[-2:])
                      + f", {compared:,} bytes identical", flush=True)

            # builds: one prefix, and a blend of it with a copy of it (two prefixes, two .idx), the copy
            # put in place uncounted
            os.makedirs(os.path.join(work, "copy"))
            for suffix in (".bin", ".idx"):
                os.link(local_prefixes[0] + suffix, os.path.join(work, "copy", DATASET + suffix))
                client.upload_file(local_prefixes[0] + suffix, bucket, f"copy/{DATASET}{suffix}")
            local_prefixes.append(os.path.join(work, "copy", DATASET))
            bucket_prefixes.append(f"s3://{bucket}/copy/{DATASET}")
            blends = {"build": lambda p: ["--data-path", p[0]],
                      "build_blend": lambda p: ["--data-path", "0.6", p[0], "0.4", p[-1]]}
            for step in ("build", "build_blend"):
                for repeat in range(repeats):
                    caches = {}
                    for side in order(repeat):
                        caches[side] = os.path.join(work, f"{step}-{side}-{repeat}")
                        prefixes = local_prefixes if side == "local" else bucket_prefixes
                        where = ["--data-cache-path", caches[side]]
                        if side == "bucket":
                            where += ["--object-storage-cache-path", os.path.join(work, f"idx-{step}-{repeat}")]
                        run(step, side, repeat, side == order(repeat)[0],
                            ["megacache", "build", *blends[step](prefixes), *BUILD_FLAGS, *where])
                    compared = same_caches(caches["local"], caches["bucket"])
                    for r in records[-2:]:
                        r["identical_bytes"] = compared
                    print(f"{step} {repeat + 1}: " + ", ".join(f"{r['side']} {r['wall_s']:.2f} s" for r in records[-2:])
                          + f", {compared:,} bytes identical", flush=True)
            for record in records:
                append_record(results, record)
            return records
        finally:
            server.stop()


def summary(records: list[dict]) -> list[str]:
    """Per step: each side's median wall seconds, and the bucket's median requests and bytes."""
    med = statistics.median
    lines = []
    for step in STEPS:
        local = [r for r in records if r["step"] == step and r["side"] == "local"]
        bucket = [r for r in records if r["step"] == step and r["side"] == "bucket"]
        if not local or not bucket:
            continue
        kinds = sorted({k for r in bucket for k in r["requests_by_kind"]})
        by_kind = ", ".join(f"{k} {med(r['requests_by_kind'].get(k, 0) for r in bucket):g}" for k in kinds)
        lines.append(f"{step}: local {med(r['wall_s'] for r in local):.2f} s, bucket "
                     f"{med(r['wall_s'] for r in bucket):.2f} s; bucket requests {by_kind}; uploaded "
                     f"{med(r['bytes_uploaded'] for r in bucket):,.0f} B, downloaded "
                     f"{med(r['bytes_downloaded'] for r in bucket):,.0f} B; {bucket[0]['identical_bytes']:,} "
                     "bytes identical")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.object_storage", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megabytes", type=float, default=20.0,
                    help="generated jsonl text to tokenize (default 20; at least 1, so that the split's 1%% test "
                         "part holds documents)")
    ap.add_argument("--ranks", type=int, default=2, help="megacache ranks (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side; medians are reported (default 3)")
    ap.add_argument("--results", default=RESULTS, help=f"JSON-lines file to append to (default {shown(RESULTS)})")
    args = ap.parse_args(argv)
    if min(args.megabytes, args.ranks, args.repeats) < 1:
        ap.error("--megabytes, --ranks and --repeats must be at least 1")
    try:
        records = measure(args.megabytes, args.ranks, args.repeats, args.results)
    except BenchmarkFailure as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    print(f"medians of {args.repeats} at P={args.ranks}:")
    for line in summary(records):
        print("  " + line)
    print(f"records appended to {shown(args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
