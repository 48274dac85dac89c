"""megacache inspect: summaries of real datasets and of real caches built by megacache (one prefix
and a blend), damaged caches reported as problems, and the CLI end to end."""

from __future__ import annotations

import os

import numpy as np
import pytest

from support.inputs.corpus import run_megacache
from megacache.interfaces.api import BuildConfig, build
from megacache.megatron.blends import parse_blend
from megacache.runtime.comm import SingleComm
from megacache.errors import MegacacheError
from megacache.formats.npy import load_npy
from megacache.readers.inspection import inspect_cache, inspect_dataset, inspect_path
from support.inputs.indexed import write_lengths

LENGTHS = [3, 0, 5, 0, 7, 1, 12, 4, 9, 2] * 8  # 80 sequences, 16 empty, 344 tokens
SETTINGS = dict(seq_length=8, sizes=(50, 5, 2), tokenizer={"class": "t"}, split="80,10,10")


@pytest.fixture
def prefix(tmp_path):
    p = str(tmp_path / "a_text_document")
    write_lengths(p, LENGTHS)
    return p


@pytest.fixture
def gpt_cache(tmp_path, prefix):
    cache = str(tmp_path / "cache")
    result = build(BuildConfig.for_prefix(prefix, cache_dir=cache, **SETTINGS), SingleComm())
    return cache, result.gpt


def test_dataset_numbers(prefix):
    s = inspect_dataset(prefix)
    assert (s.sequences, s.documents, s.tokens, s.empty_sequences) == (80, 80, 344, 16)
    assert (s.min_length, s.max_length, s.mean_length) == (0, 12, 344 / 80)
    assert s.dtype == np.uint16 and s.bin_size == os.path.getsize(prefix + ".bin") == 688
    for path in (prefix, prefix + ".idx", prefix + ".bin"):
        report = inspect_path(path)
        assert report.problems == []
        assert f"dataset {prefix}\n" in report.text
        assert "uint16, 80 sequences, 80 documents, 344 tokens" in report.text
        assert "min 0 / mean 4.30 / max 12; 16 empty" in report.text
        assert ".bin 688 bytes" in report.text


def test_gpt_cache_summary(gpt_cache, prefix):
    cache, jobs = gpt_cache
    summary = inspect_cache(cache)
    assert summary.problems == [] and summary.temporary_files == 0
    by_hash = {e.hash: e for e in summary.entries}
    assert sorted(by_hash) == sorted(j.entry.hash for j in jobs) and len(jobs) == 3
    text = inspect_path(cache).text
    for job in jobs:
        e = by_hash[job.entry.hash]
        assert (e.class_name, e.split_name, e.md5_ok, e.missing) == ("GPTDataset", job.name, True, [])
        assert e.samples == job.plan.num_samples and e.epochs == job.plan.num_epochs
        for what in ("document_index.npy", "sample_index.npy", "shuffle_index.npy"):
            array = load_npy(job.entry.path(what))
            assert e.arrays[what] == (array.shape, array.dtype)
        assert f"{job.entry.hash} GPTDataset {job.name}: complete, md5 ok" in text
        assert f"  {job.plan.num_samples:,} samples, {job.plan.num_epochs} epoch(s)\n" in text
    assert [e.split_name for e in summary.entries] == ["train", "valid", "test"]
    assert "num_samples 50 requested, sequence_length 8, random_seed 1234, split '80,10,10'" in text
    assert text.count(f"Megatron config: --data-path {prefix} --split 80,10,10 --seq-length 8 --seed 1234 "
                      f"--data-cache-path {cache}") == 3


def test_incomplete_entry_exits_2(gpt_cache):
    cache, jobs = gpt_cache
    train = next(j for j in jobs if j.name == "train")
    os.remove(train.entry.path("shuffle_index.npy"))
    report = inspect_path(cache)
    assert len(report.problems) == 1 and "missing shuffle_index.npy" in report.problems[0]
    assert f"{train.entry.hash} GPTDataset train: INCOMPLETE (missing shuffle_index.npy), md5 ok" in report.text
    proc = run_megacache(1, "inspect", cache, check=False)
    assert proc.returncode == 2
    assert "INCOMPLETE (missing shuffle_index.npy)" in proc.stdout
    assert "1 problem(s) found" in proc.stderr


def test_edited_description_is_an_md5_mismatch(gpt_cache):
    cache, jobs = gpt_cache
    valid = next(j for j in jobs if j.name == "valid")
    path = valid.entry.path("description.txt")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace('"random_seed": 1234', '"random_seed": 4321'))
    report = inspect_path(cache)
    assert len(report.problems) == 1 and valid.entry.hash in report.problems[0]
    assert f"{valid.entry.hash} GPTDataset valid: DAMAGED (problems below), md5 MISMATCH" in report.text
    assert "--seed 4321" in report.text  # what the edited file now claims
    assert run_megacache(1, "inspect", cache, check=False).returncode == 2


def test_temporary_files_are_counted_not_entries(gpt_cache):
    cache, jobs = gpt_cache
    name = os.path.basename(jobs[0].entry.path("sample_index.npy"))
    for k in range(2):
        open(os.path.join(cache, f".{name}.megacache-tmp-{k}"), "wb").close()
    summary = inspect_cache(cache)
    assert summary.temporary_files == 2 and len(summary.entries) == 3 and summary.problems == []
    assert f"\n  2 temporary files (an unfinished or crashed build: a rerun, or megacache clean {cache}, removes " \
           f"them)\n" in inspect_path(cache).text


