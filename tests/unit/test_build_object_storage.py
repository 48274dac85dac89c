"""``megacache build`` with a dataset in a bucket, run as a user runs it (``python -m megacache``,
configured through the AWS environment) against moto's S3 server (tests/support/systems/s3server.py): the
.idx read once and the .bin never, ``--dry-run`` too; throttling survived; a missing bucket or object,
or a missing local directory flag, refused with exit 2 naming what is missing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from support.inputs.corpus import run_megacache
from support.systems.s3server import SECRET_KEY, msc_config, own_s3, upload_datasets, s3, s3_server  # noqa: F401 (fixtures)

from megacache.formats.indexed import write_dataset

FLAGS = ["--split", "90,8,2", "--seq-length", "64", "--train-samples", "200", "--eval-iters", "2",
         "--eval-interval", "50", "--global-batch-size", "8", "--tokenizer-type", "NullTokenizer",
         "--vocab-size", "1000", "--megatron-version", "0.19"]


@pytest.fixture
def dataset(s3, tmp_path):
    """``s3://BUCKET/dir/name``: a small dataset uploaded to a new bucket."""
    bucket = s3.bucket()
    rng = np.random.default_rng(5)
    write_dataset(str(tmp_path / "name"), [rng.integers(0, 1000, n).astype(np.uint16)
                                           for n in rng.integers(0, 150, 300)], np.uint16)
    for suffix in (".idx", ".bin"):
        s3.client().upload_file(str(tmp_path / f"name{suffix}"), bucket, f"dir/name{suffix}")
    return bucket


def build(s3, *data_path_and_flags: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megacache", "build", "--data-path", *data_path_and_flags, *FLAGS],
                          env=s3.environment(**env), capture_output=True, text=True, timeout=600)


def test_dry_run_and_build_read_the_index_once(s3, dataset, tmp_path):
    cache, copies = tmp_path / "cache", tmp_path / "idx"
    where = ["--data-cache-path", str(cache), "--object-storage-cache-path", str(copies)]
    dry = build(s3, f"s3://{dataset}/dir/name", "--dry-run", *where)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count(f"  s3://{dataset}/dir/name\n") == 3 and "(3 missing); nothing written" in dry.stdout
    assert not cache.exists()
    assert s3.proxy.count("GET", f"/{dataset}/dir/name.idx") == 1
    s3.proxy.reset()
    done = build(s3, f"s3://{dataset}/dir/name", *where)
    assert done.returncode == 0, done.stderr
    assert s3.proxy.count("GET", f"/{dataset}/dir/name.idx") == 1
    assert [r for r in s3.proxy.requests if r[0] == "GET" and not r[1].endswith(".idx")] == []
    assert len([n for n in os.listdir(cache) if n.endswith(".npy")]) == 9
    assert (copies / dataset / "dir" / "name.idx").read_bytes() == (tmp_path / "name.idx").read_bytes()


def test_throttling_survived(s3, dataset, tmp_path):
    s3.proxy.fail(lambda method, path: method == "GET" and path.startswith(f"/{dataset}/dir/name.idx"), times=2)
    done = build(s3, f"s3://{dataset}/dir/name", "--data-cache-path", str(tmp_path / "cache"),
                 "--object-storage-cache-path", str(tmp_path / "idx"))
    assert done.returncode == 0, done.stderr
    assert s3.proxy.count("GET", f"/{dataset}/dir/name.idx") == 3
    assert len([n for n in os.listdir(tmp_path / "cache") if n.endswith(".npy")]) == 9


def test_missing_bucket_object_and_directories(s3, dataset, tmp_path):
    where = ["--data-cache-path", str(tmp_path / "cache"), "--object-storage-cache-path", str(tmp_path / "idx")]
    missing_key = build(s3, f"s3://{dataset}/dir/other", *where)
    assert (missing_key.returncode, missing_key.stdout) == (2, "")
    assert missing_key.stderr == (f"megacache build: error: s3://{dataset}/dir/other.idx (bucket '{dataset}', key "
                                  f"'dir/other.idx'): index file not found (give each prefix as training gets it: the "
                                  f"path without .idx/.bin)\n")
    missing_bucket = build(s3, "s3://no-such-bucket-53/dir/name", *where)
    assert missing_bucket.returncode == 2
    assert missing_bucket.stderr.startswith("megacache build: error: s3://no-such-bucket-53/dir/name.idx (bucket "
                                            "'no-such-bucket-53', key 'dir/name.idx'): no bucket 'no-such-bucket-53' at "
                                            "http://127.0.0.1:")
    no_copies = build(s3, f"s3://{dataset}/dir/name", "--data-cache-path", str(tmp_path / "cache"))
    assert (no_copies.returncode, no_copies.stderr) == (2, f"megacache build: error: s3://{dataset}/dir/name: a dataset "
                                                           f"in a bucket needs --object-storage-cache-path DIR, as "
                                                           f"training does (each .idx is copied there and read)\n")
    no_cache = build(s3, f"s3://{dataset}/dir/name", "--object-storage-cache-path", str(tmp_path / "idx"))
    assert (no_cache.returncode, no_cache.stderr) == (2, f"megacache build: error: s3://{dataset}/dir/name: a dataset "
                                                         f"in a bucket needs --data-cache-path DIR, a local directory "
                                                         f"for the caches (give training the same)\n")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "idx").exists()
    for done in (missing_key, missing_bucket, no_copies, no_cache):
        assert SECRET_KEY not in done.stderr + done.stdout


