"""``verify``, ``inspect``, ``open_cache`` and ``TokenDataset`` on a dataset in a bucket, against
moto's S3 server (tests/support/systems/s3server.py), configured through the AWS environment as a user
configures it: the same verdicts, summaries and samples as from the same files on disk; the
``.idx`` read whole once, the ``.bin`` by ranged requests for the bytes asked only; a missing
object or refused credentials an exit 2 naming the bucket and key."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from support.inputs.corpus import run_megacache
from support.systems.s3server import SECRET_KEY, msc_config, own_s3, s3, s3_server, upload_datasets  # noqa: F401 (fixtures)

from megacache.algorithms.blocks import BLOCK
from megacache.errors import MegacacheError
from megacache.formats.indexed import write_dataset
from megacache.interfaces.api import BuildConfig, build, open_cache, tokenizer_identifiers
from megacache.megatron.blends import parse_blend

SEQ_LENGTH = 64
#: bytes per token of the datasets (uint16)
TOKEN_BYTES = 2


def megacache(server, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megacache", *args], env=server.environment(**env),
                          capture_output=True, text=True, timeout=600)


def upload(server, local: str, bucket: str, key: str) -> str:
    """The dataset ``local`` (a prefix) put at ``s3://bucket/key``; that prefix."""
    for suffix in (".idx", ".bin"):
        server.client().upload_file(local + suffix, bucket, key + suffix)
    return f"s3://{bucket}/{key}"


@pytest.fixture
def dataset(s3, tmp_path):
    """``(local prefix, s3://BUCKET/dir/name)``: one small dataset on disk and in a new bucket."""
    rng = np.random.default_rng(11)
    local = str(tmp_path / "local" / "name")
    os.makedirs(os.path.dirname(local))
    write_dataset(local, [rng.integers(0, 1000, n).astype(np.uint16) for n in rng.integers(0, 150, 100)], np.uint16)
    return local, upload(s3, local, s3.bucket(), "dir/name")


def object_path(url: str) -> str:
    """The request path of an ``s3://`` URL."""
    return url[len("s3:/"):]


def ranges(server, url: str) -> list[str | None]:
    """The Range header of each GET of ``url`` at the server (None: the whole object)."""
    return [r for m, p, r in server.proxy.requests if m == "GET" and p.split("?", 1)[0] == object_path(url)]


def spans(server, url: str) -> list[tuple[int, int]]:
    """The byte spans ``[first, last + 1)`` the GETs of ``url`` asked for, all of them ranged."""
    got = ranges(server, url)
    assert None not in got, got
    return [(int(a), int(b) + 1) for a, b in (re.fullmatch(r"bytes=(\d+)-(\d+)", r).groups() for r in got)]


def same_text(ours: str, local: str, remote: str) -> str:
    """``ours`` with the bucket's prefix written as the local one, and the time taken left out."""
    return re.sub(r" in [0-9.]+ s on", " in T s on", ours.replace(remote, local))


# ---------------------------------------------------------------------------------------------
# verify and inspect


def test_verify_and_inspect_say_what_they_say_of_the_local_files(s3, dataset):
    local, remote = dataset
    for args in (["verify", "--vocab-size", "1000"], ["verify", "--vocab-size", "500"], ["inspect"]):
        here = megacache(s3, *args, local)
        s3.proxy.reset()
        there = megacache(s3, *args, remote)
        assert (there.returncode, same_text(there.stdout, local, remote), there.stderr.replace(remote, local)) == \
            (here.returncode, same_text(here.stdout, local, remote), here.stderr), args
        # the index read whole, once; the tokens only for the vocabulary check, by a ranged read
        assert ranges(s3, remote + ".idx") == [None]
        assert spans(s3, remote + ".bin") == ([] if args == ["inspect"] else [(0, os.path.getsize(local + ".bin"))])
        assert s3.proxy.count("HEAD", object_path(remote + ".bin")) == 1
    assert here.returncode == 0 and here.stdout.startswith(f"dataset {local}\n  dtype uint16, ")
    failed = megacache(s3, "verify", "--vocab-size", "500", remote)
    assert failed.returncode == 2
    assert re.fullmatch(rf"FAIL {remote}\n  {remote}.bin: token \d+ has id \d+, outside the vocabulary of size 500\n",
                        failed.stdout), failed.stdout


