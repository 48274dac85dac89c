"""megacache.formats.tokenizer_ids: the tokenizer identity Megatron-LM training hashes into its cache names.

New system (the default): the oracle is megatron-core 0.16.1's ``build_tokenizer(args)`` (what
``pretrain_gpt.py`` calls without ``--legacy-tokenizer``) on an ``args`` with Megatron-LM's flag
defaults, building real tokenizers from files trained here. GPT2BPETokenizer and BertWordPiece* load
the hub repos ``gpt2`` / ``bert-large-(un)cased`` (with the given vocab file); the oracle runs in a
directory holding local folders of those names, which transformers prefers to the hub, so nothing is
downloaded.

Legacy system: Megatron-LM's ``megatron/training/tokenizer/tokenizer.py`` is not installable here, so
the oracle is megatron-core's ``MegatronLegacyTokenizer`` base (which forms the identifiers) under each
Megatron-LM class name, given the paths and options that file's ``build_tokenizer`` passes to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from types import SimpleNamespace

import pytest

from megacache.errors import InputError, MegacacheError
from megacache.formats.cache import CacheEntry, blend_identifiers, describe, gpt_identifiers
from megacache.formats.tokenizer_ids import (
    identifiers_from_description,
    identifiers_from_json,
    tokenizer_identifiers,
)

# Megatron-LM arguments.py defaults of every flag megatron-core's build_tokenizer reads.
MEGATRON_DEFAULTS = dict(
    tokenizer_type=None, tokenizer_model=None, tokenizer_metadata=None, vocab_file=None,
    merge_file=None, vocab_size=None, vocab_extra_ids=0, tokenizer_special_tokens=None,
    tokenizer_sentencepiece_legacy=False, tokenizer_hf_use_fast=False,
    tokenizer_hf_include_special_tokens=False, trust_remote_code=False, tiktoken_pattern=None,
    tiktoken_num_special_tokens=1000, legacy_tokenizer=False,
)
# Megatron-LM's argument names -> ours, where they differ.
OUR_NAMES = {"tokenizer_special_tokens": "special_tokens", "legacy_tokenizer": "legacy"}

CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, tokenizers are fun",
          "pack my box with five dozen liquor jugs", "ünïcödé and <|endoftext|> here"] * 20


def ours(flags: dict) -> dict:
    return tokenizer_identifiers(**{OUR_NAMES.get(k, k): v for k, v in flags.items()})


@contextlib.contextmanager
def inside(directory):
    old = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Tokenizer files trained here: a byte-level BPE (Hugging Face directory ``hf`` and GPT-2
    ``gpt2files/{vocab.json,merges.txt}``), a WordPiece ``bertfiles/vocab.txt``, the hub-named
    folders Megatron's GPT-2/BERT wrappers load, and ``meta_<library>_<model_type>.json`` metadata."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("tokenizer_ids")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.train_from_iterator(CORPUS, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))

    for d in ("hf", "gpt2files", "bertfiles", "gpt2", "bert-large-uncased", "bert-large-cased"):
        (root / d).mkdir()
    bpe.save(str(root / "hf" / "tokenizer.json"))
    (root / "hf" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}))
    bpe.model.save(str(root / "gpt2files"))
    wordpiece.model.save(str(root / "bertfiles"))
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(root / "gpt2files" / name, root / "gpt2" / name)
    (root / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    for repo, lower in (("bert-large-uncased", True), ("bert-large-cased", False)):
        shutil.copy(root / "bertfiles" / "vocab.txt", root / repo / "vocab.txt")
        (root / repo / "config.json").write_text(json.dumps({"model_type": "bert"}))
        (root / repo / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
    for library in ("huggingface", "megatron"):
        for model_type in ("default", "gpt", "mamba", "bert", "t5"):
            (root / f"meta_{library}_{model_type}.json").write_text(
                json.dumps({"library": library, "model_type": model_type}))
    return root


@pytest.fixture(scope="module")
def build(megatron, root):
    """megatron-core 0.16.1's build_tokenizer on Megatron-LM's args with these flags, run in ``root``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer

    def run(flags: dict):
        with inside(root), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return build_tokenizer(SimpleNamespace(**{**MEGATRON_DEFAULTS, **flags}))

    return run


def assert_same(ids: dict, expected) -> None:
    """Equal entries in the same order, and the same JSON text in the cache description."""
    assert list(ids.items()) == list(expected.items())
    assert json.dumps(ids, indent=4) == json.dumps(expected, indent=4)


def test_null_tokenizer_of_the_recipe():
    ids = tokenizer_identifiers("NullTokenizer", vocab_size=1000)
    assert json.dumps(ids, separators=(",", ":")) == (
        '{"class":"megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText",'
        '"tokenizer_path":null,"vocab_size":"1000"}')


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


@pytest.mark.parametrize("case", NEW_SYSTEM)
def test_new_system_equals_megatron(build, root, case):
    flags = new_system_flags(case, root)
    tokenizer = build(flags)
    with inside(root):
        ids = ours(flags)
    assert_same(ids, tokenizer.unique_identifiers)