def test_msc_profile_builds_what_s3_builds(s3, dataset, tmp_path):
    """The same bucket through an msc:// profile: the same arrays (the hash differs: it covers the
    path string)."""
    config = msc_config(s3, str(tmp_path / "msc.json"), "corpus", dataset)
    for name, path in (("s3", f"s3://{dataset}/dir/name"), ("msc", "msc://corpus/dir/name")):
        done = build(s3, path, "--data-cache-path", str(tmp_path / name), "--object-storage-cache-path",
                     str(tmp_path / "idx"), MSC_CONFIG=config)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "idx" / "corpus" / "dir" / "name.idx").read_bytes() == (tmp_path / "name.idx").read_bytes()

    def arrays(directory):
        return sorted((n.split("-", 1)[1], (directory / n).read_bytes()) for n in os.listdir(directory)
                      if n.endswith(".npy"))

    assert arrays(tmp_path / "msc") == arrays(tmp_path / "s3") and len(arrays(tmp_path / "s3")) == 9


def index_gets(s3, prefixes) -> list[int]:
    return [s3.proxy.count("GET", p[len("s3:/"):] + ".idx") for p in prefixes]


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_weighted_blend_of_fifty_reads_each_index_once(s3, tmp_path, ranks):
    """A 50-dataset weighted blend named in a --data-args-path file: each .idx read once in all,
    by the rank that surveys it, on one rank or two; no .bin byte read, its size asked twice; no
    sequences file (megatron-core reads it for local prefixes only)."""
    prefixes = upload_datasets(s3, tmp_path / "local", 50, seed=50)
    args = tmp_path / "blend.txt"
    args.write_text("\n".join(f"{i % 7 + 1} {p}" for i, p in enumerate(prefixes)) + "\n")
    cache = tmp_path / "cache"
    s3.proxy.reset()
    done = run_megacache(ranks, "build", "--data-args-path", str(args), *FLAGS, "--data-cache-path", str(cache),
                         "--object-storage-cache-path", str(tmp_path / "idx"))
    assert index_gets(s3, prefixes) == [1] * 50
    assert [r for r in s3.proxy.requests if r[0] == "GET" and not r[1].endswith(".idx")] == []
    # the .bin's size: rank 0's check that it exists, and its surveyor's (the other ranks reuse it)
    assert [s3.proxy.count("HEAD", p[len("s3:/"):] + ".bin") for p in prefixes] == [2] * 50
    for i, p in enumerate(prefixes):
        assert (tmp_path / "idx" / p[len("s3://"):]).with_suffix(".idx").read_bytes() == \
            (tmp_path / "local" / f"part{i:02d}.idx").read_bytes()
    assert not (cache / "sequences_per_dataset.json").exists()
    assert "--per-dataset-sequences-path" not in done.stdout
    assert len([n for n in os.listdir(cache) if n.endswith(".npy")]) == 50 * 9 + 3 * 2
    assert SECRET_KEY not in done.stdout + done.stderr


@pytest.mark.slow
def test_per_split_blends_share_one_read_per_index(s3, tmp_path):
    """--per-split-data-args-path naming bucket prefixes, some in two splits: one GET per .idx on
    two ranks."""
    prefixes = upload_datasets(s3, tmp_path / "local", 6, seed=6)
    spec = {"train": f"3 {prefixes[0]} 2 {prefixes[1]} 1 {prefixes[2]}", "valid": [prefixes[2], prefixes[3]],
            "test": [prefixes[4], prefixes[5], prefixes[0]]}
    args = tmp_path / "splits.json"
    args.write_text(json.dumps(spec))
    cache = tmp_path / "cache"
    s3.proxy.reset()
    run_megacache(2, "build", "--per-split-data-args-path", str(args), *FLAGS[2:], "--data-cache-path", str(cache),
                  "--object-storage-cache-path", str(tmp_path / "idx"))
    assert index_gets(s3, prefixes) == [1] * 6
    assert len([n for n in os.listdir(cache) if n.endswith(".npy")]) == 3 * 2 + (3 + 2 + 3) * 3


