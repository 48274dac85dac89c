"""megacache verify finds each kind of damage, names the file and the first bad element."""

import re

import numpy as np
import pytest

from support.inputs.corpus import run_megacache
from megacache.formats.indexed import write_dataset
from megacache.readers.verify import verify_dataset


@pytest.fixture
def dataset(tmp_path):
    prefix = str(tmp_path / "d")
    rng = np.random.default_rng(1)
    write_dataset(prefix, [rng.integers(0, 500, rng.integers(0, 20)) for _ in range(50)], np.uint16)
    return prefix


def patch(path, offset, values):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.asarray(values).tobytes())


def test_sound_dataset_passes(dataset):
    assert verify_dataset(dataset, vocab_size=500) == []


def test_damage_is_located(dataset):
    from megacache.formats.indexed import read_layout

    lay = read_layout(dataset + ".idx")
    patch(dataset + ".idx", lay.pointers_offset + 8 * 3, np.int64(999))
    [problem] = verify_dataset(dataset)
    assert problem.startswith(dataset + ".idx: pointer of sequence 3 is 999")


def test_truncated_bin(dataset):
    with open(dataset + ".bin", "r+b") as f:
        f.truncate(f.seek(0, 2) - 2)
    [problem] = verify_dataset(dataset)
    assert "the file is truncated" in problem and problem.startswith(dataset + ".bin")


def test_non_monotone_document_indices(dataset):
    from megacache.formats.indexed import read_layout

    lay = read_layout(dataset + ".idx")
    patch(dataset + ".idx", lay.documents_offset + 8 * 10, np.int64(0))
    problems = verify_dataset(dataset)
    assert any("not monotone at entry 10" in p for p in problems)


def test_token_out_of_vocabulary(dataset):
    patch(dataset + ".bin", 2 * 7, np.uint16(4000))
    [problem] = verify_dataset(dataset, vocab_size=500)
    assert "token 7 has id 4000" in problem


def test_cli_exit_codes(dataset):
    ok = run_megacache(1, "verify", dataset)
    assert ok.stdout.startswith("ok ")
    with open(dataset + ".bin", "ab") as f:
        f.write(b"xx")
    bad = run_megacache(1, "verify", dataset, check=False)
    assert bad.returncode == 2 and "longer than its index says" in bad.stdout


# ---------------------------------------------------------------------------------------------
# Cache directories: real caches built by megacache, then damaged one file at a time


import os

from support.inputs.indexed import write_lengths
from megacache.interfaces.api import BuildConfig, build
from megacache.megatron.blends import parse_blend
from megacache.runtime.comm import SingleComm
from megacache.errors import MegacacheError
from megacache.readers.verify import verify_cache


def build_cache(tmp_path, prefixes, **fields):
    lengths = np.random.default_rng(5)
    for p in prefixes:
        write_lengths(p, lengths.integers(0, 30, 60))
    common = dict(seq_length=8, sizes=(200, 20, 5), tokenizer={"class": "t"}, split="80,10,10",
                  cache_dir=str(tmp_path / "cache"), **fields)
    if len(prefixes) == 1:
        cfg = BuildConfig.for_prefix(prefixes[0], **common)
    else:
        cfg = BuildConfig(blend=parse_blend(["0.3", prefixes[0], "0.7", prefixes[1]]), **common)
    return build(cfg, SingleComm())


def problems_of(directory):
    return {v.title: v.problems for v in verify_cache(directory) if v.problems}


@pytest.mark.parametrize("fields", [{}, {"add_extra_token": False}, {"drop_last_partial_validation": False}])
def test_sound_cache_passes(tmp_path, fields):
    result = build_cache(tmp_path, [str(tmp_path / "d")], **fields)
    verdicts = verify_cache(str(tmp_path / "cache"))
    assert len(verdicts) == 3 and all(not v.problems for v in verdicts)
    x = fields.get("add_extra_token", True)
    for v, job in zip(verdicts, result.gpt):
        assert f"{job.plan.num_samples:,} samples" in v.summary
        assert f"add_extra_token={x} drop_last={job.plan.drop_last}" in v.summary


def test_sound_blend_passes(tmp_path):
    result = build_cache(tmp_path, [str(tmp_path / "a"), str(tmp_path / "b")])
    verdicts = verify_cache(str(tmp_path / "cache"))
    assert len(verdicts) == 9 and all(not v.problems for v in verdicts)
    blends = {v.hash: v for v in verdicts if v.class_name == "BlendedDataset"}
    for b in result.blends:
        assert blends[b.entry.hash].summary.startswith(f"{b.size:,} samples from 2 datasets")


