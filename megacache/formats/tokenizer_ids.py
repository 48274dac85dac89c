"""The tokenizer's ``unique_identifiers`` that Megatron-LM training puts into every dataset cache key.

A GPTDataset's description (see cache.py) embeds ``config.tokenizer.unique_identifiers``. Which dict
that is depends on how Megatron-LM training built its tokenizer from the command line; this module
derives it from the same flags without importing megatron-core or transformers.

How training chooses (Megatron-LM paired with megatron-core 0.16.x):

* ``pretrain_gpt.py`` ``core_gpt_dataset_config_from_args``: with ``--legacy-tokenizer`` the dataset
  gets the global tokenizer of ``megatron/training/global_vars.py``, built by the legacy
  ``megatron/training/tokenizer/tokenizer.py`` ``build_tokenizer(args)``; otherwise (the default) it
  calls megatron-core's ``megatron/core/tokenizers/text/utils/build_tokenizer.py``
  ``build_tokenizer(args)``, which ends in ``MegatronTokenizer.from_pretrained(path, metadata, **kwargs)``.
* New system (``megatron/core/tokenizers/text/text_tokenizer.py``): ``class`` is the model class's
  ``module.qualname`` (chosen by ``model_type`` in the ``--tokenizer-metadata`` JSON, default
  ``DefaultTokenizerText``), ``tokenizer_path`` the path object as given (not ``str``-ed), then every
  kwarg as ``str(value)`` in the order ``build_tokenizer`` inserted it.
* Legacy system (megatron-core ``datasets/megatron_tokenizer.py`` ``MegatronLegacyTokenizer``):
  ``class`` is the bare class name (``_GPT2BPETokenizer``, ...), ``tokenizer_path`` the list of
  positional paths, then the keyword options as ``str(value)``.

Paths go in verbatim: neither system normalises them, so ``./tok/`` and ``tok`` are different caches.
Flag defaults are Megatron-LM's ``arguments.py`` ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..errors import InputError, MegacacheError

#: ``--tokenizer-type`` choices of Megatron-LM's arguments.py.
MEGATRON_TYPES = (
    "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
    "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer",
)

#: The types whose identifiers we derive (new and legacy system); the rest need an explicit file.
SUPPORTED_TYPES = (
    "NullTokenizer", "HuggingFaceTokenizer", "GPT2BPETokenizer", "BertWordPieceLowerCase",
    "BertWordPieceCase",
)

# New system: metadata ``model_type`` -> model class, under megatron.core.tokenizers.text.models.
_MODEL_CLASSES = {
    "default": "default_tokenizer.DefaultTokenizerText",
    "gpt": "gpt_tokenizer.GPTTokenizer",
    "mamba": "mamba_tokenizer.MambaTokenizer",
    "bert": "bert_tokenizer.BertTokenizer",
    "t5": "t5_tokenizer.T5Tokenizer",
}

# Extra tokens megatron-core's build_tokenizer gives BertWordPieceCase in place of the user's.
_BERT_CASED_EXTRA_TOKENS = [f"<extra_id_{i}>" for i in range(100)]

_INSTEAD = ("pass --tokenizer-identifiers FILE.json (the tokenizer's unique_identifiers as JSON) or "
            "--tokenizer-from-description PATH (a ...-description.txt Megatron wrote with this "
            "tokenizer) instead")


def tokenizer_identifiers(
    tokenizer_type: str,
    tokenizer_model: str | None = None,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    vocab_size: int | None = None,
    special_tokens: Sequence[str] | None = None,
    legacy: bool = False,
    *,
    vocab_extra_ids: int = 0,
    tokenizer_hf_use_fast: bool = False,
    tokenizer_hf_include_special_tokens: bool = False,
    trust_remote_code: bool = False,
    tokenizer_metadata: str | None = None,
) -> dict:
    """The ``unique_identifiers`` of the tokenizer Megatron-LM training builds from these flags.

    Arguments are Megatron-LM's flags, strings exactly as typed: ``--tokenizer-type``,
    ``--tokenizer-model``, ``--vocab-file``, ``--merge-file``, ``--vocab-size``,
    ``--tokenizer-special-tokens`` (``special_tokens``), ``--legacy-tokenizer`` (``legacy``),
    ``--vocab-extra-ids``, ``--tokenizer-hf-use-fast``, ``--tokenizer-hf-include-special-tokens``,
    ``--trust-remote-code`` and ``--tokenizer-metadata`` (a JSON file, read for its ``model_type``).
    Flags Megatron ignores for the chosen type and system are ignored here too.
    """
    if tokenizer_type not in SUPPORTED_TYPES:
        if tokenizer_type in MEGATRON_TYPES:
            raise MegacacheError(
                f"--tokenizer-type {tokenizer_type}: megacache cannot derive this tokenizer's identity "
                f"(it can for {', '.join(SUPPORTED_TYPES)}); {_INSTEAD}")
        raise MegacacheError(f"--tokenizer-type {tokenizer_type!r} is not one of Megatron-LM's "
                             f"({', '.join(MEGATRON_TYPES)})")
    if legacy:
        return _legacy_identifiers(tokenizer_type, tokenizer_model, vocab_file, merge_file, vocab_size,
                                   vocab_extra_ids)

    if tokenizer_type == "NullTokenizer":
        # Megatron passes vocab_size only when truthy, and NullTokenizer cannot do without it.
        if not vocab_size:
            raise MegacacheError("--tokenizer-type NullTokenizer needs a non-zero --vocab-size")
        return {"class": _model_class(None), "tokenizer_path": None, "vocab_size": str(int(vocab_size))}

    extra = list(special_tokens) if special_tokens else []
    hf_options = {
        "use_fast": str(bool(tokenizer_hf_use_fast)),
        "trust_remote_code": str(bool(trust_remote_code)),
        "include_special_tokens": str(bool(tokenizer_hf_include_special_tokens)),
    }
    if tokenizer_type == "HuggingFaceTokenizer":
        if not tokenizer_model:
            raise MegacacheError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model")
        return {"class": _model_class(tokenizer_metadata), "tokenizer_path": tokenizer_model,
                "vocab_file": str(vocab_file), "merges_file": str(merge_file),
                "additional_special_tokens": str(extra), **hf_options}
    # GPT2BPETokenizer and BertWordPiece*: megatron-core's 'megatron' library, named by the type.
    if tokenizer_type == "BertWordPieceCase":
        extra = _BERT_CASED_EXTRA_TOKENS
    return {"class": _model_class(tokenizer_metadata), "tokenizer_path": tokenizer_type,
            "additional_special_tokens": str(extra), "vocab_file": str(vocab_file),
            "merges_file": str(merge_file), **hf_options}


def _model_class(metadata_path: str | None) -> str:
    """The new system's model class, as ``MegatronTokenizer.from_pretrained`` picks it."""
    model_type = "default"
    if metadata_path:
        metadata = _read_json(metadata_path, "tokenizer metadata")
        if not isinstance(metadata, dict):
            raise InputError(metadata_path, "top level", "tokenizer metadata must be a JSON object")
        if metadata.get("tokenizer_class"):
            raise InputError(metadata_path, "tokenizer_class",
                             f"megatron-core 0.16 cannot load a metadata file naming a tokenizer class; "
                             f"{_INSTEAD}")
        model_type = metadata.get("model_type", "default")
        if not isinstance(model_type, str) or model_type not in _MODEL_CLASSES:
            raise InputError(metadata_path, "model_type",
                             f"{model_type!r} is not one of Megatron's model types "
                             f"({', '.join(_MODEL_CLASSES)})")
    return "megatron.core.tokenizers.text.models." + _MODEL_CLASSES[model_type]