# Megatron-LM build_tokenizer with --legacy-tokenizer: flags -> (class, paths, options) it constructs.
LEGACY_SYSTEM = {
    "null": (dict(tokenizer_type="NullTokenizer", vocab_size=1000), "_NullTokenizer", [None],
             dict(vocab_size=1000)),
    "null_zero": (dict(tokenizer_type="NullTokenizer", vocab_size=0), "_NullTokenizer", [None],
                  dict(vocab_size=0)),
    "gpt2": (dict(tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2files/vocab.json",
                  merge_file="./gpt2files/merges.txt", tokenizer_special_tokens=["<x>"],
                  tokenizer_hf_use_fast=True, tokenizer_metadata="missing.json"),
             "_GPT2BPETokenizer", ["gpt2files/vocab.json", "./gpt2files/merges.txt"], {}),
    "hf": (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="/models/tok/", vocab_file="v",
                trust_remote_code=True, tokenizer_hf_include_special_tokens=True),
           "_HuggingFaceTokenizer", ["/models/tok/"], {}),
    "bert_lower": (dict(tokenizer_type="BertWordPieceLowerCase", vocab_file="bert/vocab.txt"),
                   "_BertWordPieceTokenizer", ["bert/vocab.txt"], dict(lower_case=True, vocab_extra_ids=0)),
    "bert_cased_extra_ids": (dict(tokenizer_type="BertWordPieceCase", vocab_file="bert/vocab.txt",
                                  vocab_extra_ids=100),
                             "_BertWordPieceTokenizer", ["bert/vocab.txt"],
                             dict(lower_case=False, vocab_extra_ids=100)),
}


@pytest.mark.parametrize("case", LEGACY_SYSTEM)
def test_legacy_system_equals_megatron_base_class(megatron, case):
    from megatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer

    flags, class_name, paths, options = LEGACY_SYSTEM[case]
    abstract = dict.fromkeys(("tokenize", "vocab", "inv_vocab", "vocab_size"))
    tokenizer = type(class_name, (MegatronLegacyTokenizer,), abstract)(*paths, **options)
    ids = ours({**flags, "legacy_tokenizer": True})
    assert_same(ids, tokenizer.unique_identifiers)
    assert json.dumps(ids, indent=4) == tokenizer.unique_description


BAD_FLAGS = [
    # (flags, our message, what megatron-core's build_tokenizer raises on them; None where it is not
    # the oracle: legacy flags and types we do not derive)
    (dict(tokenizer_type="SentencePieceTokenizer", tokenizer_model="t.model"),
     r"SentencePieceTokenizer: megacache cannot derive .*--tokenizer-identifiers FILE\.json.*"
     r"--tokenizer-from-description PATH", None),
    (dict(tokenizer_type="TikTokenizer", legacy_tokenizer=True), r"TikTokenizer: .*cannot derive", None),
    (dict(tokenizer_type="SFTTokenizer"), r"SFTTokenizer: .*--tokenizer-identifiers", None),
    (dict(tokenizer_type="GPT2BPE"), r"'GPT2BPE' is not one of Megatron-LM's", None),
    (dict(tokenizer_type="NullTokenizer"), r"NullTokenizer needs a non-zero --vocab-size", TypeError),
    (dict(tokenizer_type="NullTokenizer", vocab_size=0), r"needs a non-zero --vocab-size", TypeError),
    (dict(tokenizer_type="NullTokenizer", legacy_tokenizer=True), r"--legacy-tokenizer .* needs --vocab-size",
     None),
    (dict(tokenizer_type="HuggingFaceTokenizer"), r"HuggingFaceTokenizer needs --tokenizer-model",
     AssertionError),
    (dict(tokenizer_type="HuggingFaceTokenizer", legacy_tokenizer=True), r"needs --tokenizer-model", None),
    (dict(tokenizer_type="GPT2BPETokenizer", vocab_file="v.json", legacy_tokenizer=True),
     r"--legacy-tokenizer --tokenizer-type GPT2BPETokenizer needs --merge-file", None),
    (dict(tokenizer_type="BertWordPieceCase", legacy_tokenizer=True), r"needs --vocab-file", None),
    (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf", tokenizer_metadata="nope.json"),
     r"nope\.json: cannot read the tokenizer metadata: No such file", AssertionError),
    (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf", tokenizer_metadata="bad.json"),
     r"bad\.json:line 1 column 13: not valid JSON", json.JSONDecodeError),
    (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf", tokenizer_metadata="llama.json"),
     r"llama\.json:model_type: 'llama' is not one of Megatron's model types", KeyError),
    (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf", tokenizer_metadata="class.json"),
     r"class\.json:tokenizer_class: megatron-core 0\.16 cannot load .*--tokenizer-identifiers",
     AttributeError),
]


