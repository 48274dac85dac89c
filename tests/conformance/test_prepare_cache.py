"""``megacache build`` given a whole training command writes, byte for byte, what Megatron-LM's own
code writes for the same command: tools/prepare_cache.py in each version that has it (0.18, 0.19
and main), the training's own start in 0.16 and 0.17 (pretrain_gpt.py up to its datasets), and in
every version the same command as a --yaml-cfg file read by the training's start; a prefix, a
weighted blend, per-split blends, a global batch derived from the world size and a batch-size
ramp-up, each amid 120 flags of model, optimizer, parallelism and logging. The caches megacache
writes are so the ones that version's training loads as its own. Megatron's answers were recorded by
tests/support/oracles/record_prepare_cache.py (tests/data/prepare-cache.json), since they need a Megatron-LM
checkout; megacache runs them on one rank, and on 2 and 3 ranks in the MPI tiers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from megacache.builders.config import check_reading
from megacache.errors import MegacacheError
from megacache.interfaces import cli
from megacache.megatron.interpreter import Identity, command_differences
from megacache.megatron.versions import SUPPORTED
from megacache.runtime.comm import SingleComm, get_comm
from support import shared_directory
from support.oracles.record_megatron_main import cache_files, write_datasets
from support.oracles.record_prepare_cache import OUT

with open(OUT, encoding="utf-8") as _f:
    RECORDED = json.load(_f)["cases"]
IDS = [f"{c['version']} {c['program']} {c['name']}" for c in RECORDED]
#: the fields of what training builds that --megatron-python compares
READING = ("sizes", "seq_length", "seed", "split", "blend", "blend_per_split", "data_cache_path",
           "mid_level_dataset_surplus", "identifiers")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepare-cache")
    write_datasets(root)
    return root


def build_as_recorded(case: dict) -> dict:
    """megacache's build of ``case`` in the current directory (the datasets'): the files it wrote
    beside the sequences file, which Megatron's programs do not write."""
    assert cli.main(["build", *case["words"], "--megatron-version", case["version"]]) == 0
    cache = case_cache(case)
    built = cache_files(cache)
    assert built.pop("sequences_per_dataset.json")
    return built


def write_yaml(case: dict) -> None:
    if "yaml" in case:
        with open(case["words"][1], "w", encoding="utf-8") as f:
            f.write(case["yaml"])


def case_cache(case: dict) -> str:
    words = case["words"]
    if "yaml" in case:
        return yaml.safe_load(case["yaml"])["data_cache_path"]
    return words[words.index("--data-cache-path") + 1]


@pytest.mark.parametrize("case", RECORDED, ids=IDS)
def test_build_writes_what_megatron_writes(case, datasets, monkeypatch, capsys):
    assert "files" in case, f"{case['program']} refused a case recorded to build: {case.get('error')}"
    monkeypatch.chdir(datasets)
    write_yaml(case)
    assert build_as_recorded(case) == case["files"]
    capsys.readouterr()


def test_every_version_and_program_is_recorded_with_whole_commands():
    assert {(c["version"], c["program"]) for c in RECORDED} == {
        *((v, "pretrain_gpt.py") for v in ("0.16", "0.17")), *((v, "prepare_cache.py") for v in ("0.18", "0.19", "0.20")),
        *((v, "pretrain_gpt.py --yaml-cfg") for v in SUPPORTED)}
    for case in RECORDED:
        if "yaml" in case:
            assert len(case["yaml"].splitlines()) >= 100, case["name"]
        else:
            assert sum(w.startswith("--") for w in case["words"]) >= 100, case["name"]


@pytest.mark.mpi(min_size=2)
def test_build_on_several_ranks_writes_what_megatron_writes(monkeypatch, capsys):
    comm = get_comm()
    with shared_directory(comm, "megacache-prepare-cache-") as root:
        monkeypatch.chdir(root)
        if comm.rank == 0:
            write_datasets(Path(root))
            for case in RECORDED:
                write_yaml(case)
        comm.barrier()
        for case in RECORDED:
            built = build_as_recorded(case)
            if comm.rank == 0:
                assert built == case["files"], f"{case['version']} {case['program']} {case['name']}"
        capsys.readouterr()


def megacache_config(case: dict):
    """megacache's own reading of ``case``'s command (in the datasets' directory)."""
    args = cli.build_parser().parse_args(["build", *case["words"], "--megatron-version", case["version"]])
    return cli.build_config(args, SingleComm())


@pytest.mark.parametrize("case", RECORDED, ids=IDS)
def test_megacache_reads_each_command_as_megatron_does(case, datasets, monkeypatch, capsys):
    """What --megatron-python compares: megacache's reading of the whole command against what that
    version's own parse_args, validate_args, ... gave for it (megacache/megatron/training_worker.py,
    run in the version's tree by the recorder)."""
    monkeypatch.chdir(datasets)
    write_yaml(case)
    assert set(case["reading"]) == set(READING), case["reading"]
    assert command_differences(case["reading"], megacache_config(case).reading()) == []
    capsys.readouterr()


def test_a_reading_megatron_differs_from_stops_the_build_naming_each_field(datasets, monkeypatch, capsys):
    monkeypatch.chdir(datasets)
    case = next(c for c in RECORDED if c["version"] == "0.19" and c["name"] == "weighted blend")
    cfg = megacache_config(case)
    asked = {**case["reading"], "seed": 8, "blend": [["data/a", "data/b"], [0.5, 0.5]]}
    found = Identity("0.19", cfg.tokenizer, "0.19.2", command=asked)
    with pytest.raises(MegacacheError) as raised:
        check_reading(found, "/train/bin/python", cfg.reading(), lambda kind, text: None)
    assert str(raised.value) == (
        "--megatron-python /train/bin/python (megatron-core 0.19.2) reads this training command otherwise than "
        "megacache:\n  seed: your Megatron has 8, megacache read 7\n  blend: your Megatron has [['data/a', "
        "'data/b'], [0.5, 0.5]], megacache read [['data/a', 'data/b'], [0.6, 0.4]]\nThe caches would not be the "
        "ones your training looks for; report this as a megacache bug, with the command")
    refused = Identity("0.19", cfg.tokenizer, "0.19.2", command={"error": "AssertionError: expected "
                                                                          "iteration-based training"})
    with pytest.raises(MegacacheError, match=r"^--megatron-python /train/bin/python: your Megatron-LM refuses this "
                                             r"training command: AssertionError: expected iteration-based training$"):
        check_reading(refused, "/train/bin/python", cfg.reading(), lambda kind, text: None)
    capsys.readouterr()