def _legacy_identifiers(tokenizer_type, tokenizer_model, vocab_file, merge_file, vocab_size,
                        vocab_extra_ids) -> dict:
    """Megatron-LM's legacy tokenizers: the arguments each class hands to MegatronLegacyTokenizer."""

    def need(value, flag):
        if value is None:
            raise MegacacheError(f"--legacy-tokenizer --tokenizer-type {tokenizer_type} needs {flag}")

    if tokenizer_type == "NullTokenizer":
        need(vocab_size, "--vocab-size")
        return {"class": "_NullTokenizer", "tokenizer_path": [None], "vocab_size": str(int(vocab_size))}
    if tokenizer_type == "GPT2BPETokenizer":
        need(vocab_file, "--vocab-file")
        need(merge_file, "--merge-file")
        return {"class": "_GPT2BPETokenizer", "tokenizer_path": [vocab_file, merge_file]}
    if tokenizer_type == "HuggingFaceTokenizer":
        need(tokenizer_model, "--tokenizer-model")
        return {"class": "_HuggingFaceTokenizer", "tokenizer_path": [tokenizer_model]}
    need(vocab_file, "--vocab-file")
    return {"class": "_BertWordPieceTokenizer", "tokenizer_path": [vocab_file],
            "lower_case": str(tokenizer_type == "BertWordPieceLowerCase"),
            "vocab_extra_ids": str(int(vocab_extra_ids))}


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
