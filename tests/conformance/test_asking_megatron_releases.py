"""``--megatron-python`` against the real releases: megacache's worker, run in each oracle's
interpreter, gets from that megatron-core's own build_tokenizer the identity megacache's table
gives, on the identity tests' random and fixed flag sets and on the tokenizers of the
200-configuration sweeps (which name their caches by these identities alone, so that a sweep told
to ask gives the table's names and bytes); and a build told to ask that interpreter writes the cache
a build from the table writes, file for file."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys

import numpy as np
import pytest

from megacache.errors import MegacacheError
from megacache.megatron.interpreter import ask, differences
from megacache.megatron.tokenizer import tokenizer_identifiers
from support.inputs.indexed import write_lengths
from megacache.megatron.versions import UNRELEASED
from support.oracles.environments import MAIN_PATH, RELEASES, interpreter
from support.inputs.tokenizer_cases import fixed_cases, random_cases, sweep_tokenizers
from support.inputs.tokenizer_files import write_tokenizer_files

pytestmark = pytest.mark.oracle_environments

#: the released versions, and Megatron-LM main where a checkout is given (its parser then reads the flags)
VERSIONS = [*RELEASES, *(["0.20"] if MAIN_PATH else [])]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_python")
    write_tokenizer_files(root)
    return root


def use(version: str, monkeypatch) -> str:
    """That oracle's interpreter, with its PYTHONPATH in this process's environment (the worker runs
    in megacache's environment)."""
    python, env = interpreter(version)
    if "PYTHONPATH" in env:
        monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    else:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    return python


@pytest.mark.parametrize("version", VERSIONS)
def test_each_megatron_answers_what_the_table_gives(root, version, monkeypatch):
    python = use(version, monkeypatch)
    monkeypatch.chdir(root)  # GPT-2 and BERT load the hub names gpt2, bert-large-*: folders in root
    # a fifth of the identity test's random cases (that test compares the table with every one), and
    # for main the fixed ones too, as there
    cases = random_cases(version, root)[::5]
    if version in UNRELEASED:
        cases += list(fixed_cases(version, root).values())
    sweeps = sweep_tokenizers(str(root), version)
    answer = ask(python, sweeps + cases)
    answers = answer["answers"]
    for flags, result in zip(sweeps, answers[:len(sweeps)], strict=True):  # every one builds, in every version
        assert "error" not in result, (flags, result["error"])
        assert differences(result["identifiers"], tokenizer_identifiers(megatron_version=version, **flags)) == [], flags
    assert answer["version"].startswith(RELEASES.get(version, version + ".")), answer["version"]
    counts = {"equal": 0, "refused": 0}
    for flags, result in zip(cases, answers[len(sweeps):], strict=True):
        try:
            table = tokenizer_identifiers(megatron_version=version, **flags)
        except MegacacheError:
            assert "error" in result, (flags, result)  # megacache refuses only what Megatron refuses
            counts["refused"] += 1
            continue
        assert "error" not in result, (flags, result["error"])
        assert differences(result["identifiers"], table) == [], flags
        counts["equal"] += 1
    assert counts["equal"] >= 0.8 * len(cases), counts
    print(f"--megatron-python, megatron-core {answer['version']}: {counts}")


@pytest.mark.parametrize("version", VERSIONS[3:])  # the newest release (and main): the names follow the identity
def test_a_build_that_asks_writes_what_the_table_names(root, version, tmp_path, monkeypatch):
    python = use(version, monkeypatch)
    data = str(tmp_path / "data")
    write_lengths(data, np.random.default_rng(4).integers(1, 300, 500))
    flags = ["build", "--data-path", data, "--seq-length", "64", "--train-samples", "3000", "--global-batch-size",
             "16", "--eval-iters", "2", "--eval-interval", "50", "--split", "90,8,2", "--tokenizer-type",
             "HuggingFaceTokenizer", "--tokenizer-model", str(root / "hf"), "--tokenizer-special-tokens", "<x>"]
    caches = {}
    for way, extra in (("asked", ["--megatron-python", python]), ("table", ["--megatron-version", version])):
        caches[way] = str(tmp_path / way)
        done = subprocess.run([sys.executable, "-m", "megacache.interfaces.cli", *flags, *extra, "--data-cache-path",
                               caches[way]], capture_output=True, text=True, cwd=root)
        assert done.returncode == 0, done.stderr
    names = sorted(n for n in os.listdir(caches["table"]) if not n.startswith("."))
    assert len(names) == 13  # three entries of four files, and the sequences file
    assert sorted(n for n in os.listdir(caches["asked"]) if not n.startswith(".")) == names
    match, mismatch, errors = filecmp.cmpfiles(caches["asked"], caches["table"], names, shallow=False)
    assert (mismatch, errors) == ([], [])
