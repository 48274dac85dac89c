"""``megacache build`` given a whole training command writes, byte for byte, what Megatron-LM's own
tools/prepare_cache.py writes for the same command, in each version that has the tool (0.18, 0.19
and main): a prefix, a weighted blend, per-split blends, a global batch derived from
``--prepare-cache-world-size`` and a batch-size ramp-up, each amid 120 flags of model, optimizer,
parallelism and logging. The tool's answers were recorded by tests/support/record_prepare_cache.py
(tests/data/prepare-cache.json), since the tool needs a Megatron-LM checkout."""

from __future__ import annotations

import json

import pytest

from megacache.interfaces import cli
from support.record_megatron_main import cache_files, write_datasets
from support.record_prepare_cache import OUT

with open(OUT, encoding="utf-8") as _f:
    RECORDED = json.load(_f)["cases"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepare-cache")
    write_datasets(root)
    return root


@pytest.mark.parametrize("case", RECORDED, ids=[f"{c['version']} {c['name']}" for c in RECORDED])
def test_build_writes_what_prepare_cache_writes(case, datasets, monkeypatch, capsys):
    assert "files" in case, f"prepare_cache.py refused a case recorded to build: {case.get('error')}"
    monkeypatch.chdir(datasets)
    words = case["words"]
    cache = words[words.index("--data-cache-path") + 1]
    assert cli.main(["build", *words, "--megatron-version", case["version"]]) == 0
    capsys.readouterr()
    built = cache_files(cache)
    assert built.pop("sequences_per_dataset.json")  # megacache's too, which prepare_cache.py does not write
    assert built == case["files"]


def test_the_recorded_commands_are_whole_training_commands():
    for case in RECORDED:
        assert sum(w.startswith("--") for w in case["words"]) >= 100, case["name"]
