"""``megacache build --dry-run`` (``builders.build.inventory``): it names exactly the files a build
then writes, tells complete, missing, partial and stale entries apart, and writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from megacache.builders.build import build, inventory
from megacache.runtime.comm import SingleComm
from support.inputs.indexed import write_lengths
from support.sweeps import (BlendSweepConfig, DatasetShape, blend_build_config, prefix_build_config,
                            random_blend_config, random_config, write_sweep_dataset)
from megacache.errors import MegacacheError


def tree(root: str) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                out[path] = f.read()
    return out


def named_files(states, others) -> set[str]:
    """What the dry run says a build writes: the files of every entry not complete, and the rest."""
    return {s.item.entry.path(w) for s in states if s.state != "complete" for w in s.item.entry.names} | set(others)


def check_names_what_build_writes(cfg, root: str) -> str:
    before = tree(root)
    try:
        _, states, others = inventory(cfg, SingleComm())
    except MegacacheError:
        with pytest.raises(MegacacheError):  # a configuration the dry run refuses, the build refuses
            build(cfg, SingleComm())
        assert tree(root) == before
        return "refused"
    assert tree(root) == before  # nothing written, not even the cache directory
    assert {s.state for s in states} == {"missing"}
    try:
        build(cfg, SingleComm())
    except MegacacheError as exc:
        # Found only by blending, which a dry run does not do; the build publishes nothing then.
        assert "oversampl" in str(exc) or "IndexError" in str(exc), exc
        assert not set(tree(root)) & named_files(states, others)
        return "oversampled"
    after = tree(root)
    assert set(after) - set(before) == named_files(states, others)
    _, states, others = inventory(cfg, SingleComm())
    assert {s.state for s in states} == {"complete"} and others == []
    assert tree(root) == after
    return "ok"


def test_dry_run_names_exactly_what_single_prefix_builds_write(tmp_path):
    rng = np.random.default_rng(11)
    outcomes = {}
    for k in range(40):
        c = random_config(rng)
        root = str(tmp_path / f"c{k}")
        os.makedirs(root)
        write_sweep_dataset(os.path.join(root, "data"), c.lengths, c.shape)
        label = check_names_what_build_writes(prefix_build_config(c, os.path.join(root, "data"),
                                                                  os.path.join(root, "cache")), root)
        outcomes[label] = outcomes.get(label, 0) + 1
    assert outcomes.get("ok", 0) >= 25, outcomes


def test_dry_run_names_exactly_what_blend_builds_write(tmp_path):
    rng = np.random.default_rng(12)
    outcomes = {}
    for k in range(30):
        c = random_blend_config(rng)
        root = str(tmp_path / f"c{k}")
        os.makedirs(root)
        prefixes = [os.path.join(root, f"d{i:04d}") for i in range(len(c.datasets))]
        for p, lengths, shape in zip(prefixes, c.datasets, c.shapes):
            write_sweep_dataset(p, lengths, shape)
        label = check_names_what_build_writes(blend_build_config(c, prefixes, os.path.join(root, "cache")), root)
        outcomes[label] = outcomes.get(label, 0) + 1
    assert outcomes.get("ok", 0) >= 20, outcomes


@pytest.fixture
def built(tmp_path):
    """A blend of two datasets, built."""
    c = BlendSweepConfig(datasets=[np.full(300, 20), np.full(200, 20)], weights=[0.3, 0.7], split="90,5,5",
                         sizes=(500, 10, 10), seq_length=16, add_extra_token=True, seed=3,
                         drop_last_partial_validation=True, per_split=False, shapes=[DatasetShape()] * 2)
    prefixes = [str(tmp_path / "a"), str(tmp_path / "b")]
    for p, lengths, shape in zip(prefixes, c.datasets, c.shapes):
        write_sweep_dataset(p, lengths, shape)
    cfg = blend_build_config(c, prefixes, str(tmp_path / "cache"))
    build(cfg, SingleComm())
    return cfg, prefixes


def test_partial_and_stale_entries(built):
    cfg, prefixes = built
    _, states, _ = inventory(cfg, SingleComm())
    first, blend = states[0], states[-1]  # the first dataset's train split, the test blend
    os.remove(first.item.entry.path("sample_index.npy"))
    os.remove(blend.item.entry.path("description.txt"))
    write_lengths(prefixes[1], np.full(200, 21))  # the same name and count, other lengths: not in the hash
    _, states, others = inventory(cfg, SingleComm())
    by_stem = {s.item.entry.stem: s for s in states}
    assert by_stem[first.item.entry.stem].state == "partial"
    assert by_stem[first.item.entry.stem].present == (True, True, False, True)
    assert by_stem[blend.item.entry.stem].state == "partial"
    stale = [s for s in states if s.state == "stale"]
    gpt = [s for s in stale if s.item.entry.class_name == "GPTDataset"]
    assert {s.item.data_path for s in gpt} == {prefixes[1]} and len(gpt) == 3
    assert all("length_checksum" in " ".join(s.problems) for s in gpt)
    # the blends still complete take other sample counts from that dataset now
    assert [s.item.name for s in stale if s not in gpt] == ["train", "valid"]
    # the sequences file holds the same counts: not rewritten
    assert others == [os.path.join(cfg.cache_dir, ".megacache", "manifest.json")]


def megacache(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megacache.interfaces.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_command_line_dry_run(built, tmp_path):
    cfg, prefixes = built
    flags = ["build", "--data-path", "0.3", prefixes[0], "0.7", prefixes[1], "--split", "90,5,5",
             "--seq-length", "16", "--seed", "3", "--train-samples", "500", "--global-batch-size", "10", "--eval-iters", "1",
             "--eval-interval", "1000", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
    before = tree(str(tmp_path))
    done = megacache(*flags, "--data-cache-path", str(tmp_path / "cache2"), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("megacache build --dry-run: 9 cache entries for megatron-core 0.16 (9 missing); "
                        "nothing written")
    assert [line.split()[:3] for line in lines[1:10]] == [
        ["missing", split, kind] for kind in ("GPTDataset",) for _ in prefixes
        for split in ("train", "valid", "test")] + [["missing", split, "BlendedDataset"]
                                                     for split in ("train", "valid", "test")]
    assert lines[10:] == [f"also written: {tmp_path}/cache2/.megacache/manifest.json",
                          f"also written: {tmp_path}/cache2/sequences_per_dataset.json"]
    done = megacache(*flags, "--data-cache-path", str(tmp_path / "cache2"), "--dry-run", "--json", "--verbose",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["entries"]) == 9 and report["megatron_version"] == "0.16"
    blend = report["entries"][6]
    assert (blend["class"], blend["split"], blend["samples"], blend["requested"]) == ("BlendedDataset", "train",
                                                                                      500, 500)
    assert json.loads(blend["description"])["weights"] == [0.3, 0.7]
    assert os.path.basename(blend["files"]["dataset_index.npy"]["path"]).startswith(blend["md5"])
    assert tree(str(tmp_path)) == before
    # the built cache: every entry complete, in the order of the plan
    done = megacache(*flags, "--data-cache-path", cfg.cache_dir, "--dry-run", cwd=tmp_path)
    assert done.stdout.splitlines()[0].endswith("(9 complete); nothing written")
    done = megacache(*flags, "--data-cache-path", cfg.cache_dir, "--json", cwd=tmp_path)
    assert done.returncode == 2 and "--json goes with --dry-run" in done.stderr


NEAR_BUILD = ["--seq-length", "8", "--train-samples", "40", "--global-batch-size", "1", "--eval-iters", "2",
              "--eval-interval", "10", "--tokenizer-type", "NullTokenizer", "--data-cache-path", "cache",
              "--megatron-version", "0.19"]


@pytest.mark.parametrize("changed, near", [
    (["--data-path", "./d", "--vocab-size", "100"], "dataset_path 'd' instead of './d'"),
    (["--data-path", "d", "--vocab-size", "100", "--seed", "5"], "random_seed 1234 instead of 5"),
    (["--data-path", "d", "--vocab-size", "101"], "tokenizer.vocab_size '100' instead of '101'"),
])
def test_a_missing_entry_names_the_built_one_that_differs_in_one_field(changed, near, tmp_path, monkeypatch,
                                                                        capsys):
    from megacache.interfaces import cli

    monkeypatch.chdir(tmp_path)
    write_lengths("d", [5, 9, 0, 30, 12] * 120)
    assert cli.main(["build", "--data-path", "d", "--vocab-size", "100", *NEAR_BUILD]) == 0
    built = {name.rsplit("-", 1)[0] for name in os.listdir("cache") if name.endswith("-description.txt")}
    capsys.readouterr()
    assert cli.main(["build", *changed, *NEAR_BUILD, "--dry-run"]) == 0
    hints = [line.strip() for line in capsys.readouterr().out.splitlines() if "nearest built entry" in line]
    assert {h.split(": ", 1)[1].split("-*")[0] for h in hints} == built and len(hints) == 3
    assert all(h.endswith(f"-*, built with {near}") for h in hints), hints
    assert cli.main(["build", *changed, *NEAR_BUILD, "--dry-run", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    assert [e["nearest_built"].endswith(near) for e in entries] == [True] * 3
    # two fields apart is no near miss
    assert cli.main(["build", *changed, "--split", "90,5,5", *NEAR_BUILD, "--dry-run"]) == 0
    assert "nearest built entry" not in capsys.readouterr().out