def test_verify_reads_the_bin_a_block_at_a_time(s3, tmp_path):
    """A .bin of more than two blocks: three ranged reads of at most a block each, covering it once."""
    rng = np.random.default_rng(3)
    local = str(tmp_path / "big")
    tokens = 2 * BLOCK + 123_457
    write_dataset(local, np.array_split(rng.integers(0, 250, tokens).astype(np.uint8), 900), np.uint8)
    remote = upload(s3, local, s3.bucket(), "big/name")
    s3.proxy.reset()
    done = megacache(s3, "verify", "--vocab-size", "250", remote)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok   {remote}: 900 documents, 900 sequences, {tokens:,} tokens (uint8)\n")
    assert spans(s3, remote + ".bin") == [(0, BLOCK), (BLOCK, 2 * BLOCK), (2 * BLOCK, tokens)]
    assert ranges(s3, remote + ".idx") == [None]


def test_verify_on_two_ranks_reads_each_index_once(s3, tmp_path):
    """Four bucket prefixes shared out over two ranks, progress shown (no local directory to keep
    the ranks' counts in): each .idx read once in all, each .bin once, by ranged reads."""
    prefixes = upload_datasets(s3, tmp_path / "local", 4, seed=4)
    s3.proxy.reset()
    done = run_megacache(2, "verify", "--vocab-size", "1000", "--progress-interval", "0.01", *prefixes)
    lines = done.stdout.splitlines()
    assert [line.split(": ", 1)[0] for line in lines[:4]] == [f"ok   {p}" for p in prefixes]
    assert lines[4].startswith("megacache verify: all 4 dataset(s) and cache entries passed in ")
    assert lines[4].endswith(" on 2 rank(s)")
    for i, p in enumerate(prefixes):
        assert ranges(s3, p + ".idx") == [None]
        assert spans(s3, p + ".bin") == [(0, os.path.getsize(tmp_path / "local" / f"part{i:02d}.bin"))]


def test_verify_and_inspect_of_a_cache_built_from_a_bucket(s3, dataset, tmp_path):
    """The entries of a bucket's dataset checked against that dataset (its index copied once per
    rank), and their epochs shown, as for the entries of the same files on disk."""
    local, remote = dataset
    caches = {}
    for name, prefix in (("here", local), ("there", remote)):
        caches[name] = str(tmp_path / f"cache-{name}")
        build(config(prefix, caches[name], str(tmp_path / "idx")))

    def words(text: str) -> str:
        """What a command says of either cache, its names and the time taken left out (the local
        cache also holds the sequences file, which names the local prefixes only)."""
        text = same_text(text, local, remote).replace(caches["there"], caches["here"])
        return re.sub(r"[0-9a-f]{32}", "HASH", text).replace("  1 other files ignored\n", "")

    for command in ("verify", "inspect"):
        here = megacache(s3, command, caches["here"], "--megatron-version", "0.19")
        s3.proxy.reset()
        there = megacache(s3, command, caches["there"], "--megatron-version", "0.19")
        assert here.returncode == there.returncode == 0, there.stdout + there.stderr
        assert words(there.stdout) == words(here.stdout)
        assert there.stdout.count(" epoch(s)") == 3
        assert ranges(s3, remote + ".idx") == ([None] if command == "verify" else ["bytes=0-33"])
        assert ranges(s3, remote + ".bin") == []


def test_a_bucket_file_of_another_format_is_refused(s3):
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="d/x.pbin", Body=b"0" * 64)
    for command in ("verify", "inspect"):
        done = megacache(s3, command, f"s3://{bucket}/d/x.pbin")
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == (f"megacache {command}: error: s3://{bucket}/d/x.pbin (bucket '{bucket}', key 'd/x.pbin'): "
                               f"a pbin file is read from a local path only (of the datasets in buckets, Megatron "
                               f".bin/.idx prefixes are read in place); copy it from the bucket first\n")


