"""Megatron-LM's data flags: parsed as megatron-core parses them, and refused with a clear message
where megatron-core would assert, crash, loop, or silently do something else."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from support.inputs.corpus import run_megacache
from megacache.megatron.blends import Blend, blend_from_flags, parse_blend, read_per_split_data_args
from megacache.interfaces.api import BlendedSamples, BuildConfig, GPTSamples, build, open_cache
from megacache.runtime.comm import SingleComm
from megacache.errors import MegacacheError
from megacache.formats.indexed import IndexLayout, IndexWriter
from support.inputs.indexed import write_lengths
from support.oracles.megatron_core import load_mcore, megatron_datasets
from support.sweeps import torch_group
from support.sweeps import NULL_TOKENIZER, cache_files


def test_words_parse_as_megatron_reads_them():
    assert parse_blend(["a"]) == Blend(("a",), None)
    assert parse_blend(["a", "b", "c"]) == Blend(("a", "b", "c"), None)
    assert parse_blend(["a", "b"]) == Blend(("a", "b"), None)
    assert parse_blend(["30", "a", "70", "b"]) == Blend(("a", "b"), (30.0, 70.0))
    assert parse_blend(["1.0", "a"]) == Blend(("a",), (1.0,))
    assert parse_blend(["0.3", " a "]) == Blend(("a",), (0.3,))  # prefixes are stripped, as Megatron does
    assert parse_blend(["1e-3", "a", "2", "b"]).weights == (1e-3, 2.0)


@pytest.mark.parametrize("words, message", [
    ([], "no dataset prefixes"),
    (["0.3", "a", "0.7"], r"3 words, some of them numbers .* WEIGHT PREFIX pairs"),
    (["0.3", "a", "b", "c"], r"word 3 \('b'\) should be the weight of 'c'"),
    (["0.3", "a", "0.7", "0.2"], r"word 4 \('0.2'\) is a number where a prefix should be"),
    (["0", "a", "1", "b"], r"the weight of 'a' is 0.0; weights must be positive and finite"),
    (["-1", "a", "1", "b"], r"the weight of 'a' is -1.0"),
    (["nan", "a", "1", "b"], r"the weight of 'a' is nan"),
    (["inf", "a", "1", "b"], r"the weight of 'a' is inf"),
    (["1", "a", "2", "a"], r"prefix 'a' is given twice \(datasets 0 and 1\)"),
    (["a", "b", "a"], r"prefix 'a' is given twice \(datasets 0 and 2\)"),
    ([f"p{i}" for i in range(32767)], r"32767 datasets; a Megatron blend holds at most 32766"),
])
def test_bad_words_are_refused_with_the_reason(words, message):
    with pytest.raises(MegacacheError, match=message):
        parse_blend(words)


def test_exactly_one_data_form(tmp_path):
    with pytest.raises(MegacacheError, match="exactly one of"):
        blend_from_flags()
    with pytest.raises(MegacacheError, match=r"got --data-path, --train-data-path"):
        blend_from_flags(["a"], split_data_paths=(["b"], None, None))
    args = tmp_path / "args.txt"
    args.write_text("0.25 a\n0.75 b\n")
    assert blend_from_flags(data_args_path=str(args)) == (Blend(("a", "b"), (0.25, 0.75)), None)
    blend, per_split = blend_from_flags(split_data_paths=(["a", "b"], ["c"], None))
    assert blend is None and per_split == [Blend(("a", "b")), Blend(("c",)), None]
    with pytest.raises(MegacacheError, match="cannot read it"):
        blend_from_flags(data_args_path=str(tmp_path / "missing.txt"))


@pytest.mark.parametrize("content, message", [
    ('{"train": ["a"], "valid": ["b"]}', "key 'test' is missing"),
    ('{"train": ["a"], "valid": ["b"], "test": 3}', "'test' must be a list of strings or one string"),
    ('{"train": ["a"],\n "valid": ["b"], "test": }', "line 2: not valid JSON"),
    ('["a"]', "expected a JSON object"),
    ('{"train": "0.5 a 0.5 b", "valid": ["0.5", "c", "x"], "test": null}', r"\['valid'\]: 3 words, some of them numbers"),
])
def test_bad_per_split_json_is_refused(tmp_path, content, message):
    path = tmp_path / "per_split.json"
    path.write_text(content)
    with pytest.raises(MegacacheError, match=message):
        read_per_split_data_args(str(path))


def test_per_split_json_takes_strings_or_lists(tmp_path):
    path = tmp_path / "per_split.json"
    path.write_text(json.dumps({"train": "0.5 a 0.5 b", "valid": ["c"], "test": None}))
    assert read_per_split_data_args(str(path)) == [Blend(("a", "b"), (0.5, 0.5)), Blend(("c",)), None]


def base_config(tmp_path, **change) -> BuildConfig:
    fields = dict(seq_length=8, sizes=(100, 10, 5), tokenizer=NULL_TOKENIZER, split="80,10,10",
                  cache_dir=str(tmp_path / "cache"))
    fields.update(change)
    return BuildConfig(**fields)


@pytest.mark.parametrize("change, message", [
    (dict(sizes=(100, None, 5)), "the valid split has weights but no sample count"),
    (dict(cache_dir=None), "a blend is only cached under --data-cache-path"),
    (dict(blend=Blend(("A", "missing"), (1.0, 1.0))), r"missing\.idx: index file not found"),
    (dict(blend=Blend(("A", "WIDE"), (1.0, 1.0))), r"different token dtypes \(.*A holds uint16, .*WIDE holds int32\)"),
    (dict(blend=Blend(("A", "EMPTY"))), r"EMPTY: the dataset has no sequences"),
    (dict(blend=Blend(("A", "SHORT")), split="50,50"),
     r"SHORT: its train split has no samples, so it gets weight 0 in this unweighted blend"),
    (dict(blend_per_split=[Blend(("A",)), None, None], split="1,1"), "--split does not apply to per-split"),
])
def test_blend_configurations_megatron_cannot_build_are_refused_before_any_work(tmp_path, change, message):
    for name in ("A", "B"):
        write_lengths(str(tmp_path / name), np.full(40, 20))
    write_lengths(str(tmp_path / "SHORT"), np.full(4, 3))  # 2 sequences of 3 tokens in train: no sample of 8
    write_lengths(str(tmp_path / "EMPTY"), np.zeros(0))
    layout = IndexLayout(np.dtype(np.int32), 40, 41)
    IndexWriter.create(str(tmp_path / "WIDE.idx"), str(tmp_path / "WIDE.bin"), layout, 4 * 800)
    with IndexWriter.open(str(tmp_path / "WIDE.idx"), str(tmp_path / "WIDE.bin"), layout) as w:
        w.write_sequences(0, np.full(40, 20, np.int32), 0)
        w.write_documents(0, np.arange(41))
    blend = change.pop("blend", Blend(("A", "B"), (0.5, 0.5)))
    if "blend_per_split" not in change:
        change["blend"] = Blend(tuple(str(tmp_path / p) for p in blend.prefixes), blend.weights)
    else:
        change["blend_per_split"] = [None if b is None else Blend(tuple(str(tmp_path / p) for p in b.prefixes))
                                     for b in change["blend_per_split"]]
    with pytest.raises(MegacacheError, match=message):
        build(base_config(tmp_path, **change), SingleComm())
    assert not os.path.exists(tmp_path / "cache") or not os.listdir(tmp_path / "cache")


@pytest.mark.parametrize("ranks", [1, 2])
def test_cli_blend_flags_build_what_megatron_builds(tmp_path, ranks, megatron):
    """--data-args-path and --per-split-data-args-path from the command line, under mpiexec too."""
    rng = np.random.default_rng(ranks)
    prefixes = []
    for i in range(3):
        prefixes.append(str(tmp_path / f"src{i}"))
        write_lengths(prefixes[-1], rng.integers(1, 300, 200))
    args_file = tmp_path / "data_args.txt"
    args_file.write_text("0.2 {}\n0.5 {}\n0.3 {}\n".format(*prefixes))
    per_split = tmp_path / "per_split.json"
    per_split.write_text(json.dumps({"train": f"3 {prefixes[0]} 1 {prefixes[1]}", "valid": [prefixes[2]],
                                     "test": [prefixes[0], prefixes[2]]}))
    sizes = (480, 96, 24)  # --train-iters 60 --global-batch-size 8 --eval-iters 3 --eval-interval 20
    common = ["--seq-length", "32", "--train-iters", "60", "--global-batch-size", "8", "--eval-iters", "3",
              "--eval-interval", "20", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
              "--seed", "77"]
    with torch_group():
        check_cli_blends(tmp_path, ranks, prefixes, args_file, per_split, sizes, common)


def check_cli_blends(tmp_path, ranks, prefixes, args_file, per_split, sizes, common):
    mcore = load_mcore()
    for kind, data in (("whole", ["--data-args-path", str(args_file), "--split", "90,8,2"]),
                       ("per-split", ["--per-split-data-args-path", str(per_split)])):
        theirs = str(tmp_path / f"theirs-{kind}-{ranks}")
        if kind == "whole":
            megatron_datasets(mcore, list(sizes), 77, 32, 1, True, theirs, True, blend=(prefixes, [0.2, 0.5, 0.3]),
                              split="90,8,2")
        else:
            megatron_datasets(mcore, list(sizes), 77, 32, 1, True, theirs, True,
                              blend_per_split=[([prefixes[0], prefixes[1]], [3.0, 1.0]), ([prefixes[2]], None),
                                               ([prefixes[0], prefixes[2]], None)])
        ours = str(tmp_path / f"ours-{kind}-{ranks}")
        proc = run_megacache(ranks, "build", *data, *common, "--data-cache-path", ours)
        assert cache_files(ours) == cache_files(theirs), kind
        # the summary counts what megatron-core built: its entries, by class
        built = {c: sum(n.endswith("description.txt") and f"-{c}-" in n for n in cache_files(theirs))
                 for c in ("GPTDataset", "BlendedDataset")}
        assert (f"{built['GPTDataset']} GPTDataset and {built['BlendedDataset']} BlendedDataset cache entries "
                f"({sum(built.values())} built, 0 already there)") in proc.stdout, proc.stdout


def test_open_cache_of_per_split_data_mixes_blends_and_single_prefixes(tmp_path):
    for name in ("A", "B", "C"):
        write_lengths(str(tmp_path / name), np.full(40, 20))
    cfg = base_config(tmp_path, split=None, blend_per_split=[
        Blend((str(tmp_path / "A"), str(tmp_path / "B")), (0.25, 0.75)), Blend((str(tmp_path / "C"),)), None])
    result = build(cfg, SingleComm())
    splits = open_cache(cfg)
    assert list(splits) == ["train", "valid"]
    assert isinstance(splits["train"], BlendedSamples) and isinstance(splits["valid"], GPTSamples)
    assert len(splits["train"]) == result.blends[0].size == 100
    assert len(splits["valid"]) == [j for j in result.gpt if j.name == "valid"][0].plan.num_samples
    assert splits["train"][0].shape == (9,) and splits["train"][0].dtype == np.int64
    assert {splits["train"].source(k)[0] for k in range(100)} == {0, 1}
