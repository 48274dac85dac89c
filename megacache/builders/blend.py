"""The BlendedDataset side of ``megacache build``: each blended split as one cache entry
(``BlendTask``, planned by ``plan_blends`` from its children's plans), and ``Blending``, which
computes every blend beside the GPTDataset builds: a long weighted blend cut into one chunk per rank
(each started from a guessed state, then confirmed or repaired in order by ``confirm_chunks``,
exact by construction), a short one whole on one owner; then Megatron's oversampling check and the
publication, a blend after all of its children."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..algorithms.blend_chunks import guess_counts, repair_chunk, unconfirmed_chunks
from ..algorithms.blend_kernels import blend_chunk, build_exhaustive_blending_indices
from ..algorithms.blend_sizes import find_oversampling, normalize, unweighted_blend_size
from ..runtime.comm import Comm
from ..errors import MegacacheError
from ..formats.npy import BackgroundWrites, NpyWriter, open_memmap
from ..runtime.fsio import Staging, make_directories, sync_filesystems
from ..runtime.progress import Progress
from ..megatron.cache import SPLIT_NAMES, CacheEntry, blend_entry
from .config import BuildConfig
from .gpt import GPTTask, array_records
from .publish import publish_entries, write_description
from .scheduling import even_slice, largest_first


#: a blend's arrays and their dtypes (each one sample long)
BLEND_ARRAYS = {"dataset_index.npy": np.dtype(np.int16), "dataset_sample_index.npy": np.dtype(np.int64)}
#: a sample's bytes in both arrays
BLEND_SAMPLE_BYTES = sum(dtype.itemsize for dtype in BLEND_ARRAYS.values())


@dataclass
class BlendTask:
    """One BlendedDataset split: one cache entry."""

    index: int
    name: str
    entry: CacheEntry
    children: list[GPTTask]
    size: int                           # samples
    weights: np.ndarray | None          # the kernel's weights; None: exhaustive over ``lengths``
    lengths: np.ndarray                 # the children's lengths (samples)
    reused: bool = False
    counts: np.ndarray | None = None    # samples taken from each child, once blended
    chunks: int = 1                     # ranks that blended it
    recomputed: int = 0                 # samples recomputed by repairs of wrong chunk guesses

    @property
    def arrays(self) -> dict:
        """Each array file's dtype and shape."""
        return {w: (np.dtype(d), (self.size,)) for w, d in BLEND_ARRAYS.items()}

    @property
    def marker(self) -> dict:
        """What the blend depends on beyond its hashed description: its children's lengths."""
        return {"lengths": self.lengths.tolist(), "arrays": array_records(self.arrays)}

    @property
    def summary(self) -> str:
        state = "existing cache reused" if self.reused else "built"
        kind = "exhaustive" if self.weights is None else "weighted"
        return (f"  {self.name} blend: {len(self.children)} datasets, {self.size:,} samples, {kind} "
                f"({state})\n    {self.entry.hash}-BlendedDataset-{self.name}-*")


def plan_blends(cfg: BuildConfig, blends: list[tuple], tasks: list[GPTTask]) -> list[BlendTask]:
    by_request = {(j.request, j.name): j for j in tasks}
    out = []
    for i, blend, request_ids, targets in blends:
        name = SPLIT_NAMES[i]
        children = [by_request[r, name] for r in request_ids]
        lengths = np.array([c.plan.num_samples for c in children], dtype=np.int64)
        if targets is not None:
            size = int(targets.blend[i])
            # BlendedDataset normalizes the (already normalized) weights once more.
            weights = normalize(normalize(blend.weights))
            described = weights.tolist()
        else:
            empty = np.flatnonzero(lengths == 0)
            if len(empty):
                c = children[int(empty[0])]
                raise MegacacheError(
                    f"{c.data_path}: its {name} split has no samples, so it gets weight 0 in this unweighted "
                    f"blend, which megatron-core rejects. Drop the prefix or give weights")
            size = unweighted_blend_size(cfg.sizes[i], lengths)
            if size is None:
                weights, described = None, lengths.tolist()
            else:
                weights = normalize(lengths)
                described = weights.tolist()
        entry = blend_entry(cfg.cache_dir, [c.entry for c in children], name, described, size)
        out.append(BlendTask(len(out), name, entry, children,
                            int(lengths.sum()) if size is None else size, weights, lengths))
    return out


