"""Megatron-Bridge 0.6.2's offline packing of SFT examples (``prepare_gpt_sft_packed_data``), from
a JSONL file to the packed file and its metadata record: every rank tokenizes an even share of the
lines (text/sft.py); rank 0 places the examples (algorithms/packing.py) and writes the files
(formats/sft_packed.py). The other ranks hand their shares to rank 0 through temporary ``.npy``
files beside the output, which rank 0 maps: it holds every example's token count but only its own
share's tokens, and gathers a Parquet file's tokens a few row groups at a time (a ``.npy`` file is
one pickle of every row: its rows are made at once). The files are the same on any number of ranks."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from ..algorithms import packing
from ..errors import MegacacheError
from ..formats import sft_packed
from ..formats.npy import load_npy, write_npy
from ..megatron.bridge_sft import BridgeSFT, PackedSplit, packed_files, read_sft_config
from ..runtime.comm import Comm, SingleComm
from ..runtime.fsio import make_directories, remove_quietly, tmp_path, writing
from ..text.sft import SFTExamples, line_count, sft_format, tokenize_lines
from ..text.tokenization import BackendTokenizer, load_tokenizer


def prepare_packed(input_path: str, output_path: str, metadata_path: str | None, tokenizer: BackendTokenizer,
                   pack_size: int, max_seq_length: int, seed: int, algorithm: str = "first_fit_shuffle",
                   dataset_kwargs: dict | None = None, pad_seq_to_mult: int | None = 1,
                   comm: Comm | None = None) -> dict:
    """The packed file at ``output_path`` (Parquet for a .parquet/.pq name, else ``.npy``) and, when
    ``metadata_path`` is given, the metadata record appended there, as Bridge's
    ``prepare_gpt_sft_packed_data`` writes them with the same arguments (``packed_sequence_size`` is
    ``pack_size``), on the ranks of ``comm``. Nothing is written where Bridge would fail. Returns
    the metadata record, on every rank."""
    comm = comm or SingleComm()
    fmt = sft_format(dataset_kwargs, tokenizer)

    def start() -> tuple[list | None, int]:
        records = None if metadata_path is None else sft_packed.metadata_records(metadata_path)
        lines = line_count(input_path)
        # both folders made before anything is written: a split is its packed file and its record
        for path in (output_path, metadata_path):
            if path is not None:
                with writing(path):
                    make_directories(os.path.dirname(os.path.abspath(path)))
        return records, lines

    records, lines = comm.on_root(start, f"reading {input_path}")
    first, stop = lines * comm.rank // comm.size, lines * (comm.rank + 1) // comm.size
    try:
        error = None
        try:
            examples = tokenize_lines(input_path, tokenizer, fmt, max_seq_length, pad_seq_to_mult, first, stop)
            if comm.rank:
                _save_share(output_path, comm.rank, examples)
        except (MegacacheError, OSError) as exc:
            if comm.size == 1:  # no other rank to tell: the error as it is, naming no rank
                raise
            error = exc
        comm.check(error, f"tokenizing {input_path}")

        def write() -> dict:
            try:
                tokens = _Tokens([examples] + [_load_share(output_path, r, fmt.chat) for r in range(1, comm.size)])
                plan = packing.plan(np.diff(tokens.offsets), pack_size, max_seq_length, seed, algorithm)
                written = write_packed(output_path, plan, tokens)
            finally:
                for r in range(1, comm.size):
                    _remove_share(output_path, r)
            if metadata_path is not None:
                try:
                    sft_packed.write_metadata(metadata_path, records + [plan.metadata])
                except BaseException:  # a packed file without its record would be taken as prepared
                    remove_quietly(written)
                    raise
            return plan.metadata

        return comm.on_root(write, f"writing {output_path}")
    except BaseException:
        if comm.rank:
            _remove_share(output_path, comm.rank)  # the job stopped before rank 0 took this rank's share
        raise


#: the arrays of a rank's share, each a temporary ``.npy`` file; ``shifted`` is the same on every rank
SHARE_FIELDS = ("offsets", "ids", "loss_mask", "mask_ints")
#: the most tokens rank 0 gathers at a time for a Parquet file (at least one row group)
CHUNK_TOKENS = 1 << 22


def _share_path(output_path: str, rank: int, field: str) -> str:
    return tmp_path(output_path, f"share-{rank}-{field}")


def _save_share(output_path: str, rank: int, examples: SFTExamples) -> None:
    for field in SHARE_FIELDS:
        write_npy(_share_path(output_path, rank, field), getattr(examples, field))


def _load_share(output_path: str, rank: int, shifted: bool) -> SFTExamples:
    """A rank's share, its tokens and masks mapped, not read."""
    arrays = {field: load_npy(_share_path(output_path, rank, field), mmap=field in ("ids", "loss_mask"))
              for field in SHARE_FIELDS}
    return SFTExamples(**arrays, shifted=shifted)