def test_blend_cache(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_lengths(a, LENGTHS)
    write_lengths(b, [6, 1, 8, 3] * 30)
    cache = str(tmp_path / "cache")
    cfg = BuildConfig(blend=parse_blend(["0.3", a, "0.7", b]), cache_dir=cache, **SETTINGS)
    result = build(cfg, SingleComm())
    summary = inspect_cache(cache)
    assert summary.problems == []
    by_hash = {e.hash: e for e in summary.entries}
    assert len(summary.entries) == len(result.blends) + len(result.gpt) == 9
    text = inspect_path(cache).text
    for blend in result.blends:
        e = by_hash[blend.entry.hash]
        assert (e.class_name, e.md5_ok, e.samples) == ("BlendedDataset", True, blend.size)
        assert e.dataset_counts == (int(blend.counts.min()), int(blend.counts.max()))
        assert f"  2 datasets, size {blend.size}, split {blend.name}\n" in text
        assert (f"  {blend.size} samples (per dataset: min {blend.counts.min()}, max {blend.counts.max()})"
                in text)
    assert text.count(f"a blend of 2 datasets, weighted (weights normalised): --data-path 0.3 {a} 0.7 {b} "
                      f"--split 80,10,10 --seq-length 8 --seed 1234 --data-cache-path {cache}") == 3
    assert text.count("Megatron config: a dataset of blend ") == 6


def test_unweighted_blend_form(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_lengths(a, LENGTHS)
    write_lengths(b, LENGTHS[::-1])
    cache = str(tmp_path / "cache")
    build(BuildConfig(blend=parse_blend([a, b]), cache_dir=cache, **SETTINGS), SingleComm())
    assert f"unweighted (weights are the datasets' lengths): --data-path {a} {b} " in inspect_path(cache).text


def test_cli(prefix, gpt_cache, tmp_path):
    cache, jobs = gpt_cache
    proc = run_megacache(1, "inspect", prefix + ".idx", cache, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "80 sequences, 80 documents, 344 tokens" in proc.stdout
    assert all(f"{j.entry.hash} GPTDataset {j.name}: complete, md5 ok" in proc.stdout for j in jobs)
    missing = str(tmp_path / "nothing")
    proc = run_megacache(1, "inspect", missing, check=False)
    assert proc.returncode == 2
    assert f"{missing}: not a dataset prefix (no {missing}.idx) nor a cache directory" in proc.stderr
    with pytest.raises(MegacacheError, match="not a dataset prefix"):
        inspect_path(missing)


@pytest.mark.parametrize("built_for, read_as, expected", [
    ("0.16", "0.16", "tokenizer: megatron-core 0.16 flags --tokenizer-type HuggingFaceTokenizer --tokenizer-model "
                     "/m/tok --tokenizer-special-tokens '<a b>'"),
    ("0.16", "0.17", "tokenizer: megatron-core 0.17 flags --tokenizer-type HuggingFaceTokenizer --tokenizer-model "
                     "/m/tok --tokenizer-special-tokens '<a b>' --tokenizer-hf-no-use-fast "
                     "--tokenizer-hf-no-include-special-tokens"),
    ("0.19", "0.19", "tokenizer: megatron-core 0.19 flags --tokenizer-type HuggingFaceTokenizer --tokenizer-model "
                     "/m/tok --tokenizer-special-tokens '<a b>'"),
    ("0.16", "0.19", "tokenizer: NOT what megatron-core 0.19 builds from any flags (that identity is megatron-core "
                     "0.16, 0.17's): a 0.19 run looks for another name"),
])
def test_tokenizer_read_as_a_versions_flags(tmp_path, prefix, built_for, read_as, expected):
    """inspect names the flags of a version that give an entry's tokenizer; verify fails an entry whose
    tokenizer that version's training never builds (its cache name is never looked up)."""
    from megacache.builders.publish import read_manifest
    from megacache.megatron.tokenizer import tokenizer_identifiers
    from megacache.readers.verify import verify_cache

    cache = str(tmp_path / "cache")
    ids = tokenizer_identifiers("HuggingFaceTokenizer", megatron_version=built_for, tokenizer_model="/m/tok",
                                tokenizer_special_tokens=["<a b>"])
    settings = {**SETTINGS, "tokenizer": ids, "megatron_version": built_for}
    result = build(BuildConfig.for_prefix(prefix, cache_dir=cache, **settings), SingleComm())
    assert result.megatron_version == built_for
    records = read_manifest(cache)
    assert len(records) == 3 and {r["megatron_version"] for r in records.values()} == {built_for}
    text = inspect_path(cache, read_as).text
    assert text.count(expected) == 3, text
    problems = [p for v in verify_cache(cache, read_as) for p in v.problems]
    if "NOT" in expected:
        assert len(problems) == 3 and all(f"rebuild with --megatron-version {read_as}" in p for p in problems)
    else:
        assert problems == []
    proc = run_megacache(1, "verify", cache, "--megatron-version", read_as, check=False)
    assert proc.returncode == (2 if "NOT" in expected else 0), proc.stderr
