"""megacache's packed SFT files equal Megatron-Bridge 0.6.2's byte for byte: random JSONL datasets
(prompt templates with a byte-level BPE and a WordPiece tokenizer, a chat template with a
{% generation %} block; empty, over-long and answerless examples), both packing algorithms, Parquet
and .npy, several pack sizes, seeds and pad multiples, each prepared by Bridge's own
``prepare_gpt_sft_packed_data`` (tests/support/oracles/bridge_sft_worker.py in the environment
tests/bridge_oracle.sh builds; skipped when it is not built) and by megacache, the packed file and
the metadata file compared. Bridge's answers are kept per machine, keyed by the cases and the
worker. Bad input is refused before anything is written, without the oracle."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from megacache.algorithms import packing
from megacache.builders import sft_packing
from megacache.builders.sft_packing import prepare_packed
from megacache.errors import MegacacheError
from megacache.formats.sft_packed import read_parquet
from megacache.runtime.comm import get_comm
from megacache.text.tokenization import load_tokenizer
from support import shared_directory
from support.oracles.environments import SCRIPTS, bridge_answer
from support.inputs.tokenizer_files import CORPUS, write_sft_tokenizers

WORKER = os.path.join(SCRIPTS, "bridge_sft_worker.py")
WORDS = sorted({w for line in CORPUS for w in line.replace(",", "").split()})
PROMPTS = (
    {},
    {"prompt_template": "Q: {input}\\n\\nA: {output}", "add_bos": True},
    {"prompt_template": "Context: {context}  Question:{question} Answer: {answer}", "label_key": "answer",
     "truncation_field": "context,question", "truncation_method": "left"},
    {"prompt_template": "{input}\\n{output}", "add_sep": True, "sep_id": 7, "add_eos": False,
     "tokens_to_generate": 3, "virtual_tokens": 2},
    {"prompt_template": "  {input} =>{output}", "truncation_field": "output", "answer_only_loss": False},
    {"prompt_template": "{input}{output}", "add_eos": False},
)
OUTPUTS = ("packed.parquet", "packed.npy", "packed.PQ", "packed")


def text(rng, most: int) -> str:
    return " ".join(rng.choice(WORDS, int(rng.integers(0, most + 1))))


def prompt_lines(rng, n: int, kwargs: dict, long: int) -> list[dict]:
    keys = ("context", "question", "answer") if "label_key" in kwargs else ("input", "output")
    lines = []
    for _ in range(n):
        line = {k: text(rng, long if rng.random() < 0.15 else 8) for k in keys}
        if rng.random() < 0.1:
            line = dict.fromkeys(keys, "")  # no token at all without EOS
        if rng.random() < 0.1:
            del line[keys[-1]]  # an answerless example: Bridge's test split allows it
        line["id"] = int(rng.integers(100))
        lines.append(line)
    return lines


def chat_lines(rng, n: int, long: int) -> list[dict]:
    lines = []
    for i in range(n):
        turns = [{"role": role, "content": text(rng, long if rng.random() < 0.1 else 6)}
                 for _ in range(int(rng.integers(1, 3))) for role in ("user", "assistant")]
        if i % 3 == 0:
            lines.append({"conversations": [{"from": {"user": "human", "assistant": "gpt"}[t["role"]],
                                             "value": t["content"]} for t in turns], "system": text(rng, 4)})
        elif i % 5 == 0:
            lines.append({"messages": turns, "tools": [{"name": "search", "args": ["q"]}]})
        else:
            lines.append({"messages": turns})
    return lines


def cases() -> list[dict]:
    rng = np.random.default_rng(5502)
    out = []
    for i in range(36):
        chat = i % 4 == 3
        pack_size = int(rng.choice([16, 32, 64, 256]))
        max_seq_length = pack_size - int(rng.choice([0, 0, pack_size // 4]))
        pad = int(rng.choice([1, 1, 2, 4, 8]))
        n = int(rng.choice([1, 5, 40, 200]))
        if chat:
            kwargs = {"chat": True, "use_hf_tokenizer_chat_template": True}
            if i % 8 == 7:
                kwargs.update(chat_loss_mode="full", tool_schemas=[{"name": "calc"}])
            lines, tokenizer = chat_lines(rng, n, pack_size), "sft-bpe"
        else:
            kwargs = dict(PROMPTS[i % len(PROMPTS)])
            lines, tokenizer = prompt_lines(rng, n, kwargs, pack_size), ("sft-bpe", "sft-wordpiece")[i % 2]
        jsonl = "".join(json.dumps(line) + "\n" for line in lines) + ("\n\n" if i % 6 == 0 else "")
        out.append({"jsonl": jsonl, "tokenizer": tokenizer, "dataset_kwargs": kwargs, "pack_size": pack_size,
                    "max_seq_length": max_seq_length, "seed": int(rng.integers(2**32)),
                    "algorithm": packing.ALGORITHMS[(i // 2) % 2], "pad_seq_to_mult": pad,
                    "output": OUTPUTS[(i + i // 4) % len(OUTPUTS)],
                    "metadata": '[{"earlier": 1.5}]' if i % 5 == 0 else None})
    # more packs than one Parquet row group holds (500): megacache gathers and writes a few at a time
    lines = prompt_lines(rng, 1500, {}, 8)
    out.append({"jsonl": "".join(json.dumps(line) + "\n" for line in lines), "tokenizer": "sft-bpe",
                "dataset_kwargs": {}, "pack_size": 16, "max_seq_length": 16, "seed": 8, "algorithm": "first_fit_shuffle",
                "pad_seq_to_mult": 1, "output": "packed.parquet", "metadata": None})
    # where Bridge fails: an example longer than the pack (KeyError), none short enough (ZeroDivisionError)
    for pack_size, max_seq_length, most in ((16, 40, 30), (16, 8, 12)):
        lines = [{"input": " ".join(WORDS[:most]), "output": "fun"}] * 3
        out.append({"jsonl": "".join(json.dumps(line) + "\n" for line in lines), "tokenizer": "sft-bpe",
                    "dataset_kwargs": {}, "pack_size": pack_size, "max_seq_length": max_seq_length, "seed": 1,
                    "algorithm": "first_fit_shuffle", "pad_seq_to_mult": 1, "output": "packed.parquet",
                    "metadata": None})
    return out


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sft-tokenizers")
    write_sft_tokenizers(root)
    return root


@pytest.fixture(scope="module")
def bridge(tokenizers):
    """Bridge's files for ``cases()``, asked once per machine and tokenizer files."""
    made = {d.name: hashlib.sha256((d / "tokenizer.json").read_bytes()).hexdigest()
            for d in sorted(tokenizers.iterdir())}
    request = {"cases": cases(), "tokenizers": made}
    asked = {"cases": [{**c, "tokenizer": str(tokenizers / c["tokenizer"])} for c in request["cases"]]}
    return request["cases"], bridge_answer(WORKER, "bridge-sft-files", request, asked)["cases"]


