"""The tokenizer flag sets the identity tests hand to megacache and to each version's build_tokenizer
(tests/conformance/test_tokenizer_identity.py), and that tests/support/oracles/record_megatron_main.py hands to
Megatron-LM main: fixed cases, and random ones per version and type. Paths are relative to the folder
write_tokenizer_files fills, or under ``root`` (ABS in the fixed cases)."""

from __future__ import annotations

import random

from megacache.megatron.tokenizer import SUPPORTED_TYPES, TOKENIZER_FLAGS
from support.inputs.tokenizer_files import TIKTOKEN_RANKS

NEW_SYSTEM = {
    "null": dict(tokenizer_type="NullTokenizer", vocab_size=1000),
    "null_ignores_other_flags": dict(
        tokenizer_type="NullTokenizer", vocab_size=50257, tokenizer_model="hf", vocab_file="v.json",
        tokenizer_special_tokens=["<a>"], tokenizer_hf_use_fast=True,
        tokenizer_metadata="meta_huggingface_gpt.json"),
    "hf": dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf"),
    "hf_path_verbatim": dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="./hf/"),
    "hf_all_options": dict(
        tokenizer_type="HuggingFaceTokenizer", tokenizer_model="ABS/hf",
        tokenizer_special_tokens=["<|tool|>", "<|im_end|>"], tokenizer_hf_use_fast=True,
        tokenizer_hf_include_special_tokens=True, vocab_extra_ids=3),
    "hf_with_vocab_and_merges": dict(
        tokenizer_type="HuggingFaceTokenizer", tokenizer_model="gpt2",
        vocab_file="gpt2files/vocab.json", merge_file="gpt2files/merges.txt"),
    "gpt2": dict(tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2files/vocab.json",
                 merge_file="gpt2files/merges.txt"),
    "gpt2_all_options": dict(
        tokenizer_type="GPT2BPETokenizer", vocab_file="ABS/gpt2files/vocab.json",
        merge_file="ABS/gpt2files/merges.txt", tokenizer_special_tokens=["<|tool|>"],
        tokenizer_hf_use_fast=True, trust_remote_code=True, tokenizer_hf_include_special_tokens=True),
    "gpt2_vocab_only": dict(tokenizer_type="GPT2BPETokenizer", vocab_file="./gpt2files/vocab.json"),
    "bert_lower": dict(tokenizer_type="BertWordPieceLowerCase", vocab_file="bertfiles/vocab.txt",
                       tokenizer_hf_include_special_tokens=True),
    "bert_cased_replaces_special_tokens": dict(
        tokenizer_type="BertWordPieceCase", vocab_file="bertfiles/vocab.txt",
        tokenizer_special_tokens=["<x>"], tokenizer_hf_use_fast=True),
    **{f"hf_metadata_{t}": dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf",
                                tokenizer_metadata=f"meta_huggingface_{t}.json")
       for t in ("default", "gpt", "mamba", "bert", "t5")},
    "gpt2_metadata_gpt": dict(tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2files/vocab.json",
                              merge_file="gpt2files/merges.txt", tokenizer_metadata="meta_megatron_gpt.json"),
}


def new_system_flags(case: str, root) -> dict:
    """The flags of NEW_SYSTEM[case], with ABS made the absolute path of ``root``."""
    return {k: v.replace("ABS", str(root)) if isinstance(v, str) else v for k, v in NEW_SYSTEM[case].items()}


# ---------------------------------------------------------------------------------------------
# Every version, every type: random flag combinations

RANDOM_CASES_PER_TYPE = 50
SPECIAL_POOL = ["<|tool|>", "<|im_end|>", "<x>", "<|endoftext|>"]
TIKTOKEN_SPECIALS = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"]