def confirm_chunks(comm: Comm, weights: np.ndarray, start: int, mine: tuple, rows, what: str) -> tuple[np.ndarray, int]:
    """The chunk protocol's second half (algorithms/blend_chunks), collective: every rank's
    ``(guessed start counts, end counts)`` gathered, then repair rounds: every rank whose chunk's
    start differs from its predecessor's end recomputes it from there at once (usually a short
    stretch), and the new ends are shared, until all agree. ``rows()`` gives this rank's chunk
    arrays (a context manager). Returns the blend's final counts and the samples recomputed."""
    starts, ends = map(list, zip(*comm.allgather(mine)))
    recomputed = 0
    while todo := unconfirmed_chunks(starts, ends):
        i, update = comm.rank, None
        with comm.agreed(f"repairing chunks of {what}"):
            if i in todo:
                with rows() as (idx, sidx):
                    repaired = repair_chunk(weights, start, ends[i - 1], starts[i], ends[i], idx, sidx)
                update = (ends[i - 1], repaired.end_counts, repaired.recomputed)
        for j, changed in enumerate(comm.allgather(update)):
            if changed is not None:
                starts[j], ends[j], fixed = changed
                recomputed += fixed
    return ends[-1], recomputed


class BlendFiles:
    """One weighted blend computed into its arrays' files (``paths``: each array's file, made at
    its full size beforehand), blended block by block into private buffers: memory O(block), where
    a memory map of the output would keep every written page resident. Whole by one rank
    (``rows``), or one chunk per rank: ``speculate`` from a guessed start, then ``confirm``."""

    def __init__(self, weights: np.ndarray, size: int, paths: dict[str, str], block: int, warmup: int,
                 counted: Callable[[int], None] | None = None):
        self.weights, self.size, self.paths, self.block, self.warmup = weights, size, paths, block, warmup
        self.counted = counted  # told the samples blended, a block at a time

    def rows(self, s0: int, s1: int, counts: np.ndarray | None) -> np.ndarray:
        """Samples ``[s0, s1)`` from the counts at ``s0`` (None: the start) into the files;
        returns the counts at ``s1``. Each block is written on a second thread while the next one
        is blended into the other of two buffers: a direct write holds its thread until the device
        has the data, and a long blend is what a big build waits for last."""
        n0 = min(self.block, s1 - s0)
        buffers = [{what: np.empty(n0, dtype) for what, dtype in BLEND_ARRAYS.items()} for _ in range(2)]
        writers = [NpyWriter(self.paths[what], dtype, (self.size,)) for what, dtype in BLEND_ARRAYS.items()]

        def write(first: int, arrays: tuple[np.ndarray, ...]) -> None:
            for writer, rows in zip(writers, arrays):
                writer.write_rows(first, rows)

        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="blend-writes") as pool:
                # one block in flight: the buffer a block is blended into was written two blocks ago
                writes = BackgroundWrites(pool, n0 * BLEND_SAMPLE_BYTES)
                for k, a in enumerate(range(s0, s1, self.block)):
                    n = min(self.block, s1 - a)
                    arrays = tuple(buffers[k % 2][what][:n] for what in BLEND_ARRAYS)
                    counts = blend_chunk(self.weights, a, counts, *arrays)
                    writes.put(n * BLEND_SAMPLE_BYTES, write, a, arrays)
                    if self.counted is not None:
                        self.counted(n)
                writes.wait()
        finally:  # after the pool's last write, failed or not
            for writer in writers:
                writer.close()
        return counts if counts is not None else np.zeros(len(self.weights), dtype=np.int64)

    def speculate(self, comm: Comm) -> tuple[np.ndarray, np.ndarray]:
        """This rank's chunk from guessed start counts: ``(the guess, the chunk's end counts)``."""
        s0, s1 = even_slice(self.size, comm.rank, comm.size)
        guess = guess_counts(self.weights, s0, self.warmup)
        return guess, self.rows(s0, s1, guess)

    def confirm(self, comm: Comm, mine: tuple, what: str) -> tuple[np.ndarray, int]:
        """Collective, after ``speculate`` on every rank: ``confirm_chunks`` over the files, giving
        the blend's final counts and the samples recomputed."""
        s0, s1 = even_slice(self.size, comm.rank, comm.size)

        @contextmanager
        def rows():
            idx, sidx = (open_memmap(self.paths[w]) for w in BLEND_ARRAYS)
            yield idx[s0:s1], sidx[s0:s1]
            idx.flush()
            sidx.flush()

        return confirm_chunks(comm, self.weights, s0, mine, rows, what)


