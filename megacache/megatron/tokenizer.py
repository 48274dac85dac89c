"""The tokenizer's ``unique_identifiers`` that Megatron-LM training hashes into every dataset cache
name, per megatron-core version, and the command-line flags that decide it.

A GPTDataset's description embeds ``config.tokenizer.unique_identifiers``. Training builds that
tokenizer from its flags (``pretrain_gpt.py``: megatron-core's ``build_tokenizer(args)``; in 0.16 with
``--legacy-tokenizer``, Megatron-LM's own legacy builder). This module derives the dict from the same
flags, without importing megatron-core or loading the tokenizer:

* New system (every version): ``class`` is the model class's ``module.qualname``, chosen by
  ``model_type`` in the ``--tokenizer-metadata`` JSON (0.20: one class, unless the metadata names
  another by ``class_path``/``class_name``); ``tokenizer_path`` is the path as given (never
  normalised: ``./tok/`` and ``tok`` are different caches; the type name for GPT-2 and BERT); then
  every keyword ``build_tokenizer`` passes, as ``str(value)``, in its order. Which keywords, their
  order and their flags changed between versions: see ``_new_system``.
* Legacy system (0.16 only): ``class`` is the bare class name, ``tokenizer_path`` the list of
  positional paths, then the keyword options as ``str(value)``.
"""

from __future__ import annotations

import ast
import functools
import json
import shlex

from ..errors import InputError, MegacacheError
from .flags import Flag, flag_words, resolve_flags, without_defaults
from .versions import SUPPORTED, at_least, resolve

#: ``--tokenizer-type`` choices of Megatron-LM's arguments.py (the same in every supported version).
MEGATRON_TYPES = (
    "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
    "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer",
)
SENTENCEPIECE_TYPES = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")
#: GPT-2 and BERT: megatron-core's "megatron" library, which loads the Hugging Face hub models.
MEGATRON_LIBRARY_TYPES = ("GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase")
#: the text tokenizer types whose identity megacache derives (the rest need an explicit identity)
SUPPORTED_TYPES = ("NullTokenizer", "HuggingFaceTokenizer", *MEGATRON_LIBRARY_TYPES, *SENTENCEPIECE_TYPES,
                   "TikTokenizer")
#: the metadata ``library`` each type's tokenizer is built with
_LIBRARY = {"HuggingFaceTokenizer": "huggingface", "TikTokenizer": "tiktoken",
            **dict.fromkeys(MEGATRON_LIBRARY_TYPES, "megatron"), **dict.fromkeys(SENTENCEPIECE_TYPES, "sentencepiece")}

# New system to 0.19: metadata ``model_type`` -> model class, under megatron.core.tokenizers.text.models.
# The name of the default changed in 0.17 ("default" -> "default-text"); each is a KeyError in the other.
_MODEL_CLASSES = {"gpt": "gpt_tokenizer.GPTTokenizer", "mamba": "mamba_tokenizer.MambaTokenizer",
                  "bert": "bert_tokenizer.BertTokenizer", "t5": "t5_tokenizer.T5Tokenizer"}
_DEFAULT_MODEL = "default_tokenizer.DefaultTokenizerText"
#: 0.20 on: the models package is gone and every text tokenizer is this class. ``model_type`` is
#: ignored; the metadata's ``class_path``/``class_name`` import another class, whose identity megacache
#: knows only when it is this one (under either module that exports it).
TEXT_CLASS = "megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText"
_TEXT_CLASS_NAMES = {("megatron.core.tokenizers.text.text_tokenizer", "MegatronTokenizerText"),
                     ("megatron.core.tokenizers.text", "MegatronTokenizerText")}


def _default_model_type(version: str) -> str:
    return "default-text" if at_least(version, "0.17") else "default"


#: the extra tokens megatron-core's build_tokenizer gives BertWordPieceCase in place of the user's
BERT_CASED_EXTRA_TOKENS = tuple(f"<extra_id_{i}>" for i in range(100))
#: The special tokens megatron-core's tiktoken library requires among any that are given, and its
#: default list: ids 0..6 in this order (EOD is ``</s>``), then ``<SPECIAL_{id}>`` fillers up to
#: ``--tiktoken-num-special-tokens``; the rank file's ids follow them.
TIKTOKEN_REQUIRED_SPECIALS = ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")
TIKTOKEN_FILLER = "<SPECIAL_{id}>"
#: megatron-core's tiktoken vocabulary size and pattern when no flag gives them.
TIKTOKEN_DEFAULT_VOCAB_SIZE = 2**17
TIKTOKEN_DEFAULT_PATTERN = "v2"
#: The regular expressions behind --tiktoken-pattern v1 / v2 (Megatron-LM's legacy TikTokenizer
#: records the expression itself in its identity, not its name).
TIKTOKEN_PATTERNS = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
          r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+",
}

