"""megacache tokenize with Megatron's SentencePiece and tiktoken tokenizer types: bytes equal to
megatron-core 0.16.1's ``build_tokenizer`` (the one tools/preprocess_data.py calls) +
``tokenize`` + ``IndexedDatasetBuilder`` on the same documents, at P = 1 and 3, with real model files
this test trains; and the backend each runs on."""

from __future__ import annotations

import json

import pytest

from megacache.text.backends import SELF_TEST_TEXTS
from support.inputs.corpus import (documents, megatron_tokenized, run_megacache, tokenize_in_parts, train_bpe,
                                   write_jsonl)
from support.inputs.tokenizer_files import TIKTOKEN_RANKS, write_tiktoken_ranks

# Special tokens of both libraries written in the text, around the generated documents.
SPECIALS_IN_TEXT = ["<s> begins", "ends </s>", "<unk><pad><mask>", "a<cls>b<sep>c", "<SPECIAL_9> x", " <s>  </s> "]


def _documents() -> list[str]:
    return documents(300, newlines=True) + list(SELF_TEST_TEXTS) + SPECIALS_IN_TEXT


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """SentencePiece models (BPE with byte fallback, identity normalisation: gigatoken's case; the
    same with NFKC, where gigatoken's self-test fails; unigram, which gigatoken refuses) and a
    tiktoken rank file."""
    import sentencepiece
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("models")
    text = [d for d in documents(2000, seed=11, newlines=True) if d]
    models = {"bpe": dict(model_type="bpe", byte_fallback=True, normalization_rule_name="identity"),
              "bpe_nfkc": dict(model_type="bpe", byte_fallback=True),
              "unigram": dict(model_type="unigram")}
    for name, options in models.items():
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(root / name),
                                                 vocab_size=1200, minloglevel=2, **options)
    write_tiktoken_ranks(root / "ranks.json", Tokenizer.from_file(train_bpe(str(root / "bpe.json"))))
    return root


@pytest.mark.parametrize("model, backend", [
    ("bpe", "tokenizer backend: gigatoken"),
    ("bpe_nfkc", "tokenizer backend: sentencepiece (gigatoken disagrees with sentencepiece on the self-test text"),
    ("unigram", "tokenizer backend: sentencepiece (gigatoken cannot load it: only BPE sentencepiece models"),
])
@pytest.mark.parametrize("tokenizer_type", ["SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"])
def test_sentencepiece_types_write_megatrons_bytes(tmp_path, megatron, files, model, backend, tokenizer_type):
    docs = _documents()
    path = str(files / f"{model}.model")
    expected, _ = megatron_tokenized(megatron, str(tmp_path / "oracle"), docs, tokenizer_type=tokenizer_type,
                                     tokenizer_model=path)
    for ranks in (1, 3):
        run, got = tokenize_in_parts(tmp_path, docs, ranks, "--tokenizer-type", tokenizer_type, "--tokenizer-model", path,
                             "--verify-fraction", "1")
        assert got == expected, f"{tokenizer_type} {model} P={ranks}"
        assert backend in run.stdout


@pytest.mark.parametrize("flags, backend", [
    (("--tiktoken-num-special-tokens", "10", "--vocab-size", str(10 + TIKTOKEN_RANKS)), "gigatoken"),
    (("--tiktoken-pattern", "v1", "--vocab-size", str(1000 + TIKTOKEN_RANKS)),
     "tiktoken (gigatoken has no pre-tokenizer equal to Megatron's tiktoken pattern v1)"),
    (("--tiktoken-pattern", "v2", "--vocab-size", str(1000 + TIKTOKEN_RANKS - 20)), "gigatoken"),
])
def test_tiktokenizer_writes_megatrons_bytes(tmp_path, megatron, files, flags, backend):
    docs = _documents()
    args = dict(zip(flags[::2], flags[1::2]))
    expected, _ = megatron_tokenized(megatron, str(tmp_path / "oracle"), docs, tokenizer_type="TikTokenizer",
                                     tokenizer_model=str(files / "ranks.json"),
                                     tiktoken_pattern=args.get("--tiktoken-pattern"),
                                     vocab_size=int(args["--vocab-size"]),
                                     tiktoken_num_special_tokens=int(args.get("--tiktoken-num-special-tokens", 1000)))
    for ranks in (1, 3):
        run, got = tokenize_in_parts(tmp_path, docs, ranks, "--tokenizer-type", "TikTokenizer", "--tokenizer-model",
                             str(files / "ranks.json"), "--verify-fraction", "1", *flags)
        assert got == expected, f"{flags} P={ranks}"
        assert f"tokenizer backend: {backend}" in run.stdout


def test_tiktoken_rank_file_errors_name_the_file_and_entry(tmp_path, files):
    (tmp_path / "in").mkdir()
    entries = json.loads((files / "ranks.json").read_text())
    entries[3]["rank"] = 7
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(entries))
    write_jsonl(str(tmp_path / "in" / "a.jsonl"), ["hello"])
    cases = [
        (str(bad), ["--vocab-size", "1290"], f"--tokenizer-model {bad}: entry 3 must be {{\"rank\": 3"),
        (str(files / "ranks.json"), [], "entries, but the vocabulary size less the special tokens asks for 130072"),
        (str(files / "bpe.model"), [], "megatron-core reads a TikTokenizer vocabulary from a .json file"),
    ]
    for model, extra, message in cases:
        run = run_megacache(1, "tokenize", "--input", str(tmp_path / "in"), "--output-prefix", str(tmp_path / "o"),
                            "--tokenizer-type", "TikTokenizer", "--tokenizer-model", model, *extra, check=False)
        assert run.returncode == 2 and message in run.stderr, run.stderr
