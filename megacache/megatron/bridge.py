"""Megatron-Bridge: what a Bridge ``ConfigContainer`` says about the data, as megacache's build needs
it (no Bridge import). The container comes as Bridge writes it to YAML (``cfg.to_yaml``, the
``logger.save_config_filepath`` file or a checkpoint's ``run_config.yaml``), as the same mapping in
Python (``cfg.to_dict()``), or as a live ``ConfigContainer`` (read by attribute).

Bridge's pretraining (``pretrain`` -> ``setup``) builds the datasets with megatron-core's
``BlendedMegatronDatasetBuilder(GPTDataset, sizes, ..., cfg.dataset).build()``, after validating the
container. What decides the cache names, and where megacache reads it:

* **Data** (``dataset``, a ``GPTDatasetConfig``; its finalize and megatron-core's post-init):
  ``blend`` ``[prefixes, weights|null]``; else ``data_path`` (a string of whitespace-separated words
  or a list of them, read like Megatron-LM's ``--data-path``); or ``blend_per_split`` (three blends
  or nulls). ``blend`` with ``blend_per_split``, or ``split`` with ``blend_per_split``, is refused (as
  megatron-core asserts). All empty is Bridge's mock data: nothing is cached.
* **split**: ``dataset.split`` as written. Bridge has no default: a blend without a split is refused
  (Bridge's recipes write ``"9999,8,2"``; its mock preset ``"1,1,1"``).
* **seq_length** ``dataset.seq_length`` (else ``sequence_length``), which must equal
  ``model.seq_length`` when the model gives one; **seed** ``dataset.random_seed`` (not
  ``rng.seed``); **cache** ``dataset.path_to_cache`` (null: next to each prefix, and no blend cache);
  ``add_extra_token_to_sequence``, ``drop_last_partial_validation_sequence`` and
  ``mid_level_dataset_surplus`` (defaults true, true, 0.005); ``per_dataset_sequences_path``, the
  per-dataset sequences file Bridge reads when given, is where megacache writes it.
* **Sizes** (Bridge's ``data/loaders.py``, not Megatron-LM's training loop), B = ``train.global_batch_size``:

  - train: ``train.train_samples`` when given, else ``train.train_iters`` x B. Exactly one of them
    (``train.num_epochs`` is for SFT datasets only); ``train_samples`` > 0 sets
    ``train_iters = train_samples // B``. The container Bridge saves after validating a
    ``train_samples`` run holds both, the iterations derived, and Bridge refuses it when run again:
    so does megacache. The scheduler's fields must be those of the same mode (``lr_decay_iters``,
    ``lr_warmup_iters``, ``max_steps`` with iterations; ``lr_decay_samples``, ``lr_warmup_samples``
    with samples), as Bridge asserts.
  - E = ``validation.eval_global_batch_size``, else B; I = ``validation.eval_iters`` (default 100);
    the deprecated ``train.eval_iters`` / ``train.eval_interval`` / ``train.skip_train`` override
    their ``validation`` namesakes when not null.
  - valid: (``train_iters`` // ``validation.eval_interval`` + 1) x I x E when the interval is set and
    non-zero, else 0. test: I x E. Never None: ``skip_train``, ``full_validation`` and
    ``start_eval_at_iter`` change nothing in these counts, nor do batch-size ramp-ups.
  - Refused as Bridge's validation refuses them: E not a multiple of the evaluation micro batch
    (``validation.eval_micro_batch_size``, else ``train.micro_batch_size``), and a learning-rate
    schedule of no steps (``train_iters: 0`` without ``scheduler.lr_decay_iters``).
* **Tokenizer** (``tokenizer``, Bridge's ``TokenizerConfig``, built by megatron-core's
  ``build_tokenizer``): its fields are Megatron-LM's tokenizer flags without dashes
  (``tokenizer_type``, ``tokenizer_model``, ``vocab_file``, ``merge_file``, ``vocab_size``,
  ``vocab_extra_ids``, ``tiktoken_pattern``, ``tiktoken_num_special_tokens``,
  ``tokenizer_sentencepiece_legacy``, ``tokenizer_sentencepiece_ignore_extra_whitespaces``,
  ``tokenizer_hf_no_use_fast``, ``tokenizer_hf_no_include_special_tokens``, ``trust_remote_code``,
  ``null_tokenizer_eod_id``, ``null_tokenizer_pad_id``, ``chat_template``, ``padded_vocab_size``)
  except ``metadata_path`` (``tokenizer_metadata``; a mapping is accepted too) and
  ``special_tokens`` (``tokenizer_special_tokens``), passed to ``tokenizer.tokenizer_identifiers``.
  Bridge's construction overwrites four of them from its deprecated keyword mappings, whatever they
  were set to: ``tokenizer_hf_no_use_fast = not hf_tokenizer_kwargs.use_fast (default true)``,
  ``tokenizer_hf_no_include_special_tokens = not hf_tokenizer_kwargs.include_special_tokens``
  (default true), ``trust_remote_code = hf_tokenizer_kwargs.trust_remote_code`` (default false),
  ``tokenizer_sentencepiece_legacy = sp_tokenizer_kwargs.legacy`` (default false). A mapping or YAML
  is constructed, so this applies; a live object is read as it is (rebuilt, so overwritten, when it
  has a ``chat_template_path``). ``chat_template_path`` is read as ``chat_template``. A
  ``hf_tokenizer_kwargs.revision`` with a Hub model name is resolved by Bridge to a Hub snapshot
  path at run time: refused by megacache.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

from ..algorithms.blend_sizes import DEFAULT_SURPLUS
from ..errors import MegacacheError
from ..runtime.fsio import read_mapping
from .blends import Blend, parse_blend
from .tokenizer import TOKENIZER_FLAGS, tokenizer_identifiers
from .versions import NEWEST, SUPPORTED, at_least, resolve

#: the oldest megatron-core Megatron-Bridge 0.6 runs on (its configuration classes need 0.19's)
OLDEST_MEGATRON = "0.19"
#: Bridge's dataset configuration class megacache builds for, and those it refuses (``_target_`` names)
GPT_DATASET = "megatron.bridge.training.config.GPTDatasetConfig"
OTHER_DATASETS = {
    "MockGPTDatasetConfig": "mock data, which has no cache",
    "GPTFIMDatasetConfig": "fill-in-the-middle datasets (GPTFIMDataset caches, which megacache does not build)",
}
#: Bridge ``TokenizerConfig`` field -> ``tokenizer_identifiers`` keyword, where they differ
_RENAMED = {"metadata_path": "tokenizer_metadata", "special_tokens": "tokenizer_special_tokens"}
#: the TokenizerConfig fields that reach the identity (the rest only size the embedding or are Bridge's)
_TOKENIZER_FIELDS = ("tokenizer_type", "tokenizer_model", "metadata_path", "vocab_file", "merge_file", "vocab_size",
                     "padded_vocab_size", "vocab_extra_ids", "special_tokens", "tiktoken_pattern",
                     "tiktoken_num_special_tokens", "tokenizer_sentencepiece_legacy",
                     "tokenizer_sentencepiece_ignore_extra_whitespaces", "tokenizer_hf_no_use_fast",
                     "tokenizer_hf_no_include_special_tokens", "trust_remote_code", "null_tokenizer_eod_id",
                     "null_tokenizer_pad_id", "chat_template")
_MISSING = object()


@dataclass
class BridgeData:
    """What a Bridge configuration's first run builds, in megacache's terms (``BuildConfig`` fields)."""

    seq_length: int
    sizes: tuple                        # (train, valid, test) samples, as Bridge's loader asks
    tokenizer: dict                     # the tokenizer's unique_identifiers
    tokenizer_flags: dict               # the tokenizer_identifiers keywords they were derived from
    megatron_version: str
    blend: Blend | None
    blend_per_split: list | None
    split: str | None
    seed: int
    cache_dir: str | None
    add_extra_token: bool
    drop_last_partial_validation: bool
    surplus: float
    sequences_path: str | None          # dataset.per_dataset_sequences_path (None: megacache's default)
    field_names: dict                   # the fields seq_length and seed came from (``BuildConfig`` checks them)

    def build_fields(self) -> dict:
        """Keyword arguments of ``megacache.builders.build.BuildConfig``."""
        fields = dict(seq_length=self.seq_length, sizes=self.sizes, tokenizer=self.tokenizer,
                      megatron_version=self.megatron_version, blend=self.blend,
                      blend_per_split=self.blend_per_split, split=self.split, seed=self.seed,
                      cache_dir=self.cache_dir, add_extra_token=self.add_extra_token,
                      drop_last_partial_validation=self.drop_last_partial_validation, surplus=self.surplus,
                      field_names=self.field_names)
        if self.sequences_path is not None:
            fields["sequences_path"] = self.sequences_path
        return fields


# ---------------------------------------------------------------------------------------------
# Reading the container


class _Section:
    """One section of the container, a mapping (as YAML) or an object (as Python), with its YAML
    path for messages."""

    def __init__(self, value, path: str):
        self.value, self.path = value, path
        self.is_mapping = isinstance(value, Mapping)

    def get(self, name: str, default=None):
        if self.is_mapping:
            value = self.value.get(name, default)
        else:
            value = getattr(self.value, name, default)
        if isinstance(value, str) and "${" in value:
            raise MegacacheError(f"{self.field(name)}: {value!r} is an OmegaConf interpolation; resolve the YAML "
                                 f"first (OmegaConf.to_container(..., resolve=True))")
        return value

    def has(self, name: str) -> bool:
        return self.get(name, _MISSING) is not _MISSING

    def field(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def section(self, name: str, required: bool = True) -> "_Section | None":
        value = self.get(name)
        if value is None:
            if required:
                raise MegacacheError(f"{self.field(name)}: missing; a Bridge ConfigContainer has one")
            return None
        return _Section(value, self.field(name))

    def class_names(self) -> list[str]:
        """The configuration class: the ``_target_`` a mapping names (none: []), or an object's
        class and its bases."""
        if self.is_mapping:
            target = self.value.get("_target_")
            return [] if target is None else [str(target)]
        return [f"{cls.__module__}.{cls.__qualname__}" for cls in type(self.value).__mro__[:-1]]

    def integer(self, name: str, value=_MISSING, minimum: int | None = None, allow_none: bool = False):
        value = self.get(name) if value is _MISSING else value
        if value is None and allow_none:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise MegacacheError(f"{self.field(name)}: expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise MegacacheError(f"{self.field(name)}: must be at least {minimum}, got {value}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool):
            raise MegacacheError(f"{self.field(name)}: expected true or false, got {value!r}")
        return value


def load_yaml(path: str) -> dict:
    """A ConfigContainer as Bridge writes it to YAML (``to_yaml``), as a mapping."""
    return read_mapping(path, "the Bridge configuration", "expected a Bridge ConfigContainer (a mapping with dataset, "
                        "train, validation and tokenizer sections)", "YAML")


def read_config(source, megatron_version: str | None = None) -> BridgeData:
    """What Bridge's first pretraining run with this ConfigContainer builds: ``source`` is a YAML
    path, the container as a mapping, or the container object. ``megatron_version`` is the
    megatron-core Bridge runs on (default: the installed one's where Bridge runs on it, else the
    newest release)."""
    if isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        try:
            data = _read(_Section(load_yaml(where), ""), megatron_version)
        except MegacacheError as exc:
            if str(exc).startswith(where):
                raise
            raise MegacacheError(f"{where}: {exc}") from None
        data.field_names = {name: f"{where}: {field}" for name, field in data.field_names.items()}
        return data
    return _read(_Section(source, ""), megatron_version)


def _read(root: _Section, megatron_version: str | None) -> BridgeData:
    version = resolve(megatron_version)
    if megatron_version is None and not at_least(version, OLDEST_MEGATRON):
        version = NEWEST  # the megatron-core beside megacache is older than any Bridge runs on: not Bridge's
    if not at_least(version, OLDEST_MEGATRON):
        raise MegacacheError(f"Megatron-Bridge runs on megatron-core {OLDEST_MEGATRON} or later; megacache "
                             f"reproduces {', '.join(v for v in SUPPORTED if at_least(v, OLDEST_MEGATRON))} "
                             f"for it (got {version})")
    dataset = root.section("dataset")
    _check_dataset_class(dataset)
    data = _data(dataset)
    seq_length, seq_length_field = _seq_length(dataset, root.section("model", required=False))
    train = root.section("train")
    sizes = split_sizes(train, root.section("validation", required=False))
    _check_schedule(train, root.section("scheduler", required=False))
    ids, flags = tokenizer_ids(root.section("tokenizer"), version)
    surplus = dataset.get("mid_level_dataset_surplus", DEFAULT_SURPLUS)
    if isinstance(surplus, bool) or not isinstance(surplus, (int, float)):
        raise MegacacheError(f"{dataset.field('mid_level_dataset_surplus')}: expected a number, got {surplus!r}")
    sequences_path = dataset.get("per_dataset_sequences_path")
    if sequences_path is not None and not isinstance(sequences_path, str):
        raise MegacacheError(f"{dataset.field('per_dataset_sequences_path')}: expected a path, got {sequences_path!r}")
    return BridgeData(
        seq_length=seq_length, sizes=sizes, tokenizer=ids, tokenizer_flags=flags, megatron_version=version,
        seed=dataset.get("random_seed"), cache_dir=_cache_dir(dataset),
        add_extra_token=dataset.boolean("add_extra_token_to_sequence", True),
        drop_last_partial_validation=dataset.boolean("drop_last_partial_validation_sequence", True),
        surplus=float(surplus), sequences_path=sequences_path,
        field_names={"seq_length": seq_length_field, "seed": dataset.field("random_seed")}, **data)


def _check_dataset_class(dataset: _Section) -> None:
    """Bridge picks the dataset builder by the configuration's class: GPTDatasetConfig (or a
    subclass of it) builds GPTDatasets; its mock and fill-in-the-middle subclasses, and Bridge's
    other dataset configurations, build no GPTDataset cache. A mapping without ``_target_``, or an
    object of none of Bridge's classes, is taken for a GPTDatasetConfig."""
    names = dataset.class_names()
    for name in names:
        short = name.rsplit(".", 1)[-1]
        if short in OTHER_DATASETS and name.startswith("megatron.bridge."):
            raise MegacacheError(f"{dataset.field('_target_')}: {names[0]} is {OTHER_DATASETS[short]}; megacache "
                                 f"builds the caches of {GPT_DATASET}")
        if name == GPT_DATASET:
            return
    if names and names[0].startswith("megatron."):
        raise MegacacheError(f"{dataset.field('_target_')}: {names[0]}: megacache builds the GPTDataset caches of "
                             f"Bridge's pretraining datasets ({GPT_DATASET}); this dataset configuration builds "
                             f"no such cache")