def _remove_share(output_path: str, rank: int) -> None:
    for field in SHARE_FIELDS:
        remove_quietly(_share_path(output_path, rank, field))


class _Tokens:
    """The ranks' shares as one run of examples in line order: example i's tokens are
    ``offsets[i]:offsets[i + 1]`` of their concatenation, read from the share that holds them."""

    def __init__(self, shares: list[SFTExamples]):
        self.shares = shares
        counts = np.concatenate([np.diff(s.offsets) for s in shares])
        self.offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=self.offsets[1:])
        self.bounds = np.cumsum([0] + [int(s.offsets[-1]) for s in shares])  # each share's first token
        self.mask_ints = np.concatenate([s.mask_ints for s in shares])
        self.shifted = shares[0].shifted

    def take(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids and loss-mask values at ``index`` (positions in the concatenation)."""
        ids = np.empty(index.size, dtype=np.int64)
        mask = np.empty(index.size, dtype=np.int8)
        share = np.searchsorted(self.bounds, index, side="right") - 1
        for k, s in enumerate(self.shares):
            at = np.flatnonzero(share == k)
            local = index[at] - self.bounds[k]
            ids[at] = s.ids[local]
            mask[at] = s.loss_mask[local]
        return ids, mask


def write_packed(path: str, plan: packing.PackingPlan, tokens: _Tokens) -> str:
    """The packed sequences of ``plan`` made of ``tokens``, written at ``path``; the path written."""
    starts = packing.sequence_starts(plan.offsets, plan.lengths)
    if sft_packed.is_parquet(path):
        first_tokens = np.concatenate(([0], np.cumsum(plan.lengths + 1)))[plan.offsets]  # each pack's first token

        def chunks():
            for a, b in _row_group_chunks(first_tokens):
                token_offsets, index = packing.packed_tokens(plan, tokens.offsets, a, b)
                places = plan.offsets[a:b + 1]
                yield (token_offsets, *tokens.take(index), places - places[0], starts[places[0]:places[-1]])

        sft_packed.write_parquet(path, int(first_tokens[-1]), chunks())
        return path
    token_offsets, index = packing.packed_tokens(plan, tokens.offsets)
    input_ids, loss_mask = tokens.take(index)
    return sft_packed.write_npy(path, token_offsets, input_ids, loss_mask, _mask_ints(plan, tokens, index),
                                plan.offsets, starts)


def _row_group_chunks(first_tokens: np.ndarray) -> list[tuple[int, int]]:
    """The packs (pack b's tokens start at ``first_tokens[b]``, the last entry is the end) in runs
    of whole row groups (but the last) of at most CHUNK_TOKENS tokens, or one row group where it
    alone has more."""
    packs = first_tokens.size - 1
    bounds = np.append(np.arange(0, packs, sft_packed.ROW_GROUP_SIZE), packs)
    at = first_tokens[bounds]
    chunks, a = [], 0
    while a < bounds.size - 1:
        b = max(a + 1, int(np.searchsorted(at, at[a] + CHUNK_TOKENS, side="right")) - 1)
        chunks.append((int(bounds[a]), int(bounds[b])))
        a = b
    return chunks


def _mask_ints(plan: packing.PackingPlan, tokens: _Tokens, index: np.ndarray) -> np.ndarray:
    """Which packed loss-mask values are Python ints in Bridge's rows: Bridge stacks each length's
    masks into one array, so all of a length's values are ints if one example of it holds an int;
    the value Bridge appends to a shifted mask is always a bool."""
    ints = np.zeros(index.size, dtype=bool)
    if not tokens.mask_ints.any():
        return ints
    counts = plan.lengths + 1
    int_lengths = np.unique(plan.lengths[tokens.mask_ints[plan.examples]])
    ints = np.repeat(np.isin(plan.lengths, int_lengths), counts)
    if tokens.shifted:
        ints[np.cumsum(counts) - 1] = False
    return ints


class PackedOutcome(NamedTuple):
    split: PackedSplit
    state: str  # "present": Bridge finds it and packs nothing; "missing": to write; "written"
    metadata: dict | None  # the record appended, for a split written


def _check_present(path: str) -> None:
    """A packed file Bridge would load as it is: read without unpickling, and refused with what is
    wrong in it (a crafted pickle, damage) rather than left for Bridge's loader to unpickle."""
    try:
        rows = sft_packed.read_packed(path)
        found = sft_packed.problems(path, rows)
    except MegacacheError as exc:
        found = [str(exc)]
    if found:
        raise MegacacheError(f"{found[0]}; Bridge would load this packed file as it is and prepare nothing: "
                             f"remove it (megacache verify {path} lists every problem) and pack again")


def packed_states(cfg: BridgeSFT, comm: Comm) -> list[PackedOutcome]:
    """Each split of a Bridge finetuning configuration: whether Bridge's builder finds its packed
    file (and prepares nothing; a file found is checked first) or would prepare it. A missing path
    megacache cannot write (a glob, a folder) is an error."""
    def states() -> list[PackedOutcome]:
        out = []
        for split in cfg.splits:
            found = packed_files(split.output_path)
            for path in found:
                _check_present(path)
            present = bool(found)
            if not present and ("*" in split.output_path or "?" in split.output_path
                                or os.path.isdir(split.output_path)):
                raise MegacacheError(f"{split.output_path}: the packed {split.name} path names no file yet, and is "
                                     "a glob or a folder; give a file path ending in .parquet or .pq")
            out.append(PackedOutcome(split, "present" if present else "missing", None))
        return out

    return comm.on_root(states, "looking for the packed files")


def read_config(path: str, comm: Comm) -> BridgeSFT:
    """A Bridge finetuning ConfigContainer's YAML, read on rank 0, as every rank learns it."""
    return comm.on_root(lambda: read_sft_config(path), f"reading {path}")


def pack_bridge(cfg: BridgeSFT, comm: Comm) -> list[PackedOutcome]:
    """The packed files of a Bridge finetuning configuration that Bridge's builder would prepare,
    training then validation, each split whose file is there left as it is (as Bridge leaves it)."""
    tokenizer = load_tokenizer(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=cfg.tokenizer_model,
                               include_special_tokens=cfg.include_special_tokens)
    out = []
    for outcome in packed_states(cfg, comm):
        if outcome.state == "missing":
            split = outcome.split
            metadata = prepare_packed(split.input_path, split.output_path, cfg.metadata_path, tokenizer, cfg.pack_size,
                                      cfg.max_seq_length, cfg.seed, dataset_kwargs=cfg.dataset_kwargs,
                                      pad_seq_to_mult=cfg.pad_seq_to_mult, comm=comm)
            outcome = PackedOutcome(split, "written", metadata)
        out.append(outcome)
    return out
