"""``megacache build``: Megatron-exact GPTDataset index caches, every rank building a slice.

1. Plan (every rank, identically): each rank sums its slice of the ``.idx`` sequence lengths per
   split range; an allgather gives every rank the same tokens per epoch, and from them the same
   epochs, sample counts and dtypes. Every output file's shape is now known, so rank 0
   preallocates them all under temporary names.
2. Document index: one serial MT19937 Fisher–Yates per split, on the split's owner rank (splits are
   spread over ranks, largest first). The RNG state it leaves is exactly the shuffle index's starting
   state, and the shuffle index's length is in the plan, so the owner starts the shuffle index on a
   background thread (the numba kernel releases the GIL) at once.
3. Sample index: every rank takes a slice of document-index positions, computes its token prefix
   sums, learns the tokens before its slice from an exscan, and writes the sample rows its slice
   owns at their row offset.
4. Owners join their shuffle threads; everyone fsyncs; rank 0 renames the arrays into place and the
   description last (Megatron's cache-hit test needs all four files, so a reader never sees part of
   a cache). Then every rank can memory-map the result.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from ..algorithms.gpt_index import (GPTIndexPlan, build_document_index, build_shuffle_index,
                                    document_token_ends, sample_index_rows, sample_rows_in_slice)
from ..algorithms.permutation import MT19937
from ..algorithms.splits import split_matrix, split_ranges
from ..comm import Comm, get_comm
from ..errors import MegacacheError
from ..formats.cache import SPLIT_NAMES, CacheEntry, default_cache_dir, gpt_identifiers
from ..formats.indexed import IndexedDataset
from ..formats.npy import NpyWriter, load_npy
from ..fsio import publish, remove_quietly, tmp_path, write_atomic
from .scheduling import even_slice, largest_first

MEGATRON_DEFAULT_SPLIT = "969, 30, 1"
UINT32_MAX = 2**32 - 1


@dataclass
class GPTBuildConfig:
    data_path: str                      # the prefix exactly as Megatron is given it (it is hashed)
    seq_length: int
    sizes: tuple                        # requested samples per split (train, valid, test); None = one epoch
    tokenizer: dict                     # the tokenizer's unique_identifiers (hashed)
    split: str = MEGATRON_DEFAULT_SPLIT
    seed: int = 1234
    cache_dir: str | None = None        # default: Megatron's <prefix>/cache/GPTDataset_indices
    add_extra_token: bool = True
    drop_last_partial_validation: bool = True

    @property
    def cache_path(self) -> str:
        return self.cache_dir if self.cache_dir is not None else default_cache_dir(self.data_path)


@dataclass
class SplitResult:
    name: str
    entry: CacheEntry
    plan: GPTIndexPlan
    split_range: tuple[int, int]
    reused: bool

    @property
    def summary(self) -> str:
        p = self.plan
        state = "existing cache reused" if self.reused else "built"
        sep = ", final epoch separated" if p.separate_final_epoch else ""
        return (f"  {self.name}: sequences [{self.split_range[0]}, {self.split_range[1]}), "
                f"{p.tokens_per_epoch:,} tokens/epoch, {p.num_epochs} epoch(s){sep}, {p.num_samples:,} samples "
                f"({state})\n    {self.entry.hash}-GPTDataset-{self.name}-*")


@dataclass
class GPTBuildResult:
    cache_dir: str
    splits: list[SplitResult]
    seconds: float
    ranks: int
    phases: dict[str, float] = field(default_factory=dict)


def megatron_split_sizes(train_samples: int | None = None, train_iters: int | None = None,
                         global_batch_size: int | None = None, eval_iters: int = 100,
                         eval_interval: int = 1000, full_validation: bool = False) -> tuple:
    """Samples per split as Megatron-LM's training loop asks for them."""
    if train_samples is None and train_iters is None:
        raise MegacacheError("give --train-samples, or --train-iters with --global-batch-size")
    needs_gbs = train_samples is None or eval_iters
    if needs_gbs and not global_batch_size:
        raise MegacacheError("--global-batch-size is needed to turn iterations into samples")
    if train_iters is None:  # Megatron derives the iterations from the samples
        train_iters = train_samples // global_batch_size
    train = train_samples if train_samples is not None else train_iters * global_batch_size
    gbs = global_batch_size or 0
    valid = None if full_validation else (train_iters // eval_interval + 1) * eval_iters * gbs
    return (train, valid, eval_iters * gbs)


def _validate(cfg: GPTBuildConfig) -> None:
    if not isinstance(cfg.seq_length, int) or cfg.seq_length < 1:
        raise MegacacheError(f"--seq-length must be a positive integer, got {cfg.seq_length!r}")
    if not 0 <= cfg.seed <= UINT32_MAX:
        raise MegacacheError(f"--seed {cfg.seed} is outside numpy's RandomState range [0, 2**32-1]")
    if len(cfg.sizes) != 3:
        raise MegacacheError(f"sizes must give train, valid and test, got {cfg.sizes!r}")
    for name, n in zip(SPLIT_NAMES, cfg.sizes):
        if n is not None and n < 0:
            raise MegacacheError(f"the {name} sample count is negative ({n})")


def _plan(cfg: GPTBuildConfig, ds: IndexedDataset, comm: Comm) -> list[tuple[str, tuple, GPTIndexPlan]]:
    """Per non-None split: (name, range, plan). Tokens per split are summed in slices over ranks."""
    lengths = ds.sequence_lengths
    n = len(lengths)
    if n == 0:
        raise MegacacheError(f"{cfg.data_path}: the dataset has no sequences; there is nothing to sample")
    matrix = split_matrix(cfg.split)
    ranges = split_ranges(matrix, n)
    a, b = even_slice(n, comm.rank, comm.size)
    mine = np.asarray(lengths[a:b], dtype=np.int64)
    partial = [int(mine[max(r[0], a) - a : max(min(r[1], b), a) - a].sum()) if r else 0 for r in ranges]
    gathered = comm.allgather((partial, int(mine.max()) if len(mine) else 0))
    tokens = [sum(g[0][i] for g in gathered) for i in range(3)]
    longest = max(g[1] for g in gathered)

    plans = []
    for i, (name, rng) in enumerate(zip(SPLIT_NAMES, ranges)):
        if rng is None:
            continue
        size = cfg.sizes[i]
        if rng[0] == rng[1] and size is not None and (size > 0 or cfg.add_extra_token):
            raise MegacacheError(
                f"the {name} split is empty ({cfg.split!r} of {n} sequences rounds to [{rng[0]}, {rng[1]})) "
                f"but {size} samples are requested from it; megatron-core would loop forever. "
                f"Change --split, or request no {name} samples"
            )
        drop_last = cfg.drop_last_partial_validation if name == "valid" else True
        plan = GPTIndexPlan.from_counts(rng[1] - rng[0], tokens[i], longest, size, cfg.seq_length,
                                        int(cfg.add_extra_token), drop_last)
        plans.append((name, rng, plan))
    return plans


def _entry(cfg: GPTBuildConfig, name: str, plan: GPTIndexPlan) -> CacheEntry:
    ids = gpt_identifiers(cfg.data_path, plan.requested_samples, name, cfg.seed, cfg.seq_length, cfg.split,
                          [list(b) if b is not None else None for b in split_matrix(cfg.split)], cfg.tokenizer)
    return CacheEntry(cfg.cache_path, ids)


def _shapes(plan: GPTIndexPlan) -> dict[str, tuple[np.dtype, tuple]]:
    return {
        "document_index.npy": (np.dtype(np.int32), (plan.document_index_length,)),
        "sample_index.npy": (np.dtype(plan.sample_index_dtype), plan.sample_index_shape),
        "shuffle_index.npy": (np.dtype(plan.shuffle_index_dtype), (plan.shuffle_index_length,)),
    }


def build_gpt(cfg: GPTBuildConfig, comm: Comm | None = None) -> GPTBuildResult:
    comm = comm or get_comm()
    t0 = time.monotonic()
    phases: dict[str, float] = {}

    def mark(phase: str, since: float) -> float:
        now = time.monotonic()
        phases[phase] = now - since
        return now

    _validate(cfg)
    ds = IndexedDataset(cfg.data_path)
    planned = _plan(cfg, ds, comm)
    results = []
    todo = []
    for name, rng, plan in planned:
        entry = _entry(cfg, name, plan)
        reused = comm.on_root(entry.exists, "looking for an existing cache")
        results.append(SplitResult(name, entry, plan, rng, reused))
        if not reused:
            todo.append(results[-1])
    t = mark("plan", t0)

    tag = comm.bcast(uuid.uuid4().hex[:12] if comm.rank == 0 else None)
    tmp = {(s.name, what): tmp_path(s.entry.path(what), tag) for s in todo for what in _shapes(s.plan)}

    def preallocate() -> None:
        os.makedirs(cfg.cache_path, exist_ok=True)
        for s in todo:
            for what, (dtype, shape) in _shapes(s.plan).items():
                NpyWriter.create(tmp[s.name, what], dtype, shape)

    try:
        comm.on_root(preallocate, "preallocating the cache files")
        _build_splits(cfg, ds, todo, tmp, comm, phases)
        t = time.monotonic()

        def publish_cache() -> None:
            for s in todo:
                for what in _shapes(s.plan):
                    publish(tmp[s.name, what], s.entry.path(what))
                # The description last: Megatron's cache hit needs all four files.
                write_atomic(s.entry.path("description.txt"), s.entry.description.encode("utf-8"))

        comm.on_root(publish_cache, "publishing the cache")
        mark("publish", t)
    finally:
        if comm.rank == 0:
            for path in tmp.values():
                remove_quietly(path)
    return GPTBuildResult(cfg.cache_path, results, time.monotonic() - t0, comm.size, phases)


def _build_splits(cfg: GPTBuildConfig, ds: IndexedDataset, todo: list[SplitResult], tmp: dict,
                  comm: Comm, phases: dict[str, float]) -> None:
    owners = largest_first([s.plan.document_index_length + s.plan.shuffle_index_length for s in todo], comm.size)
    threads: list[threading.Thread] = []
    thread_errors: list[BaseException] = []

    def shuffle_in_background(s: SplitResult, state: MT19937) -> None:
        try:
            out = np.lib.format.open_memmap(tmp[s.name, "shuffle_index.npy"], mode="r+")
            build_shuffle_index(s.plan.num_samples, s.plan.shuffle_first_range, s.plan.shuffle_index_dtype,
                                state, out=out)
            out.flush()
            del out
        except BaseException as exc:  # reported at the final check
            thread_errors.append(exc)

    t = time.monotonic()
    error = None
    try:
        for s, owner in zip(todo, owners):
            if owner != comm.rank:
                continue
            state = MT19937.from_seed(cfg.seed)
            out = np.lib.format.open_memmap(tmp[s.name, "document_index.npy"], mode="r+")
            build_document_index(np.arange(*s.split_range, dtype=np.int32), s.plan.num_epochs,
                                 s.plan.separate_final_epoch, state, out=out)
            out.flush()
            del out
            th = threading.Thread(target=shuffle_in_background, args=(s, state), name=f"shuffle-{s.name}")
            th.start()
            threads.append(th)
    except Exception as exc:
        error = exc
    comm.check(error, "building the document index")
    phases["document_index"] = time.monotonic() - t

    # Sample index. Collectives never sit behind fallible local work: a rank that failed would skip
    # them and pair the others' collectives with the wrong calls. So: local sums, agreement, one
    # exscan for every split at once, then the rows.
    t = time.monotonic()
    error = None
    slices = []
    try:
        for s in todo:
            slices.append(_slice_token_ends(s, ds.sequence_lengths, tmp[s.name, "document_index.npy"], comm))
    except Exception as exc:
        error = exc
    comm.check(error, "summing tokens for the sample index")
    starts = comm.exscan(np.array([int(ends[-1]) if len(ends) else 0 for _, _, ends in slices], dtype=np.int64))
    try:
        for s, (p0, p1, ends), start in zip(todo, slices, starts.tolist()):
            _write_sample_rows(s, p0, p1, ends, start, tmp[s.name, "sample_index.npy"], comm)
    except Exception as exc:
        error = exc
    phases["sample_index"] = time.monotonic() - t

    t = time.monotonic()
    for th in threads:
        th.join()
    if thread_errors and error is None:
        error = thread_errors[0]
    phases["shuffle_index_wait"] = time.monotonic() - t
    comm.check(error, "building the sample and shuffle indices")


def _slice_token_ends(s: SplitResult, sizes: np.ndarray, doc_path: str, comm: Comm) -> tuple:
    """This rank's slice of document-index positions and its token prefix sums (from 0)."""
    p0, p1 = even_slice(s.plan.document_index_length, comm.rank, comm.size)
    return p0, p1, document_token_ends(sizes, load_npy(doc_path)[p0:p1])


def _write_sample_rows(s: SplitResult, p0: int, p1: int, ends: np.ndarray, start: int, sample_path: str,
                       comm: Comm) -> None:
    """The sample-index rows this rank's slice owns, written at their row offset."""
    plan = s.plan
    if plan.document_index_length == 0 and comm.rank != comm.size - 1:
        return  # an empty document index: its single row belongs to the last rank alone
    total = int(ends[-1]) if len(ends) else 0
    ends += start
    k0, k1 = sample_rows_in_slice(plan, p0, p1, start, start + total)
    if k1 > k0:
        rows = sample_index_rows(plan, ends, start, p0, k0, k1)
        with NpyWriter(sample_path, plan.sample_index_dtype, plan.sample_index_shape) as w:
            w.write_rows(k0, rows)
            w.fsync()
