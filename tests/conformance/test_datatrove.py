"""datatrove's .ds: what its DocumentTokenizer writes converts to the Megatron dataset megacache's own
tokenize writes for the same documents, byte for byte, on 1 to 3 ranks; a Megatron dataset converts
to the .ds files datatrove writes, which its reader serves as the same documents; a loss mask that
masks tokens is not dropped silently. Damaged files: tests/unit/test_bad_input.py."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from support.inputs.corpus import documents, file_bytes, run_megacache, write_jsonl
from support.inputs.tokenizer_files import write_pbin_tokenizers

EOS = "<|endoftext|>"
#: tokenizer -> (datatrove's width, Megatron's dtype): 2,002 ids; 70,002 ids (above 65,536 both widen)
WIDTHS = {"bytes2": (2, np.uint16), "words4": (4, np.int32)}


def texts(kind: str) -> list[str]:
    if kind == "words4":
        rng = np.random.default_rng(4)
        return [" ".join(f"w{w}" for w in rng.integers(0, 70_000, size=rng.integers(1, 40))) for _ in range(200)]
    # datatrove gives a document without tokens its EOS, Megatron's tools nothing (docs/datatrove.md §2)
    return [d for d in documents(400) if d.strip()]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, datatrove):
    """Per tokenizer: the documents, datatrove's .ds of them (with its all-ones loss mask) and megacache
    tokenize's Megatron dataset of them (EOD appended, as datatrove's eos_token does); and under
    ``tasks``, the folder of the bytes2 corpus as a job of three tasks writes it, a .ds per task."""
    root = tmp_path_factory.mktemp("datatrove")
    tokenizers = write_pbin_tokenizers(root / "tokenizers")
    docs = {kind: texts(kind) for kind in WIDTHS}
    whole = [dict(texts=docs[kind], tokenizer=str(tokenizers[kind] / "tokenizer.json"), folder=str(root / kind),
                  eos=EOS, loss=True) for kind in WIDTHS]
    tasks = [dict(texts=docs["bytes2"][a:b], tokenizer=str(tokenizers["bytes2"] / "tokenizer.json"),
                  folder=str(root / "tasks"), eos=EOS, loss=False, rank=rank)
             for rank, (a, b) in enumerate([(0, 150), (150, 151), (151, None)])]
    made = datatrove.tokenize(whole + tasks)
    for kind in WIDTHS:
        write_jsonl(str(root / f"{kind}.jsonl"), docs[kind])
        run_megacache(1, "tokenize", "--input", str(root / f"{kind}.jsonl"), "--output-prefix", str(root / kind),
                      "--tokenizer", str(tokenizers[kind]), "--append-eod")
    return {**{kind: (docs[kind], ds, str(root / f"{kind}_text_document")) for kind, ds in zip(WIDTHS, made)},
            "tasks": str(root / "tasks")}


#: the bytes2 corpus at P = 2: test_a_jobs_files_convert_to_one_dataset
CASES = [("bytes2", 1), ("bytes2", 3), ("words4", 2)]


@pytest.mark.parametrize("kind,ranks", CASES, ids=[f"{k}-P{r}" for k, r in CASES])
def test_datatrove_files_convert_to_megacaches_tokenize_and_back(tmp_path, corpora, datatrove, megacache, kind,
                                                                  ranks):
    docs, theirs, tokenized = corpora[kind]
    width, dtype = WIDTHS[kind]
    _, out, _ = megacache(ranks, "convert", theirs, str(tmp_path / "megatron"), "--chunk-bytes", "4K")
    assert file_bytes(str(tmp_path / "megatron")) == file_bytes(tokenized)
    assert f"{len(docs):,} documents, {len(docs):,} sequences" in out
    assert "had a .ds.loss mask, not carried" in out and "it masked no token" in out

    os.makedirs(tmp_path / "back")
    ours = str(tmp_path / "back" / "corpus.ds")
    megacache(ranks, "convert", tokenized, ours, "--chunk-bytes", "4K")
    for suffix in ("", ".index"):  # the files datatrove wrote; its .metadata names its tokenizer, ours "unknown"
        with open(theirs + suffix, "rb") as a, open(ours + suffix, "rb") as b:
            assert a.read() == b.read(), suffix
    with open(ours + ".metadata") as f:
        assert f.read().splitlines()[:2] == [f"unknown|{width}", str(os.path.getsize(ours) // width)]
    served = datatrove.documents(str(tmp_path / "back"), width)
    stream = np.fromfile(tokenized + ".bin", dtype=dtype)
    lengths = np.fromfile(tokenized + ".idx", dtype=np.int32, count=len(docs), offset=34)  # one sequence a document
    want = np.split(stream, np.cumsum(lengths)[:-1])
    assert len(served) == len(docs) and all(np.array_equal(s, w) for s, w in zip(served, want))

    if ranks == 1:  # and through Modalities' format, the same dataset comes back
        megacache(1, "convert", theirs, str(tmp_path / "x.pbin"), "--chunk-bytes", "4K")
        megacache(1, "convert", str(tmp_path / "x.pbin"), str(tmp_path / "again.ds"), "--chunk-bytes", "4K")
        with open(theirs, "rb") as a, open(tmp_path / "again.ds", "rb") as b:
            assert a.read() == b.read()


def test_a_jobs_files_convert_to_one_dataset(tmp_path, corpora, megacache):
    """A datatrove job writes a .ds per task; the folder of them converts to one dataset, in task order."""
    docs, _, tokenized = corpora["bytes2"]
    tasks = corpora["tasks"]
    assert len([n for n in os.listdir(tasks) if n.endswith(".ds")]) == 3
    _, out, _ = megacache(2, "convert", tasks, str(tmp_path / "megatron"), "--chunk-bytes", "4K")
    assert file_bytes(str(tmp_path / "megatron")) == file_bytes(tokenized)
    assert f"3 dataset(s) -> {tmp_path / 'megatron'}.bin/.idx: {len(docs):,} documents" in out


def test_a_loss_mask_that_masks_tokens_is_refused_unless_dropped(tmp_path, corpora, megacache):
    _, theirs, tokenized = corpora["bytes2"]
    masked = str(tmp_path / "masked.ds")
    for suffix in ("", ".index", ".loss"):
        shutil.copyfile(theirs + suffix, masked + suffix)
    with open(masked + ".loss", "r+b") as f:  # what datatrove writes for a document's no_loss_ranges
        f.seek(1000)
        f.write(bytes(5))
    code, _, err = megacache(2, "convert", masked, str(tmp_path / "out"), "--chunk-bytes", "4K", check=False)
    assert code == 2 and f"{masked}.loss: token 1000 (document " in err and "--drop-loss-mask" in err, err
    left = sorted(os.path.relpath(os.path.join(d, n), tmp_path) for d, _, names in os.walk(tmp_path) for n in names)
    assert [n for n in left if not n.startswith(".megacache/")] == ["masked.ds", "masked.ds.index", "masked.ds.loss"]
    _, out, _ = megacache(1, "convert", masked, str(tmp_path / "out"), "--chunk-bytes", "4K", "--drop-loss-mask")
    assert "--drop-loss-mask: the tokens were written without it, masked ones too" in out
    assert file_bytes(str(tmp_path / "out")) == file_bytes(tokenized)


def test_verify_and_inspect_read_datatrove_files(corpora, megacache):
    docs, theirs, _ = corpora["words4"]
    _, out, _ = megacache(1, "verify", theirs, "--vocab-size", "70002")
    assert f"ok   {theirs}: {len(docs):,} documents" in out and "(4-byte tokens, a loss mask; datatrove .ds)" in out
    _, out, _ = megacache(1, "inspect", theirs)
    assert "datatrove file" in out and "4-byte tokens (tokenizer " in out
    assert f"{len(docs):,} documents" in out and "0 token(s) masked" in out
