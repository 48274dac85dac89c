"""``megacache tokenize`` never guesses and never silently replaces: a tokenizer must be named
(``--tokenizer byte`` for raw bytes), and a dataset already at the output is kept when the same
inputs and settings made it, refused otherwise (other inputs or flags, another tool's, changed since),
and replaced only with ``--overwrite``. Run as a user runs it: ``python -m megacache`` (and under
``mpiexec -n 2``), its exit status, its exact words and the files it leaves."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest

from megacache.builders.publish import RECORD_SUFFIX
from megacache.builders.tokenize import TokenizeConfig, tokenize
from megacache.errors import MegacacheError
from megacache.formats.indexed import IndexedDataset
from megacache.runtime.comm import SingleComm
from megacache.runtime.fsio import STATE_DIR
from support.inputs.corpus import documents, run_megacache, write_jsonl
from support.systems.faults import leftovers

NO_TOKENIZER = ("no tokenizer given: pass --tokenizer SPEC (a tokenizer.json, a directory holding a Hugging Face "
                "or GPT-2 tokenizer, or a BERT vocab.txt) or --tokenizer-type TYPE with its files, as for "
                "Megatron-LM's preprocess_data.py; --tokenizer byte picks the raw UTF-8 byte tokenizer "
                "(ids 0..255, EOD 256) explicitly")
REFUSED = "megacache tokenize: error: the output is there already, not made from these inputs and settings:\n"
OVERWRITE = "Nothing was written. Pass --overwrite to replace it, or give another --output-prefix\n"
MORE = '{"text": "one more document"}\n'
ALREADY = re.compile(r"megacache tokenize: already there, made from these inputs with these settings: nothing "
                     r"written \([0-9.]+ s on (\d) rank\(s\)\); --overwrite rebuilds\n")


@pytest.fixture
def corpus(tmp_path):
    """Two input files, an empty output directory, and the command tokenizing them into it."""
    docs = documents(300, seed=7)
    write_jsonl(str(tmp_path / "a.jsonl"), docs[:200])
    write_jsonl(str(tmp_path / "b.jsonl"), docs[200:])
    (tmp_path / "out").mkdir()
    return tmp_path, docs, command(tmp_path, tmp_path / "out" / "o")


def command(tmp_path, prefix) -> list[str]:
    return ["tokenize", "--input", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--output-prefix",
            str(prefix), "--unit-bytes", "8K"]


def dataset(directory) -> dict[str, tuple[bytes, int]]:
    """The files a reader loads in ``directory``: bytes and modification time."""
    return {n: ((directory / n).read_bytes(), (directory / n).stat().st_mtime_ns)
            for n in sorted(os.listdir(directory)) if not n.startswith(".")}


def tokenized(tmp_path, *flags: str) -> dict[str, bytes]:
    """A fresh tokenize of the same inputs with ``flags``, into a directory of its own: its files' bytes."""
    fresh = tmp_path / f"fresh{len(os.listdir(tmp_path))}"
    fresh.mkdir()
    run_megacache(1, *command(tmp_path, fresh / "o"), *flags)
    return {n: data for n, (data, _) in dataset(fresh).items()}


def test_no_tokenizer_is_an_error_naming_the_flags_and_writes_nothing(corpus):
    tmp_path, _, args = corpus
    run = run_megacache(1, *args, check=False)
    assert (run.returncode, run.stdout, run.stderr) == (2, "", f"megacache tokenize: error: {NO_TOKENIZER}\n")
    assert os.listdir(tmp_path / "out") == []  # no dataset, lock, work directory or record
    with pytest.raises(MegacacheError) as raised:  # Python's API: no default either
        tokenize(TokenizeConfig(inputs=[str(tmp_path / "a.jsonl")], output_prefix=str(tmp_path / "out" / "o")),
                 SingleComm())
    assert str(raised.value) == NO_TOKENIZER
    assert os.listdir(tmp_path / "out") == []


def test_the_byte_tokenizer_named_writes_the_utf8_bytes(corpus):
    tmp_path, docs, args = corpus
    run_megacache(1, *args, "--tokenizer", "byte", "--append-eod")
    ds = IndexedDataset(str(tmp_path / "out" / "o_text_document"))
    assert ds.dtype == np.uint16 and ds.num_documents == len(docs)
    # EOD after every non-empty document, as Megatron's --append-eod
    assert [ds.document(i).tolist() for i in range(len(docs))] == [[*d.encode("utf-8"), 256] if d else [] for d in docs]
    assert sorted(os.listdir(tmp_path / "out")) == [STATE_DIR, "o_text_document.bin", "o_text_document.idx"]
    assert os.listdir(tmp_path / "out" / STATE_DIR) == ["o_text_document" + RECORD_SUFFIX]
    assert not leftovers(str(tmp_path / "out"))