def resave(path, array):
    np.save(path, array, allow_pickle=False)


@pytest.fixture
def gpt_cache(tmp_path):
    job = build_cache(tmp_path, [str(tmp_path / "d")]).gpt[0]  # train: several epochs
    assert job.plan.num_epochs > 1
    return job, str(tmp_path / "cache"), f"{job.entry.hash} GPTDataset train"


def test_shuffle_index_duplicate(gpt_cache):
    job, cache, title = gpt_cache
    path = job.entry.path("shuffle_index.npy")
    shuffled = np.load(path)
    shuffled[7] = shuffled[3]
    resave(path, shuffled)
    assert problems_of(cache) == {title: [
        f"{path}: shuffle_index[7] is {shuffled[3]}, which appears earlier too: not a permutation"]}


def test_sample_index_not_monotone(gpt_cache):
    job, cache, title = gpt_cache
    path = job.entry.path("sample_index.npy")
    samples = np.load(path)
    samples[10, 0] = samples[9, 0] - 1
    resave(path, samples)
    assert problems_of(cache) == {title: [
        f"{path}: sample_index not monotone at row 10: document position {samples[9, 0]} then {samples[10, 0]}"]}


def test_sample_offset_beyond_document(gpt_cache):
    from megacache.formats.indexed import IndexedDataset

    job, cache, title = gpt_cache
    path, doc = job.entry.path("sample_index.npy"), np.load(job.entry.path("document_index.npy"))
    samples = np.load(path)
    p = int(samples[10, 0])
    length = int(IndexedDataset(job.data_path).sequence_lengths[doc[p]])
    samples[10, 1] = length  # with add_extra_token the last legal offset is length - 1
    resave(path, samples)
    assert problems_of(cache) == {title: [
        f"{path}: sample_index[10] is ({p}, {length}), but the document at position {p} (sequence {doc[p]}) "
        f"has {length} tokens: offsets lie in [0, {length - 1}]"]}


def test_offset_rule_holds_on_varied_caches(tmp_path):
    """Empty documents, both add_extra_token settings, partial last validation samples, many
    sequence lengths: the exact offset rule never flags a cache megacache built."""
    from support.inputs.indexed import random_lengths

    rng = np.random.default_rng(11)
    for case in range(8):
        prefix = str(tmp_path / f"d{case}")
        write_lengths(prefix, random_lengths(rng, int(rng.integers(20, 200))))
        cfg = BuildConfig.for_prefix(prefix, seq_length=int(rng.integers(1, 40)), sizes=(300, 37, None),
                                     tokenizer={"class": "t"}, split="70,20,10", cache_dir=str(tmp_path / "c"),
                                     add_extra_token=bool(case % 2), drop_last_partial_validation=case % 4 < 2)
        try:
            build(cfg, SingleComm())
        except MegacacheError:
            continue  # a configuration megatron-core rejects too (e.g. an empty split asked for samples)
    verdicts = verify_cache(str(tmp_path / "c"))
    assert len(verdicts) >= 12 and [v.problems for v in verdicts if v.problems] == []


def test_document_index_outside_split(gpt_cache):
    job, cache, title = gpt_cache
    path = job.entry.path("document_index.npy")
    doc = np.load(path)
    lo, hi = job.split_range
    doc[5] = hi
    resave(path, doc)
    assert problems_of(cache)[title][0] == (
        f"{path}: document_index[5] is {hi}, outside the split's sequences [{lo}, {hi})")


def test_wrong_dtype(gpt_cache):
    job, cache, title = gpt_cache
    path = job.entry.path("document_index.npy")
    doc = np.load(path)
    resave(path, doc.astype(np.int64))
    assert problems_of(cache) == {title: [f"{path}: int64[{len(doc)}], expected 1-D of int32"]}


def test_dataset_changed_since_build(gpt_cache, tmp_path):
    job, cache, title = gpt_cache
    write_lengths(str(tmp_path / "d"), np.full(60, 3))
    problems = problems_of(cache)[title]
    assert problems[0] == (f"{job.entry.path('sample_index.npy')}: shapes match no plan for this dataset: the "
                           f"dataset changed since the cache was built, or the cache is corrupt")


@pytest.fixture
def blend_cache(tmp_path):
    result = build_cache(tmp_path, [str(tmp_path / "a"), str(tmp_path / "b")])
    blend = result.blends[0]
    return result, blend, str(tmp_path / "cache"), f"{blend.entry.hash} BlendedDataset {blend.name}"


