"""What a build is asked for: Megatron-LM's data and tokenizer settings, and megacache's tuning,
as one configuration (``BuildConfig``), made directly, from Megatron-LM flags or from a
Megatron-Bridge configuration."""

from __future__ import annotations

from dataclasses import dataclass

from ..algorithms.blend_chunks import DEFAULT_WARMUP
from ..algorithms.blend_sizes import DEFAULT_SURPLUS
from ..runtime.log import LOG
from ..megatron.blends import Blend
from ..megatron.training import DEFAULT_SEED, DEFAULT_SPLIT
from .gpt import GPTSettings

#: samples blended in memory per block (BuildConfig.blend_block): 2.5 MB of buffers. Larger blocks
#: gain nothing (a block's fixed cost is already small beside its blending) and their fresh pages
#: cost: every page of a rank's buffers is faulted in by the kernel and counts in its peak RSS.
BLEND_BLOCK = 1 << 18


@dataclass
class BuildConfig:
    """What Megatron-LM's training arguments say about the data (field names as its flags)."""

    seq_length: int
    sizes: tuple                        # requested samples (train, valid, test); None = one epoch
    tokenizer: dict                     # the tokenizer's unique_identifiers (hashed)
    #: the megatron-core whose caches to reproduce (``megatron.versions``); None: the installed one's,
    #: else the newest supported
    megatron_version: str | None = None
    blend: Blend | None = None          # --data-path / --data-args-path
    blend_per_split: list | None = None  # --train/valid/test-data-path / --per-split-data-args-path
    split: str | None = DEFAULT_SPLIT
    seed: int = DEFAULT_SEED
    cache_dir: str | None = None        # --data-cache-path
    add_extra_token: bool = True
    drop_last_partial_validation: bool = True
    surplus: float = DEFAULT_SURPLUS    # mid_level_dataset_surplus
    #: a blend is cut over ranks only when each rank's chunk is at least this long
    blend_min_chunk: int = 4 * DEFAULT_WARMUP
    #: greedy steps each chunk's guessed start state is run for
    blend_warmup: int = DEFAULT_WARMUP
    #: samples a rank blends into memory before writing them (memory per rank: 10 bytes each)
    blend_block: int = BLEND_BLOCK
    #: replace existing entries that megacache's manifest shows were built from other data or
    #: settings (else that is an error)
    rebuild_stale: bool = False
    #: where to write Megatron's --per-dataset-sequences-path JSON (default: in ``cache_dir``, as
    #: ``megatron.sequences.FILE_NAME``; "" writes none)
    sequences_path: str | None = None

    @classmethod
    def from_megatron_flags(cls, tokenizer: dict, training: dict, megatron_version: str | None = None,
                            megatron_python: str | None = None, **fields) -> "BuildConfig":
        """A configuration from the flags a Megatron-LM run is given, as keywords in snake case: the
        tokenizer's (``tokenizer_type``, ``tokenizer_model``, ``vocab_size``, ...) and the training
        loop's that size the splits (``train_samples`` or ``train_iters``, ``global_batch_size``,
        ``eval_iters``, ``eval_interval``, ...; ``world_size``, the ranks training runs on, where
        ``micro_batch_size`` gives the global batch). The megatron-core version is resolved once, as
        ``megatron_version`` says (else the installed one's), or asked of the interpreter
        ``megatron_python`` together with the tokenizer identity (``megatron.interpreter``); the
        sizes and the identity follow it. ``fields``: the rest (``blend``, ``split``, ``seq_length``,
        ``seed``, ``cache_dir``, ...)."""
        from ..megatron.flags import without_defaults
        from ..megatron.interpreter import identity
        from ..megatron.tokenizer import TOKENIZER_FLAGS
        from ..megatron.training import split_sizes

        found = identity(without_defaults(TOKENIZER_FLAGS, tokenizer), megatron_version, megatron_python)
        if found.note:
            LOG.warning(f"megacache: note: {found.note}")
        return cls(sizes=split_sizes(found.version, **training), tokenizer=found.identifiers,
                   megatron_version=found.version, **fields)

    @classmethod
    def from_bridge(cls, container, megatron_version: str | None = None, **fields) -> "BuildConfig":
        """The caches a Megatron-Bridge run's first start builds: ``container`` is its
        ``ConfigContainer``, the same as a mapping, or the path of its YAML (``megatron.bridge``);
        ``megatron_version`` the megatron-core Bridge runs on (default: the installed one's);
        ``fields``: further BuildConfig fields (``rebuild_stale``, ...)."""
        from ..megatron.bridge import read_config

        return cls(**{**read_config(container, megatron_version).build_fields(), **fields})

    @classmethod
    def for_prefix(cls, data_path: str, **fields) -> "BuildConfig":
        """One prefix without a weight: plain GPTDatasets, as ``--data-path PREFIX``."""
        return cls(blend=Blend((data_path,)), **fields)

    @property
    def settings(self) -> GPTSettings:
        return GPTSettings(self.seq_length, self.tokenizer, self.seed, self.cache_dir, self.add_extra_token,
                           self.drop_last_partial_validation)