_INSTEAD = ("pass --tokenizer-identifiers FILE.json (the tokenizer's unique_identifiers as JSON) or "
            "--tokenizer-from-description PATH (a ...-description.txt Megatron wrote with this "
            "tokenizer) instead")


# ---------------------------------------------------------------------------------------------
# Flags


#: Megatron-LM's tokenizer flags in every supported version (arguments.py; 0.18 on, its
#: TokenizerConfig). Flags that only size the embedding are accepted and change nothing in megacache.
TOKENIZER_FLAGS = (
    Flag(("--tokenizer-type",), "str", help="Megatron's --tokenizer-type"),
    Flag(("--tokenizer-model",), "str", help="the HuggingFace, SentencePiece or tiktoken model"),
    Flag(("--tokenizer-metadata",), "str", help="metadata JSON (its model_type picks the class)"),
    Flag(("--vocab-file",), "str", help="GPT-2's vocab.json, BERT's vocab.txt (build hashes the path as given)"),
    Flag(("--merge-file",), "str", help="GPT-2's merges.txt (build hashes the path as given)"),
    Flag(("--vocab-size",), "int", minimum=0,
         help="NullTokenizer's and TikTokenizer's vocabulary size (0 is read as not given, as Megatron reads it)"),
    Flag(("--padded-vocab-size",), "int", minimum=0, help="(embedding size only; not hashed)"),
    Flag(("--vocab-extra-ids",), "int", default=0, minimum=0,
         help="(0.16's legacy BERT and SentencePiece tokenizers)"),
    Flag(("--tokenizer-special-tokens",), "list", help="added special tokens (Hugging Face, GPT-2, tiktoken, "
         "legacy SentencePiece)"),
    Flag(("--legacy-tokenizer",), "true", until="0.16", default=False, help="Megatron-LM's own tokenizers"),
    # Megatron-LM's parser takes any text, but every tokenizer that reads it refuses all but these.
    Flag(("--tiktoken-pattern",), "str", choices=tuple(TIKTOKEN_PATTERNS),
         help=f"TikTokenizer's pre-tokenizer pattern (default {TIKTOKEN_DEFAULT_PATTERN})"),
    Flag(("--tiktoken-num-special-tokens",), "int", default=1000, minimum=0, help="ids reserved for special tokens"),
    Flag(("--tiktoken-special-tokens",), "list", until="0.17",
         help="(deprecated: used when --tokenizer-special-tokens is not given)"),
    Flag(("--tokenizer-sentencepiece-legacy",), "true", default=False, help="SentencePiece's legacy mode"),
    Flag(("--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
          "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces"), "false", since="0.18", default=True),
    # 0.17 kept these two as switches whose default is True, so they change nothing there.
    Flag(("--tokenizer-hf-use-fast",), "true", until="0.17", default=False,
         help="a fast Hugging Face tokenizer (0.17: already the default)"),
    Flag(("--tokenizer-hf-include-special-tokens",), "true", until="0.17", default=False,
         help="special tokens in encodings (0.17: already the default)"),
    Flag(("--tokenizer-hf-no-use-fast",), "true", since="0.17", default=False,
         help="a slow Hugging Face tokenizer"),
    Flag(("--tokenizer-hf-no-include-special-tokens",), "true", since="0.17", default=False,
         help="no special tokens in encodings"),
    Flag(("--trust-remote-code",), "true", default=False, help="Hugging Face's trust_remote_code"),
    Flag(("--null-tokenizer-eod-id",), "int", since="0.18", help="NullTokenizer's end-of-document id"),
    Flag(("--null-tokenizer-pad-id",), "int", since="0.18", default=-1, help="NullTokenizer's pad id"),
    Flag(("--chat-template",), "str", since="0.18", help="a chat template (hashed as given)"),
    Flag(("--no-pad-vocab-size", "--disable-pad-vocab-size"), "false", since="0.18", default=True,
         help="(embedding size only; not hashed)"),
    Flag(("--use-gigatoken",), "true", since="0.20", default=False,
         help="(Hugging Face, GPT-2 and BERT types; hashed)"),
)
# ---------------------------------------------------------------------------------------------
# Identity


