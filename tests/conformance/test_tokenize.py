"""megacache tokenize: bytes equal to megatron-core's IndexedDatasetBuilder, for every input format
and rank count; resume after a real SIGKILL; bad input."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from support.inputs.corpus import (documents, file_bytes, kill_tree, megacache_cmd, megatron_reference,
                                   process_tree, run_megacache, train_bpe, write_input)
from support.systems.faults import leftovers


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe(str(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf(bpe):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(bpe)
    eod = tok.token_to_id("<|endoftext|>")
    return (lambda docs: [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]), eod


@pytest.fixture(scope="module")
def reference(tmp_path_factory, megatron, hf):
    """megatron-core's bytes for the shared test documents, with and without EOD."""
    encode, eod = hf
    out = {}
    d = tmp_path_factory.mktemp("ref")
    for with_eod in (True, False):
        prefix = str(d / f"ref_{with_eod}")
        megatron_reference(megatron, prefix, documents(), encode, eod if with_eod else None, np.uint16)
        out[with_eod] = file_bytes(prefix)
    return out


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst", ".txt", ".parquet"])
def test_every_format_gives_megatron_bytes(tmp_path, bpe, reference, suffix):
    # Three input files so units, files and ranks all interleave; 2 ranks; small units.
    docs = documents()
    cuts = [0, 150, 151, 999999]
    for f in range(3):
        write_input(str(tmp_path / f"part_{f}{suffix}"), docs[cuts[f] : cuts[f + 1]])
    run = run_megacache(2, "tokenize", "--input", str(tmp_path / f"part_*{suffix}"), "--output-prefix",
                        str(tmp_path / "out"), "--tokenizer", bpe, "--append-eod", "--unit-bytes", "4K")
    assert file_bytes(str(tmp_path / "out_text_document")) == reference[True]
    assert "tokenizer backend: gigatoken" in run.stdout  # the default backend, exact


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_same_bytes_for_any_rank_count(tmp_path, bpe, reference, ranks):
    docs = documents()
    for f, (a, b) in enumerate([(0, 100), (100, 101), (101, 300), (300, None)]):
        write_input(str(tmp_path / f"shard_{f}.jsonl"), docs[a:b])
    run = run_megacache(ranks, "tokenize", "--input", str(tmp_path), "--output-prefix", str(tmp_path / "out"),
                        "--tokenizer", bpe, "--unit-bytes", "3K")
    assert file_bytes(str(tmp_path / "out_text_document")) == reference[False]
    assert "tokenizer backend: gigatoken" in run.stdout
    assert not leftovers(str(tmp_path)), "work files left behind"


def test_multiple_keys_and_documents_with_newlines(tmp_path, megatron, bpe, hf):
    import json

    encode, eod = hf
    docs = documents(newlines=True)
    titles = [d[:20] for d in docs]
    with open(tmp_path / "in.jsonl", "w", encoding="utf-8") as f:
        for d, t in zip(docs, titles):
            f.write(json.dumps({"title": t, "text": d}) + "\n")
    run_megacache(1, "tokenize", "--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o"),
                  "--json-keys", "text", "title", "--tokenizer", bpe, "--append-eod", "--unit-bytes", "2K")
    for key, texts in (("text", docs), ("title", titles)):
        megatron_reference(megatron, str(tmp_path / f"ref_{key}"), texts, encode, eod, np.uint16)
        assert file_bytes(str(tmp_path / f"o_{key}_document")) == file_bytes(str(tmp_path / f"ref_{key}"))


def test_natural_order_of_shards(tmp_path, megatron):
    # shard_2 must precede shard_10 (a plain sort would not).
    for i in (10, 2, 1):
        write_input(str(tmp_path / f"shard_{i}.txt"), [f"document {i}"])
    run_megacache(1, "tokenize", "--input", str(tmp_path / "shard_*.txt"), "--output-prefix", str(tmp_path / "o"),
                  "--tokenizer", "byte")
    from megacache.formats.indexed import IndexedDataset

    ds = IndexedDataset(str(tmp_path / "o_text_document"))
    texts = [bytes(ds.document(d).astype(np.uint8)).decode() for d in range(3)]
    assert texts == ["document 1", "document 2", "document 10"]


def test_byte_tokenizer_gives_megatrons_bytes(tmp_path, megatron):
    docs = documents(50)
    write_input(str(tmp_path / "in.jsonl"), docs)
    run_megacache(1, "tokenize", "--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o"),
                  "--tokenizer", "byte", "--append-eod")
    megatron_reference(megatron, str(tmp_path / "ref"), docs,
                       lambda ds: [list(d.encode("utf-8")) for d in ds], 256, np.uint16)
    assert file_bytes(str(tmp_path / "o_text_document")) == file_bytes(str(tmp_path / "ref"))


