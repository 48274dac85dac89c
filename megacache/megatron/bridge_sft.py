"""Megatron-Bridge 0.6.2's fine-tuning data: what a finetuning ``ConfigContainer`` (its YAML) says
about the packed SFT files Bridge's ``GPTSFTDatasetBuilder`` prepares before training, and where it
looks for them (docs/sft-packing.md §1 and §7). No Bridge import.

* ``dataset`` (``GPTSFTDatasetConfig``, or its deprecated name ``FinetuningDatasetConfig``): the
  JSONL splits ``dataset_root/training.jsonl`` and ``validation.jsonl`` (the latter when
  ``do_validation``, default true), ``seq_length``, ``seed`` (default 1234), ``dataset_kwargs``,
  ``preprocessing`` (null, or a chat preprocessing: ``chat`` with the tokenizer's template and its
  ``loss_mode``), ``enable_offline_packing`` with ``offline_packing_specs`` (Bridge's
  ``PackedSequenceSpecs``: ``packed_sequence_size``, ``max_single_sequence_length``,
  ``pad_seq_to_mult``, ``tokenizer_model_name``, the packed paths).
* ``tokenizer``: a ``HuggingFaceTokenizer`` (the SFT examples are rendered by Hugging Face's
  library), read as ``build --bridge-config`` reads it.
* The packed files: each split's explicit path, else the builder's default directory
  ``dataset_root/packed/{tokenizer}_pad_seq_to_mult{m}_sft_{fingerprint}`` with
  ``training_{P}.idx.parquet``, ``validation_{P}.idx.parquet`` and ``{P}_metadata.jsonl``.
  Bridge's ``PackedSequenceSpecs`` refuses an explicit packed path that names no file yet, so such
  a path is one only megacache prepares; a split whose packed file is there is left as it is.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass

from ..errors import MegacacheError
from ..formats.sft_packed import default_file_name, default_metadata_name
from .bridge import _Section, load_yaml, tokenizer_keywords

#: the dataset configuration classes that describe local SFT JSONL data
SFT_DATASETS = ("GPTSFTDatasetConfig", "FinetuningDatasetConfig")
#: Bridge's default preprocessing of local JSONL (``_default_gpt_sft_preprocessing``), every field
#: of its ``PromptCompletionSFTPreprocessingConfig``, as the fingerprint records it
DEFAULT_PREPROCESSING = ("PromptCompletionSFTPreprocessingConfig", {
    "prompt_column": "input", "completion_column": "output", "prompt_template": "{prompt}", "separator": " ",
    "loss_mode": "completion", "strip_whitespace": True, "add_bos": False, "add_sep": False, "add_eos": True,
    "truncation_method": "right"})
#: dataset_kwargs that Bridge refuses beside an explicit preprocessing
SEMANTIC_KWARGS = ("add_bos", "add_eos", "add_sep", "answer_only_loss", "chat", "chat_loss_mode", "label_key",
                   "prompt_completion_config", "prompt_template", "truncation_field", "truncation_method",
                   "use_hf_tokenizer_chat_template")
SPLITS = ("training", "validation")


@dataclass
class PackedSplit:
    name: str  # training or validation
    input_path: str  # the split's JSONL
    output_path: str  # where Bridge looks for its packed file


@dataclass
class BridgeSFT:
    """The packed SFT files a Bridge finetuning configuration's builder prepares, and how."""

    splits: list[PackedSplit]
    metadata_path: str
    pack_size: int
    max_seq_length: int
    seed: int
    pad_seq_to_mult: int | None
    dataset_kwargs: dict  # as the builder passes them to the SFT dataset
    tokenizer_model: str
    include_special_tokens: bool


def read_sft_config(path: str) -> BridgeSFT:
    """The packed SFT files of the finetuning ConfigContainer YAML at ``path``."""
    try:
        return _read(_Section(load_yaml(path), ""))
    except MegacacheError as exc:
        if path in str(exc):
            raise
        raise MegacacheError(f"{path}: {exc}") from None