# ---------------------------------------------------------------------------------------------
# Data


def _blend(value, where: str) -> Blend:
    """``[prefixes, weights|null]`` (a list or tuple pair)."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise MegacacheError(f"{where}: expected [prefixes, weights or null], got {value!r}")
    prefixes, weights = value
    if not isinstance(prefixes, (list, tuple)) or not prefixes or not all(isinstance(p, str) for p in prefixes):
        raise MegacacheError(f"{where}: the prefixes must be a non-empty list of paths, got {prefixes!r}")
    if weights is None:
        parse_blend(list(prefixes), where)  # its checks: no prefix twice, at most 32767 datasets
        return Blend(tuple(prefixes))
    if not isinstance(weights, (list, tuple)) or len(weights) != len(prefixes):
        raise MegacacheError(f"{where}: {len(prefixes)} prefixes need as many weights, got {weights!r} "
                             f"(megatron-core asserts)")
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise MegacacheError(f"{where}: weights must be numbers, got {w!r}")
    # parse_blend's checks too: positive finite weights, no prefix twice, at most 32767 datasets
    parse_blend([word for w, p in zip(weights, prefixes) for word in (repr(float(w)), p)], where)
    return Blend(tuple(prefixes), tuple(float(w) for w in weights))


def _data(dataset: _Section) -> dict:
    """blend / blend_per_split / split, as the dataset configuration's finalize and megatron-core's
    post-init settle them."""
    blend = dataset.get("blend")
    if blend is not None:
        blend = _blend(blend, dataset.field("blend"))
    else:
        words = dataset.get("data_path")
        if words is not None:
            if isinstance(words, str):
                words = words.split()
            if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) for w in words):
                raise MegacacheError(f"{dataset.field('data_path')}: expected a string or a list of strings, "
                                     f"got {words!r}")
            blend = parse_blend(list(words), dataset.field("data_path"))
    per_split = dataset.get("blend_per_split")
    split = dataset.get("split")
    if split is not None and not isinstance(split, str):
        raise MegacacheError(f"{dataset.field('split')}: expected a string such as \"9999,8,2\", got {split!r}")
    for name in ("fast_cache_load", "defer_npy_index_mmap"):
        if dataset.get(name) and dataset.get("path_to_cache") is None:
            raise MegacacheError(f"{dataset.field(name)} needs {dataset.field('path_to_cache')} "
                                 f"(megatron-core asserts)")
    if per_split is not None and not isinstance(per_split, (list, tuple)):
        raise MegacacheError(f"{dataset.field('blend_per_split')}: expected a list of three blends or nulls")
    if per_split is not None and any(per_split):
        if blend is not None:
            raise MegacacheError(f"{dataset.field('blend')} (or data_path) and {dataset.field('blend_per_split')} "
                                 f"are incompatible (megatron-core asserts); give one")
        if split is not None:
            raise MegacacheError(f"{dataset.field('split')} must be null with {dataset.field('blend_per_split')} "
                                 f"(megatron-core asserts 'split and blend_per_split are incompatible')")
        if len(per_split) != 3:
            raise MegacacheError(f"{dataset.field('blend_per_split')}: must hold 3 blends (train, valid, test; null "
                                 f"for none), got {len(per_split)}")
        blends = [None if b is None else _blend(b, f"{dataset.field('blend_per_split')}[{i}]")
                  for i, b in enumerate(per_split)]
        if dataset.get("multiple_validation_sets") and blends[1] is not None and len(blends[1].prefixes) > 1:
            raise MegacacheError(f"{dataset.field('multiple_validation_sets')}: validation datasets built one by one "
                                 f"are not supported by megacache; set it false or build them separately")
        return dict(blend=None, blend_per_split=blends, split=None)
    if blend is None:
        raise MegacacheError(f"{dataset.field('blend')}, {dataset.field('blend_per_split')} and "
                             f"{dataset.field('data_path')} are all empty: Bridge then trains on mock data, which "
                             f"has no cache to build")
    if dataset.get("fast_cache_load"):
        raise MegacacheError(f"{dataset.field('fast_cache_load')} cannot be used with a blend or data_path "
                             f"(megatron-core asserts); use blend_per_split")
    if split is None:
        raise MegacacheError(f"{dataset.field('split')}: missing; Bridge has no default split and megatron-core "
                             f"asserts one is given with a blend (Bridge's recipes use \"9999,8,2\")")
    return dict(blend=blend, blend_per_split=None, split=split)


def _seq_length(dataset: _Section, model: _Section | None) -> tuple:
    """The dataset's sequence length (checked by ``BuildConfig``) and the field it came from."""
    name = "seq_length" if dataset.get("seq_length") is not None else "sequence_length"
    seq_length = dataset.get(name)
    if seq_length is None:
        raise MegacacheError(f"{dataset.field('seq_length')}: missing")
    model_length = model.get("seq_length") if model is not None else None
    if model_length is not None and model_length != seq_length:
        raise MegacacheError(f"{model.field('seq_length')} ({model_length}) and {dataset.field(name)} ({seq_length}) "
                             f"differ; Bridge asserts they match")
    return seq_length, dataset.field(name)