@pytest.mark.parametrize("output_format", ["megatron", "pbin"])
def test_resume_after_sigkill_redoes_only_unfinished_units(tmp_path, bpe, megatron, hf, output_format):
    encode, eod = hf
    docs = documents(6000, seed=11)
    for f in range(4):
        write_input(str(tmp_path / f"s{f}.jsonl"), docs[f::4])
    flags = ["--input", str(tmp_path / "s*.jsonl"), "--tokenizer", bpe, "--append-eod", "--unit-bytes", "64K",
             "--threads", "1", "--output-format", output_format]
    args = ["tokenize", "--output-prefix", str(tmp_path / "o"), *flags]
    work = str(tmp_path / ".o.megacache-work")
    proc = subprocess.Popen(megacache_cmd(2, *args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    done, tree = [], None
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.isdir(work):
            tree = tree or process_tree(proc.pid)  # the ranks are up: rank 0 made the work directory
            try:
                done = [n for n in os.listdir(work) if n.endswith(".done")]
            except FileNotFoundError:  # the run ended and removed it: the assertion below says so
                continue
            if len(done) >= 3:
                break
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be killed; make the corpus larger"
    # Stopped at once (on tmpfs, units finish faster than the process table is read), then killed.
    for p in tree or []:
        try:
            os.kill(p, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    kill_tree(proc.pid)
    proc.wait()
    killed_done = len([n for n in os.listdir(work) if n.endswith(".done")])
    assert not os.path.exists(tmp_path / "o_text_document.idx"), "a killed run published output"
    assert not os.path.exists(tmp_path / "o_text_document.pbin"), "a killed run published output"

    result = run_megacache(2, *args)
    total_units, reused = map(int, re.search(r"units: (\d+) \((\d+) reused", result.stdout).groups())
    print(f"resume: {total_units} units, {killed_done} finished before SIGKILL, {reused} reused, "
          f"{total_units - reused} redone")
    assert reused == killed_done and 3 <= reused < total_units
    assert not os.path.exists(work)

    if output_format == "pbin":  # its bytes against Modalities' packer: tests/conformance/test_pbin.py
        run_megacache(1, "tokenize", "--output-prefix", str(tmp_path / "ref"), *flags)
        assert (tmp_path / "o_text_document.pbin").read_bytes() == (tmp_path / "ref_text_document.pbin").read_bytes()
        return
    megatron_reference(megatron, str(tmp_path / "ref"), [d for f in range(4) for d in docs[f::4]], encode, eod,
                       np.uint16)
    assert file_bytes(str(tmp_path / "o_text_document")) == file_bytes(str(tmp_path / "ref"))


@pytest.mark.parametrize("ranks", [1, 2])
def test_bad_line_stops_with_location_and_publishes_nothing(tmp_path, ranks):
    good = '{"text": "fine"}\n'
    (tmp_path / "a.jsonl").write_text(good * 50)
    (tmp_path / "b.jsonl").write_text(good * 30 + '{"text": "broken\n' + good * 5)
    proc = run_megacache(ranks, "tokenize", "--input", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"),
                         "--output-prefix", str(tmp_path / "o"), "--tokenizer", "byte", "--unit-bytes", "100",
                         check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"{tmp_path / 'b.jsonl'}:line 31" in proc.stderr
    assert not any(n.startswith("o_") for n in os.listdir(tmp_path))

    proc = run_megacache(ranks, "tokenize", "--input", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"),
                         "--output-prefix", str(tmp_path / "o"), "--tokenizer", "byte", "--unit-bytes", "100",
                         "--skip-bad")
    assert "skipped 1 bad record(s)" in proc.stdout and "b.jsonl:line 31" in proc.stdout
    from megacache.formats.indexed import IndexedDataset

    assert IndexedDataset(str(tmp_path / "o_text_document")).num_documents == 85


def test_progress_is_aggregated_over_ranks(tmp_path, bpe):
    docs = documents(3000, seed=5)
    for f in range(2):
        write_input(str(tmp_path / f"s{f}.jsonl"), docs[f::2])
    proc = run_megacache(2, "tokenize", "--input", str(tmp_path), "--output-prefix", str(tmp_path / "o"),
                         "--tokenizer", bpe, "--unit-bytes", "64K", "--log-interval", "0.01", "--threads", "1")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("tokenize: ")]
    assert lines, proc.stderr
    # Not a terminal: plain log lines; the last one covers every rank's documents.
    assert "\r" not in proc.stderr
    last = lines[-1]
    assert "100.0%" in last and "3.01k docs" in last and "MB/s" in last and "ETA" in last, last