def tokenizer_identifiers(tokenizer_type: str | None = None, megatron_version: str | None = None,
                          **flags) -> dict:
    """The ``unique_identifiers`` of the tokenizer Megatron-LM ``megatron_version`` training builds from
    these flags (keywords: the flags in snake case, e.g. ``tokenizer_model``, ``vocab_size``,
    ``tokenizer_special_tokens``, ``tokenizer_hf_no_use_fast``; values as typed). The version defaults
    to the installed megatron-core's, else the newest supported. Flags Megatron ignores for the chosen
    type are ignored by this function too."""
    version = resolve(megatron_version)
    args = resolve_flags(TOKENIZER_FLAGS, version,
                         {"tokenizer_type": tokenizer_type, **without_defaults(TOKENIZER_FLAGS, flags)})
    kind = args["tokenizer_type"]
    if kind not in SUPPORTED_TYPES:
        if kind in MEGATRON_TYPES:
            raise MegacacheError(
                f"--tokenizer-type {kind}: megacache cannot derive this tokenizer's identity "
                f"(it can for {', '.join(SUPPORTED_TYPES)}); {_INSTEAD}")
        raise MegacacheError(f"--tokenizer-type {kind!r} is not one of Megatron-LM's ({', '.join(MEGATRON_TYPES)})")
    if args.get("legacy_tokenizer"):
        return _legacy(args)
    return _new_system(version, args)


def special_tokens(version: str, args: dict) -> list | None:
    """``--tokenizer-special-tokens``; before 0.18, Megatron-LM's argument check copies the deprecated
    ``--tiktoken-special-tokens`` there when it is not given."""
    if args["tokenizer_special_tokens"] is None and not at_least(version, "0.18"):
        return args.get("tiktoken_special_tokens")
    return args["tokenizer_special_tokens"]


def _new_system(version: str, args: dict) -> dict:
    """megatron-core's ``build_tokenizer``: the keywords it passes for each type, in its order."""
    kind = args["tokenizer_type"]
    since_018 = at_least(version, "0.18")
    special = special_tokens(version, args)

    def need_model() -> str:
        if not args["tokenizer_model"]:
            raise MegacacheError(f"--tokenizer-type {kind} needs --tokenizer-model")
        return args["tokenizer_model"]

    if kind == "NullTokenizer":
        # Megatron passes vocab_size only when truthy, and NullTokenizer cannot do without it; the
        # metadata file is not read for it.
        if not args["vocab_size"]:
            raise MegacacheError("--tokenizer-type NullTokenizer needs a non-zero --vocab-size")
        ids = {"class": _model_class(version, None, kind), "tokenizer_path": None,
               "vocab_size": str(args["vocab_size"])}
        for key, dest in (("eod_id", "null_tokenizer_eod_id"), ("pad_id", "null_tokenizer_pad_id")):
            if since_018 and args[dest] is not None:
                ids[key] = str(args[dest])
        return ids

    if kind in SENTENCEPIECE_TYPES:
        path = need_model()
        if special is not None and not args["tokenizer_sentencepiece_legacy"]:
            raise MegacacheError(f"--tokenizer-type {kind}: --tokenizer-special-tokens needs "
                                 f"--tokenizer-sentencepiece-legacy (megatron-core's SentencePiece library "
                                 f"refuses special tokens otherwise)")
        options = {}
        if since_018:
            options = {"chat_template": args["chat_template"],
                       "ignore_extra_whitespaces": args["tokenizer_sentencepiece_ignore_extra_whitespaces"]}
        options.update(legacy=args["tokenizer_sentencepiece_legacy"], special_tokens=special)
        return _new_identifiers(version, args, path, options)

    if kind == "TikTokenizer":
        path = need_model()
        check_tiktoken(args, special)
        options = {"chat_template": args["chat_template"]} if since_018 else {}
        if args["tiktoken_pattern"]:
            options["pattern"] = args["tiktoken_pattern"]
        if args["vocab_size"]:
            options["vocab_size"] = args["vocab_size"]
        options.update(num_special_tokens=args["tiktoken_num_special_tokens"], special_tokens=special)
        return _new_identifiers(version, args, path, options)

    if at_least(version, "0.17"):  # the positive switches became no-ops, the negative ones decide
        hf = {"use_fast": not args["tokenizer_hf_no_use_fast"], "trust_remote_code": args["trust_remote_code"],
              "include_special_tokens": not args["tokenizer_hf_no_include_special_tokens"]}
    else:
        hf = {"use_fast": args["tokenizer_hf_use_fast"], "trust_remote_code": args["trust_remote_code"],
              "include_special_tokens": args["tokenizer_hf_include_special_tokens"]}
    if at_least(version, "0.20"):
        hf["use_gigatoken"] = args["use_gigatoken"]
    files = {"vocab_file": args["vocab_file"], "merges_file": args["merge_file"]}
    if kind == "HuggingFaceTokenizer":
        path = need_model()
        options = {"chat_template": args["chat_template"]} if since_018 else {}
        options.update(files, additional_special_tokens=special or [], **hf)
        return _new_identifiers(version, args, path, options)
    # GPT-2 and BERT: megatron-core's "megatron" library, named by the type.
    if kind.startswith("Bert") and hf.get("use_gigatoken"):
        raise MegacacheError(f"--tokenizer-type {kind} with --use-gigatoken: megatron-core cannot build it "
                             f"(gigatoken loads BPE tokenizers only; BERT's is WordPiece)")
    extra = list(BERT_CASED_EXTRA_TOKENS) if kind == "BertWordPieceCase" else special or []
    return _new_identifiers(version, args, kind, {"additional_special_tokens": extra, **files, **hf})


