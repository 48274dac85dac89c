"""Merging per-task shards at their scale: 10,000 small Megatron datasets (and folders of 2,000 datatrove .ds
files or OLMo token files, converted) named by a list file, a quoted glob or a folder merge, on 1 to 3
ranks, into what megatron-core's
``add_index`` chain makes of them (recorded in tests/data/merge-shards.json by
tests/support/oracles/record_merge_shards.py), or into --max-size parts that together are that dataset; and
convert --per-file turns each shard into its own dataset of another format."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from megacache.interfaces.cli import main
from support.inputs import shards
from support.inputs.corpus import run_megacache

with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "merge-shards.json")) as f:
    RECORDED = json.load(f)["merged"]


def digests(prefix: str) -> dict:
    out = {}
    for suffix in ("bin", "idx"):
        with open(f"{prefix}.{suffix}", "rb") as f:
            out[suffix] = hashlib.sha256(f.read()).hexdigest()
    return out


def merged_as_recorded(prefix: str, count: int | str) -> bool:
    want = RECORDED[str(count)]
    return digests(prefix) == {"bin": want["bin"], "idx": want["idx"]}


@pytest.fixture(scope="module")
def megatron_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    prefixes = shards.write_megatron(str(root / "shards"), 10_000)
    listed = root / "shards.txt"
    listed.write_text("# one per line\n" + "".join(p + "\n" for p in prefixes))
    return root, str(listed)


@pytest.mark.parametrize("ranks,spelling", [(1, "list"), (2, "glob"), (3, "folder")])
def test_ten_thousand_shards_merge_as_megatrons_add_index_chain(tmp_path, megatron_shards, ranks, spelling, capsys):
    root, listed = megatron_shards
    inputs = {"list": ["--input-list", listed], "glob": [str(root / "shards" / "shard_*")],
              "folder": [str(root / "shards")]}[spelling]
    args = ["merge", *inputs, "--output-prefix", str(tmp_path / "merged"), "--chunk-bytes", "64K"]
    if ranks == 1:
        assert main(args) == 0
        out = capsys.readouterr().out
    else:
        out = run_megacache(ranks, *args).stdout
    assert merged_as_recorded(str(tmp_path / "merged"), 10_000)
    assert f"megacache merge: 10000 dataset(s) -> {tmp_path / 'merged'}.bin/.idx" in out


def test_shards_merge_into_parts_of_a_max_size_that_together_are_the_whole(tmp_path, megatron_shards, capsys):
    root, _ = megatron_shards
    prefixes = [os.path.join(root, "shards", shards.name(k)) for k in range(2_000)]
    assert main(["merge", *prefixes, "--output-prefix", str(tmp_path / "part"), "--max-size", "40K"]) == 0
    parts = sorted(n[:-4] for n in os.listdir(tmp_path) if n.endswith(".idx"))
    total = RECORDED["2000"]["bin_bytes"]
    assert len(parts) >= total // (40 << 10) + 1 and parts[0] == f"part-00000-of-{len(parts):05d}"
    assert f"-> {len(parts)} parts {tmp_path / parts[0]}.bin/.idx ... {tmp_path / parts[-1]}.bin/.idx" in \
        capsys.readouterr().out
    assert all(os.path.getsize(tmp_path / f"{p}.bin") <= 40 << 10 for p in parts)
    assert main(["merge", str(tmp_path / "part-*"), "--output-prefix", str(tmp_path / "joined")]) == 0
    assert merged_as_recorded(str(tmp_path / "joined"), 2_000)


@pytest.fixture(scope="module")
def converter_shards(tmp_path_factory):
    """2,000 shards as a datatrove job's folder of .ds files, and as a folder of OLMo token files
    (their documents ending with the EOS; shards without documents left out)."""
    root = tmp_path_factory.mktemp("converted")
    shards.write_ds(str(root / "ds"), 2_000)
    shards.write_olmo(str(root / "olmo"), 2_000)
    return root


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("kind", ["ds", "olmo"])
def test_a_folder_of_converter_shards_converts_to_the_chains_dataset(tmp_path, converter_shards, kind, ranks):
    flags = ["--eos-id", str(shards.EOS), "--dtype", "uint16"] if kind == "olmo" else []
    args = ["convert", str(converter_shards / kind), str(tmp_path / "merged"), "--chunk-bytes", "16K", *flags]
    assert (main(args) if ranks == 1 else run_megacache(ranks, *args).returncode) == 0
    assert merged_as_recorded(str(tmp_path / "merged"), "2000+eos" if kind == "olmo" else 2_000)


def test_per_file_converts_each_shard_into_its_own_dataset_and_back(tmp_path, megatron_shards):
    root, _ = megatron_shards
    shards.write_ds(str(tmp_path / "tasks"), 200)
    out = run_megacache(2, "convert", "--per-file", str(tmp_path / "tasks"), str(tmp_path / "megatron" / "*")).stdout
    assert f"200 datasets {tmp_path / 'megatron' / 'shard_00000'}.bin/.idx ... " in out
    for k in range(200):
        for suffix in (".bin", ".idx"):
            with open(tmp_path / "megatron" / f"{shards.name(k)}{suffix}", "rb") as a, \
                    open(root / "shards" / f"{shards.name(k)}{suffix}", "rb") as b:
                assert a.read() == b.read(), (k, suffix)
    assert main(["convert", "--per-file", str(tmp_path / "megatron" / "shard_0001*"), str(tmp_path / "back" / "*.ds")]) == 0
    assert sorted(os.listdir(tmp_path / "back")) == sorted(f"{shards.name(k)}.ds{s}" for k in range(10, 20)
                                                            for s in ("", ".index", ".metadata"))
    for k in range(10, 20):
        for suffix in (".ds", ".ds.index"):
            with open(tmp_path / "back" / f"{shards.name(k)}{suffix}", "rb") as a, \
                    open(tmp_path / "tasks" / f"{shards.name(k)}{suffix}", "rb") as b:
                assert a.read() == b.read(), (k, suffix)