@pytest.mark.parametrize("flags,message,megatron_error", BAD_FLAGS)
def test_bad_flags(build, root, flags, message, megatron_error):
    (root / "bad.json").write_text('{"library": huggingface}')
    (root / "llama.json").write_text(json.dumps({"library": "huggingface", "model_type": "llama"}))
    (root / "class.json").write_text(json.dumps(
        {"library": "huggingface", "tokenizer_class": True, "tokenizer_class_path": "x",
         "tokenizer_class_name": "Y"}))
    with inside(root), pytest.raises(MegacacheError, match=message):
        ours(flags)
    if megatron_error is not None:
        with pytest.raises(megatron_error):
            build(flags)


def test_identifiers_from_json(build, root, tmp_path):
    tokenizer = build(new_system_flags("hf_all_options", root))
    path = tmp_path / "ids.json"
    path.write_text(json.dumps(tokenizer.unique_identifiers, indent=2))
    assert_same(identifiers_from_json(str(path)), tokenizer.unique_identifiers)

    def fails(text, message, error=InputError):
        path.write_text(text)
        with pytest.raises(error, match=message):
            identifiers_from_json(str(path))

    fails('{"class": "X",\n "tokenizer_path": nul}', r"ids\.json:line 2 column 20: not valid JSON")
    fails('["class"]', r"ids\.json:top level: .*JSON object with a 'class' string")
    fails('{"tokenizer_path": null}', r"JSON object with a 'class' string")
    fails(json.dumps(gpt_identifiers("p", 1, "train", 1, 2, "1", [[0, 1.0]], {"class": "X"})),
          r"dataset description, not tokenizer identifiers: pass it with --tokenizer-from-description")
    path.write_bytes(b'{"class": "\xff"}')
    with pytest.raises(InputError, match="not UTF-8"):
        identifiers_from_json(str(path))
    with pytest.raises(MegacacheError, match=r"missing\.json: cannot read the tokenizer identifiers"):
        identifiers_from_json(str(tmp_path / "missing.json"))


def test_megatron_cache_name_end_to_end(megatron, build, root, tmp_path):
    """A GPTDataset megatron-core builds with a real Hugging Face tokenizer caches under the name
    megacache computes from the flags; the description it writes gives the identifiers back."""
    from oracle import load_mcore, megatron_splits, write_lengths

    flags = dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=f"{root}/hf",
                 tokenizer_special_tokens=["<|tool|>"], tokenizer_hf_use_fast=True)
    mcore = SimpleNamespace(**{**vars(load_mcore()), "tokenizer": build(flags)})
    prefix, cache = str(tmp_path / "data"), str(tmp_path / "cache")
    write_lengths(prefix, [5, 7, 3, 9, 4, 6, 8, 2, 10, 1] * 10)
    megatron_splits(mcore, prefix, "969,30,1", [40, None, None], 1234, 8, 1, True, path_to_cache=cache)

    split_matrix = [[0, 0.969], [0.969, 0.999], [0.999, 1.0]]
    entry = CacheEntry(cache, gpt_identifiers(prefix, 40, "train", 1234, 8, "969,30,1", split_matrix,
                                              ours(flags)))
    assert entry.exists()
    written = sorted(os.listdir(cache))
    assert sorted(os.path.basename(p) for p in entry.paths().values()) == [
        n for n in written if n.split("-")[-2] == "train"]
    with open(entry.path("description.txt")) as f:
        assert f.read() == entry.description
    assert_same(identifiers_from_description(entry.path("description.txt")), ours(flags))


def test_identifiers_from_blend_description(tmp_path):
    tok = tokenizer_identifiers("GPT2BPETokenizer", vocab_file="v.json", merge_file="m.txt", legacy=True)
    other = tokenizer_identifiers("NullTokenizer", vocab_size=7)

    def gpt(prefix, tokenizer):
        return gpt_identifiers(prefix, 10, "train", 1, 8, "1", [[0, 1.0], None, None], tokenizer)

    path = tmp_path / "blend-description.txt"
    path.write_text(describe(blend_identifiers([gpt("a", tok), gpt("b", tok)], "train", [0.5, 0.5], 20)))
    assert_same(identifiers_from_description(str(path)), tok)

    def fails(description, message):
        path.write_text(json.dumps(description))
        with pytest.raises(InputError, match=message):
            identifiers_from_description(str(path))

    fails(blend_identifiers([gpt("a", tok), gpt("b", other)], "train", [0.5, 0.5], 20),
          r"blend-description\.txt:datasets: the blended datasets use 2 different tokenizers")
    fails(blend_identifiers([gpt("a", tok), {"class": "GPTDataset"}], "train", [1.0], 2),
          r":datasets\[1\]: has no 'tokenizer' entry")
    fails({"class": "GPTDataset", "tokenizer": "oops"},
          r":tokenizer: tokenizer identifiers must be a JSON object")
    fails({"class": "X"}, r":top level: no 'tokenizer' entry: expected the description\.txt")
    fails([1, 2], r"no 'tokenizer' entry")