def _new_identifiers(version: str, args: dict, path: str, options: dict) -> dict:
    return {"class": _model_class(version, args["tokenizer_metadata"], args["tokenizer_type"]),
            "tokenizer_path": path, **{k: str(v) for k, v in options.items()}}


def check_tiktoken(args: dict, special: list | None) -> None:
    """What megatron-core's tiktoken library asserts on the flags alone (the rank file's size is
    checked when Megatron loads it)."""
    pattern = args["tiktoken_pattern"]
    if pattern and pattern not in TIKTOKEN_PATTERNS:
        raise MegacacheError(f"--tiktoken-pattern {pattern!r}: Megatron knows v1 and v2")
    if special is not None:
        missing = [t for t in TIKTOKEN_REQUIRED_SPECIALS if t not in special]
        if missing or len(set(special)) != len(special):
            raise MegacacheError(
                f"--tokenizer-special-tokens for TikTokenizer must be unique and include "
                f"{' '.join(TIKTOKEN_REQUIRED_SPECIALS)} (megatron-core asserts); "
                + (f"missing {' '.join(missing)}" if missing else "some are repeated"))
        if len(special) > args["tiktoken_num_special_tokens"]:
            raise MegacacheError(f"{len(special)} special tokens, more than --tiktoken-num-special-tokens "
                                 f"{args['tiktoken_num_special_tokens']} (megatron-core asserts)")


def _model_class(version: str, metadata_path: str | None, tokenizer_type: str) -> str:
    """The new system's model class, as ``MegatronTokenizer.from_pretrained`` picks it from the
    metadata file (NullTokenizer ignores the file)."""
    model_type = _default_model_type(version)
    one_class = at_least(version, "0.20")
    if metadata_path and tokenizer_type != "NullTokenizer":
        metadata = _read_json(metadata_path, "tokenizer metadata")
        if not isinstance(metadata, dict):
            raise InputError(metadata_path, "top level", "tokenizer metadata must be a JSON object")
        if metadata.get("tokenizer_class") and not one_class:  # 0.20 reads class_name instead
            raise InputError(metadata_path, "tokenizer_class",
                             f"megatron-core cannot load a metadata file naming a tokenizer class; {_INSTEAD}")
        library = metadata.get("library")
        if library != _LIBRARY[tokenizer_type]:
            raise InputError(metadata_path, "library",
                             f"{library!r}: --tokenizer-type {tokenizer_type} is built with library "
                             f"{_LIBRARY[tokenizer_type]!r}, and megatron-core builds the file's library "
                             f"(it fails or loads another tokenizer otherwise)")
        if one_class:
            named = (metadata.get("class_path"), metadata.get("class_name"))
            if named[1] and named not in _TEXT_CLASS_NAMES:
                raise InputError(metadata_path, "class_name",
                                 f"{'.'.join(map(str, named))}: megacache knows the identity of megatron-core "
                                 f"{version}'s {TEXT_CLASS} only (the text models package of 0.16-0.19 is "
                                 f"gone); {_INSTEAD}")
            return TEXT_CLASS
        if "model_type" in metadata:
            model_type = metadata["model_type"]
            if model_type is None and at_least(version, "0.17"):
                model_type = _default_model_type(version)
        known = [_default_model_type(version), *_MODEL_CLASSES]
        if model_type not in known:
            raise InputError(metadata_path, "model_type",
                             f"{model_type!r} is not one of megatron-core {version}'s text model types "
                             f"({', '.join(known)})")
    if one_class:
        return TEXT_CLASS
    return "megatron.core.tokenizers.text.models." + _MODEL_CLASSES.get(model_type, _DEFAULT_MODEL)