# ---------------------------------------------------------------------------------------------
# open_cache and TokenDataset


def config(prefix: str, cache: str, copies: str) -> BuildConfig:
    return BuildConfig(blend=parse_blend([prefix]), split="90,8,2", seq_length=SEQ_LENGTH, sizes=(40, 10, 5),
                       tokenizer=tokenizer_identifiers("NullTokenizer", "0.19", vocab_size=1000), megatron_version="0.19",
                       cache_dir=cache, object_cache=copies)


def read_tokens(samples) -> int:
    """Tokens a pass over every sample reads from the ``.bin``: all but the padding (pad id -1)."""
    return sum(int(np.count_nonzero(samples[k] != -1)) for k in range(len(samples)))


def test_open_cache_reads_the_samples_of_the_local_files_by_ranged_reads(s3, dataset, tmp_path):
    local, remote = dataset
    ours = {}
    for name, prefix in (("here", local), ("there", remote)):
        build(config(prefix, str(tmp_path / f"cache-{name}"), str(tmp_path / "idx")))
        s3.proxy.reset()
        ours[name] = open_cache(config(prefix, str(tmp_path / f"cache-{name}"), str(tmp_path / "idx")))
    assert ranges(s3, remote + ".idx") == [None] and ranges(s3, remote + ".bin") == []
    assert list(ours["there"]) == list(ours["here"]) == ["train", "valid", "test"]
    s3.proxy.reset()
    for split in ours["here"]:
        here, there = ours["here"][split], ours["there"][split]
        assert len(there) == len(here) > 0
        for k in range(len(here)):
            assert np.array_equal(there[k], here[k]), (split, k)
            assert np.array_equal(there.document_ids(k), here.document_ids(k))
    # one ranged read per document a sample spans, of that document's tokens in the sample only
    read = spans(s3, remote + ".bin")
    assert sum(b - a for a, b in read) == TOKEN_BYTES * sum(read_tokens(ours["here"][split]) for split in ours["here"])
    assert max(b - a for a, b in read) <= TOKEN_BYTES * (SEQ_LENGTH + 1)
    assert len(read) >= sum(len(s) for s in ours["here"].values())
    assert ranges(s3, remote + ".idx") == []


def test_token_dataset_in_dataloader_workers(s3, dataset, tmp_path):
    """TokenDataset over a bucket's dataset in two forked DataLoader workers: the batches of the
    local files, each worker with its own client."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from megacache.interfaces.torchdata import TokenDataset

    local, remote = dataset
    loaded, samples = {}, {}
    for name, prefix in (("here", local), ("there", remote)):
        cfg = config(prefix, str(tmp_path / f"cache-{name}"), str(tmp_path / "idx"))
        build(cfg)
        samples[name] = open_cache(cfg)["train"]
        train = TokenDataset(samples[name])
        assert torch.equal(train[7], torch.from_numpy(samples[name][7]))
        s3.proxy.reset()
        loader = DataLoader(train, batch_size=16, num_workers=2, multiprocessing_context="fork")
        loaded[name] = list(loader)
    assert len(loaded["there"]) == len(loaded["here"]) == -(-len(train) // 16)
    for a, b in zip(loaded["there"], loaded["here"]):
        assert a.dtype == torch.int64 and torch.equal(a, b)
    # the workers' reads: ranged, of the samples' tokens only
    read = spans(s3, remote + ".bin")
    assert len(read) >= len(train) and sum(b - a for a, b in read) == TOKEN_BYTES * read_tokens(samples["here"])


def test_msc_profile(s3, dataset, tmp_path, monkeypatch):
    """The same bucket through a multi-storage-client profile: verify's and inspect's words and
    open_cache's samples those of the local files; the .bin read by ranged requests."""
    local, remote = dataset
    bucket = remote.split("/")[2]
    # a profile of this test's own: multi-storage-client keeps a process's clients by profile name
    config_file = msc_config(s3, str(tmp_path / "msc.json"), f"corpus-{bucket}", bucket)
    msc = f"msc://corpus-{bucket}/dir/name"
    for args in (["verify", "--vocab-size", "1000"], ["inspect"]):
        here = megacache(s3, *args, local)
        there = megacache(s3, *args, msc, MSC_CONFIG=config_file)
        assert there.returncode == here.returncode == 0, there.stderr
        assert same_text(there.stdout, local, msc) == same_text(here.stdout, local, msc)
    monkeypatch.setenv("MSC_CONFIG", config_file)
    for name, prefix in (("here", local), ("there", msc)):
        build(config(prefix, str(tmp_path / f"cache-{name}"), str(tmp_path / "idx")))
    s3.proxy.reset()
    here = open_cache(config(local, str(tmp_path / "cache-here"), str(tmp_path / "idx")))["train"]
    there = open_cache(config(msc, str(tmp_path / "cache-there"), str(tmp_path / "idx")))["train"]
    assert len(there) == len(here)
    for k in range(len(here)):
        assert np.array_equal(there[k], here[k]), k
    assert ranges(s3, remote + ".idx") == [None]
    assert sum(b - a for a, b in spans(s3, remote + ".bin")) == TOKEN_BYTES * read_tokens(here)