@pytest.mark.parametrize("output_format", ["megatron", "pbin"])
def test_the_same_command_again_keeps_the_dataset_and_writes_nothing(corpus, output_format):
    tmp_path, docs, args = corpus
    args = [*args, "--tokenizer", "byte", "--append-eod", "--output-format", output_format]
    run_megacache(1, *args)
    before = dataset(tmp_path / "out")
    record = (tmp_path / "out" / STATE_DIR / f"{'o_text_document.pbin' if output_format == 'pbin' else 'o_text_document'}"
              f"{RECORD_SUFFIX}")
    recorded = (record.read_bytes(), record.stat().st_mtime_ns)
    run = run_megacache(1, *args)
    files = ".pbin" if output_format == "pbin" else ".bin/.idx"
    tokens = sum(len(d.encode("utf-8")) + 1 for d in docs if d or output_format == "pbin")
    assert ALREADY.fullmatch(run.stdout.splitlines(keepends=True)[0]), run.stdout
    assert run.stdout.splitlines()[1:] == [f"  {tmp_path}/out/o_text_document{files}: {len(docs):,} documents, "
                                           f"{tokens:,} tokens"]
    assert dataset(tmp_path / "out") == before  # bytes and modification times
    assert (record.read_bytes(), record.stat().st_mtime_ns) == recorded
    assert os.listdir(tmp_path / "out" / STATE_DIR) == [record.name] and not leftovers(str(tmp_path / "out"))


def test_a_changed_input_or_flag_is_refused_and_the_dataset_kept(corpus):
    tmp_path, _, args = corpus
    run_megacache(1, *args, "--tokenizer", "byte")
    before = dataset(tmp_path / "out")
    bin_file = f"{tmp_path}/out/o_text_document.bin"

    run = run_megacache(1, *args, "--tokenizer", "byte", "--append-eod", check=False)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == f"{REFUSED}  {bin_file}: --append-eod: not given then, given now\n{OVERWRITE}"
    assert dataset(tmp_path / "out") == before

    size = (tmp_path / "b.jsonl").stat().st_size
    with open(tmp_path / "b.jsonl", "a") as f:
        f.write(MORE)
    run = run_megacache(1, *args, "--tokenizer", "byte", check=False)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (f"{REFUSED}  {bin_file}: input {tmp_path}/b.jsonl: {size:,} bytes then, {size + len(MORE):,} now\n"
                          f"{OVERWRITE}")
    assert dataset(tmp_path / "out") == before
    assert not leftovers(str(tmp_path / "out"))  # the refusal took and released the lock, left no work directory

    os.utime(tmp_path / "a.jsonl")  # the same bytes, written again: it may hold other documents now
    run = run_megacache(1, *args, "--tokenizer", "byte", "--json-keys", "text", "title", check=False)
    assert run.returncode == 2
    assert run.stderr == (f"{REFUSED}  {bin_file}: input {tmp_path}/a.jsonl: modified since; input {tmp_path}/b.jsonl: "
                          f"{size:,} bytes then, {size + len(MORE):,} now; --json-keys: ['text'] then, ['text', 'title'] now\n"
                          f"{OVERWRITE}")


def test_overwrite_replaces_it_with_what_a_fresh_tokenize_writes(corpus):
    tmp_path, _, args = corpus
    run_megacache(1, *args, "--tokenizer", "byte")
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write(MORE)
    run = run_megacache(1, *args, "--tokenizer", "byte", "--append-eod", "--overwrite")
    assert run.stdout.startswith("megacache tokenize: done in ")
    replaced = {n: data for n, (data, _) in dataset(tmp_path / "out").items()}
    assert replaced == tokenized(tmp_path, "--tokenizer", "byte", "--append-eod")
    again = run_megacache(1, *args, "--tokenizer", "byte", "--append-eod")  # its record is this run's
    assert ALREADY.match(again.stdout), again.stdout
    assert not leftovers(str(tmp_path / "out"))