def test_sequences_file_lists_the_local_prefixes(s3, dataset, tmp_path):
    """A blend of a bucket's prefix and a local one: the sequences file lists the local one, the
    only one megatron-core looks up there; asked for by name with only bucket prefixes, refused."""
    local = str(tmp_path / "name")
    where = ["--data-cache-path", str(tmp_path / "cache"), "--object-storage-cache-path", str(tmp_path / "idx")]
    done = build(s3, "1", f"s3://{dataset}/dir/name", "2", local, *where)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "cache" / "sequences_per_dataset.json").read_text()) == {local: [295, 301]}
    named = build(s3, f"s3://{dataset}/dir/name", *where, "--per-dataset-sequences-path", str(tmp_path / "seq.json"))
    assert (named.returncode, named.stderr) == (2, f"megacache build: error: --per-dataset-sequences-path "
                                                   f"{tmp_path / 'seq.json'}: every dataset is in a bucket, and "
                                                   f"megatron-core reads that file only for local prefixes (a prefix "
                                                   f"in a bucket has its .idx header read from the copy); leave the "
                                                   f"flag out\n")


@pytest.mark.slow
def test_server_killed_mid_build_leaves_nothing_and_a_rerun_completes(own_s3, tmp_path):
    """moto killed while the .idx files are downloaded (a slow store makes the window): exit 2
    naming the object, no cache written, only whole .idx copies; with the store back the same
    command completes."""
    prefixes = upload_datasets(own_s3, tmp_path / "local", 6, seed=7)
    bucket = prefixes[0].split("/")[2]
    (tmp_path / "blend.txt").write_text(" ".join(f"1 {p}" for p in prefixes))
    cache, copies = tmp_path / "cache", tmp_path / "idx"
    command = [sys.executable, "-m", "megacache", "build", "--data-args-path", str(tmp_path / "blend.txt"), *FLAGS,
               "--data-cache-path", str(cache), "--object-storage-cache-path", str(copies)]
    own_s3.proxy.latency = 0.3
    job = subprocess.Popen(command, env=own_s3.environment(AWS_MAX_ATTEMPTS="2"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(m == "GET" and p.endswith(".idx") for m, p, _ in own_s3.proxy.requests):
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.02)
    own_s3.kill()
    out, err = job.communicate(timeout=300)
    assert job.returncode == 2, err
    assert re.fullmatch(rf"megacache build: error: 1 rank\(s\) failed during opening the datasets:\n  rank 0: "
                        rf"s3://{bucket}/(tok/part\d\d\.(idx|bin)) \(bucket '{bucket}', key "
                        rf"'\1'\): [a-z ]+ failed at {own_s3.proxy.url}: \w+; is the endpoint \(AWS_ENDPOINT_URL\) "
                        rf"reachable\?\n", err), err
    assert not cache.exists() or not [n for n in os.listdir(cache) if not n.startswith(".")]
    left = [os.path.join(d, n) for d, _, names in os.walk(copies) for n in names]
    assert all(os.path.basename(f) in os.listdir(tmp_path / "local") for f in left), left
    for f in left:
        assert open(f, "rb").read() == (tmp_path / "local" / os.path.basename(f)).read_bytes()

    own_s3.start()
    own_s3.client().create_bucket(Bucket=bucket)
    for name in sorted(os.listdir(tmp_path / "local")):
        own_s3.client().upload_file(str(tmp_path / "local" / name), bucket, f"tok/{name}")
    own_s3.proxy.latency = 0.0
    again = subprocess.run(command, env=own_s3.environment(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert len([n for n in os.listdir(cache) if n.endswith(".npy")]) == 6 * 9 + 3 * 2


def test_wrong_credentials_exit_2_naming_the_bucket_and_no_secret(own_s3, tmp_path):
    """A store that knows none of the user's keys: exit 2 naming the bucket and key, no secret."""
    prefix, = upload_datasets(own_s3, tmp_path / "local", 1, seed=1)
    bucket = prefix.split("/")[2]
    own_s3.enforce_credentials()
    done = build(own_s3, prefix, "--data-cache-path", str(tmp_path / "cache"), "--object-storage-cache-path",
                 str(tmp_path / "idx"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"megacache build: error: {prefix}.idx (bucket '{bucket}', key 'tok/part00.idx'): reading "
                           f"the size refused (403): the credentials are wrong or may not access bucket '{bucket}'; "
                           f"check AWS_ACCESS_KEY_ID/AWS_PROFILE\n")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "idx").exists()