def _legacy(args: dict) -> dict:
    """Megatron-LM 0.16's legacy tokenizers: the arguments each class hands to its base class."""
    kind = args["tokenizer_type"]

    def need(dest: str) -> str:
        if args[dest] is None:
            raise MegacacheError(f"--legacy-tokenizer --tokenizer-type {kind} needs --{dest.replace('_', '-')}")
        return args[dest]

    if kind == "NullTokenizer":
        return {"class": "_NullTokenizer", "tokenizer_path": [None], "vocab_size": str(need("vocab_size"))}
    if kind == "GPT2BPETokenizer":
        return {"class": "_GPT2BPETokenizer", "tokenizer_path": [need("vocab_file"), need("merge_file")]}
    if kind == "HuggingFaceTokenizer":
        return {"class": "_HuggingFaceTokenizer", "tokenizer_path": [need("tokenizer_model")]}
    if kind in ("BertWordPieceLowerCase", "BertWordPieceCase"):
        return {"class": "_BertWordPieceTokenizer", "tokenizer_path": [need("vocab_file")],
                "lower_case": str(kind == "BertWordPieceLowerCase"), "vocab_extra_ids": str(args["vocab_extra_ids"])}
    if kind in SENTENCEPIECE_TYPES:
        extra_ids = args["vocab_extra_ids"] if kind == "SentencePieceTokenizer" else 0
        return {"class": f"_{kind}", "tokenizer_path": [need("tokenizer_model")], "vocab_extra_ids": str(extra_ids)}
    path = need("tokenizer_model")
    pattern = need("tiktoken_pattern")
    if pattern not in TIKTOKEN_PATTERNS:
        raise MegacacheError(f"--tiktoken-pattern {pattern!r}: Megatron knows v1 and v2")
    special = special_tokens("0.16", args)
    return {"class": "CustomTikTokenizer", "tokenizer_path": [path], "pattern": TIKTOKEN_PATTERNS[pattern],
            "vocab_size": str(args["vocab_size"]), "num_special_tokens": str(args["tiktoken_num_special_tokens"]),
            "special_tokens": str(special)}


# ---------------------------------------------------------------------------------------------
# From identity back to flags


def check_identity(ids) -> None:
    """Refuse a tokenizer identity no Megatron tokenizer has: its keys are strings and its values
    strings (each option as ``str()`` writes it), None, or a list of paths. The cache name hashes the
    values as they are, so ``1000`` where Megatron has ``"1000"`` would name caches Megatron never finds."""
    if not isinstance(ids, dict):
        raise MegacacheError(f"the tokenizer identity must be a dict of Megatron's unique_identifiers, not "
                             f"{type(ids).__name__}")
    for key, value in ids.items():
        if isinstance(key, str) and (value is None or isinstance(value, str) or (
                isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))):
            continue
        raise MegacacheError(f"the tokenizer identity's {key!r} is {value!r} ({type(value).__name__}): Megatron's "
                             f"unique_identifiers hold strings (each option as str() writes it), None or a list of "
                             f"paths, and the cache name hashes them as they are; give {str(value)!r}, or the "
                             f"tokenizer flags instead of the identity")


def tokenizer_flags(ids: dict, version: str) -> str | None:
    """The Megatron-LM ``version`` flags whose tokenizer has these identifiers, as command-line text
    (a metadata file, which only names the class, is shown as ``--tokenizer-metadata FILE``); None when
    no flags of that version give them (another version's form, or a type megacache does not derive)."""
    if not isinstance(ids, dict):
        return None
    # Every entry of a cache usually shares one tokenizer: derive once per identity (its JSON keeps
    # the key order, which the comparison below depends on).
    return _flags_of(json.dumps(ids), version)


