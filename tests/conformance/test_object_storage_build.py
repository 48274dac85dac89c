"""Acceptance (issue 53): ``megacache build --data-path s3://BUCKET/dir/name`` against a real S3 API
server (moto's, tests/support/systems/s3server.py) writes byte for byte the caches, under the same names, that
megatron-core 0.19.2 writes building from the same s3:// path against the same server itself (its
object-storage path: the .idx copied into ``object_storage_cache_path``, the .bin left in the
bucket); megatron-core then loads megacache's caches without building. megacache reads the .idx
once (a GET counted at the server) and never the .bin.

megatron-core reads s3:// paths with boto3, which its test environment (tests/megatron_oracles.sh)
installs for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from support.oracles.environments import ask
from support.systems.s3server import msc_config, s3, s3_server, upload_datasets  # noqa: F401 (fixtures)
from support.sweeps import snapshot

from megacache.formats.indexed import write_dataset
from megacache.megatron.training import split_sizes

pytestmark = pytest.mark.oracle_environments

VERSION = "0.19"
SIZE_FLAGS = dict(train_samples=200, eval_iters=2, eval_interval=50, global_batch_size=8)
TOKENIZER = {"tokenizer_type": "NullTokenizer", "vocab_size": 1000}


def megacache_build(data_path: str | None, cache: str, object_cache: str, env: dict, *extra: str):
    data = ["--data-path", data_path, "--split", "90,8,2"] if data_path else []
    command = [sys.executable, "-m", "megacache", "build", *data,
               "--seq-length", "64", "--seed", "1234", "--megatron-version", VERSION,
               "--tokenizer-type", TOKENIZER["tokenizer_type"], "--vocab-size", str(TOKENIZER["vocab_size"]),
               "--data-cache-path", cache, "--object-storage-cache-path", object_cache, "--per-dataset-sequences-path",
               "", *extra]
    for flag, value in SIZE_FLAGS.items():
        command += [f"--{flag.replace('_', '-')}", str(value)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def cache_files(directory) -> dict:
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
            if not name.startswith(".")}


def test_build_from_s3_equals_megatron_building_from_s3(s3, tmp_path):
    bucket = s3.bucket()
    rng = np.random.default_rng(53)
    documents = [rng.integers(0, 1000, n).astype(np.uint16) for n in rng.integers(0, 150, 400)]
    write_dataset(str(tmp_path / "name"), documents, np.uint16)
    for suffix in (".idx", ".bin"):
        s3.client().upload_file(str(tmp_path / f"name{suffix}"), bucket, f"dir/name{suffix}")
    data_path = f"s3://{bucket}/dir/name"
    sizes = list(split_sizes(VERSION, None, **SIZE_FLAGS))
    config = dict(seed=1234, seq_length=64, add_extra_token=True, drop_last_partial_validation=True, sizes=sizes,
                  split="90,8,2", blend=[[data_path], None], tokenizer=TOKENIZER, tokenizer_cwd=str(tmp_path))

    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    assert ask(VERSION, {"task": "caches", "configs": [dict(config, path_to_cache=str(theirs),
               object_storage_cache_path=str(tmp_path / "their-idx"))]}) == [None]
    # megatron-core copies the .idx to <object_storage_cache_path>/<bucket>/<key>
    their_copy = tmp_path / "their-idx" / bucket / "dir" / "name.idx"
    assert their_copy.read_bytes() == (tmp_path / "name.idx").read_bytes()

    s3.proxy.reset()
    done = megacache_build(data_path, str(ours), str(tmp_path / "our-idx"), s3.environment())
    assert done.returncode == 0, done.stderr
    assert s3.proxy.count("GET", f"/{bucket}/dir/name.idx") == 1
    assert s3.proxy.count("GET", f"/{bucket}/dir/name.bin") == 0
    assert (tmp_path / "our-idx" / bucket / "dir" / "name.idx").read_bytes() == their_copy.read_bytes()

    mine, megatrons = cache_files(ours), cache_files(theirs)
    assert len(megatrons) == 12  # three splits, four files each
    assert list(mine) == list(megatrons)
    for name in megatrons:
        assert mine[name] == megatrons[name], name
    assert f'"dataset_path": "{data_path}"' in megatrons[next(n for n in megatrons if n.endswith("train-description.txt"))].decode()

    # megatron-core finds megacache's caches and loads them: nothing in the directory changes
    before = snapshot(str(ours))
    assert ask(VERSION, {"task": "caches", "configs": [dict(config, path_to_cache=str(ours),
               object_storage_cache_path=str(tmp_path / "their-idx"))]}) == [None]
    assert snapshot(str(ours)) == before


def megatron_words(prefixes, weights) -> list[str]:
    return list(prefixes) if weights is None else [w for pair in zip(map(str, weights), prefixes) for w in pair]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["weighted blend of 50", "per-split"])
def test_blends_from_s3_equal_megatron_building_from_s3(s3, tmp_path, kind):
    """A 50-dataset weighted blend named in a --data-args-path file, and per-split blends in a
    --per-split-data-args-path file, all of s3:// prefixes: megacache writes megatron-core's files
    under its names, each .idx read once, and megatron-core loads them without building."""
    prefixes = upload_datasets(s3, tmp_path / "local", 50 if kind == "weighted blend of 50" else 5, seed=len(kind))
    sizes = list(split_sizes(VERSION, None, **SIZE_FLAGS))
    config = dict(seed=1234, seq_length=64, add_extra_token=True, drop_last_partial_validation=True, sizes=sizes,
                  tokenizer=TOKENIZER, tokenizer_cwd=str(tmp_path))
    if kind == "weighted blend of 50":
        weights = [float(i % 7 + 1) for i in range(50)]
        config.update(split="90,8,2", blend=[prefixes, weights])
        (tmp_path / "blend.txt").write_text(" ".join(megatron_words(prefixes, weights)))
        data = ["--data-args-path", str(tmp_path / "blend.txt"), "--split", "90,8,2"]
    else:
        per_split = [[prefixes[:3], [3.0, 2.0, 1.0]], [prefixes[2:4], None], [[prefixes[4], prefixes[0]], [1.0, 4.0]]]
        config.update(split=None, blend_per_split=per_split)
        (tmp_path / "splits.json").write_text(json.dumps(dict(zip(("train", "valid", "test"),
                                                                  (megatron_words(*b) for b in per_split)))))
        data = ["--per-split-data-args-path", str(tmp_path / "splits.json")]

    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    assert ask(VERSION, {"task": "caches", "configs": [dict(config, path_to_cache=str(theirs),
               object_storage_cache_path=str(tmp_path / "their-idx"))]}) == [None]

    s3.proxy.reset()
    done = megacache_build(None, str(ours), str(tmp_path / "our-idx"), s3.environment(), *data)
    assert done.returncode == 0, done.stderr
    assert [s3.proxy.count("GET", p[len("s3:/"):] + ".idx") for p in prefixes] == [1] * len(prefixes)
    assert [r for r in s3.proxy.requests if r[0] == "GET" and not r[1].endswith(".idx")] == []
    for p in prefixes:
        copy = p[len("s3://"):] + ".idx"
        assert (tmp_path / "our-idx" / copy).read_bytes() == (tmp_path / "their-idx" / copy).read_bytes()

    mine, megatrons = cache_files(ours), cache_files(theirs)
    assert len(megatrons) > 4 * len(prefixes)
    assert list(mine) == list(megatrons)
    for name in megatrons:
        assert mine[name] == megatrons[name], name

    before = snapshot(str(ours))
    assert ask(VERSION, {"task": "caches", "configs": [dict(config, path_to_cache=str(ours),
               object_storage_cache_path=str(tmp_path / "their-idx"))]}) == [None]
    assert snapshot(str(ours)) == before


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["one prefix", "weighted blend"])
def test_msc_profile_equals_megatron_with_enable_msc(s3, tmp_path, monkeypatch, kind):
    """msc:// paths through a multi-storage-client profile file (MSC_CONFIG) naming the bucket:
    megacache writes the files megatron-core 0.19.2 writes with --enable-msc, under the same names
    (hashed from the msc:// strings), copying each .idx to <object_storage_cache_path>/<profile>/<path>
    as it does, with one GET per .idx."""
    buckets = upload_datasets(s3, tmp_path / "local", 1 if kind == "one prefix" else 5, seed=len(kind))
    bucket = buckets[0].split("/")[2]
    monkeypatch.setenv("MSC_CONFIG", msc_config(s3, str(tmp_path / "msc.json"), "corpus", bucket))
    prefixes = [f"msc://corpus/{p.split('/', 3)[3]}" for p in buckets]
    weights = None if kind == "one prefix" else [float(i + 1) for i in range(len(prefixes))]
    sizes = list(split_sizes(VERSION, None, **SIZE_FLAGS))
    config = dict(seed=1234, seq_length=64, add_extra_token=True, drop_last_partial_validation=True, sizes=sizes,
                  split="90,8,2", blend=[prefixes, weights], tokenizer=TOKENIZER, tokenizer_cwd=str(tmp_path),
                  enable_msc=True)

    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    assert ask(VERSION, {"task": "caches", "configs": [dict(config, path_to_cache=str(theirs),
               object_storage_cache_path=str(tmp_path / "their-idx"))]}) == [None]
    s3.proxy.reset()
    done = megacache_build(None, str(ours), str(tmp_path / "our-idx"),
                           s3.environment(MSC_CONFIG=os.environ["MSC_CONFIG"]),
                           "--data-path", *megatron_words(prefixes, weights), "--split", "90,8,2")
    assert done.returncode == 0, done.stderr
    assert [s3.proxy.count("GET", f"/{b[len('s3://'):]}.idx") for b in buckets] == [1] * len(buckets)
    assert [r for r in s3.proxy.requests if r[0] == "GET" and not r[1].split("?")[0].endswith(".idx")] == []
    for p in prefixes:
        copy = p[len("msc://"):] + ".idx"
        assert (tmp_path / "our-idx" / copy).read_bytes() == (tmp_path / "their-idx" / copy).read_bytes()

    mine, megatrons = cache_files(ours), cache_files(theirs)
    assert len(megatrons) == 12 * len(prefixes) + (9 if weights else 0)  # a blend: 3 files per split
    assert list(mine) == list(megatrons)
    for name in megatrons:
        assert mine[name] == megatrons[name], name
    assert f'"dataset_path": "{prefixes[0]}"' in b"".join(v for n, v in megatrons.items()
                                                           if n.endswith("-description.txt")).decode()

    before = snapshot(str(ours))
    assert ask(VERSION, {"task": "caches", "configs": [dict(config, path_to_cache=str(ours),
               object_storage_cache_path=str(tmp_path / "their-idx"))]}) == [None]
    assert snapshot(str(ours)) == before