def _read(root: _Section) -> BridgeSFT:
    dataset = root.section("dataset")
    names = dataset.class_names()
    if names and names[0].rsplit(".", 1)[-1] not in SFT_DATASETS:
        raise MegacacheError(f"{dataset.field('_target_')}: {names[0]} is not Bridge's fine-tuning data; megacache "
                             f"pack prepares the packed files of {' or '.join(SFT_DATASETS)}")
    for name in ("hf_dataset", "hf_validation_dataset", "hf_test_dataset"):
        if dataset.get(name) is not None:
            raise MegacacheError(f"{dataset.field(name)}: Hugging Face sources are not reproduced; give dataset_root, "
                                 "a folder of training.jsonl and validation.jsonl")
    root_dir = dataset.get("dataset_root")
    if not isinstance(root_dir, str) or not root_dir.strip():
        raise MegacacheError(f"{dataset.field('dataset_root')}: expected the folder of training.jsonl and "
                             f"validation.jsonl, got {root_dir!r}")
    seq_length = dataset.integer("seq_length", minimum=1)
    seed = dataset.integer("seed", dataset.get("seed", 1234), minimum=0)
    specs = dataset.section("offline_packing_specs", required=False)
    if specs is None or not dataset.boolean("enable_offline_packing", False):
        raise MegacacheError(f"{dataset.field('offline_packing_specs')}: Bridge packs nothing without "
                             "enable_offline_packing: true and offline_packing_specs with a packed_sequence_size")
    pack_size = specs.integer("packed_sequence_size", specs.get("packed_sequence_size", -1), minimum=1)
    single = specs.integer("max_single_sequence_length", minimum=1, allow_none=True)
    if single is not None and single > pack_size:
        raise MegacacheError(f"{specs.field('max_single_sequence_length')} ({single}) exceeds packed_sequence_size "
                             f"({pack_size}); Bridge refuses it")
    pad = specs.integer("pad_seq_to_mult", specs.get("pad_seq_to_mult", 1), minimum=1, allow_none=True)
    raw_kwargs = dataset.get("dataset_kwargs")
    if raw_kwargs is not None and not isinstance(raw_kwargs, dict):
        raise MegacacheError(f"{dataset.field('dataset_kwargs')}: expected a mapping, got {raw_kwargs!r}")
    kwargs, preprocessing = _preprocessing(dataset, raw_kwargs)
    tokenizer = tokenizer_keywords(root.section("tokenizer"))
    if tokenizer["tokenizer_type"] != "HuggingFaceTokenizer" or not isinstance(tokenizer["tokenizer_model"], str):
        raise MegacacheError(f"tokenizer.tokenizer_type: {tokenizer['tokenizer_type']!r}; megacache pack reproduces "
                             "Bridge's SFT examples with a HuggingFaceTokenizer and its tokenizer_model")
    if tokenizer["tokenizer_hf_no_use_fast"]:
        raise MegacacheError("tokenizer.hf_tokenizer_kwargs.use_fast: false is not reproduced; megacache tokenizes "
                             "with the fast tokenizer")
    # the builder's fingerprint of what shapes the packed rows (``_packing_fingerprint``)
    identity = {"seq_length": seq_length, "seed": seed,
                "preprocessing_explicit": dataset.get("preprocessing") is not None,
                "preprocessing_type": preprocessing[0], "preprocessing": preprocessing[1], "dataset_kwargs": raw_kwargs}
    if single is not None:
        identity["max_single_sequence_length"] = single
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
                                 .encode()).hexdigest()[:12]
    name = specs.get("tokenizer_model_name")
    name = _tokenizer_name(tokenizer["tokenizer_model"]) if name is None else str(name)
    default_dir = os.path.join(root_dir, "packed", f"{name}_pad_seq_to_mult{pad}_sft_{fingerprint}")
    explicit = {"training": "packed_train_data_path", "validation": "packed_val_data_path"}
    wanted = SPLITS if dataset.boolean("do_validation", True) else SPLITS[:1]
    splits = [PackedSplit(split, os.path.join(root_dir, f"{split}.jsonl"), _packed_path(specs, explicit[split])
                          or os.path.join(default_dir, default_file_name(split, pack_size))) for split in wanted]
    metadata = _path(specs, "packed_metadata_path") or os.path.join(default_dir, default_metadata_name(pack_size))
    return BridgeSFT(splits, metadata, pack_size, single or seq_length, seed, pad, kwargs,
                     tokenizer["tokenizer_model"], not tokenizer["tokenizer_hf_no_include_special_tokens"])