@functools.lru_cache(maxsize=256)
def _flags_of(text: str, version: str) -> str | None:
    ids = json.loads(text)
    flags = _candidate_flags(ids, version)
    if flags is None:
        return None
    model = str(ids.get("class", "")).rpartition("text.models.")[2]
    model_type = next((t for t, m in _MODEL_CLASSES.items() if m == model), None)
    try:
        derived = tokenizer_identifiers(megatron_version=version, **flags)
    except MegacacheError:
        return None
    if model_type is not None and not flags.get("legacy_tokenizer") and ids.get("tokenizer_path") is not None:
        derived["class"] = ids["class"]  # what a metadata file with that model_type gives
    if list(derived.items()) != list(ids.items()):
        return None
    words = [shlex.quote(w) for w in flag_words(TOKENIZER_FLAGS, flags)]  # flag names are shell-safe as they are
    if model_type is not None and ids.get("tokenizer_path") is not None and not flags.get("legacy_tokenizer"):
        words.append(f"--tokenizer-metadata FILE (model_type {model_type})")
    return " ".join(words)


def _candidate_flags(ids: dict, version: str) -> dict | None:
    """The flags that would give ``ids``, read off its entries (checked by recomputing them)."""
    def value(key):
        text = ids.get(key)
        return None if text in (None, "None") else text

    def tokens(key):
        try:
            parsed = ast.literal_eval(ids.get(key) or "None")
        except (ValueError, SyntaxError):
            return None
        return parsed or None

    def number(key):
        text = value(key)
        return int(text) if isinstance(text, str) and text.lstrip("-").isdigit() else None

    path, cls = ids.get("tokenizer_path"), str(ids.get("class", ""))
    if cls.startswith("_") or cls == "CustomTikTokenizer":  # 0.16's legacy system
        paths = path if isinstance(path, list) else []
        legacy = {"_NullTokenizer": dict(tokenizer_type="NullTokenizer", vocab_size=number("vocab_size")),
                  "_HuggingFaceTokenizer": dict(tokenizer_type="HuggingFaceTokenizer"),
                  "_GPT2BPETokenizer": dict(tokenizer_type="GPT2BPETokenizer")}.get(cls)
        if cls == "_BertWordPieceTokenizer":
            legacy = dict(tokenizer_type="BertWordPieceLowerCase" if ids.get("lower_case") == "True"
                          else "BertWordPieceCase", vocab_extra_ids=number("vocab_extra_ids"))
        elif cls in ("_SentencePieceTokenizer", "_GPTSentencePieceTokenizer", "_Llama2Tokenizer"):
            legacy = dict(tokenizer_type=cls[1:], vocab_extra_ids=number("vocab_extra_ids"))
        elif cls == "CustomTikTokenizer":
            pattern = next((k for k, v in TIKTOKEN_PATTERNS.items() if v == ids.get("pattern")), None)
            legacy = dict(tokenizer_type="TikTokenizer", tiktoken_pattern=pattern, vocab_size=number("vocab_size"),
                          tiktoken_num_special_tokens=number("num_special_tokens"),
                          tokenizer_special_tokens=tokens("special_tokens"))
        if legacy is None or version != "0.16":
            return None
        kind = legacy["tokenizer_type"]
        if kind in ("GPT2BPETokenizer",) and len(paths) == 2:
            legacy.update(vocab_file=paths[0], merge_file=paths[1])
        elif kind in ("HuggingFaceTokenizer", "TikTokenizer", *SENTENCEPIECE_TYPES) and len(paths) == 1:
            legacy["tokenizer_model"] = paths[0]
        elif kind.startswith("Bert") and len(paths) == 1:
            legacy["vocab_file"] = paths[0]
        return {k: v for k, v in legacy.items() if v is not None} | {"legacy_tokenizer": True}

    since_017 = at_least(version, "0.17")
    common = {"chat_template": value("chat_template")} if at_least(version, "0.18") else {}
    if path is None:
        flags = dict(tokenizer_type="NullTokenizer", vocab_size=number("vocab_size"))
        if at_least(version, "0.18"):
            flags.update(null_tokenizer_eod_id=number("eod_id"), null_tokenizer_pad_id=number("pad_id"))
        return flags
    if not isinstance(path, str):
        return None
    if "num_special_tokens" in ids:
        return dict(tokenizer_type="TikTokenizer", tokenizer_model=path, tiktoken_pattern=value("pattern"),
                    vocab_size=number("vocab_size"), tiktoken_num_special_tokens=number("num_special_tokens"),
                    tokenizer_special_tokens=tokens("special_tokens"), **common)
    if "legacy" in ids:
        flags = dict(tokenizer_type="SentencePieceTokenizer", tokenizer_model=path,
                     tokenizer_sentencepiece_legacy=ids["legacy"] == "True",
                     tokenizer_special_tokens=tokens("special_tokens"), **common)
        if at_least(version, "0.18"):
            flags["tokenizer_sentencepiece_ignore_extra_whitespaces"] = ids.get("ignore_extra_whitespaces") != "False"
        return flags
    if "use_fast" not in ids:
        return None
    if since_017:
        switches = dict(tokenizer_hf_no_use_fast=ids["use_fast"] == "False",
                        tokenizer_hf_no_include_special_tokens=ids.get("include_special_tokens") == "False")
        if at_least(version, "0.20"):
            switches["use_gigatoken"] = ids.get("use_gigatoken") == "True"
    else:
        switches = dict(tokenizer_hf_use_fast=ids["use_fast"] == "True",
                        tokenizer_hf_include_special_tokens=ids.get("include_special_tokens") == "True")
    flags = dict(vocab_file=value("vocab_file"), merge_file=value("merges_file"),
                 trust_remote_code=ids.get("trust_remote_code") == "True", **switches)
    if path in MEGATRON_LIBRARY_TYPES:
        special = None if path == "BertWordPieceCase" else tokens("additional_special_tokens")
        return dict(tokenizer_type=path, tokenizer_special_tokens=special, **flags)
    return dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=path,
                tokenizer_special_tokens=tokens("additional_special_tokens"), **common, **flags)