def random_flags(rng: random.Random, version: str, kind: str, root) -> dict:
    """Flags of one Megatron-LM ``version`` run with ``--tokenizer-type kind``: the type's own flags
    in random forms, some flags the type ignores, switches at random (only flags the version has)."""
    have = {f.dest for f in TOKENIZER_FLAGS if f.exists_in(version)}
    maybe = lambda p=0.5: rng.random() < p  # noqa: E731
    flags: dict = {"tokenizer_type": kind}

    def path(name: str) -> str:
        return rng.choice([name, f"./{name}", f"{root}/{name}"])

    def switch(dest: str, p=0.3) -> None:
        if dest in have and maybe(p):
            flags[dest] = not next(f.default for f in TOKENIZER_FLAGS if f.dest == dest)

    model_types = ["default" if version == "0.16" else "default-text", "gpt", "mamba", "bert", "t5"]
    library = {"HuggingFaceTokenizer": "huggingface", "TikTokenizer": "tiktoken", "NullTokenizer": "huggingface"}.get(
        kind, "sentencepiece" if "SentencePiece" in kind or kind == "Llama2Tokenizer" else "megatron")
    if maybe(0.4):
        flags["tokenizer_metadata"] = rng.choice(
            [f"meta_{library}_{t}.json" for t in model_types] + [f"meta_{library}.json"])
    if kind == "NullTokenizer":
        flags["vocab_size"] = rng.choice([1, 257, 1000, 50257, 70000])
        if "null_tokenizer_eod_id" in have and maybe():
            flags["null_tokenizer_eod_id"] = rng.randrange(0, 1000)
        if "null_tokenizer_pad_id" in have and maybe():
            flags["null_tokenizer_pad_id"] = rng.choice([0, 5, 999])
        if maybe(0.3):  # flags NullTokenizer ignores
            flags.update(tokenizer_model="hf", vocab_file="gpt2files/vocab.json", vocab_extra_ids=3)
    elif kind == "HuggingFaceTokenizer":
        if maybe(0.25):
            flags.update(tokenizer_model="gpt2", vocab_file="gpt2files/vocab.json")
            if maybe():
                flags["merge_file"] = "gpt2files/merges.txt"
        else:
            flags["tokenizer_model"] = path("hf")
    elif kind in ("GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase"):
        if kind == "GPT2BPETokenizer":
            flags.update(vocab_file=path("gpt2files/vocab.json"), merge_file=path("gpt2files/merges.txt"))
        else:
            flags["vocab_file"] = path("bertfiles/vocab.txt")
    elif kind == "TikTokenizer":
        flags["tokenizer_model"] = path("ranks.json")
        specials = 1000
        if maybe():
            specials = rng.choice([10, 50, 1000])
            flags["tiktoken_num_special_tokens"] = specials
        flags["vocab_size"] = specials + TIKTOKEN_RANKS
        if maybe():
            flags["tiktoken_pattern"] = rng.choice(["v1", "v2"])
    else:  # SentencePiece types
        flags["tokenizer_model"] = path("sp.model")
        switch("tokenizer_sentencepiece_legacy", 0.5)
        switch("tokenizer_sentencepiece_ignore_extra_whitespaces", 0.5)
        if maybe(0.3):
            flags["vocab_extra_ids"] = 2
    if maybe(0.4):
        if kind == "TikTokenizer":
            name = "tiktoken_special_tokens" if "tiktoken_special_tokens" in have and maybe() else "tokenizer_special_tokens"
            flags[name] = TIKTOKEN_SPECIALS + rng.sample(SPECIAL_POOL, rng.randrange(0, 3))
        elif kind != "NullTokenizer" and ("SentencePiece" not in kind and kind != "Llama2Tokenizer"
                                          or flags.get("tokenizer_sentencepiece_legacy")):
            flags["tokenizer_special_tokens"] = rng.sample(SPECIAL_POOL, rng.randrange(1, 3))
    if "chat_template" in have and kind not in ("NullTokenizer",) and maybe(0.3):
        flags["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    for dest in ("tokenizer_hf_use_fast", "tokenizer_hf_include_special_tokens", "tokenizer_hf_no_use_fast",
                 "tokenizer_hf_no_include_special_tokens", "trust_remote_code"):
        switch(dest)
    switch("use_gigatoken", 0.15)  # less often: the BERT types refuse it
    return flags


def random_cases(version: str, root) -> list[dict]:
    """The random flag sets of ``version``'s identity test: RANDOM_CASES_PER_TYPE of each type."""
    rng = random.Random(f"tokenizer identity {version}")
    return [random_flags(rng, version, kind, root) for kind in SUPPORTED_TYPES for _ in range(RANDOM_CASES_PER_TYPE)]