# ---------------------------------------------------------------------------------------------
# Errors


def test_missing_objects_and_bucket(s3, dataset, tmp_path):
    local, remote = dataset
    bucket = remote.split("/")[2]
    other = f"s3://{bucket}/dir/other"
    done = megacache(s3, "verify", other)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, f"FAIL {other}\n  {other}.idx (bucket '{bucket}', key 'dir/other.idx'): index file not found\n",
        f"megacache verify: error: 1 of 1 dataset(s) or cache entries failed verification: {other}\n")
    done = megacache(s3, "inspect", other)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"megacache inspect: error: {other}.idx (bucket '{bucket}', key 'dir/other.idx'): index file not found\n")
    s3.client().copy_object(Bucket=bucket, Key="dir/lone.idx", CopySource={"Bucket": bucket, "Key": "dir/name.idx"})
    lone = f"s3://{bucket}/dir/lone"
    done = megacache(s3, "verify", lone)
    assert (done.returncode, done.stdout) == (
        2, f"FAIL {lone}\n  {lone}.bin (bucket '{bucket}', key 'dir/lone.bin'): token file not found (its index "
           f"{lone}.idx exists)\n")
    for command in ("verify", "inspect"):
        done = megacache(s3, command, "s3://no-such-bucket-71/dir/name")
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr.startswith(f"megacache {command}: error: s3://no-such-bucket-71/dir/name.idx (bucket "
                                      f"'no-such-bucket-71', key 'dir/name.idx'): no bucket 'no-such-bucket-71' at "
                                      f"http://127.0.0.1:"), done.stderr
        assert SECRET_KEY not in done.stderr

    # the .bin gone after the cache was opened: the sample that reads it says so
    cfg = config(remote, str(tmp_path / "cache"), str(tmp_path / "idx"))
    build(cfg)
    train = open_cache(cfg)["train"]
    s3.client().delete_object(Bucket=bucket, Key="dir/name.bin")
    with pytest.raises(MegacacheError) as gone:
        train[0]
    assert str(gone.value) == f"{remote}.bin (bucket '{bucket}', key 'dir/name.bin'): bucket '{bucket}' has no " \
                              f"object 'dir/name.bin'"


def test_wrong_credentials_exit_2_naming_the_bucket_and_no_secret(own_s3, tmp_path):
    prefix, = upload_datasets(own_s3, tmp_path / "local", 1, seed=2)
    bucket = prefix.split("/")[2]
    own_s3.enforce_credentials()
    refused = (f"{prefix}.idx (bucket '{bucket}', key 'tok/part00.idx'): reading the size refused (403): the "
               f"credentials are wrong or may not access bucket '{bucket}'; check AWS_ACCESS_KEY_ID/AWS_PROFILE")
    for command in ("verify", "inspect"):
        done = megacache(own_s3, command, prefix)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"megacache {command}: error: {refused}\n")