def versions_of(ids: dict) -> list[str]:
    """The supported versions whose flags can give these identifiers."""
    return [v for v in SUPPORTED if tokenizer_flags(ids, v) is not None]


# ---------------------------------------------------------------------------------------------
# Identity given verbatim


def identifiers_from_json(path: str) -> dict:
    """Tokenizer identifiers the user saved as a JSON object, e.g. with
    ``json.dumps(tokenizer.unique_identifiers)``."""
    ids = _read_json(path, "tokenizer identifiers")
    if isinstance(ids, dict) and "tokenizer" in ids and "dataset_path" in ids:
        raise InputError(path, "top level", "this is a dataset description, not tokenizer identifiers: "
                                            "pass it with --tokenizer-from-description")
    _check_identifiers(ids, path, "top level")
    return ids


def identifiers_from_description(path: str) -> dict:
    """The ``tokenizer`` entry of a Megatron ``...-description.txt`` (a GPTDataset's, or a
    BlendedDataset's whose datasets all share one tokenizer)."""
    description = _read_json(path, "dataset description")
    if isinstance(description, dict) and "tokenizer" in description:
        _check_identifiers(description["tokenizer"], path, "tokenizer")
        return description["tokenizer"]
    datasets = description.get("datasets") if isinstance(description, dict) else None
    if not isinstance(datasets, list) or not datasets:
        raise InputError(path, "top level", "no 'tokenizer' entry: expected the description.txt of a "
                                            "Megatron GPTDataset or BlendedDataset cache")
    found = []
    for i, dataset in enumerate(datasets):
        if not isinstance(dataset, dict) or "tokenizer" not in dataset:
            raise InputError(path, f"datasets[{i}]", "has no 'tokenizer' entry")
        _check_identifiers(dataset["tokenizer"], path, f"datasets[{i}].tokenizer")
        if dataset["tokenizer"] not in found:
            found.append(dataset["tokenizer"])
    if len(found) > 1:
        raise InputError(path, "datasets", f"the blended datasets use {len(found)} different tokenizers")
    return found[0]


def _check_identifiers(ids, path: str, where: str) -> None:
    if not isinstance(ids, dict) or not isinstance(ids.get("class"), str):
        raise InputError(path, where, "tokenizer identifiers must be a JSON object with a 'class' string")


def _read_json(path: str, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise MegacacheError(f"{path}: cannot read the {what}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise InputError(path, f"line {e.lineno} column {e.colno}", f"not valid JSON ({e.msg})") from None
    except UnicodeDecodeError:
        raise InputError(path, "encoding", "not UTF-8 text") from None
