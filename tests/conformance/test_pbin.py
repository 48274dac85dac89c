"""Modalities' .pbin: megacache tokenize writes the bytes Modalities' packer writes, Modalities'
readers read megacache's files, convert round-trips Megatron datasets, merge is correct (unlike
Modalities' own), and a crafted or damaged file is refused without anything run or published."""

from __future__ import annotations

import os
import pickle
import re
import struct

import numpy as np
import pytest

from megacache.text.sample_corpus import sample_documents
from support.inputs.corpus import file_bytes, run_megacache, write_jsonl
from support.inputs.tokenizer_files import PBIN_TOKENIZERS, WORDS4_WORDS, write_pbin_tokenizers

EOD = "<|endoftext|>"


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    return write_pbin_tokenizers(tmp_path_factory.mktemp("pbin_tokenizers"))


def hf_ids(tokenizer_dir, docs):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return [e.ids for e in tok.encode_batch(docs)], tok.token_to_id(EOD)


def corpus(kind: str, n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    if kind == "words4":
        docs = [" ".join(f"w{w}" for w in rng.integers(0, WORDS4_WORDS + 50, size=rng.integers(1, 40)))
                for _ in range(n)]
    else:
        docs = [d.replace("\n", " ") for d in sample_documents(n, seed=seed)]
        docs[3:3] = ["ünïcödé 東京 🙂 tab\tseparated", "x", "trailing  "]
    # some documents already end with EOD (no second one is added), some hold it inside
    for i in range(0, len(docs), 17):
        docs[i] += EOD
    docs[1] = f"a{EOD}b"
    return docs


def expected_documents(tokenizer_dir, docs):
    """Modalities' rule: EOD appended unless the document ends with it; ``docs`` holds no empty one."""
    ids, eod = hf_ids(tokenizer_dir, docs)
    return [np.array(d if d and d[-1] == eod else d + [eod]) for d in ids]


@pytest.fixture(scope="module")
def packed(tmp_path_factory, tokenizers, modalities):
    """Each tokenizer's corpus, as JSON lines, and what Modalities' packer makes of it."""
    d = tmp_path_factory.mktemp("packed")
    out = {}
    for kind in PBIN_TOKENIZERS:
        docs = corpus(kind, 9000 if kind == "bytes2" else 1500, seed=len(kind))
        ids, _ = hf_ids(tokenizers[kind], docs)
        docs = [t for t, i in zip(docs, ids) if i]  # its packer drops a batch on an empty document
        src = str(d / f"{kind}.jsonl")
        write_jsonl(src, docs)
        out[kind] = (src, docs, modalities.pack(src, str(tokenizers[kind]), str(d / f"{kind}.pbin")))
    return out


CASES = [("bytes2", 1), ("bytes2", 2), ("bytes2", 3), ("chars1", 2), ("words4", 3)]


@pytest.mark.parametrize("kind,ranks", CASES, ids=[f"{k}-P{r}" for k, r in CASES])
def test_tokenize_writes_the_packers_bytes_and_modalities_reads_them(tmp_path, tokenizers, packed, modalities,
                                                                      kind, ranks):
    src, docs, theirs = packed[kind]
    run = run_megacache(ranks, "tokenize", "--input", src, "--output-prefix", str(tmp_path / "out"),
                        "--output-format", "pbin", "--tokenizer", str(tokenizers[kind]), "--unit-bytes", "16K")
    path = str(tmp_path / "out_text_document.pbin")
    ours = (tmp_path / "out_text_document.pbin").read_bytes()
    assert struct.unpack("<QI", ours[:12])[1] == PBIN_TOKENIZERS[kind]
    assert ours == theirs
    assert f"{len(docs):,} documents" in run.stdout and "every document ending with EOD" in run.stdout
    if kind != "bytes2":
        return
    assert len(ours) - struct.unpack("<Q", ours[:8])[0] > 65536  # an index of several pickle frames
    want = expected_documents(tokenizers[kind], docs)
    got = modalities.documents(path)
    assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))
    stream = np.concatenate(want)
    for block, reuse in ((65, True), (64, False)):
        step = block - 1 if reuse else block
        samples = modalities.samples(path, block, reuse)
        assert len(samples) == ((len(stream) - block) // step + 1 if reuse else len(stream) // block)
        assert all(np.array_equal(s, stream[i * step : i * step + block]) for i, s in enumerate(samples))


def test_empty_documents_become_one_eod_and_are_counted(tmp_path, tokenizers, modalities):
    docs = ["first", "", "third", "", "", "last"]
    write_jsonl(str(tmp_path / "in.jsonl"), docs)
    run = run_megacache(2, "tokenize", "--input", str(tmp_path / "in.jsonl"), "--output-prefix",
                        str(tmp_path / "out"), "--output-format", "pbin", "--tokenizer", str(tokenizers["bytes2"]),
                        "--unit-bytes", "1K")
    assert "3 document(s) of 'text' had no tokens: each is one EOD token in the .pbin" in run.stdout
    ids, eod = hf_ids(tokenizers["bytes2"], docs)
    got = modalities.documents(str(tmp_path / "out_text_document.pbin"))
    assert [g.tolist() for g in got] == [i + [eod] for i in ids]


def test_tokenize_pbin_needs_an_eod(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    write_jsonl(str(tmp_path / "in.jsonl"), ["a b a"])
    run = run_megacache(1, "tokenize", "--input", str(tmp_path / "in.jsonl"), "--output-prefix",
                        str(tmp_path / "out"), "--output-format", "pbin", "--tokenizer", str(tmp_path / "tokenizer.json"),
                        check=False)
    assert run.returncode == 2 and "--output-format pbin (every document ends with EOD)" in run.stderr
    assert "has no end-of-document token; pass --eod-id" in run.stderr


def megatron_dataset(megatron, prefix, dtype, vocab, seed):
    rng = np.random.default_rng(seed)
    builder = megatron.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for _ in range(3000):
        n = int(rng.choice([0, 1, rng.integers(2, 300)]))
        ids = rng.integers(0, vocab, size=n).tolist()
        builder.add_document(ids, [n] if n else [])
    builder.finalize(prefix + ".idx")
    return megatron.IndexedDataset(prefix)


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("dtype,vocab,size", [(np.uint16, 50_000, 2), (np.int32, 1_000_000, 4)])
def test_convert_round_trip_is_byte_identical(tmp_path, megatron, modalities, dtype, vocab, size, ranks):
    ds = megatron_dataset(megatron, str(tmp_path / "src"), dtype, vocab, seed=ranks)
    pbin = str(tmp_path / "src.pbin")
    run_megacache(ranks, "convert", str(tmp_path / "src"), pbin, "--chunk-bytes", "64K")
    with open(pbin, "rb") as f:
        assert struct.unpack("<QI", f.read(12))[1] == size
    got = modalities.documents(pbin)
    assert len(got) == len(ds.document_indices) - 1
    for d, g in enumerate(got):
        s0, s1 = ds.document_indices[d], ds.document_indices[d + 1]
        want = np.concatenate([ds[s] for s in range(s0, s1)]) if s1 > s0 else np.zeros(0)
        assert np.array_equal(g, want)
    run_megacache(ranks, "convert", pbin, str(tmp_path / "back"), "--chunk-bytes", "64K")
    assert file_bytes(str(tmp_path / "back")) == file_bytes(str(tmp_path / "src"))


def test_convert_token_sizes_follow_vocab_size(tmp_path, megatron):
    megatron_dataset(megatron, str(tmp_path / "src"), np.uint16, 200, seed=1)
    run_megacache(1, "convert", str(tmp_path / "src"), str(tmp_path / "small.pbin"), "--vocab-size", "256")
    with open(tmp_path / "small.pbin", "rb") as f:
        assert struct.unpack("<QI", f.read(12))[1] == 1
    run_megacache(1, "convert", str(tmp_path / "small.pbin"), str(tmp_path / "back"))
    assert file_bytes(str(tmp_path / "back")) == file_bytes(str(tmp_path / "src"))
    megatron_dataset(megatron, str(tmp_path / "wide"), np.int32, 1000, seed=2)
    run = run_megacache(2, "convert", str(tmp_path / "wide"), str(tmp_path / "tiny.pbin"), "--vocab-size", "256",
                        check=False)
    assert run.returncode == 2 and "does not fit" in run.stderr and "--vocab-size" in run.stderr
    assert not os.path.exists(tmp_path / "tiny.pbin")


@pytest.fixture(scope="module")
def packed_parts(tmp_path_factory, tokenizers, packed, modalities):
    """The chars1 corpus cut in three files (one of a single document), each packed by Modalities."""
    d = tmp_path_factory.mktemp("parts")
    _, docs, _ = packed["chars1"]
    cuts = [0, 400, 401, len(docs)]
    parts = []
    for i in range(3):
        write_jsonl(str(d / f"part{i}.jsonl"), docs[cuts[i] : cuts[i + 1]])
        parts.append(str(d / f"part{i}.pbin"))
        modalities.pack(str(d / f"part{i}.jsonl"), str(tokenizers["chars1"]), parts[-1])
    return parts


@pytest.mark.parametrize("ranks", [1, 3])
def test_merge_equals_packing_the_concatenation(tmp_path, packed, packed_parts, ranks):
    run_megacache(ranks, "merge", *packed_parts, "--output-prefix", str(tmp_path / "merged.pbin"),
                  "--chunk-bytes", "4K")
    assert (tmp_path / "merged.pbin").read_bytes() == packed["chars1"][2]


def test_modalities_merge_output_is_refused_with_the_reason(tmp_path, packed_parts):
    from pathlib import Path

    from modalities.dataloader.create_packed_data import EmbeddedStreamData, join_embedded_stream_data

    join_embedded_stream_data([EmbeddedStreamData(Path(p)) for p in packed_parts], Path(tmp_path / "theirs.pbin"))
    run = run_megacache(1, "verify", str(tmp_path / "theirs.pbin"), check=False)
    assert run.returncode == 2 and "merge_packed_data" in run.stdout, run.stdout


def index(*pairs) -> bytes:
    """A pickled index as Modalities writes one (a new tuple per entry, so none is memo-shared)."""
    return pickle.dumps([tuple(list(p)) for p in pairs], protocol=4)


def write_pbin(path, tokens: np.ndarray, index: bytes, data_bytes: int | None = None, size: int = 2) -> None:
    data = np.asarray(tokens, dtype=f"<u{size}").tobytes()
    with open(path, "wb") as f:
        f.write(struct.pack("<QI", len(data) if data_bytes is None else data_bytes, size) + data + index)


class Exploit:
    """Unpickling this creates the file named: what a crafted index could do instead."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("command", ["convert", "verify", "inspect", "merge"])
def test_a_crafted_index_runs_nothing_and_publishes_nothing(tmp_path, command):
    marker = str(tmp_path / "exploited")
    evil = str(tmp_path / "evil.pbin")
    write_pbin(evil, np.arange(10), pickle.dumps([(0, 20), Exploit(marker)], protocol=4))
    args = {"convert": ["convert", evil, str(tmp_path / "out")], "verify": ["verify", evil],
            "inspect": ["inspect", evil],
            "merge": ["merge", evil, evil.replace("evil", "evil2"), "--output-prefix", str(tmp_path / "m.pbin")]}
    if command == "merge":
        write_pbin(evil.replace("evil", "evil2"), np.arange(4), index((0, 8)))
    before = set(os.listdir(tmp_path))
    run = run_megacache(2, *args[command], check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    assert not os.path.exists(marker)
    assert set(os.listdir(tmp_path)) == before  # nothing published, no temporary left
    said = run.stdout + run.stderr
    assert "evil.pbin (index at byte 32): index byte 23: opcode GLOBAL" in said or \
        "evil.pbin (index at byte 32): index byte 2" in said, said


@pytest.mark.parametrize("case,message", [
    ("token_size_3", r"header byte 8: token size 3; a \.pbin has 1, 2 or 4"),
    ("data_past_end", r"truncated: the header gives 400 data bytes but the file has"),
    ("odd_data", r"header byte 0: data length 19 is not a multiple of the token size 2"),
    ("no_index", r"no index after the 20 data bytes"),
    ("out_of_order", r"document 2 starts at data byte 4, before the end of document 1 \(12\): offsets out of order"),
    ("outside", r"document 1 ends at data byte 24, past the data's 20 bytes"),
    ("misaligned", r"document 1: offset 5 or length 4 is not a multiple of the token size 2"),
    ("gap", r"2 token\(s\) between documents 0 and 1"),
    ("uncovered", r"the documents cover 6 of the data's 10 tokens"),
    ("truncated_index", r"index byte \d+: .*truncated file"),
])
def test_damaged_files_get_clear_errors(tmp_path, case, message):
    path = str(tmp_path / "bad.pbin")
    good = index((0, 8), (8, 12))
    tokens = np.arange(10)
    if case == "token_size_3":
        with open(path, "wb") as f:
            f.write(struct.pack("<QI", 30, 3) + bytes(30) + good)
    elif case == "data_past_end":
        write_pbin(path, tokens, good, data_bytes=400)
    elif case == "odd_data":
        with open(path, "wb") as f:
            f.write(struct.pack("<QI", 19, 2) + bytes(19) + good)
    elif case == "no_index":
        write_pbin(path, tokens, b"")
    elif case == "out_of_order":
        write_pbin(path, tokens, index((0, 4), (4, 8), (4, 8)))
    elif case == "outside":
        write_pbin(path, tokens, index((0, 8), (8, 16)))
    elif case == "misaligned":
        write_pbin(path, tokens, index((0, 4), (5, 4)))
    elif case == "gap":
        write_pbin(path, tokens, index((0, 4), (8, 12)))
    elif case == "uncovered":
        write_pbin(path, tokens, index((0, 4), (4, 8)))
    elif case == "truncated_index":
        write_pbin(path, tokens, good[:-4])
    run = run_megacache(1, "verify", path, check=False)
    assert run.returncode == 2
    assert re.search(message, run.stdout), run.stdout
    assert path in run.stdout
