"""What a build is asked for: Megatron-LM's data and tokenizer settings, and megacache's tuning,
as one configuration (``BuildConfig``), made directly, from Megatron-LM flags or from a
Megatron-Bridge configuration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..algorithms.blend_chunks import DEFAULT_WARMUP
from ..algorithms.blend_sizes import DEFAULT_SURPLUS
from ..algorithms.checks import integer
from ..algorithms.gpt_index import INT32_MAX, UINT32_MAX
from ..errors import MegacacheError
from ..runtime.log import LOG
from ..megatron.blends import Blend
from ..megatron.cache import default_cache_dir
from ..megatron.tokenizer import TOKENIZER_FLAGS, check_identity
from ..megatron.training import DEFAULT_SEED, DEFAULT_SPLIT, SIZE_FLAGS

#: the Megatron-LM flags a build reads, by their names in Megatron's parsed arguments: the data's
#: (``megatron.blends``), the sizes' (``megatron.training.SIZE_FLAGS``) and the tokenizer's
#: (``megatron.tokenizer.TOKENIZER_FLAGS``)
DATA_FLAGS = ("data_path", "data_args_path", "train_data_path", "valid_data_path", "test_data_path",
              "per_split_data_args_path", "split", "seq_length", "encoder_seq_length", "seed", "data_cache_path",
              "mid_level_dataset_surplus", "per_dataset_sequences_path", "dataloader_fast_cache_load",
              "dataloader_defer_npy_index_mmap", "object_storage_cache_path")
MEGATRON_FLAGS = DATA_FLAGS + tuple(f.dest for f in SIZE_FLAGS + TOKENIZER_FLAGS)

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
    #: --object-storage-cache-path: where each ``.idx`` of a dataset in a bucket is copied to be read
    object_cache: str | None = None
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
    #: replace existing entries whose files are damaged (truncated, extended, another array in
    #: them: training would fail on them); else that is an error
    rebuild_damaged: bool = True
    #: where to write Megatron's --per-dataset-sequences-path JSON (default: in ``cache_dir``, as
    #: ``megatron.sequences.FILE_NAME``; "" writes none)
    sequences_path: str | None = None
    #: seconds between progress lines on stderr (``runtime.progress``; None: 0.5 on a terminal, 30
    #: otherwise; 0: none)
    progress_interval_s: float | None = None
    #: how the user named the fields ``__post_init__`` checks, for its messages (default: the flag,
    #: ``--seq-length``): a Bridge configuration's field, say
    field_names: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Every way in (flags, a Bridge configuration, Python) makes a BuildConfig: the one check of
        # the values the plans take as they are.
        seq_length, seed = self.field_name("seq_length"), self.field_name("seed")
        integer(seq_length, self.seq_length, 1)
        if self.seq_length + int(self.add_extra_token) > INT32_MAX:
            raise MegacacheError(f"{seq_length} {self.seq_length} (+{int(self.add_extra_token)}) does not fit "
                                 f"Megatron's int32 arithmetic")
        integer(seed, self.seed)
        if self.seed > UINT32_MAX:
            raise MegacacheError(f"{seed} {self.seed} is outside numpy's RandomState range [0, 2**32-1]")
        check_identity(self.tokenizer)

    def field_name(self, name: str) -> str:
        """``name`` as the user gave it."""
        return self.field_names.get(name, "--" + name.replace("_", "-"))

    def drop_last(self, split_name: str) -> bool:
        """Whether a split's sample walk drops its last partial sample: only valid's is configurable."""
        return self.drop_last_partial_validation if split_name == "valid" else True

    def cache_path(self, data_path: str) -> str:
        """Where a prefix's GPTDataset entries go: ``cache_dir``, else Megatron's default under the prefix."""
        return self.cache_dir if self.cache_dir is not None else default_cache_dir(data_path)

    @classmethod
    def from_megatron_flags(cls, flags: Mapping, megatron_version: str | None = None,
                            megatron_python: str | None = None, world_size: int | None = None,
                            comm=None, report=None, command: list[str] | None = None,
                            **fields) -> "BuildConfig":
        """The build a Megatron-LM training run's flags ask for: ``flags`` are those the run is
        given, by their names in Megatron's parsed arguments (``data_path`` as a list of words,
        ``split``, ``seq_length``, ``seed``, ``data_cache_path``, the sizes' ``train_iters``,
        ``global_batch_size``, ..., the tokenizer's ``tokenizer_type``, ``tokenizer_model``, ...;
        ``MEGATRON_FLAGS`` lists them), each read as that version's training reads it. The
        megatron-core version is resolved once, as ``megatron_version`` says (else the installed
        one's), or asked of the interpreter ``megatron_python`` with the tokenizer identity
        (``megatron.interpreter``); ``world_size``: the ranks training runs on, where
        ``micro_batch_size`` gives the global batch. ``comm``: the job whose one process looks at
        the datasets and derives the identity for all; ``report(kind, text)`` gets the warnings and
        notes ("warning", "note"; default: the megacache logger). ``command``: the whole training
        command these flags come from, which ``megatron_python``'s Megatron-LM then reads too, as
        tools/prepare_cache.py does (parse_args, validate_args, ...): where its answer (sizes, seed,
        split, blends, cache path, surplus) differs from this reading, the build stops naming the
        field. ``fields``: megacache's own
        settings (``rebuild_stale``, ``add_extra_token``, ..., or ``tokenizer``: the identity
        itself, instead of the one the tokenizer flags give)."""
        from ..algorithms.splits import check_split_string
        from ..megatron.blends import blend_from_flags
        from ..megatron.flags import resolve_flags
        from ..megatron.interpreter import identity
        from ..megatron.tokenizer import TOKENIZER_FLAGS
        from ..megatron.training import SIZE_FLAGS, split_sizes
        from ..megatron.versions import resolve
        from ..runtime.comm import SingleComm

        comm = comm or SingleComm()
        unknown = sorted(set(flags) - set(MEGATRON_FLAGS))
        if unknown:
            raise MegacacheError(f"not Megatron-LM flags a build reads: {', '.join(unknown)} (they are "
                                 f"{', '.join(MEGATRON_FLAGS)})")
        flags = {k: v for k, v in flags.items() if v is not None and v is not False}
        if report is None:
            report = lambda kind, text: LOG.warning(f"megacache: {kind}: {text}")  # noqa: E731
        blend, per_split = blend_from_flags(flags.get("data_path"), flags.get("data_args_path"),
                                            tuple(flags.get(f"{s}_data_path") for s in ("train", "valid", "test")),
                                            flags.get("per_split_data_args_path"))
        if flags.get("dataloader_fast_cache_load") and not per_split:
            raise MegacacheError("--dataloader-fast-cache-load and --data-path cannot be used together (megatron-core "
                                 "asserts): give the data per split (--per-split-data-args-path or "
                                 "--train/valid/test-data-path)")
        check_datasets(blend, per_split, comm)  # the most basic problem first
        if "seq_length" in flags and "encoder_seq_length" in flags:
            raise MegacacheError("give --seq-length or --encoder-seq-length, not both (Megatron-LM asserts)")
        seq_length = flags.get("seq_length", flags.get("encoder_seq_length"))
        if seq_length is None:
            raise MegacacheError("--seq-length is required (training's sequence length: it is hashed)")
        split = flags.get("split", None if per_split else DEFAULT_SPLIT)
        if "split" in flags and not per_split:  # with per-split data, --split is refused as it is
            warning = check_split_string(flags["split"])
            if warning and comm.rank == 0:
                report("warning", warning)
        tokenizer_flags = {f.dest: flags[f.dest] for f in TOKENIZER_FLAGS if f.dest in flags}
        if "tokenizer" in fields:
            if megatron_python:
                raise MegacacheError("--megatron-python asks your Megatron for the tokenizer identity: give it the "
                                     "tokenizer flags, not the identity itself")
            version = resolve(megatron_version)
            resolve_flags(TOKENIZER_FLAGS, version, tokenizer_flags)  # a flag the version lacks is an error
            tokenizer = fields.pop("tokenizer")
        else:
            if not tokenizer_flags.get("tokenizer_type"):
                raise MegacacheError("the cache name hashes the tokenizer: give Megatron's --tokenizer-type (with "
                                     "--tokenizer-model/--vocab-file/--merge-file/--vocab-size as in training), or "
                                     "--tokenizer-identifiers FILE.json, or --tokenizer-from-description PATH")
            # asking megatron_python imports that Megatron (seconds): one process asks for all
            asked = {"words": command, "world_size": world_size} if command is not None else None
            found = comm.on_root(lambda: identity(tokenizer_flags, megatron_version, megatron_python, asked),
                                 "deriving the tokenizer identity")
            if found.note and comm.rank == 0:
                report("note", found.note)
            version, tokenizer = found.version, found.identifiers
        sizes = split_sizes(version, world_size, **{f.dest: flags[f.dest] for f in SIZE_FLAGS if f.dest in flags})
        settings = dict(seed=flags.get("seed", DEFAULT_SEED), cache_dir=flags.get("data_cache_path"),
                        surplus=flags.get("mid_level_dataset_surplus", DEFAULT_SURPLUS),
                        sequences_path=flags.get("per_dataset_sequences_path"),
                        object_cache=flags.get("object_storage_cache_path"))
        cfg = cls(seq_length=seq_length, sizes=sizes, tokenizer=tokenizer, megatron_version=version, blend=blend,
                  blend_per_split=per_split, split=split, **{**settings, **fields})
        if megatron_python and command is not None and "tokenizer" not in fields:
            check_reading(found, megatron_python, cfg.reading(), report if comm.rank == 0 else lambda kind, text: None)
        return cfg

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

    def reading(self) -> dict:
        """What training builds, as Megatron-LM's own code gives it (the answer of
        ``megatron.training_worker.read_command`` to the same command)."""
        return dict(sizes=list(self.sizes), seq_length=self.seq_length, seed=self.seed, split=self.split,
                    blend=self.blend and self.blend.as_megatron(),
                    blend_per_split=self.blend_per_split and [b and b.as_megatron() for b in self.blend_per_split],
                    data_cache_path=self.cache_dir, mid_level_dataset_surplus=self.surplus,
                    identifiers=self.tokenizer)


def check_reading(found, python: str, mine: dict, report) -> None:
    """megacache's reading of the training command (``mine``) against what the Megatron-LM of
    ``python`` read from it (``found.command``): a difference stops the build naming the field."""
    from ..megatron.interpreter import command_differences

    asked = found.command or {}
    if "error" in asked:
        raise MegacacheError(f"--megatron-python {python}: your Megatron-LM refuses this training command: "
                             f"{asked['error']}")
    if "partial" in asked or not asked:
        why = asked.get("partial", "no answer")
        report("note", f"--megatron-python {python} checked the tokenizer identity only, not the whole command "
                       f"({why}; validate_args needs Megatron-LM and the model's flags)")
        return
    problems = command_differences(asked, mine)
    if problems:
        raise MegacacheError(f"--megatron-python {python} (megatron-core {found.megatron}) reads this training "
                             f"command otherwise than megacache:\n" + "\n".join(f"  {p}" for p in problems)
                             + "\nThe caches would not be the ones your training looks for; report this as a "
                               "megacache bug, with the command")


def check_datasets(blend, blend_per_split, comm) -> None:
    """Every dataset of the blend or per-split blends is there (one process of ``comm`` looks)."""
    from ..megatron.blends import check_prefixes_exist

    blends = [blend] if blend else [b for b in blend_per_split if b]
    comm.on_root(lambda: check_prefixes_exist(dict.fromkeys(p for b in blends for p in b.prefixes)),
                 "looking for the datasets")