class Blending:
    """The blends to compute: each either chunked over all ranks or whole on one owner."""

    def __init__(self, todo: list[BlendTask], cfg: BuildConfig, comm: Comm, tag: str, progress: Progress):
        self.todo, self.cfg, self.comm, self.progress = todo, cfg, comm, progress
        # the blend files wait under temporary names (every rank writes rows into them), rank 0's
        # staging publishes them
        self.staging = Staging(tag)
        self.tmp = {(b.index, what): self.staging.name(b.entry.path(what)) for b in todo for what in BLEND_ARRAYS}
        self.files = {b.index: BlendFiles(b.weights, b.size, {what: self.tmp[b.index, what] for what in BLEND_ARRAYS},
                                          cfg.blend_block, cfg.blend_warmup, progress.counter("blend"))
                      for b in todo if b.weights is not None}
        self.chunked = [b for b in todo if b.weights is not None and comm.size > 1
                        and b.size // comm.size >= cfg.blend_min_chunk]
        chunked = {b.index for b in self.chunked}
        whole = [b for b in todo if b.index not in chunked]
        self.owners = dict(zip((b.index for b in whole), largest_first([b.size for b in whole], comm.size)))

    def start(self) -> None:
        """Preallocate the outputs, then compute this rank's share (whole blends it owns, its chunk
        of the long ones) on a background thread: the kernels release the GIL, so the blend runs
        while this rank builds GPT datasets, which mostly wait on the filesystem."""
        def preallocate() -> None:
            make_directories(self.cfg.cache_dir)
            for b in self.todo:
                for what, dtype in BLEND_ARRAYS.items():
                    NpyWriter.create(self.staging.path(b.entry.path(what)), dtype, (b.size,))
                write_description(b.entry, self.staging)

        if self.todo:
            self.comm.on_root(preallocate, "preallocating the blend files")
            # each sample blended once: whole blends by their owners, the others in one chunk per rank
            self.progress.phase("blend", sum(b.size for b in self.todo), "samples")
        self._counts: dict[int, np.ndarray] = {}
        self._speculated: dict[int, tuple] = {}
        self._error: BaseException | None = None

        def work() -> None:
            try:
                for b in self.todo:
                    if self.owners.get(b.index) == self.comm.rank:
                        self._counts[b.index] = self._whole(b)
                for b in self.chunked:
                    self._speculated[b.index] = self.files[b.index].speculate(self.comm)
            except BaseException as exc:  # reported collectively in finish()
                self._error = exc

        self._thread = threading.Thread(target=work, name="blend", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """Join the thread, repair the chunks in order (collective), share every blend's counts."""
        comm = self.comm
        self._thread.join()
        comm.check(self._error, "blending")
        counts = self._counts
        for b in self.chunked:
            counts[b.index], b.recomputed = self.files[b.index].confirm(comm, self._speculated[b.index],
                                                                        f"the {b.name} blend")
            b.chunks = comm.size
        with comm.agreed("syncing the blend files"):
            if self.todo:  # this rank's blend writes durable before rank 0 publishes (other nodes too)
                sync_filesystems([self.cfg.cache_dir])
        for from_rank in comm.allgather({k: v for k, v in counts.items() if self.owners.get(k) == comm.rank}):
            counts.update(from_rank)
        for b in self.todo:
            b.counts = counts[b.index]

    def _whole(self, b: BlendTask) -> np.ndarray:
        if b.weights is not None:
            return self.files[b.index].rows(0, b.size, None)
        idx, sidx = (open_memmap(self.tmp[b.index, what]) for what in BLEND_ARRAYS)
        idx[:], sidx[:] = build_exhaustive_blending_indices(b.lengths)
        idx.flush()
        sidx.flush()
        self.progress.add("blend", b.size)
        return b.lengths.copy()

    def check_oversampling(self) -> None:
        """Megatron's IndexError, as an error naming the dataset, before anything is published."""
        for b in self.todo:
            over = find_oversampling(b.counts, b.lengths)
            if over:
                o = over[0]
                raise MegacacheError(
                    f"the {b.name} blend takes {o.requested:,} samples from {b.children[o.dataset].data_path} "
                    f"(dataset {o.dataset}), which has only {o.available:,}"
                    + (f" ({len(over) - 1} more datasets likewise)" if len(over) > 1 else "")
                    + "; megatron-core raises IndexError here. Raise mid_level_dataset_surplus "
                      "(--mid-level-dataset-surplus) or the dataset's weight")

    def publish(self) -> None:
        """Rank 0: the blends into place."""
        publish_entries((b.entry for b in self.todo), self.staging)
        self.progress.add("publish", len(self.todo))

    def discard(self) -> None:
        """After a failure elsewhere: let the thread end (no work left running), remove the files."""
        if getattr(self, "_thread", None) is not None:
            self._thread.join()
        self.staging.discard()
