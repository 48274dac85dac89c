"""OLMo-core's numpy token files: the files OLMo trains from (ids back to back, each document ending
with the EOS) convert to the Megatron dataset of the same documents and back, byte for byte, on 1 to 3
ranks; OLMo-core 3.0.0's own datasets serve the same windows and documents from megacache's
conversion of a Megatron dataset as from the files written directly. Bad inputs:
tests/unit/test_bad_input.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

from megacache.formats import olmo as olmo_format
from megacache.formats.indexed import write_dataset
from support.inputs.corpus import file_bytes

#: OLMo's width -> (the Megatron dtype that holds it, the EOS id, the vocabulary): GPT-2's 50,304 ids
#: and a vocabulary above 65,536 ids (uint32 in OLMo, int32 in Megatron)
KINDS = {"uint16": (np.uint16, 50_256, 50_304), "uint32": (np.int32, 100_257, 100_352)}
SEQUENCE = 64  # OLMo's sequence_length: a window holds several documents, and documents cross windows
#: the folder's three files: documents [0, 150), [150, 151) and the rest, as a job of three tasks writes them
SPLITS = [(0, 150), (150, 151), (151, None)]


def corpus(kind: str) -> list[np.ndarray]:
    """300 documents, each its ids then the EOS (tokenize --append-eod), some of the EOS alone."""
    _, eos, _ = KINDS[kind]
    rng = np.random.default_rng(len(kind))
    return [np.append(rng.integers(0, eos, rng.integers(0, 60)), eos) for _ in range(300)]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Per width: the documents, their Megatron dataset (write_dataset: one sequence a document), the
    OLMo file of them all (numpy's tofile of the ids, as OLMo's tokenizers write it) and a folder of
    three OLMo files of them."""
    root = tmp_path_factory.mktemp("olmo")
    out = {}
    for kind, (dtype, _, _) in KINDS.items():
        docs = corpus(kind)
        write_dataset(str(root / kind), docs, dtype)
        np.concatenate(docs).astype(kind).tofile(root / f"{kind}.npy")
        os.makedirs(root / f"{kind}-tasks")
        for task, (a, b) in enumerate(SPLITS):
            np.concatenate(docs[a:b]).astype(kind).tofile(root / f"{kind}-tasks" / f"part_{task:05d}.npy")
        out[kind] = (docs, str(root / kind), str(root / f"{kind}.npy"), str(root / f"{kind}-tasks"))
    return out


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


CASES = [("uint16", 1), ("uint16", 2), ("uint32", 3)]


@pytest.mark.parametrize("kind,ranks", CASES, ids=[f"{k}-P{r}" for k, r in CASES])
def test_olmo_files_convert_to_megatron_and_back_byte_for_byte(tmp_path, corpora, megacache, kind, ranks):
    docs, megatron, whole, tasks = corpora[kind]
    _, eos, _ = KINDS[kind]
    _, out, _ = megacache(ranks, "convert", tasks, str(tmp_path / "m"), "--eos-id", str(eos), "--dtype", kind,
                          "--chunk-bytes", "256")
    assert file_bytes(str(tmp_path / "m")) == file_bytes(megatron)
    assert f"3 dataset(s) -> {tmp_path / 'm'}.bin/.idx: {len(docs):,} documents, {len(docs):,} sequences" in out
    assert "after their last EOS" not in out

    megacache(ranks, "convert", str(tmp_path / "m"), str(tmp_path / "back.npy"), "--eos-id", str(eos),
              "--chunk-bytes", "256")
    assert read(str(tmp_path / "back.npy")) == read(whole)


@pytest.mark.parametrize("kind", KINDS)
def test_olmo_files_go_through_pbin_and_ds_and_back(tmp_path, corpora, megacache, kind):
    """Through Modalities' and datatrove's formats too: the same bytes come back."""
    _, _, whole, tasks = corpora[kind]
    _, eos, _ = KINDS[kind]
    for suffix in (".pbin", ".ds"):
        there = str(tmp_path / f"x{suffix}")
        megacache(1, "convert", tasks, there, "--eos-id", str(eos), "--dtype", kind, "--chunk-bytes", "256")
        megacache(1, "convert", there, str(tmp_path / f"back{suffix}.npy"), "--eos-id", str(eos), "--chunk-bytes",
                  "256")
        assert read(str(tmp_path / f"back{suffix}.npy")) == read(whole), suffix


@pytest.mark.parametrize("chunk", ["2", "256"])
def test_a_scan_in_small_blocks_cuts_the_same_documents(tmp_path, corpora, megacache, monkeypatch, chunk):
    """The EOS is searched a block at a time, chunks close across blocks: blocks of 7 tokens, chunks
    of one document (2 bytes) or of several, give the same dataset, with or without a tail."""
    monkeypatch.setattr(olmo_format, "SCAN_TOKENS", 7)
    docs, megatron, whole, tasks = corpora["uint16"]
    _, eos, _ = KINDS["uint16"]
    megacache(1, "convert", tasks, str(tmp_path / "m"), "--eos-id", str(eos), "--dtype", "uint16",
              "--chunk-bytes", chunk)
    assert file_bytes(str(tmp_path / "m")) == file_bytes(megatron)
    np.concatenate([*docs, [7, 8, 9]]).astype(np.uint16).tofile(tmp_path / "tail.npy")
    megacache(1, "convert", str(tmp_path / "tail.npy"), str(tmp_path / "t"), "--eos-id", str(eos), "--dtype",
              "uint16", "--chunk-bytes", chunk)
    write_dataset(str(tmp_path / "want"), [*docs, np.array([7, 8, 9])], np.uint16)
    assert file_bytes(str(tmp_path / "t")) == file_bytes(str(tmp_path / "want"))