#: Megatron-LM main (0.20): metadata files naming a class (main's write_metadata names its text class;
#: 0.19's wrote a model_type, or a class of the text models package main removed) and the switch it added
MAIN_CASES = {
    **{f"hf_metadata_{name}": dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf",
                                   tokenizer_metadata=f"meta_huggingface_{name}.json")
       for name in ("class_text", "class_text_package", "class_gpt", "class_without_path", "written_by_019",
                    "tokenizer_class")},
    "gpt2_metadata_class_text": dict(tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2files/vocab.json",
                                     merge_file="gpt2files/merges.txt",
                                     tokenizer_metadata="meta_megatron_class_text.json"),
    "sentencepiece_metadata_class_text": dict(tokenizer_type="SentencePieceTokenizer", tokenizer_model="sp.model",
                                              tokenizer_metadata="meta_sentencepiece_class_text.json"),
    "hf_gigatoken": dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="ABS/hf", use_gigatoken=True),
    "gpt2_gigatoken": dict(tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2files/vocab.json",
                           merge_file="gpt2files/merges.txt", use_gigatoken=True),
    "bert_cased_gigatoken": dict(tokenizer_type="BertWordPieceCase", vocab_file="bertfiles/vocab.txt",
                                 use_gigatoken=True, tokenizer_hf_no_use_fast=True),
    "null_ignores_gigatoken": dict(tokenizer_type="NullTokenizer", vocab_size=1000, use_gigatoken=True),
    "sentencepiece_ignores_gigatoken": dict(tokenizer_type="SentencePieceTokenizer", tokenizer_model="sp.model",
                                            use_gigatoken=True),
    "tiktoken_ignores_gigatoken": dict(tokenizer_type="TikTokenizer", tokenizer_model="ranks.json",
                                       vocab_size=1000 + TIKTOKEN_RANKS, use_gigatoken=True),
}


def fixed_cases(version: str, root) -> dict[str, dict]:
    """NEW_SYSTEM in ``version``'s flags (those it lacks left out), then MAIN_CASES from 0.20 on."""
    have = {f.dest for f in TOKENIZER_FLAGS if f.exists_in(version)}
    # gpt2_vocab_only has Megatron download GPT-2's merges file; the tests' oracles download nothing
    cases = {case: {k: v for k, v in new_system_flags(case, root).items() if k in have} for case in NEW_SYSTEM
             if case != "gpt2_vocab_only"}
    if "use_gigatoken" in have:
        cases.update({case: {k: v.replace("ABS", str(root)) if isinstance(v, str) else v for k, v in flags.items()}
                      for case, flags in MAIN_CASES.items()})
    return cases


def sweep_tokenizers(files: str, version: str = "0.19") -> list[dict]:
    """The tokenizers of the 200-configuration sweeps (test_version_conformance.py), one per
    configuration in turn, their files under ``files``: Megatron-LM 0.19's flags, less those
    ``version`` lacks. A sweep names its caches by these identities alone."""
    exists = {f.dest: f.exists_in(version) for f in TOKENIZER_FLAGS}
    return [{k: v for k, v in flags.items() if exists[k]} for flags in [
        dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=f"{files}/hf"),
        dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=f"{files}/hf/",
             tokenizer_special_tokens=["<|tool|>"], tokenizer_hf_no_use_fast=True, chat_template="{{ messages }}",
             tokenizer_metadata=f"{files}/meta_huggingface_gpt.json"),
        dict(tokenizer_type="NullTokenizer", vocab_size=1000),
        dict(tokenizer_type="NullTokenizer", vocab_size=50257, null_tokenizer_eod_id=0, null_tokenizer_pad_id=1),
        dict(tokenizer_type="GPT2BPETokenizer", vocab_file=f"{files}/gpt2files/vocab.json",
             merge_file=f"{files}/gpt2files/merges.txt"),
        dict(tokenizer_type="SentencePieceTokenizer", tokenizer_model=f"{files}/sp.model"),
        dict(tokenizer_type="Llama2Tokenizer", tokenizer_model=f"{files}/sp.model", tokenizer_sentencepiece_legacy=True,
             tokenizer_special_tokens=["<x>"]),
        dict(tokenizer_type="TikTokenizer", tokenizer_model=f"{files}/ranks.json", vocab_size=1000 + TIKTOKEN_RANKS,
             tiktoken_pattern="v2"),
    ]]
