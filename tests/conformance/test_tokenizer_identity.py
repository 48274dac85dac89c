"""megacache.megatron.tokenizer: the tokenizer identity Megatron-LM training hashes into its cache names,
for every supported megatron-core version.

New system (every version): the oracle is each version's own ``build_tokenizer(args)`` (what
``pretrain_gpt.py`` calls) on an ``args`` with that version's Megatron-LM flag defaults, building real
tokenizers from files these tests train (tests/support/oracles/megatron_worker.py, in that version's interpreter).
GPT2BPETokenizer and BertWordPiece* load the hub repos ``gpt2`` / ``bert-large-(un)cased`` (with the
given vocab file); the oracle runs in a directory holding local folders of those names, which
transformers prefers to the hub, so nothing is downloaded.

Legacy system (0.16's ``--legacy-tokenizer``): Megatron-LM's ``megatron/training/tokenizer/tokenizer.py``
is not installed for these tests, so the oracle is megatron-core 0.16's ``MegatronLegacyTokenizer``
base (which forms the identifiers) under each Megatron-LM class name, given the paths and options
that file's ``build_tokenizer`` passes to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from types import SimpleNamespace

import pytest

from megacache.errors import InputError, MegacacheError
from megacache.megatron.cache import CacheEntry, blend_identifiers, describe, gpt_identifiers
from megacache.megatron.tokenizer import (
    SUPPORTED_TYPES,
    identifiers_from_description,
    identifiers_from_json,
    tokenizer_identifiers,
)
from megacache.megatron.versions import SUPPORTED, UNRELEASED
from support.oracles.environments import ask, recorded_main
from support.inputs.tokenizer_cases import (
    NEW_SYSTEM,
    RANDOM_CASES_PER_TYPE,
    fixed_cases,
    new_system_flags,
    random_cases,
)
from support.inputs.tokenizer_files import write_tokenizer_files

pytestmark = pytest.mark.oracle_environments

# Megatron-LM arguments.py defaults of every flag megatron-core's build_tokenizer reads.
MEGATRON_DEFAULTS = dict(
    tokenizer_type=None, tokenizer_model=None, tokenizer_metadata=None, vocab_file=None,
    merge_file=None, vocab_size=None, vocab_extra_ids=0, tokenizer_special_tokens=None,
    tokenizer_sentencepiece_legacy=False, tokenizer_hf_use_fast=False,
    tokenizer_hf_include_special_tokens=False, trust_remote_code=False, tiktoken_pattern=None,
    tiktoken_num_special_tokens=1000, legacy_tokenizer=False,
)


def ours(flags: dict) -> dict:
    return tokenizer_identifiers(megatron_version="0.16", **flags)


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
    root = tmp_path_factory.mktemp("tokenizer_ids")
    write_tokenizer_files(root)
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


@pytest.mark.parametrize("case", NEW_SYSTEM)
def test_new_system_equals_megatron(build, root, case):
    flags = new_system_flags(case, root)
    tokenizer = build(flags)
    with inside(root):
        ids = ours(flags)
    assert_same(ids, tokenizer.unique_identifiers)


# ---------------------------------------------------------------------------------------------
# Every version, every type: random flag combinations against that version's build_tokenizer


def compare(version: str, cases: list, results: list, root) -> dict:
    """megacache's identity of each case equals the oracle's (same entries, same order), or megacache
    refuses what the oracle refused; the outcomes counted by type."""
    counts: dict = {}
    for flags, result in zip(cases, results, strict=True):
        with inside(root):
            if "error" in result:
                with pytest.raises(MegacacheError):
                    tokenizer_identifiers(megatron_version=version, **flags)
                outcome = "refused"
            else:
                assert_same(tokenizer_identifiers(megatron_version=version, **flags), result["ids"])
                outcome = "equal"
        key = (flags["tokenizer_type"], outcome)
        counts[key] = counts.get(key, 0) + 1
    return counts


def assert_mostly_equal(version: str, counts: dict) -> None:
    for kind in SUPPORTED_TYPES:  # mostly real identities, not refusals
        assert counts.get((kind, "equal"), 0) >= 0.8 * RANDOM_CASES_PER_TYPE, (version, kind, counts)


@pytest.mark.parametrize("version", SUPPORTED)
def test_random_flags_equal_each_versions_build_tokenizer(root, version):
    cases = random_cases(version, root)
    if version in UNRELEASED:  # the fixed cases too: Megatron-LM main has no other live test
        cases += list(fixed_cases(version, root).values())
    results = ask(version, {"task": "tokenizers", "cwd": str(root), "cases": cases})
    assert_mostly_equal(version, compare(version, cases, results, root))


def _under(value, root: str):
    """``value`` (recorded JSON) with every ``<ROOT>`` made ``root``."""
    if isinstance(value, str):
        return value.replace("<ROOT>", root)
    if isinstance(value, list):
        return [_under(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _under(v, root) for k, v in value.items()}
    return value


@pytest.mark.parametrize("version", UNRELEASED)
def test_identities_equal_those_recorded_from_megatron_main(root, version):
    """Megatron-LM main has no wheel: its build_tokenizer's answers to the random and fixed flag sets,
    recorded at one commit by tests/support/oracles/record_megatron_main.py, against megacache's table."""
    recorded = recorded_main("tokenizer_identities.json")
    assert recorded["megatron_core"].startswith(f"{version}."), recorded["megatron_core"]
    random_part = [_under(c, str(root)) for c in recorded["random"]]
    fixed_part = {name: _under(c, str(root)) for name, c in recorded["fixed"].items()}
    # the recording is of the flag sets these tests make (re-record when they change)
    assert [c["flags"] for c in random_part] == random_cases(version, root)
    assert {name: c["flags"] for name, c in fixed_part.items()} == fixed_cases(version, root)
    counts = compare(version, [c["flags"] for c in random_part], random_part, root)
    assert_mostly_equal(version, counts)
    compare(version, [c["flags"] for c in fixed_part.values()], list(fixed_part.values()), root)
    refused = {name for name, c in fixed_part.items() if "error" in c}
    assert refused == {"hf_metadata_class_gpt", "hf_metadata_class_without_path", "bert_cased_gigatoken"}, refused


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
    "sentencepiece": (dict(tokenizer_type="SentencePieceTokenizer", tokenizer_model="sp.model", vocab_extra_ids=3,
                           tokenizer_sentencepiece_legacy=True),
                      "_SentencePieceTokenizer", ["sp.model"], dict(vocab_extra_ids=3)),
    "gpt_sentencepiece": (dict(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model="./sp.model",
                               vocab_extra_ids=3), "_GPTSentencePieceTokenizer", ["./sp.model"], dict(vocab_extra_ids=0)),
    "llama2": (dict(tokenizer_type="Llama2Tokenizer", tokenizer_model="/m/sp.model"), "_Llama2Tokenizer",
               ["/m/sp.model"], dict(vocab_extra_ids=0)),
    # the legacy TikTokenizer records the pattern's regular expression (Megatron-LM's PATTERN_TIKTOKEN)
    "tiktoken": (dict(tokenizer_type="TikTokenizer", tokenizer_model="ranks.json", tiktoken_pattern="v1",
                      vocab_size=1290, tiktoken_special_tokens=["<unk>", "<s>", "</s>"]),
                 "CustomTikTokenizer", ["ranks.json"],
                 dict(pattern=r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
                      vocab_size=1290, num_special_tokens=1000, special_tokens=["<unk>", "<s>", "</s>"])),
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
    (dict(tokenizer_type="MultimodalTokenizer", tokenizer_model="t.model"),
     r"MultimodalTokenizer: megacache cannot derive .*--tokenizer-identifiers FILE\.json.*"
     r"--tokenizer-from-description PATH", None),
    (dict(tokenizer_type="TikTokenizer", legacy_tokenizer=True), r"TikTokenizer needs --tokenizer-model", None),
    (dict(tokenizer_type="TikTokenizer", tokenizer_model="ranks.json", legacy_tokenizer=True),
     r"TikTokenizer needs --tiktoken-pattern", None),
    (dict(tokenizer_type="TikTokenizer", tokenizer_model="ranks.json", tiktoken_pattern="v3"),
     r"--tiktoken-pattern 'v3': Megatron knows v1 and v2", ValueError),
    (dict(tokenizer_type="TikTokenizer", tokenizer_model="ranks.json", tokenizer_special_tokens=["<s>"]),
     r"must be unique and include <unk> <s> </s> .*missing <unk> </s>", AssertionError),
    (dict(tokenizer_type="SentencePieceTokenizer", tokenizer_model="sp.model", tokenizer_special_tokens=["<x>"]),
     r"--tokenizer-special-tokens needs --tokenizer-sentencepiece-legacy", ValueError),
    (dict(tokenizer_type="Llama2Tokenizer"), r"Llama2Tokenizer needs --tokenizer-model", AssertionError),
    (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf", tokenizer_metadata="meta_megatron_gpt.json"),
     r"meta_megatron_gpt\.json:library: 'megatron': --tokenizer-type HuggingFaceTokenizer is built with library "
     r"'huggingface'", None),
    (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf",
          tokenizer_metadata="meta_huggingface_default-text.json"),
     r"'default-text' is not one of megatron-core 0\.16's text model types \(default, gpt", KeyError),
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
     r"llama\.json:model_type: 'llama' is not one of megatron-core 0\.16's text model types", KeyError),
    (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf", tokenizer_metadata="class.json"),
     r"class\.json:tokenizer_class: megatron-core cannot load .*--tokenizer-identifiers",
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
    from support.inputs.indexed import write_lengths
    from support.oracles.megatron_core import load_mcore, megatron_splits

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
    tok = tokenizer_identifiers("GPT2BPETokenizer", vocab_file="v.json", merge_file="m.txt", legacy_tokenizer=True,
                                megatron_version="0.16")
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