def test_a_jobs_files_go_to_parts_and_back_each_whole(tmp_path, corpora, megacache):
    """A folder of task files into --max-size parts of whole files, and those parts back: each part is
    one task's file again, named in the parts' order."""
    _, _, _, tasks = corpora["uint16"]
    _, eos, _ = KINDS["uint16"]
    names = sorted(os.listdir(tasks))
    megacache(1, "convert", tasks, str(tmp_path / "m"), "--eos-id", str(eos), "--dtype", "uint16", "--max-size", "1")
    parts = [str(tmp_path / f"m-{k:05d}-of-00003") for k in range(3)]
    megacache(1, "convert", *parts, str(tmp_path / "back.npy"), "--eos-id", str(eos), "--max-size", "1")
    for k, name in enumerate(names):
        assert read(str(tmp_path / f"back-{k:05d}-of-00003.npy")) == read(os.path.join(tasks, name))


def test_olmo_serves_the_same_windows_from_a_converted_megatron_dataset(tmp_path, corpora, megacache, olmo):
    jobs, want = [], []
    for kind, (docs, megatron, whole, _) in corpora.items():
        _, eos, vocab = KINDS[kind]
        converted = str(tmp_path / f"{kind}.npy")
        megacache(1, "convert", megatron, converted, "--eos-id", str(eos))
        for path in (whole, converted):
            jobs.append(dict(paths=[path], dtype=kind, eos=eos, vocab=vocab, pad=0, sequence_length=SEQUENCE,
                             work_dir=str(tmp_path / "work")))
        want.append(docs)
    served = olmo.read(jobs)
    for docs, direct, ours in zip(want, served[::2], served[1::2]):
        for key in ("windows", "doc_lens", "documents"):
            assert len(ours[key]) == len(direct[key]) and all(map(np.array_equal, ours[key], direct[key])), key
        stream = np.concatenate(docs)
        windows = len(stream) // SEQUENCE  # OLMo drops the remainder of a file
        assert np.array_equal(np.stack(ours["windows"]), stream[: windows * SEQUENCE].reshape(windows, SEQUENCE))
        assert len(ours["documents"]) == len(docs) and all(map(np.array_equal, ours["documents"], docs))


def test_tokens_after_the_last_eos_are_one_more_document(tmp_path, corpora, megacache):
    """The ids after a file's last EOS (a truncated task, or a wrong --eos-id) become a document of
    their own, and the summary says so; that document cannot go back to an OLMo file, which would
    join it to the next file's first."""
    docs, _, whole, _ = corpora["uint16"]
    _, eos, _ = KINDS["uint16"]
    tail = str(tmp_path / "tail.npy")
    np.concatenate([*docs, [7, 8, 9]]).astype(np.uint16).tofile(tail)
    _, out, _ = megacache(1, "convert", tail, str(tmp_path / "m"), "--eos-id", str(eos), "--vocab-size", "50304")
    assert f"{len(docs) + 1:,} documents" in out
    assert "1 input(s) end with tokens after their last EOS: each such tail became a document without EOS" in out
    write_dataset(str(tmp_path / "want"), [*docs, np.array([7, 8, 9])], np.uint16)
    assert file_bytes(str(tmp_path / "m")) == file_bytes(str(tmp_path / "want"))

    code, _, err = megacache(1, "convert", str(tmp_path / "m"), str(tmp_path / "back.npy"), "--eos-id", str(eos),
                             check=False)
    assert code == 2 and f"{tmp_path / 'm'}: document {len(docs)} ends with token 9, not with --eos-id" in err
    assert not os.path.exists(tmp_path / "back.npy")


def test_verify_and_inspect_read_olmo_files(corpora, megacache):
    docs, _, whole, _ = corpora["uint32"]
    _, eos, vocab = KINDS["uint32"]
    tokens = sum(map(len, docs))
    _, out, _ = megacache(1, "verify", whole, "--eos-id", str(eos), "--vocab-size", str(vocab))
    assert f"ok   {whole}: {len(docs):,} documents, {tokens:,} tokens (uint32, EOS {eos}; OLMo token file)" in out
    _, out, _ = megacache(1, "inspect", whole, "--eos-id", str(eos), "--dtype", "uint32")
    lengths = [len(d) for d in docs]
    assert f"OLMo token file {whole} (headerless uint32 ids, documents ending with EOS {eos})" in out
    assert f"{len(docs):,} documents, {tokens:,} tokens\n" in out
    assert f"document length min {min(lengths)} / mean {tokens / len(docs):,.2f} / max {max(lengths)}" in out
