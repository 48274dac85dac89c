"""``--megatron-python``: megacache asks another interpreter's Megatron for the tokenizer identity.
In these tests that Megatron is a stand-in package (it imports in milliseconds) that answers what a test
makes it answer; tests/conformance/test_asking_megatron_releases.py asks the real megatron-core releases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from megacache.errors import MegacacheError
from megacache.megatron.flags import flag_words
from megacache.megatron.interpreter import asked_identifiers, differences
from megacache.megatron.tokenizer import TOKENIZER_FLAGS, tokenizer_identifiers
from megacache.megatron.versions import SUPPORTED
from support.inputs.indexed import write_lengths

HF = dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="some/model")


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """A Megatron whose version and answer come from the environment, first on PYTHONPATH."""
    root = tmp_path / "standin"
    utils = root / "megatron" / "core" / "tokenizers" / "utils"
    utils.mkdir(parents=True)
    for package in (root / "megatron", root / "megatron" / "core" / "tokenizers", utils):
        (package / "__init__.py").write_text("")
    (root / "megatron" / "core" / "__init__.py").write_text(
        "import os\n__version__ = os.environ['STANDIN_VERSION']\n")
    (utils / "build_tokenizer.py").write_text(textwrap.dedent("""\
        import json, os, sys

        class Tokenizer:
            pass

        def build_tokenizer(args):
            print("a Megatron that prints")
            answer = json.loads(os.environ["STANDIN_ANSWER"])
            if "fail" in answer:
                raise ValueError(answer["fail"])
            with open(os.environ["STANDIN_ARGS"], "w") as f:
                json.dump(vars(args), f)
            tokenizer = Tokenizer()
            tokenizer.unique_identifiers = answer
            return tokenizer
    """))
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.setenv("STANDIN_ARGS", str(tmp_path / "args.json"))

    def answer(version: str, ids: dict) -> str:
        monkeypatch.setenv("STANDIN_VERSION", version)
        monkeypatch.setenv("STANDIN_ANSWER", json.dumps(ids))
        return str(tmp_path / "args.json")

    return answer


def test_an_agreeing_megatron_is_followed(standin):
    table = tokenizer_identifiers(megatron_version="0.19", **HF, tokenizer_special_tokens=["<a>", "<b>"])
    args = standin("0.19.2", table)
    asked = asked_identifiers(sys.executable, dict(HF, tokenizer_special_tokens=["<a>", "<b>"]))
    assert (asked.megatron, asked.version, asked.identifiers, asked.note) == ("0.19.2", "0.19", table, None)
    # megatron-core alone (no megatron.training): args as 0.19's Megatron-LM parses the flags
    with open(args) as f:
        given = json.load(f)
    assert given["special_tokens"] == ["<a>", "<b>"] and given["metadata_path"] is None
    assert given["tokenizer_type"] == "HuggingFaceTokenizer" and given["tokenizer_hf_no_use_fast"] is False
    assert given["make_vocab_size_divisible_by"] == 128


def test_a_disagreeing_megatron_stops_the_build_naming_each_field(standin, tmp_path):
    table = tokenizer_identifiers(megatron_version="0.19", **HF)
    patched = {**table, "use_fast": "False", "extra": "1"}
    standin("0.19.2", patched)
    with pytest.raises(MegacacheError) as caught:
        asked_identifiers(sys.executable, HF)
    message = str(caught.value)
    assert "gives another tokenizer identity than megacache's table for 0.19" in message
    assert "  use_fast: this Megatron has 'False', megacache's table has 'True'\n" in message
    assert "  extra: this Megatron has '1', megacache's table has no such field\n" in message
    # the same from the command line: exit 2, nothing written
    write_lengths(str(tmp_path / "data"), np.full(100, 30))
    done = subprocess.run(
        [sys.executable, "-m", "megacache.interfaces.cli", "build", "--data-path", str(tmp_path / "data"), "--seq-length", "8",
         "--train-samples", "100", "--global-batch-size", "4", "--eval-iters", "0", "--split", "90,5,5",
         "--tokenizer-type", HF["tokenizer_type"], "--tokenizer-model", HF["tokenizer_model"],
         "--megatron-python", sys.executable, "--data-cache-path", str(tmp_path / "cache")],
        capture_output=True, text=True, env=os.environ)
    assert done.returncode == 2, done.stderr
    assert "use_fast: this Megatron has 'False'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "cache").exists()


def test_field_order_is_part_of_the_identity():
    table = {"class": "C", "tokenizer_path": "p", "a": "1", "b": "2"}
    assert differences(dict(table), table) == []
    assert differences({"class": "C", "tokenizer_path": "p", "b": "2", "a": "1"}, table) == [
        "field order: this Megatron has ['class', 'tokenizer_path', 'b', 'a'], megacache's table has "
        "['class', 'tokenizer_path', 'a', 'b']"]


def test_a_megatron_newer_than_the_table_is_followed_with_a_note(standin):
    ids = {"class": "megatron.core.tokenizers.Future", "tokenizer_path": "some/model", "new": "True"}
    standin("0.99.0", ids)
    asked = asked_identifiers(sys.executable, HF)
    assert (asked.version, asked.identifiers) == (SUPPORTED[-1], ids)
    assert asked.note == (f"megatron-core 0.99.0 is newer than megacache's table ({SUPPORTED[-1]}): its own "
                          f"tokenizer identity names the cache; the indices follow {SUPPORTED[-1]}")


@pytest.mark.parametrize("version, answer, flags, message", [
    ("0.15.1", {}, {}, "runs megatron-core 0.15.1, older than the versions megacache reproduces"),
    ("0.19.2", {"fail": "no such model"}, {},
     "its megatron-core 0.19.2 could not build the tokenizer from these flags: ValueError: no such model"),
    ("nightly", {}, {}, "its megatron.core reports version 'nightly', which is not a version number"),
    ("0.19.2", {}, {"requested": "0.18"}, "--megatron-version 0.18, but --megatron-python"),
])
def test_refusals(standin, version, answer, flags, message):
    standin(version, answer)
    with pytest.raises(MegacacheError, match=message.replace("(", r"\(").replace(")", r"\)")):
        asked_identifiers(sys.executable, HF, **flags)


def test_interpreters_that_cannot_answer(tmp_path):
    with pytest.raises(MegacacheError, match="no such program"):
        asked_identifiers(str(tmp_path / "missing"), HF)
    with pytest.raises(MegacacheError, match="did not answer as a Python interpreter"):
        asked_identifiers("/bin/true", HF)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MegacacheError, match="No module named 'megatron'.*install megatron-core there"):
        _without_megatron(empty)


def _without_megatron(empty):
    """Asked in an interpreter that imports no megatron: one started with -I (isolated: no site
    packages, no PYTHONPATH) stands in for it."""
    wrapper = empty / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    wrapper.chmod(0o755)
    return asked_identifiers(str(wrapper), HF)


def test_flag_words():
    assert flag_words(TOKENIZER_FLAGS, dict(tokenizer_type="NullTokenizer", vocab_size=7, tokenizer_special_tokens=["a", "b"],
                           tokenizer_hf_no_use_fast=True, trust_remote_code=False, tokenizer_model=None)) == [
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "7", "--tokenizer-special-tokens", "a", "b",
        "--tokenizer-hf-no-use-fast"]


def test_a_configuration_from_megatron_flags(standin, tmp_path, monkeypatch):
    from megacache.builders.build import BuildConfig
    from megacache.megatron.blends import Blend
    from megacache.megatron.training import split_sizes

    monkeypatch.chdir(tmp_path)
    write_lengths("d", [5, 9, 30] * 20)
    training = dict(train_iters=100, global_batch_size=4, eval_iters=2, eval_interval=10)
    null = dict(tokenizer_type="NullTokenizer", vocab_size=1000, null_tokenizer_pad_id=-1)  # -1: the default
    cfg = BuildConfig.from_megatron_flags(dict(data_path=["d"], seq_length=8, **training, **null),
                                          megatron_version="0.18")
    assert (cfg.megatron_version, cfg.sizes, cfg.tokenizer, cfg.blend, cfg.split, cfg.seed) == (
        "0.18", split_sizes("0.18", **training), tokenizer_identifiers("NullTokenizer", "0.18", vocab_size=1000),
        Blend(("d",)), "969, 30, 1", 1234)
    # the version comes once, from the Megatron asked, and the sizes follow it
    standin("0.17.1", tokenizer_identifiers(megatron_version="0.17", **HF))
    cfg = BuildConfig.from_megatron_flags(dict(data_path=["d"], seq_length=8, tokenizer_hf_no_use_fast=False,
                                               **training, **HF), megatron_python=sys.executable)
    assert (cfg.megatron_version, cfg.tokenizer) == ("0.17", tokenizer_identifiers(megatron_version="0.17", **HF))
    with pytest.raises(MegacacheError, match="not Megatron-LM flags a build reads: blend, num_layers"):
        BuildConfig.from_megatron_flags(dict(blend=Blend(("d",)), num_layers=2, **training, **null))


def test_library_notes_go_to_the_megacache_logger(standin, caplog, capsys, tmp_path, monkeypatch):
    import logging

    from megacache.builders.build import BuildConfig

    monkeypatch.chdir(tmp_path)
    write_lengths("d", [5, 9, 30] * 20)
    standin("0.99.0", {"class": "C", "tokenizer_path": "p"})
    flags = dict(data_path=["d"], seq_length=8, train_samples=100, global_batch_size=4, eval_iters=0,
                 eval_interval=10, **HF)
    with caplog.at_level(logging.WARNING, logger="megacache"):
        BuildConfig.from_megatron_flags(flags, megatron_python=sys.executable)
    assert [r.name for r in caplog.records] == ["megacache"]
    assert "megatron-core 0.99.0 is newer than megacache's table" in caplog.records[0].getMessage()
    # an embedding program silences it as any logger
    logging.getLogger("megacache").setLevel(logging.ERROR)
    try:
        BuildConfig.from_megatron_flags(flags, megatron_python=sys.executable)
    finally:
        logging.getLogger("megacache").setLevel(logging.NOTSET)
    assert "newer than" not in capsys.readouterr().err
