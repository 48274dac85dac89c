"""Configuration drift Megatron's cache hash cannot see (docs/megatron.md §3.1): add-extra-token,
drop-last on the valid split, a dataset regenerated at the same path. megacache's manifest (written
last, after the entries) records what each entry was built from; a build or ``open_cache`` that
would reuse a drifted entry refuses, naming it, or (``rebuild_stale``) replaces it."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest

from megacache.megatron.sequences import FILE_NAME as SEQUENCES_FILE

from megacache.interfaces.api import open_cache
from megacache.builders.build import BuildConfig, build
from megacache.runtime.comm import SingleComm
from megacache.errors import MegacacheError
from megacache.builders.publish import manifest_path
from support.inputs.indexed import write_lengths
from support.sweeps import NULL_TOKENIZER, cache_files


@pytest.fixture
def dataset(tmp_path):
    lengths = np.random.default_rng(3).integers(1, 300, 20_000).astype(np.int32)
    prefix = str(tmp_path / "d")
    write_lengths(prefix, lengths)
    return prefix, lengths


def config(prefix: str, cache, **changes) -> BuildConfig:
    cfg = BuildConfig.for_prefix(prefix, seq_length=64, sizes=(30_000, 3_000, 100), tokenizer=NULL_TOKENIZER,
                                 split="90,8,2", cache_dir=str(cache))
    return replace(cfg, **changes)


def fresh(tmp_path, cfg: BuildConfig, name: str) -> dict:
    other = tmp_path / name
    build(replace(cfg, cache_dir=str(other), rebuild_stale=False), SingleComm())
    return cache_files(str(other))


@pytest.mark.parametrize("change,stale,says", [
    (dict(add_extra_token=False), 3, "add_extra_token_to_sequence: built with True, this configuration gives False"),
    (dict(drop_last_partial_validation=False), 1,
     "drop_last_partial_sequence: built with True, this configuration gives False"),
])
def test_a_setting_megatron_does_not_hash_is_refused_then_rebuilt_on_request(tmp_path, dataset, change, stale, says):
    prefix, _ = dataset
    cache = tmp_path / "cache"
    build(config(prefix, cache), SingleComm())
    changed = config(prefix, cache, **change)
    with pytest.raises(MegacacheError) as refused:
        build(changed, SingleComm())
    message = str(refused.value)
    assert f"{stale} existing cache entr{'y was' if stale == 1 else 'ies were'} built from other data or settings" in message
    assert says in message and "--rebuild-stale" in message
    assert f"{cache}/" in message and "-description.txt" in message
    with pytest.raises(MegacacheError, match="built from other data or settings"):
        open_cache(changed)                     # training refuses it too
    result = build(replace(changed, rebuild_stale=True), SingleComm())
    assert sum(not j.reused for j in result.gpt) == stale
    assert cache_files(str(cache)) == fresh(tmp_path, changed, "fresh")
    assert open_cache(changed)["train"][0].shape == (64 + int(changed.add_extra_token),)


def test_a_dataset_regenerated_with_the_same_counts_is_detected(tmp_path, dataset):
    prefix, lengths = dataset
    cache = tmp_path / "cache"
    cfg = config(prefix, cache)
    build(cfg, SingleComm())
    swapped = lengths.copy()
    swapped[[5, 6]] = lengths[[6, 5]] if lengths[5] != lengths[6] else (lengths[5] + 1, lengths[6] - 1)
    write_lengths(prefix, swapped)              # same sequences, same tokens: the same file names
    with pytest.raises(MegacacheError, match=r"length_checksum: built with '[0-9a-f]{16}', this configuration gives"):
        build(cfg, SingleComm())
    build(replace(cfg, rebuild_stale=True), SingleComm())
    assert cache_files(str(cache)) == fresh(tmp_path, cfg, "fresh")


def test_without_a_manifest_the_array_shapes_are_checked(tmp_path, dataset):
    """An entry megatron-core (or an older tool) wrote has no manifest record: reused when its arrays'
    dtypes and shapes are this configuration's, refused when not (in this test: the dataset
    regenerated with more sequences; the file names, hashed from the path and the requested sizes,
    stay the same)."""
    prefix, lengths = dataset
    cache = tmp_path / "cache"
    build(config(prefix, cache), SingleComm())
    os.unlink(manifest_path(str(cache)))
    assert all(j.reused for j in build(config(prefix, cache), SingleComm()).gpt)
    write_lengths(prefix, np.concatenate([lengths, lengths[:500]]))
    with pytest.raises(MegacacheError, match=r"arrays: built with \{'document_index.npy': \['<i4', \[\d+\]\]"):
        build(config(prefix, cache), SingleComm())


def test_the_manifest_is_written_last_and_is_deterministic(tmp_path, dataset):
    prefix, _ = dataset
    a, b = tmp_path / "a", tmp_path / "b"
    build(config(prefix, a), SingleComm())
    build(config(prefix, b), SingleComm())
    manifest = open(manifest_path(str(a)), "rb").read()
    # the same records but for the times their files were published at, each its file's size and time
    records = []
    for directory in (a, b):
        entries = json.loads(open(manifest_path(str(directory)), "rb").read())["entries"]
        for stem, record in entries.items():
            files = record.pop("files")
            assert len(files) in (3, 4)
            for what, recorded in files.items():
                st = os.stat(os.path.join(directory, f"{stem}-{what}"))
                assert recorded == [st.st_size, st.st_mtime_ns]
        records.append(entries)
    assert records[0] == records[1]
    newest_entry = max(os.stat(os.path.join(a, n)).st_mtime_ns for n in os.listdir(a)
                       if n not in (".megacache", SEQUENCES_FILE))
    assert os.stat(manifest_path(str(a))).st_mtime_ns >= newest_entry
    assert b'"add_extra_token_to_sequence": true' in manifest and b'"num_samples"' in manifest
