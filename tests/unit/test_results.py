"""What a Python user sees printing a result: one line saying what was done, not kilobytes of
dataclass fields; and build's summary shows the blends apart from the datasets they draw on."""

from __future__ import annotations

import numpy as np

from megacache.builders.merge import merge
from megacache.builders.tokenize import TokenizeConfig, tokenize
from megacache.interfaces import cli
from megacache.interfaces.api import BuildConfig, PreparedCache, build, open_cache
from megacache.megatron.blends import parse_blend
from megacache.runtime.comm import SingleComm
from support.inputs.corpus import documents, write_jsonl
from support.inputs.indexed import write_lengths

PREFIXES = [f"data/d{i}" for i in range(30)]


def blend_config(tmp_path, monkeypatch) -> BuildConfig:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    rng = np.random.default_rng(3)
    for prefix in PREFIXES:
        write_lengths(prefix, rng.integers(1, 40, 50))
    words = [w for p in PREFIXES for w in ("1", p)]
    return BuildConfig(blend=parse_blend(words), seq_length=8, sizes=(300, 30, 10), tokenizer={"class": "t"},
                       split="80,15,5", cache_dir="cache")


def test_a_build_prints_one_line(tmp_path, monkeypatch):
    result = build(blend_config(tmp_path, monkeypatch), SingleComm())
    assert repr(result) == (f"BuildResult(30 dataset(s), 90 GPTDataset and 3 BlendedDataset cache entries (93 built, "
                            f"0 already there) for megatron-core {result.megatron_version} in {result.seconds:.1f} s "
                            f"on 1 rank(s))")


def test_a_prepared_cache_prints_its_splits_and_what_was_done(tmp_path, monkeypatch):
    cfg = blend_config(tmp_path, monkeypatch)
    built = build(cfg, SingleComm())
    splits = open_cache(cfg)
    sizes = ", ".join(f"{name} {len(splits[name]):,} samples" for name in ("train", "valid", "test"))
    assert repr(PreparedCache(splits, built)) == f"PreparedCache({sizes}; {built.headline()})"
    text = repr(PreparedCache(open_cache(cfg), None))
    assert text.startswith("PreparedCache(train ") and text.endswith("; already there: opened)")
    assert "\n" not in text and len(text) < 200


def test_tokenize_and_merge_print_one_line(tmp_path):
    write_jsonl(str(tmp_path / "a.jsonl"), documents(200, seed=2))
    cfg = TokenizeConfig(inputs=[str(tmp_path / "a.jsonl")], output_prefix=str(tmp_path / "t"), tokenizer="byte",
                         threads=1)
    done = tokenize(cfg, SingleComm())
    out = done.outputs["text"]
    assert repr(done) == (f"TokenizeResult({out}: {done.documents:,} documents, {done.tokens['text']:,} tokens, 1 units (0 reused), "
                          f"0 bad records skipped, in {done.seconds:.1f} s on 1 rank(s))")
    merged = merge([out], str(tmp_path / "m"), SingleComm())
    assert repr(merged) == (f"MergeResult(1 dataset(s) -> {tmp_path / 'm'}: {done.documents:,} documents, {done.tokens['text']:,} "
                            f"tokens, in {merged.seconds:.1f} s on 1 rank(s))")


def test_the_build_summary_shows_the_blends_apart(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for prefix in PREFIXES[:2]:
        write_lengths(prefix, np.random.default_rng(1).integers(1, 40, 50))
    assert cli.main(["build", "--data-path", "0.5", PREFIXES[0], "0.5", PREFIXES[1], "--split", "80,15,5",
                     "--seq-length", "8", "--train-samples", "100", "--global-batch-size", "1", "--eval-iters", "2",
                     "--eval-interval", "50", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
                     "--data-cache-path", "cache", "--megatron-version", "0.19"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("blends: cache cache")
    assert lines[at - 1].startswith("    ") and "-GPTDataset-test-*" in lines[at - 1]
    assert [line.split(" blend:")[0] for line in lines[at + 1:at + 7:2]] == ["  train", "  valid", "  test"]