def test_blend_sample_out_of_order(blend_cache):
    _, blend, cache, title = blend_cache
    ids, path = np.load(blend.entry.path("dataset_index.npy")), blend.entry.path("dataset_sample_index.npy")
    samples = np.load(path)
    first, second = np.flatnonzero(ids == 1)[:2]
    samples[[first, second]] = samples[[second, first]]
    resave(path, samples)
    assert problems_of(cache) == {title: [
        f"{path}: dataset_sample_index[{first}] is 1, but it is sample 0 drawn from dataset 1: each dataset's "
        f"samples must be 0, 1, 2, ... in order"]}


def test_blend_draws_more_than_child_has(blend_cache):
    _, blend, cache, title = blend_cache
    child = blend.children[0]
    # The child entry loses its last samples (its arrays shrunk consistently with a smaller request).
    path = child.entry.path("sample_index.npy")
    kept = int(blend.counts[0]) - 1
    resave(path, np.load(path)[: kept + 1])
    problems = problems_of(cache)
    assert problems[title] == [f"{blend.entry.path('dataset_index.npy')}: {int(blend.counts[0]):,} samples drawn "
                               f"from dataset 0 ({child.data_path}), but its entry {child.entry.hash} has only "
                               f"{kept:,}"]


def test_blend_child_missing(blend_cache):
    _, blend, cache, title = blend_cache
    child = blend.children[1]
    for what in ("description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy"):
        os.remove(child.entry.path(what))
    assert problems_of(cache) == {title: [
        f"{blend.entry.path('description.txt')}: dataset 1 ({child.data_path}) has no GPTDataset entry "
        f"{child.entry.hash} in {cache}: rebuild the cache"]}


def test_cli_verifies_cache_directories(blend_cache):
    _, blend, cache, title = blend_cache
    ok = run_megacache(1, "verify", cache)
    lines = ok.stdout.splitlines()
    assert len(lines) == 10 and all(line.startswith("ok   ") for line in lines[:9])
    assert re.fullmatch(r"megacache verify: all 9 dataset\(s\) and cache entries passed in [0-9.]+ s on 1 rank\(s\)",
                        lines[9])
    assert f"ok   {title}: {blend.size:,} samples from 2 datasets" in ok.stdout
    path = blend.entry.path("dataset_sample_index.npy")
    resave(path, np.load(path).astype(np.int32))
    bad = run_megacache(1, "verify", cache, check=False)
    assert bad.returncode == 2
    assert f"FAIL {title}\n  {path}: int32[{blend.size}], expected 1-D of int64\n" in bad.stdout
    assert "1 of 9 dataset(s) or cache entries failed verification" in bad.stderr


def test_verdicts_do_not_depend_on_the_ranks(blend_cache):
    """Ranks check slices of each blend and shares of the entries: the same lines at P = 1, 2, 3,
    with faults where P = 3's slices start, an id outside the datasets after an order fault (the id
    is named, as one pass reports it), and a damaged GPTDataset entry."""
    result, blend, cache, title = blend_cache
    train, valid = result.blends[0], result.blends[1]
    ids = np.load(train.entry.path("dataset_index.npy"))
    path = train.entry.path("dataset_sample_index.npy")
    samples = np.load(path)
    start = len(ids) * 2 // 3  # where the third rank's slice starts
    d = int(ids[start])
    samples[np.flatnonzero(ids == d)[np.flatnonzero(np.flatnonzero(ids == d) >= start)[0]:]] += 1
    resave(path, samples)
    ids = np.load(valid.entry.path("dataset_index.npy"))
    ids[-1] = 7
    resave(valid.entry.path("dataset_index.npy"), ids)
    path = valid.entry.path("dataset_sample_index.npy")
    samples = np.load(path)
    samples[[0, 1]] = samples[[1, 0]] + 3
    resave(path, samples)
    child = result.gpt[0].entry.path("shuffle_index.npy")
    shuffled = np.load(child)
    shuffled[-1] = shuffled[0]
    resave(child, shuffled)
    runs = [run_megacache(p, "verify", cache, check=False) for p in (1, 2, 3)]
    assert [r.returncode for r in runs] == [2, 2, 2]
    assert runs[1].stdout == runs[0].stdout == runs[2].stdout
    assert f"{title}\n  {train.entry.path('dataset_sample_index.npy')}: dataset_sample_index[{start}] is " in runs[0].stdout
    assert (f"{valid.entry.path('dataset_index.npy')}: dataset_index[{len(ids) - 1}] is 7, outside the description's "
            f"2 datasets") in runs[0].stdout
    assert f"{child}: shuffle_index[{len(shuffled) - 1}] is {shuffled[0]}, which appears earlier too" in runs[0].stdout
    assert "3 of 9 dataset(s) or cache entries failed verification" in runs[2].stderr