def ours(case: dict, tokenizers: Path, directory: Path, comm=None) -> dict[str, bytes]:
    """megacache's files for a case, written in ``directory`` as the worker has Bridge write them,
    on the ranks of ``comm`` (one process when None); the files are read on rank 0."""
    rank = 0 if comm is None else comm.rank
    if rank == 0:
        (directory / "training.jsonl").write_text(case["jsonl"], encoding="utf-8")
        if case["metadata"] is not None:
            (directory / "metadata.json").write_text(case["metadata"])
    if comm is not None:
        comm.barrier()
    tokenizer = load_tokenizer(str(tokenizers / case["tokenizer"]), include_special_tokens=True)
    prepare_packed(str(directory / "training.jsonl"), str(directory / case["output"]), str(directory / "metadata.json"),
                   tokenizer, case["pack_size"], case["max_seq_length"], case["seed"], case["algorithm"],
                   case["dataset_kwargs"], case["pad_seq_to_mult"], comm=comm)
    if rank:
        return {}
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != "training.jsonl"}


@pytest.mark.oracle_environments
def test_packed_files_equal_bridges(bridge, tokenizers, tmp_path, monkeypatch):
    asked, answers = bridge
    kinds = set()
    for i, (case, theirs) in enumerate(zip(asked, answers, strict=True)):
        where = (i, case["tokenizer"], case["dataset_kwargs"], case["output"], case["pad_seq_to_mult"])
        directory = tmp_path / str(i)
        directory.mkdir()
        if "error" in theirs:
            with pytest.raises(MegacacheError):
                ours(case, tokenizers, directory)
            assert sorted(p.name for p in directory.iterdir()) == sorted(
                ["training.jsonl"] + (["metadata.json"] if case["metadata"] is not None else [])), where
            kinds.add("refused")
            continue
        mine = ours(case, tokenizers, directory)
        expected = {name: base64.b64decode(data) for name, data in theirs["files"].items()}
        assert sorted(mine) == sorted(expected), where
        for name in expected:
            assert mine[name] == expected[name], (where, name)
        if case["output"].endswith(".parquet") and read_parquet(str(directory / case["output"])).packs > 500:
            kinds.add("row groups")
            for tokens in (1, 15000):  # a row group at a time (each holds more), two at a time
                with monkeypatch.context() as patch:
                    patch.setattr(sft_packing, "CHUNK_TOKENS", tokens)
                    (directory / case["output"]).unlink()
                    assert ours(case, tokenizers, directory)[case["output"]] == expected[case["output"]], (where, tokens)
        npy = case["output"].endswith("npy") or "." not in case["output"]
        kinds.add((case["dataset_kwargs"].get("chat", False), npy))
    assert {(False, False), (False, True), (True, False), (True, True), "refused", "row groups"} <= kinds, kinds


