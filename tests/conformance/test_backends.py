"""Tokenizer backends: gigatoken runs where it is exact, and the guard catches it where it is not.

A wrong gigatoken is made by tests/support/systems/faulty_gigatoken.py, which runs the megacache command with
gigatoken's first id of every document holding the marker text made wrong, in a real mpiexec run."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from megacache.text.backends import DEFAULT_VERIFY_FRACTION, SELF_TEST_TEXTS, sampled
from support.inputs.corpus import MEGACACHE, documents, file_bytes, run_megacache, train_bpe, write_input

MARKER = "zqxv-marker"
FAULTY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "systems",
                      "faulty_gigatoken.py")


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe(str(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


def _corpus(tmp_path, marked: list[int] = ()) -> list[str]:
    """Two jsonl files of the shared test documents, ``MARKER`` appended to the documents numbered
    ``marked`` (each file is one work unit; documents numbered within it)."""
    docs = documents()
    halves = [docs[:200], docs[200:]]
    for d in marked:
        halves[0][d] += f" {MARKER}"
    for f, half in enumerate(halves):
        write_input(str(tmp_path / "in" / f"part_{f}.jsonl"), half)
    return docs


def _tokenize(tmp_path, tokenizer, name, *args, ranks=2, fault=None, check=True):
    return run_megacache(ranks, "tokenize", "--input", str(tmp_path / "in"), "--output-prefix",
                         str(tmp_path / name), "--tokenizer", tokenizer, "--append-eod", *args, check=check,
                         program=(sys.executable, FAULTY, fault) if fault else MEGACACHE)


def test_auto_runs_gigatoken_and_writes_the_hf_backends_bytes(tmp_path, bpe):
    os.makedirs(tmp_path / "in")
    _corpus(tmp_path)
    hf = _tokenize(tmp_path, bpe, "hf", "--tokenizer-backend", "hf")
    auto = _tokenize(tmp_path, bpe, "auto", "--verify-fraction", "1")
    assert "tokenizer backend: hf (--tokenizer-backend hf)" in hf.stdout
    assert "tokenizer backend: gigatoken" in auto.stdout
    assert "seconds per stage, all ranks: read " in auto.stdout
    assert f"exactness guard: {len(documents()):,} documents encoded again by the reference: all equal" in auto.stdout
    assert file_bytes(str(tmp_path / "auto_text_document")) == file_bytes(str(tmp_path / "hf_text_document"))


def test_guard_catches_a_wrong_id_redoes_the_unit_and_exits_3(tmp_path, bpe):
    # The wrong document is one the default sample checks, in the first file's unit.
    checked = np.flatnonzero(sampled(0, 200, DEFAULT_VERIFY_FRACTION))
    assert checked.size, "the default sample checks some of the first 200 documents"
    os.makedirs(tmp_path / "in")
    _corpus(tmp_path, marked=[int(checked[0])])
    hf = _tokenize(tmp_path, bpe, "hf", "--tokenizer-backend", "hf")
    run = _tokenize(tmp_path, bpe, "auto", fault=MARKER, check=False)
    assert run.returncode == 3, run.stdout + run.stderr
    where = f"document {checked[0] + 1} of {tmp_path / 'in' / 'part_0.jsonl'}, bytes 0-"
    assert f"gigatoken disagrees with hf on {where}" in run.stderr
    assert "1 unit(s) disagreed and were tokenized again by it: " + where in run.stdout
    assert file_bytes(str(tmp_path / "auto_text_document")) == file_bytes(str(tmp_path / "hf_text_document"))
    assert "disagree" not in hf.stdout + hf.stderr


def test_strict_backend_stops_on_a_disagreement_and_publishes_nothing(tmp_path, bpe):
    os.makedirs(tmp_path / "in")
    _corpus(tmp_path, marked=[3])
    run = _tokenize(tmp_path, bpe, "out", "--strict-backend", "--verify-fraction", "1", fault=MARKER, check=False)
    assert run.returncode == 2
    assert "--strict-backend: gigatoken disagrees with hf on document 4 of " in run.stderr
    assert not os.path.exists(tmp_path / "out_text_document.bin")


def test_self_test_failure_falls_back_to_hf_or_is_an_error_when_gigatoken_is_required(tmp_path, bpe):
    os.makedirs(tmp_path / "in")
    _corpus(tmp_path)
    fault = "quick brown fox"
    assert any(fault in t for t in SELF_TEST_TEXTS)
    _tokenize(tmp_path, bpe, "hf", "--tokenizer-backend", "hf")
    auto = _tokenize(tmp_path, bpe, "auto", fault=fault)
    assert "tokenizer backend: hf (gigatoken disagrees with hf on the self-test text 'Hello, world! The quick" in auto.stdout
    assert file_bytes(str(tmp_path / "auto_text_document")) == file_bytes(str(tmp_path / "hf_text_document"))
    forced = _tokenize(tmp_path, bpe, "forced", "--tokenizer-backend", "gigatoken", fault=fault, check=False)
    assert forced.returncode == 2
    assert "--tokenizer-backend gigatoken: gigatoken disagrees with hf on the self-test text" in forced.stderr


def test_tokenizers_gigatoken_cannot_load_run_on_hf(tmp_path):
    from support.inputs.tokenizer_files import write_tokenizer_files

    write_tokenizer_files(tmp_path)
    os.makedirs(tmp_path / "in")
    _corpus(tmp_path)
    bert = str(tmp_path / "bertfiles" / "vocab.txt")
    run = _tokenize(tmp_path, bert, "auto", ranks=1)
    assert "tokenizer backend: hf (gigatoken cannot load it: Unsupported model type \"WordPiece\"" in run.stdout
    forced = _tokenize(tmp_path, bert, "forced", "--tokenizer-backend", "gigatoken", ranks=1, check=False)
    assert forced.returncode == 2 and "--tokenizer-backend gigatoken: gigatoken cannot load it" in forced.stderr
    byte = run_megacache(1, "tokenize", "--input", str(tmp_path / "in"), "--output-prefix", str(tmp_path / "b"),
                         "--tokenizer", "byte")
    assert "tokenizer backend: builtin (gigatoken does not apply to byte-level" in byte.stdout


def test_the_guards_sample_is_fixed_by_document_number_and_near_its_fraction():
    whole = sampled(0, 100_000, 0.01)
    pieces = np.concatenate([sampled(a, b - a, 0.01) for a, b in ((0, 7), (7, 50_000), (50_000, 100_000))])
    assert np.array_equal(whole, pieces)
    assert 900 <= whole.sum() <= 1100
    assert not sampled(0, 1000, 0).any() and sampled(0, 1000, 1).all()