def _preprocessing(dataset: _Section, raw_kwargs: dict | None) -> tuple[dict, tuple[str, dict]]:
    """The dataset options the builder passes on (``normalize_gpt_sft_dataset_kwargs``), and the
    preprocessing's class name and fields, which its fingerprint records."""
    kwargs = dict(raw_kwargs or {})
    given = dataset.section("preprocessing", required=False)
    if given is None:
        return kwargs, DEFAULT_PREPROCESSING
    semantic = sorted(set(SEMANTIC_KWARGS) & set(kwargs))
    if semantic:
        raise MegacacheError(f"{dataset.field('dataset_kwargs')}: {', '.join(semantic)} beside an explicit "
                             "preprocessing; Bridge refuses the two together")
    names = given.class_names()
    kind = names[0].rsplit(".", 1)[-1] if names else None
    if kind != "ChatSFTPreprocessingConfig":
        raise MegacacheError(f"{given.field('_target_')}: {kind or 'a preprocessing without _target_'} is not "
                             "reproduced; megacache pack reproduces ChatSFTPreprocessingConfig, or dataset_kwargs "
                             "with preprocessing null")
    loss_mode = given.get("loss_mode", "assistant")
    return ({"chat": True, "use_hf_tokenizer_chat_template": True, "chat_loss_mode": loss_mode, **kwargs},
            (kind, {"loss_mode": loss_mode}))


def _path(specs: _Section, name: str) -> str | None:
    value = specs.get(name)
    if value is not None and (not isinstance(value, str) or not value):
        raise MegacacheError(f"{specs.field(name)}: expected a path, got {value!r}")
    return value


def _packed_path(specs: _Section, name: str) -> str | None:
    """An explicit packed path, of a kind Bridge reads (``PackedSequenceSpecs``): a ``.npy`` file,
    or Parquet (a file, a glob of them, a folder of them)."""
    value = _path(specs, name)
    if value is not None and not (value.lower().endswith((".npy", ".parquet", ".pq")) or os.path.isdir(value)
                                  or ("*" in value or "?" in value) and (".parquet" in value.lower()
                                                                         or ".pq" in value.lower())):
        raise MegacacheError(f"{specs.field(name)}: {value!r} is neither a .npy file nor packed Parquet (a path "
                             "ending in .parquet or .pq, a glob of such files, a folder of them); Bridge refuses it")
    return value


def packed_files(path: str) -> list[str]:
    """The files a packed path names as Bridge resolves it (paths.py): a Parquet file, a glob of
    Parquet files, a directory's Parquet files, or a ``.npy`` file; none when there are none."""
    if "*" in path or "?" in path:
        return sorted(p for p in glob.glob(path) if p.lower().endswith((".parquet", ".pq")))
    if os.path.isdir(path):
        return sorted(glob.glob(os.path.join(path, "*.parquet")) + glob.glob(os.path.join(path, "*.pq")))
    return [path] if os.path.isfile(path) else []


def _tokenizer_name(path: str) -> str:
    """The builder's name for a Hugging Face tokenizer: its path with / as --; a NeMo checkpoint's
    ``.../org/model/[context/]nemo_tokenizer`` is ``org--model``."""
    if path.endswith("context/nemo_tokenizer"):
        return "--".join(path.split("/")[-4:-2])
    if path.endswith("nemo_tokenizer"):
        return "--".join(path.split("/")[-3:-1])
    return path.replace("/", "--")