@pytest.mark.mpi(min_size=2)
def test_packed_files_are_the_same_on_any_number_of_ranks(tokenizers, tmp_path):
    """Every case (and every refusal) of ``cases()`` prepared by the ranks of the job and by one
    process: the same files, byte for byte, and no share left behind."""
    comm = get_comm()
    kinds = set()
    with shared_directory(comm, "megacache-sft-ranks-") as root:
        for i, case in enumerate(cases()):
            directory = Path(root) / str(i)
            if comm.rank == 0:
                directory.mkdir()
            try:
                mine = ours(case, tokenizers, directory, comm)
            except MegacacheError:
                mine = None
            if comm.rank:
                continue
            alone = tmp_path / str(i)
            alone.mkdir()
            try:
                expected = ours(case, tokenizers, alone)
            except MegacacheError:
                expected = None
            assert mine == expected, (i, case["output"], comm.size)
            assert sorted(os.listdir(directory)) == sorted(os.listdir(alone)), i
            kinds.add(expected is None)
    if comm.rank == 0:
        assert kinds == {False, True}, kinds


def test_malformed_line_is_refused_and_nothing_written(tokenizers, tmp_path):
    lines = [json.dumps({"input": "hello world", "output": "the fox"}), '{"input": "pack my box", "output": ',
             json.dumps({"input": "a", "output": "b"})]
    (tmp_path / "training.jsonl").write_text("\n".join(lines) + "\n")
    tokenizer = load_tokenizer(str(tokenizers / "sft-bpe"), include_special_tokens=True)
    for output in ("packed.parquet", "packed.npy"):
        with pytest.raises(MegacacheError) as refused:
            prepare_packed(str(tmp_path / "training.jsonl"), str(tmp_path / output), str(tmp_path / "metadata.json"),
                           tokenizer, 64, 64, 1234)
        assert str(refused.value) == (
            f"{tmp_path / 'training.jsonl'}:line 2: not valid JSON (Expecting value at column 36); Bridge 0.6.2 "
            "fails on it: fix or remove the line")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["training.jsonl"]


def test_unreproduced_options_are_refused(tokenizers, tmp_path):
    (tmp_path / "training.jsonl").write_text(json.dumps({"input": "hello", "output": "world"}) + "\n")
    tokenizer = load_tokenizer(str(tokenizers / "sft-bpe"), include_special_tokens=True)
    refusals = {
        "hf_dataset": ({"hf_dataset": True}, "dataset_kwargs hf_dataset: not reproduced for packed SFT data"),
        "legacy chat": ({"chat": True}, "use_hf_tokenizer_chat_template"),
        "last_turn": ({"chat": True, "use_hf_tokenizer_chat_template": True, "chat_loss_mode": "last_turn"},
                      "chat_loss_mode 'last_turn' is not reproduced"),
        "template": ({"prompt_template": "{output} {input}"}, "must end with {output}"),
        "sep": ({"add_sep": True}, "add_sep needs sep_id"),
    }
    for name, (kwargs, message) in refusals.items():
        with pytest.raises(MegacacheError, match=message.replace("{", r"\{").replace("}", r"\}")):
            prepare_packed(str(tmp_path / "training.jsonl"), str(tmp_path / "packed.parquet"), None, tokenizer,
                           64, 64, 1, dataset_kwargs=kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["training.jsonl"]


def test_metadata_file_that_is_not_a_list_is_refused_first(tokenizers, tmp_path):
    """Bridge 0.6.2 writes the packed file, then fails on such a metadata file; megacache refuses
    before writing anything and leaves the metadata file as it was."""
    (tmp_path / "training.jsonl").write_text(json.dumps({"input": "hello", "output": "world"}) + "\n")
    (tmp_path / "metadata.json").write_text('{"pack_size": 64}')
    tokenizer = load_tokenizer(str(tokenizers / "sft-bpe"), include_special_tokens=True)
    with pytest.raises(MegacacheError) as refused:
        prepare_packed(str(tmp_path / "training.jsonl"), str(tmp_path / "packed.parquet"),
                       str(tmp_path / "metadata.json"), tokenizer, 64, 64, 1)
    assert str(refused.value) == (f"{tmp_path / 'metadata.json'}: the packing metadata file holds a JSON dict, not "
                                  "a list of records; remove it or give another metadata path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metadata.json", "training.jsonl"]
    assert (tmp_path / "metadata.json").read_text() == '{"pack_size": 64}'