def test_another_tools_dataset_or_one_changed_since_is_refused(corpus):
    tmp_path, _, args = corpus
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_megacache(1, *command(tmp_path, elsewhere / "x"), "--tokenizer", "byte")
    out = tmp_path / "out"
    bin_file = f"{out}/o_text_document.bin"
    # written by megacache merge, and by hand: the same bytes tokenize would write, but no record
    run_megacache(1, "merge", str(elsewhere / "x_text_document"), "--output-prefix", str(out / "o_text_document"))
    for how in ("merge", "by hand"):
        if how == "by hand":
            shutil.rmtree(out)
            out.mkdir()
            for suffix in (".bin", ".idx"):
                shutil.copy(elsewhere / f"x_text_document{suffix}", out / f"o_text_document{suffix}")
        before = dataset(out)
        run = run_megacache(1, *args, "--tokenizer", "byte", check=False)
        assert run.returncode == 2, how
        assert run.stderr == (f"{REFUSED}  {bin_file}: no record of megacache tokenize writing it (another tool's "
                              f"output?)\n{OVERWRITE}"), how
        assert dataset(out) == before, how

    run_megacache(1, *args, "--tokenizer", "byte", "--overwrite")
    (out / "o_text_document.idx").unlink()  # a dataset tokenize wrote, changed since
    with open(out / "o_text_document.bin", "ab") as f:
        f.write(b"\0\0")
    run = run_megacache(1, *args, "--tokenizer", "byte", check=False)
    assert run.returncode == 2
    assert run.stderr == (f"{REFUSED}  {bin_file}: o_text_document.idx missing since megacache tokenize wrote it; "
                          f"o_text_document.bin changed since megacache tokenize wrote it\n{OVERWRITE}")


def test_a_missing_keys_dataset_is_written_again(corpus):
    tmp_path, docs, args = corpus
    write_jsonl(str(tmp_path / "a.jsonl"), docs[:200], key="title")  # a's documents lack 'text': --skip-bad
    flags = ["--tokenizer", "byte", "--json-keys", "title", "--skip-bad"]
    run_megacache(1, *args, *flags)
    (tmp_path / "out" / "o_title_document.bin").unlink()
    (tmp_path / "out" / "o_title_document.idx").unlink()
    run = run_megacache(1, *args, *flags)  # none there: nothing to keep or refuse
    assert run.stdout.startswith("megacache tokenize: done in "), run.stdout
    assert IndexedDataset(str(tmp_path / "out" / "o_title_document")).num_documents == 200


def test_under_mpiexec_every_rank_follows_the_one_decision(corpus):
    tmp_path, _, args = corpus
    run_megacache(2, *args, "--tokenizer", "byte")
    before = dataset(tmp_path / "out")
    assert {n: data for n, (data, _) in before.items()} == tokenized(tmp_path, "--tokenizer", "byte")
    again = run_megacache(2, *args, "--tokenizer", "byte")
    assert ALREADY.match(again.stdout) and ALREADY.match(again.stdout).group(1) == "2", again.stdout
    refused = run_megacache(2, *args, "--tokenizer", "byte", "--append-eod", check=False)
    assert refused.returncode == 2
    assert refused.stderr == (f"{REFUSED}  {tmp_path}/out/o_text_document.bin: --append-eod: not given then, given "
                              f"now\n{OVERWRITE}")  # said once, by rank 0
    assert dataset(tmp_path / "out") == before
    replaced = run_megacache(2, *args, "--tokenizer", "byte", "--append-eod", "--overwrite")
    assert replaced.stdout.startswith("megacache tokenize: done in ") and " on 2 rank(s)" in replaced.stdout
    assert ({n: data for n, (data, _) in dataset(tmp_path / "out").items()}
            == tokenized(tmp_path, "--tokenizer", "byte", "--append-eod"))
    assert not leftovers(str(tmp_path / "out"))


def test_a_run_stopped_between_publishing_and_its_record_is_resumed(corpus, monkeypatch):
    """The datasets are renamed into place, then recorded: a run that stops between the two leaves
    datasets without a record, and its work directory, which the same command resumes and records."""
    import megacache.builders.tokenize as module

    tmp_path, _, args = corpus

    def fails(output, record):
        raise OSError(f"{output}: the filesystem went away")

    monkeypatch.setattr(module, "write_record", fails)
    cfg = TokenizeConfig(inputs=[str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")],
                         output_prefix=str(tmp_path / "out" / "o"), tokenizer="byte", unit_bytes=8 << 10, threads=1)
    with pytest.raises(OSError, match="the filesystem went away"):
        tokenize(cfg, SingleComm())
    # no record, and no job folder: the failed job's rank removed its own
    assert sorted(os.listdir(tmp_path / "out")) == [".o.megacache-work", "o_text_document.bin", "o_text_document.idx"]
    monkeypatch.undo()
    rerun = run_megacache(1, *args, "--tokenizer", "byte")
    units = re.search(r"resuming: (\d+) of (\d+) units already done", rerun.stderr)
    assert units and units.group(1) == units.group(2), rerun.stderr
    assert {n: data for n, (data, _) in dataset(tmp_path / "out").items()} == tokenized(tmp_path, "--tokenizer", "byte")
    assert ALREADY.match(run_megacache(1, *args, "--tokenizer", "byte").stdout)
    assert not leftovers(str(tmp_path / "out"))