def _cache_dir(dataset: _Section) -> str | None:
    path = dataset.get("path_to_cache")
    if path is not None and not isinstance(path, str):
        raise MegacacheError(f"{dataset.field('path_to_cache')}: expected a directory, got {path!r}")
    return path


# ---------------------------------------------------------------------------------------------
# Sizes


def split_sizes(train: _Section, validation: _Section | None) -> tuple[int, int, int]:
    """Samples per split (train, valid, test) as Bridge's loader computes them, after the
    container's validation (``train``/``validation``: the sections, mappings or objects)."""
    if not isinstance(train, _Section):
        train = _Section(train, "train")
    if validation is not None and not isinstance(validation, _Section):
        validation = _Section(validation, "validation")
    if train.get("num_epochs") is not None:
        raise MegacacheError(f"{train.field('num_epochs')}: Bridge trains by epochs only on finite SFT datasets, "
                             f"not on GPTDatasetConfig data; give train_iters or train_samples")
    iters = train.integer("train_iters", allow_none=True)
    samples = train.integer("train_samples", allow_none=True)
    gbs = train.integer("global_batch_size", allow_none=True)
    if iters is None and samples is None:
        raise MegacacheError(f"{train.field('train_iters')} or {train.field('train_samples')} must be given")
    if gbs is None or gbs <= 0:
        raise MegacacheError(f"{train.field('global_batch_size')} must be a positive integer, got {gbs!r} (Bridge "
                             f"multiplies the iterations by it)")
    if samples is not None:
        if samples <= 0:
            raise MegacacheError(f"{train.field('train_samples')} must be positive, got {samples} (Bridge asserts)")
        if train.get("rampup_batch_size") is not None:
            raise MegacacheError(f"{train.field('rampup_batch_size')}: Bridge does not ramp the batch size up with "
                                 f"train_samples (it asserts)")
        if iters is not None:
            raise MegacacheError(f"give one of {train.field('train_iters')} and {train.field('train_samples')}: "
                                 f"Bridge asserts 'Cannot specify more than one of train_iters, train_samples, or "
                                 f"num_epochs' (the configuration Bridge saves after validating a train_samples run "
                                 f"holds both, the iterations derived; leave train_iters out)")
        iters = samples // gbs
    elif iters < 0:
        raise MegacacheError(f"{train.field('train_iters')} must not be negative, got {iters}")

    def setting(name: str, default):
        """A validation setting; the deprecated training field of that name wins when not null."""
        if train.get(name) is not None:
            return train.get(name), train
        if validation is None or not validation.has(name):
            return default, validation
        return validation.get(name), validation

    eval_gbs, where = setting("eval_global_batch_size", None)
    if eval_gbs is None:
        eval_gbs = gbs
    else:
        eval_gbs = where.integer("eval_global_batch_size", eval_gbs, minimum=0)
    eval_mbs, where = setting("eval_micro_batch_size", None)
    if eval_mbs is None:
        eval_mbs, where = train.get("micro_batch_size"), train
        if eval_mbs is None:
            raise MegacacheError(f"{train.field('micro_batch_size')} must be set when "
                                 f"validation.eval_micro_batch_size is not (Bridge asserts)")
    eval_mbs = where.integer("micro_batch_size" if where is train else "eval_micro_batch_size", eval_mbs, minimum=1)
    if eval_gbs % eval_mbs:
        raise MegacacheError(f"the evaluation batch ({eval_gbs}) is not a multiple of the evaluation micro batch "
                             f"({eval_mbs}); Bridge asserts it divides by micro batch x data-parallel size")
    eval_iters, where = setting("eval_iters", 100)
    if eval_iters is None:
        raise MegacacheError("validation.eval_iters is null: Bridge multiplies it into the validation and test "
                             "sample counts (and fails); give 0 for no evaluation")
    eval_iters = where.integer("eval_iters", eval_iters, minimum=0)
    interval, where = setting("eval_interval", None)
    if interval is not None:
        interval = where.integer("eval_interval", interval, minimum=0)
    train_samples = samples if samples is not None else iters * gbs
    valid = (iters // interval + 1) * eval_iters * eval_gbs if interval else 0
    return (train_samples, valid, eval_iters * eval_gbs)


def _check_schedule(train: _Section, scheduler: _Section | None) -> None:
    """What Bridge's validation refuses of the learning-rate schedule: scheduler fields in two units,
    or in the other unit than the training's, a decay of no steps (e.g. ``train_iters: 0``), ``scheduler.max_steps``
    below ``train_iters``."""
    get = (lambda name: None) if scheduler is None else scheduler.get  # noqa: E731
    samples, iters, gbs = train.get("train_samples"), train.get("train_iters"), train.get("global_batch_size")
    if get("max_steps") is not None and get("max_steps") <= 0:
        raise MegacacheError(f"scheduler.max_steps must be positive, got {get('max_steps')} (Bridge raises)")
    # the scheduler's own check: its fields in one unit only (the warmups default to 0)
    given = {unit: [f"{name}={get(name)}" for name in (f"lr_decay_{unit}", f"lr_warmup_{unit}", f"lr_wsd_decay_{unit}")
                    if get(name) not in (None, 0) or name == f"lr_decay_{unit}" and get(name) is not None]
             for unit in ("iters", "samples")}
    if given["iters"] and given["samples"]:
        raise MegacacheError(f"scheduler: {', '.join(given['iters'] + given['samples'])}: Bridge asserts 'Cannot mix "
                             f"iteration-based and sample-based scheduler fields'; keep those of one unit")
    if get("lr_warmup_fraction") is not None and (get("lr_warmup_iters") or get("lr_warmup_samples")):
        raise MegacacheError("scheduler.lr_warmup_fraction with lr_warmup_iters or lr_warmup_samples: Bridge asserts "
                             "'Use either lr_warmup_fraction OR lr_warmup_iters OR lr_warmup_samples'")
    mode, unit, nulls, zero = ("train_samples", "samples", ("max_steps", "lr_decay_iters"), "lr_warmup_iters") \
        if samples is not None else ("train_iters", "iters", ("lr_decay_samples",), "lr_warmup_samples")
    # Bridge asserts the scheduler counts in the training's unit (its warmups default to 0)
    for name in nulls:
        if get(name) is not None:
            raise MegacacheError(f"scheduler.{name} ({get(name)}) does not go with train.{mode}: Bridge asserts the "
                                 f"scheduler counts in {unit} then; set it null")
    if scheduler is not None and scheduler.has(zero) and scheduler.get(zero) != 0:
        raise MegacacheError(f"scheduler.{zero} ({scheduler.get(zero)}) does not go with train.{mode}: Bridge "
                             f"asserts it is 0 then; use lr_warmup_{unit}")
    if samples is not None:
        decay, name = (get("lr_decay_samples"), "lr_decay_samples") if get("lr_decay_samples") is not None else \
            (samples, "train_samples")
    else:
        max_steps = get("max_steps")
        if max_steps is not None and max_steps < iters:
            raise MegacacheError(f"scheduler.max_steps ({max_steps}) is below train.train_iters ({iters}); Bridge "
                                 f"refuses it")
        decay_iters = max_steps if max_steps is not None else get("lr_decay_iters")
        decay_iters, name = (decay_iters, "lr_decay_iters") if decay_iters is not None else (iters, "train_iters")
        decay = decay_iters * gbs
    if decay <= 0:
        where = f"train.{name}" if name.startswith("train") else f"scheduler.{name}"
        raise MegacacheError(f"{where}: the learning rate would decay over {decay} steps; Bridge refuses a "
                             f"schedule of no steps (give scheduler.lr_decay_iters or lr_decay_samples)")


# ---------------------------------------------------------------------------------------------
# Tokenizer


def tokenizer_keywords(tokenizer: _Section) -> dict:
    """The ``tokenizer_identifiers`` keywords of Bridge's TokenizerConfig (see the module's notes)."""
    if not isinstance(tokenizer, _Section):
        tokenizer = _Section(tokenizer, "tokenizer")
    values = {name: tokenizer.get(name) for name in _TOKENIZER_FIELDS}
    template_path = tokenizer.get("chat_template_path")
    if tokenizer.is_mapping or template_path is not None:  # constructed: Bridge's __post_init__ applies
        hf = _kwargs(tokenizer, "hf_tokenizer_kwargs")
        sp = _kwargs(tokenizer, "sp_tokenizer_kwargs")
        values.update(tokenizer_hf_no_use_fast=not hf.get("use_fast", True),
                      tokenizer_hf_no_include_special_tokens=not hf.get("include_special_tokens", True),
                      trust_remote_code=hf.get("trust_remote_code", False),
                      tokenizer_sentencepiece_legacy=sp.get("legacy", False))
    hf = tokenizer.get("hf_tokenizer_kwargs") or {}
    revision = hf.get("revision") if isinstance(hf, Mapping) else None
    if values["tokenizer_type"] == "HuggingFaceTokenizer" and revision is not None:
        model = values["tokenizer_model"]
        if not isinstance(revision, str) or not revision.strip():
            raise MegacacheError(f"{tokenizer.field('hf_tokenizer_kwargs')}.revision must be a non-empty string "
                                 f"(Bridge raises)")
        if isinstance(model, str) and not _local_path(model):
            raise MegacacheError(
                f"{tokenizer.field('hf_tokenizer_kwargs')}.revision: Bridge downloads {model!r} at that revision "
                f"and hashes the snapshot's local path, which megacache cannot know; give tokenizer_model as "
                f"that local snapshot directory without a revision")
    if template_path is not None:
        if values["chat_template"] is not None:
            raise MegacacheError(f"set only one of {tokenizer.field('chat_template')} and "
                                 f"{tokenizer.field('chat_template_path')} (Bridge raises)")
        if str(template_path).startswith("msc://"):
            raise MegacacheError(f"{tokenizer.field('chat_template_path')}: msc:// paths are not supported; "
                                 f"give a local file")
        try:
            with open(template_path, encoding="utf-8") as f:
                values["chat_template"] = f.read()
        except OSError as exc:
            raise MegacacheError(f"{tokenizer.field('chat_template_path')}: cannot read {template_path} "
                                 f"({exc.strerror})") from None
    special = values["special_tokens"]
    if special is not None and not (isinstance(special, (list, tuple)) and all(isinstance(t, str) for t in special)):
        raise MegacacheError(f"{tokenizer.field('special_tokens')}: expected a list of strings, got {special!r}")
    for name in ("tiktoken_num_special_tokens", "tokenizer_sentencepiece_ignore_extra_whitespaces",
                 "tokenizer_hf_no_use_fast", "tokenizer_hf_no_include_special_tokens", "trust_remote_code",
                 "tokenizer_sentencepiece_legacy"):
        if values[name] is None and tokenizer.has(name):
            raise MegacacheError(f"{tokenizer.field(name)}: null is not supported here; give a value or leave the "
                                 f"field out for its default")
    return {_RENAMED.get(k, k): (list(v) if isinstance(v, tuple) else v) for k, v in values.items()}


def _kwargs(tokenizer: _Section, name: str) -> Mapping:
    value = tokenizer.get(name, {})
    if not isinstance(value, Mapping):
        raise MegacacheError(f"{tokenizer.field(name)}: expected a mapping, got {value!r} (Bridge's TokenizerConfig "
                             f"reads it as one)")
    return value


def _local_path(model: str) -> bool:
    """Whether Bridge takes a tokenizer_model as a local path (it then resolves no revision)."""
    path = os.path.expanduser(model)
    return os.path.exists(path) or os.path.isabs(path) or model.startswith(("./", "../", "~"))


def tokenizer_ids(tokenizer, version: str) -> tuple[dict, dict]:
    """The identity of Bridge's tokenizer (a section, mapping or object) under megatron-core
    ``version``, and the ``tokenizer_identifiers`` keywords it was derived from."""
    if not isinstance(tokenizer, _Section):
        tokenizer = _Section(tokenizer, "tokenizer")
    flags = tokenizer_keywords(tokenizer)
    try:
        ids = _identifiers(flags, version)
    except MegacacheError as exc:
        raise MegacacheError(f"tokenizer: {_bridge_names(str(exc))}") from None
    if flags["tokenizer_type"] == "NullTokenizer" and flags["null_tokenizer_pad_id"] is None \
            and tokenizer.has("null_tokenizer_pad_id"):
        ids.pop("pad_id", None)  # an explicit null: megatron-core passes no pad id (the flag's default is -1)
    return ids, flags


def _identifiers(flags: dict, version: str) -> dict:
    metadata = flags.get("tokenizer_metadata")
    if not isinstance(metadata, Mapping):
        return tokenizer_identifiers(megatron_version=version, **flags)
    # megatron-core takes the metadata itself as well as a file of it
    with tempfile.TemporaryDirectory(prefix="megacache-bridge-") as tmp:
        path = os.path.join(tmp, "metadata.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dict(metadata), f)
        return tokenizer_identifiers(megatron_version=version, **{**flags, "tokenizer_metadata": path})


def _bridge_names(message: str) -> str:
    """A tokenizer message with Megatron-LM's flag names replaced by the TokenizerConfig fields."""
    inverse = {v: k for k, v in _RENAMED.items()}
    names = sorted(((n, inverse.get(f.dest, f.dest)) for f in TOKENIZER_FLAGS for n in f.names),
                   key=lambda pair: -len(pair[0]))
    for flag, field in names:
        message = message.replace(flag, f"tokenizer.{field}")
    return message
