"""megacache tokenize with the vocabularies current LLMs have (above 65,500 tokens, so Megatron
stores int32): bytes equal to megatron-core 0.16.1's ``build_tokenizer`` + ``tokenize`` +
``IndexedDatasetBuilder`` with the dtype its ``DType.optimal_dtype`` picks for the tokenizer's
``vocab_size`` (what tools/preprocess_data.py does), at P = 1, 2 and 3, for a Hugging Face BPE, a
SentencePiece BPE and a tiktoken rank file, and at P = 1 for Hugging Face BPEs of 65,499 and 65,500
entries, either side of Megatron's threshold. Each is a tokenizer this test trains and widens with
unused entries (tests/support/inputs/tokenizer_files.py) so that the ids a text gets lie above 65,535 as
well as below: a uint16 anywhere on the way would change them. Every case runs on gigatoken, the default
backend, once its self-test against each library passes."""

from __future__ import annotations

import numpy as np
import pytest

from megacache.formats.indexed import IndexedDataset
from support.inputs.corpus import documents, megatron_tokenized, tokenize_in_parts, train_bpe
from support.inputs.tokenizer_files import widen_bpe, widen_sentencepiece, write_tiktoken_ranks

#: Llama 3's, Qwen 2's and o200k's vocabulary sizes
LLAMA3, QWEN2, O200K = 128_256, 151_936, 200_019


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import sentencepiece
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("large")
    bpe = train_bpe(str(root / "bpe.json"))
    widen_bpe(bpe, root / "hf", LLAMA3)
    for size in (65_499, 65_500):  # either side of Megatron's threshold
        widen_bpe(bpe, root / f"hf{size}", size)
    text = [d for d in documents(2000, seed=11, newlines=True) if d]
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(root / "sp"),
                                             vocab_size=1200, minloglevel=2, model_type="bpe", byte_fallback=True,
                                             normalization_rule_name="identity")
    widen_sentencepiece(root / "sp.model", root / "sp_wide.model", QWEN2)
    write_tiktoken_ranks(root / "ranks.json", Tokenizer.from_file(bpe), fillers=O200K - 1000 - 290)
    return root


#: the cases either side of Megatron's dtype threshold (ids below 65,500 in both)
THRESHOLD = ("hf65499", "hf65500")
CASES = {
    "hf": (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf"), []),
    "hf65499": (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf65499"), []),
    "hf65500": (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf65500"), []),
    "sentencepiece": (dict(tokenizer_type="Llama2Tokenizer", tokenizer_model="sp_wide.model"), []),
    "tiktoken": (dict(tokenizer_type="TikTokenizer", tokenizer_model="ranks.json", tiktoken_pattern="v2",
                      vocab_size=O200K), ["--tiktoken-pattern", "v2", "--vocab-size", str(O200K)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_large_vocabularies_write_megatrons_int32_bytes(tmp_path, megatron, files, case, report):
    args, extra = CASES[case]
    model = str(files / args["tokenizer_model"])
    docs = documents(300, newlines=True)
    expected, dtype = megatron_tokenized(megatron, str(tmp_path / "oracle"), docs, **{**args, "tokenizer_model": model})
    assert dtype == (np.uint16 if case == "hf65499" else np.int32), (case, dtype)
    if case not in THRESHOLD:
        ids = np.frombuffer(expected[0], dtype=np.int32)
        assert ids.max() > 65_535 and ids.min() < 65_535, "the ids should lie on both sides of 65,535"
    rank_counts = (1,) if case in THRESHOLD else (1, 2, 3)  # the threshold does not depend on the ranks
    for ranks in rank_counts:
        run, got = tokenize_in_parts(tmp_path, docs, ranks, "--tokenizer-type", args["tokenizer_type"],
                                     "--tokenizer-model", model, "--verify-fraction", "1", *extra)
        # gigatoken: the default backend, exact for these tokenizers
        assert "tokenizer backend: gigatoken" in run.stdout, run.stdout
        assert IndexedDataset(str(tmp_path / f"out{ranks}_text_document")).layout.dtype == dtype
        assert got == expected, f"{case} P={ranks}"
    ids = np.frombuffer(expected[0], dtype=dtype)
    report(f"tokenize, {args['tokenizer_type']} ({case}): {dtype.name} ids {ids.min()}..{ids.max()}, "
           f"equal to megatron-core's at P = {', '.join(map(str, rank_counts))}, on gigatoken")
