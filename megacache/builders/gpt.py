"""Megatron-exact GPTDataset index caches for any number of datasets, every rank building a slice.

A *request* is one GPTDataset family (a prefix, its split, samples per split); a *task* is one split
of one request, i.e. one cache entry. A blend of 1000 prefixes is 1000 requests and up to 3000
tasks, built by the same four steps as a single prefix:

1. Plan: each dataset surveyed by one rank (``survey_datasets``): its counts, dtype and each
   split's tokens per epoch from three entries of its index (``split_tokens``: the pointers span
   the split's sequences); the surveys allgathered, every rank plans every task identically: the
   same epochs, sample counts and dtypes, hence every file's shape. O(splits) per rank, whatever
   the corpus; no lengths are read, and a rank opens only the datasets it surveys or reads.
   Whoever reads a split's lengths later checks their sum (``check_tokens``) and records their
   checksum for the drift check: a small task's owner, all ranks together for the large ones
   (``measure_lengths``) and for entries found existing.
2. Document index: one serial MT19937 Fisher–Yates per task, on the task's owner (tasks spread over
   ranks by cost, largest first). The RNG state it leaves
   is the shuffle index's starting state and the shuffle index's length is in the plan, so the
   owner hands the shuffle index to a background thread (the numba kernel releases the GIL) at once.
3. Sample index: a small task's owner computes it at once from the document index in memory and
   writes each array in one go (a blend of many small datasets is bound by per-file costs). The
   document indices of the large tasks are laid end to end and cut evenly over the ranks, so a
   large dataset is shared by many ranks. Each rank computes the token totals of its pieces;
   the only piece that needs tokens from other ranks is its first (a task that started on an
   earlier rank), which one small allgather supplies. Each rank writes the rows its pieces own
   in place.
4. Owners join their shuffle threads, fsync, and publish their tasks (arrays first, the description
   last: Megatron's cache hit needs every file, so a reader never sees part of an entry).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..algorithms.gpt_index import (GPTIndexPlan, build_document_index, build_sample_index,
                                    build_shuffle_index, length_stats, piece_tokens, sample_index_rows,
                                    sample_rows_in_piece)
from ..algorithms.permutation import MT19937
from ..algorithms.splits import split_ranges
from ..runtime.comm import Comm
from ..errors import MegacacheError
from ..megatron.cache import SPLIT_NAMES, CacheEntry, gpt_identifiers
from .config import BuildConfig
from .publish import publish_entries, write_description
from ..formats.indexed import IndexedDataset, idx_path
from ..formats.npy import BackgroundWrites, NpyWriter, load_npy, npy_image, open_memmap
from ..runtime.fsio import Staging, sync_filesystems, write_new_file, writing
from ..runtime.object_storage import download, is_object_storage, local_copy
from ..runtime.progress import Progress
from .scheduling import even_pieces, largest_first_groups

#: arrays one rank computes whole are built in memory up to this size, else in a memory map
IN_MEMORY_BYTES = 16 << 20
#: a task's sample index is shared by all ranks when its document index is more than this share
#: of one rank's part of all document indices (and always when it is too large for memory)
SHARED_FRACTION = 0.25
#: sequence lengths read per block when summing them
READ_BLOCK = 1 << 24
#: document-index positions a rank walks per call when it sums tokens and writes sample-index rows
#: of a shared task: progress is seen as each call ends, and per-call costs stay negligible
WALK_STEP = 1 << 24
#: threads that open datasets and read their split bounds when those reads wait on the filesystem
IO_THREADS = 16
#: the first this many opens run on the calling thread, to tell a slow filesystem from a fast one...
PROBE_OPENS = 8
#: ... slow: these took over this long on average (seconds each)
SLOW_OPEN_S = 0.5e-3


@dataclass(frozen=True)
class GPTRequest:
    """One prefix's GPTDatasets: which splits, cut how, with how many samples each."""

    data_path: str                      # exactly as Megatron is given it (it is hashed)
    bookends: tuple                     # per split (lo, hi) fractions, None = not built
    sizes: tuple                        # per split requested samples, None = one epoch
    split: str | None                   # the split string as hashed (None for per-split blends)
    hashed_matrix: list | None          # the split matrix as hashed


@dataclass
class GPTTask:
    """One split of one request: one cache entry."""

    index: int                          # position in the build's task list (the same on every rank)
    request: int
    name: str
    data_path: str
    entry: CacheEntry
    plan: GPTIndexPlan
    split_range: tuple[int, int]
    reused: bool = False
    #: of the split's sequence lengths (``length_stats``): measured when the entry is found or built
    length_checksum: int | None = None

    @property
    def marker(self) -> dict:
        """What this entry was built from, beyond what Megatron's hash covers (megacache's drift
        check compares it with the manifest's record)."""
        p = self.plan
        return {
            "dataset": self.data_path, "split_range": list(self.split_range),
            "tokens": p.tokens_per_epoch, "length_checksum": f"{self.length_checksum:016x}",
            "add_extra_token_to_sequence": bool(p.add_extra_token),
            # only the valid split's walk reads it; the others always drop the last partial sample
            "drop_last_partial_sequence": p.drop_last,
            "num_samples": p.num_samples,
            "arrays": array_records(self.arrays),
        }

    @property
    def arrays(self) -> dict:
        """Each array file's dtype and shape."""
        return array_shapes(self.plan)

    @property
    def cost(self) -> int:
        return self.plan.document_index_length + self.plan.shuffle_index_length

    @property
    def summary(self) -> str:
        p = self.plan
        state = "existing cache reused" if self.reused else "built"
        sep = ", final epoch separated" if p.separate_final_epoch else ""
        return (f"  {self.name}: sequences [{self.split_range[0]}, {self.split_range[1]}), "
                f"{p.tokens_per_epoch:,} tokens/epoch, {p.num_epochs} epoch(s){sep}, {p.num_samples:,} samples "
                f"({state})\n    {self.entry.hash}-GPTDataset-{self.name}-*")


def array_records(shapes: dict[str, tuple[np.dtype, tuple]]) -> dict[str, list]:
    """``{file: [dtype, shape]}`` as JSON holds them."""
    return {what: [np.dtype(dtype).str, [int(n) for n in shape]] for what, (dtype, shape) in shapes.items()}


def array_shapes(plan: GPTIndexPlan) -> dict[str, tuple[np.dtype, tuple]]:
    return {
        "document_index.npy": (np.dtype(np.int32), (plan.document_index_length,)),
        "sample_index.npy": (np.dtype(plan.sample_index_dtype), plan.sample_index_shape),
        "shuffle_index.npy": (np.dtype(plan.shuffle_index_dtype), (plan.shuffle_index_length,)),
    }


# ---------------------------------------------------------------------------------------------
# Plan


class Datasets(Mapping):
    """A build's datasets by prefix, each opened (memory-mapped) on first use: a rank opens only
    the datasets it surveys or reads lengths from (1000 prefixes opened by each of 4096 ranks would
    be four million opens on a shared filesystem's metadata server).

    A dataset in a bucket is read from its ``.idx`` copied into ``object_cache`` (Megatron's
    ``--object-storage-cache-path``, at the path Megatron gives its own copy): its surveyor copies
    it (``fetched``), once in all, and every rank opens the copy after, with the ``.bin`` size the
    surveyor asked the store for (``surveyed``): a request per rank per dataset saved."""

    def __init__(self, prefixes, object_cache: str | None = None):
        self._prefixes = dict.fromkeys(prefixes)
        self._opened: dict[str, IndexedDataset] = {}
        self._object_cache = object_cache
        self._bin_sizes: dict[str, int] = {}

    def __getitem__(self, prefix: str) -> IndexedDataset:
        dataset = self._opened.get(prefix)
        if dataset is None:
            if prefix not in self._prefixes:
                raise KeyError(prefix)
            # threads racing to open one prefix keep the first opening
            dataset = self._opened.setdefault(prefix, IndexedDataset(prefix, index_copy=self._index_copy(prefix),
                                                                     bin_size=self._bin_sizes.get(prefix)))
        return dataset

    def surveyed(self, surveys: dict) -> None:
        """The ``.bin`` sizes of the datasets in buckets, from their ``Survey``s."""
        self._bin_sizes.update((p, s.bin_size) for p, s in surveys.items() if is_object_storage(p))

    def _index_copy(self, prefix: str) -> str | None:
        if not is_object_storage(prefix):
            return None
        return local_copy(idx_path(prefix), self._object_cache)

    def fetched(self, prefix: str) -> IndexedDataset:
        """The dataset, its ``.idx`` first copied from its bucket where it is in one."""
        copy = self._index_copy(prefix)
        if copy is not None and prefix not in self._opened:
            download(idx_path(prefix), copy)
        return self[prefix]

    def __iter__(self):
        return iter(self._prefixes)

    def __len__(self) -> int:
        return len(self._prefixes)

    def open(self, prefixes) -> None:
        """Open these prefixes now (``open_all``)."""
        open_all(self.__getitem__, dict.fromkeys(prefixes))

    @property
    def opened(self) -> list[str]:
        """The prefixes this rank has opened."""
        return list(self._opened)


def open_all(fn, items) -> list:
    """``[fn(x) for x in items]`` for a ``fn`` that opens a dataset and reads a few entries: on
    IO_THREADS threads where the filesystem makes each call wait (a shared filesystem's latency,
    a cold disk), else on this thread. The first PROBE_OPENS calls tell which. Where the files are
    local or cached a call is a short run of Python, and threads only hand the GIL around, costing
    several times the CPU of one thread."""
    items = list(items)
    t = time.perf_counter()
    done = [fn(x) for x in items[:PROBE_OPENS]]
    rest = items[PROBE_OPENS:]
    if not rest or time.perf_counter() - t < SLOW_OPEN_S * PROBE_OPENS:
        return done + [fn(x) for x in rest]
    with ThreadPoolExecutor(max_workers=IO_THREADS) as pool:
        return done + list(pool.map(fn, rest))


@dataclass(frozen=True)
class Survey:
    """What planning needs from one dataset's index: its counts, dtype and each split's tokens."""

    sequence_count: int
    document_count: int                 # as the index stores it: documents + 1
    dtype: str
    tokens: dict                        # {(lo, hi): tokens of sequences [lo, hi)}
    bin_size: int                       # the .bin's bytes


def survey_datasets(requests: list[GPTRequest], datasets: Datasets, comm: Comm) -> dict[str, Survey]:
    """Every prefix's ``Survey`` in request order, each taken by one rank (prefixes dealt round
    robin, opened by ``open_all``) and allgathered: each rank holds O(datasets) small records, and
    each dataset is opened by one rank. Errors agreed collectively."""
    bookends: dict[str, set] = {}
    for r in requests:
        bookends.setdefault(r.data_path, set()).add(tuple(r.bookends))

    def take(prefix: str) -> tuple[str, Survey]:
        dataset = datasets.fetched(prefix)
        if len(dataset) == 0:
            raise MegacacheError(f"{prefix}: the dataset has no sequences; there is nothing to sample")
        ranges = sorted({rng for b in bookends[prefix] for rng in split_ranges(list(b), len(dataset))
                         if rng is not None})
        lay = dataset.layout
        return prefix, Survey(lay.sequence_count, lay.document_count, np.dtype(lay.dtype).str,
                              dict(zip(ranges, split_tokens(dataset, ranges))), dataset.bin_size)

    with comm.agreed("opening the datasets"):
        mine = open_all(take, list(bookends)[comm.rank::comm.size])
    surveyed = dict(pair for from_rank in comm.allgather(mine) for pair in from_rank)
    datasets.surveyed(surveyed)
    return {prefix: surveyed[prefix] for prefix in bookends}


def split_tokens(dataset: IndexedDataset, ranges: list[tuple[int, int]]) -> list[int]:
    """Tokens of each sequence range from three entries of the index: the ``.bin`` holds the
    sequences back to back, so their pointers span them. Whoever reads the lengths later
    (``check_tokens``) confirms it; an index whose pointers and lengths disagree is an error."""
    spans = iter(dataset.span_bytes([r for r in ranges if r[1] > r[0]]))
    out = []
    for lo, hi in ranges:
        first, end = next(spans) if hi > lo else (0, 0)
        out.append((end - first) // dataset.dtype.itemsize)
    return out


def check_tokens(task: GPTTask, tokens: int, checksum: int) -> None:
    """Record a task's length checksum once its lengths are read, and check their sum against
    the plan's tokens (from the pointers)."""
    if tokens != task.plan.tokens_per_epoch:
        lo, hi = task.split_range
        raise MegacacheError(
            f"{task.data_path}.idx: the lengths of sequences [{lo}, {hi}) sum to {tokens:,} tokens but their "
            f"pointers span {task.plan.tokens_per_epoch:,}: the index is inconsistent (megacache verify "
            f"{task.data_path} locates it); re-create the dataset")
    task.length_checksum = checksum


def _length_stats_read(dataset: IndexedDataset, lo: int, hi: int) -> tuple[int, int]:
    """``(tokens, checksum)`` of sequences ``[lo, hi)`` (``length_stats``), read in bounded blocks."""
    tokens = checksum = 0
    for a in range(lo, hi, READ_BLOCK):
        t, _, c = length_stats(dataset.read_lengths(a, min(hi, a + READ_BLOCK)), a)
        tokens, checksum = tokens + t, (checksum + c) % 2**64
    return tokens, checksum


def measure_lengths(tasks: list[GPTTask], datasets: Datasets, comm: Comm) -> None:
    """Every task's lengths read once, collectively (the split ranges laid end to end and cut
    evenly over the ranks, one allgather): its checksum recorded and its tokens checked. Every
    rank calls it, with the same tasks (none is fine)."""
    mine = []
    with comm.agreed("reading sequence lengths"):
        for i, a, b in even_pieces([hi - lo for lo, hi in (j.split_range for j in tasks)], comm.rank, comm.size):
            lo = tasks[i].split_range[0]
            mine.append((i, *_length_stats_read(datasets[tasks[i].data_path], lo + a, lo + b)))
    totals = [[0, 0] for _ in tasks]
    for from_rank in comm.allgather(mine):
        for i, tokens, checksum in from_rank:
            totals[i][0] += tokens
            totals[i][1] = (totals[i][1] + checksum) % 2**64
    with comm.agreed("checking sequence lengths"):
        for task, (tokens, checksum) in zip(tasks, totals):
            check_tokens(task, tokens, checksum)


def plan_tasks(requests: list[GPTRequest], cfg: BuildConfig, surveys: dict[str, Survey]) -> list[GPTTask]:
    """Every request's non-None splits as tasks with their plans (identical on every rank, from the
    datasets' surveys: no lengths are read), in request order then split order; whether each entry
    exists already is decided on rank 0."""
    tasks = []
    for k, r in enumerate(requests):
        survey = surveys[r.data_path]
        for i, (name, rng) in enumerate(zip(SPLIT_NAMES, split_ranges(list(r.bookends), survey.sequence_count))):
            if rng is None:
                continue
            tokens = survey.tokens[rng]
            size = r.sizes[i]
            if tokens == 0 and size is not None and (size > 0 or cfg.add_extra_token):
                what = "empty" if rng[0] == rng[1] else "made of empty sequences"
                raise MegacacheError(
                    f"{r.data_path}: the {name} split is {what} ({r.split!r} of {survey.sequence_count} "
                    f"sequences gives [{rng[0]}, {rng[1]})) but {size} samples are requested from it; "
                    f"megatron-core would loop forever. Change --split, or request no {name} samples")
            try:
                plan = GPTIndexPlan.from_counts(num_documents=rng[1] - rng[0], tokens_per_epoch=tokens,
                                                num_samples=size, seq_length=cfg.seq_length,
                                                add_extra_token=int(cfg.add_extra_token),
                                                drop_last=cfg.drop_last(name))
            except MegacacheError as exc:
                raise MegacacheError(f"{r.data_path}, {name} split: {exc}") from None
            ids = gpt_identifiers(dataset_path=r.data_path, num_samples=plan.requested_samples, split_name=name,
                                  random_seed=cfg.seed, seq_length=cfg.seq_length, split=r.split,
                                  split_matrix=r.hashed_matrix, tokenizer=cfg.tokenizer)
            tasks.append(GPTTask(len(tasks), k, name, r.data_path, CacheEntry(cfg.cache_path(r.data_path), ids),
                                 plan, rng))
    return tasks


# ---------------------------------------------------------------------------------------------
# Build


class GPTBuild:
    """The tasks still to build, their temporary files, and who owns which."""

    def __init__(self, tasks: list[GPTTask], datasets: Datasets, seed: int,
                 comm: Comm, tag: str, progress: Progress):
        self.todo = [j for j in tasks if not j.reused]
        self.datasets, self.comm, self.progress = datasets, comm, progress
        total = sum(j.plan.document_index_length for j in self.todo)
        self.shared = [j for j in self.todo if j.plan.document_index_length * 4 > IN_MEMORY_BYTES
                       or (comm.size > 1 and j.plan.document_index_length > SHARED_FRACTION * total / comm.size)]
        self.shared_ids = {j.index for j in self.shared}
        # A dataset's own tasks (its splits) go to one rank, which then opens only its own datasets'
        # indexes; a shared task, which every rank works on, is placed on its own.
        self.owners = largest_first_groups([j.cost for j in self.todo],
                                           [(j.index,) if j.index in self.shared_ids else j.data_path
                                            for j in self.todo], comm.size)
        self.mine = [j for j, o in zip(self.todo, self.owners) if o == comm.rank]
        self.published = False
        # this rank's tasks' files until they are published
        self.staging = Staging(tag)
        # every task's generator starts as a copy of this one (seeding is 624 steps; copying it, one)
        self.seeded = MT19937.from_seed(seed)

    def build(self, phases: dict[str, float], enter=lambda phase: None) -> None:
        """``enter(phase)`` is told each phase as it starts (the job's rank monitor). Small tasks'
        sample and shuffle indices are made beside the document indices, so the three progress
        phases start together."""
        self.progress.phase("document index", sum(j.plan.document_index_length for j in self.todo), "documents")
        self.progress.phase("sample index", sum(j.plan.sample_index_shape[0] for j in self.todo), "samples")
        self.progress.phase("shuffle index", sum(j.plan.shuffle_index_length for j in self.todo), "samples")
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="index-pool") as pool:
            enter("document index")
            t = time.monotonic()
            futures: list[Future] = []
            writes = BackgroundWrites(pool, IN_MEMORY_BYTES)
            with self.comm.agreed("building the document indices"):
                self.datasets.open(task.data_path for task in self.mine)
                for task in self.mine:
                    future = self._document_index(task, pool, writes)
                    if future is not None:
                        futures.append(future)
                writes.wait()
            phases["document_index"] = time.monotonic() - t

            enter("sample index")
            t = time.monotonic()
            # A small task's owner read its lengths; a shared task's are read by all ranks.
            measure_lengths(self.shared, self.datasets, self.comm)
            self._sample_index()
            for from_rank in self.comm.allgather({j.index: j.length_checksum for j in self.mine}):
                for j in self.todo:
                    j.length_checksum = from_rank.get(j.index, j.length_checksum)
            phases["sample_index"] = time.monotonic() - t

            enter("shuffle index")
            t = time.monotonic()
            with self.comm.agreed("building the shuffle indices"):
                for f in futures:
                    f.result()
                # Durable before anyone publishes: what this rank wrote, including rows in other
                # ranks' files (their owners' sync would not cover another node's writes).
                sync_filesystems({j.entry.directory for j in self.todo})
            phases["shuffle_index_wait"] = time.monotonic() - t

    def _document_index(self, task: GPTTask, pool: ThreadPoolExecutor, writes: BackgroundWrites) -> Future | None:
        """Shuffle the task's document index on the calling thread. A small task's sample index
        follows at once, and one background job computes its shuffle index and writes its files (a
        job per task, not per file: a blend has thousands of tasks, and each hand-over to the pool
        costs Python time). A shared task's sample index is preallocated for every rank to fill, and the
        future of its shuffle index returned."""
        p = task.plan
        state = self.seeded.copy()
        shuffled = self.progress.counter("document index")
        if task.index not in self.shared_ids:
            document_file, document_index = npy_image(np.int32, (p.document_index_length,))
            build_document_index(task.split_range, p.num_epochs, p.separate_final_epoch, state, out=document_index,
                                 progress=shuffled)
            sizes = self.datasets[task.data_path].read_lengths(*task.split_range)
            tokens, _, checksum = length_stats(sizes, task.split_range[0])
            check_tokens(task, tokens, checksum)
            sample_file, sample_index = npy_image(p.sample_index_dtype, p.sample_index_shape)
            build_sample_index(sizes, document_index, p, task.split_range[0], out=sample_index)
            self.progress.add("sample index", len(sample_index))
            writes.put(document_file.nbytes + sample_file.nbytes, self._finish, task, state, document_file,
                       sample_file)
            return None
        NpyWriter.create(self.staging.path(task.entry.path("sample_index.npy")), p.sample_index_dtype,
                         p.sample_index_shape)
        with self._array(task, "document_index.npy", shared=True) as out:
            build_document_index(task.split_range, p.num_epochs, p.separate_final_epoch, state, out=out,
                                 progress=shuffled)
        write_description(task.entry, self.staging)
        return pool.submit(self._shuffle_index, task, state)

    def _finish(self, task: GPTTask, state: MT19937, document_file: np.ndarray, sample_file: np.ndarray) -> None:
        """A small task's files: its two arrays' (``npy_image``s), its shuffle index, its description."""
        self.staging.write(task.entry.path("document_index.npy"), [document_file])
        self.staging.write(task.entry.path("sample_index.npy"), [sample_file])
        self._shuffle_index(task, state)
        write_description(task.entry, self.staging)

    def _shuffle_index(self, task: GPTTask, state: MT19937) -> None:
        p = task.plan
        with self._array(task, "shuffle_index.npy") as out:
            build_shuffle_index(p.num_samples, p.shuffle_first_range, p.shuffle_index_dtype, state, out=out,
                                progress=self.progress.counter("shuffle index"))

    @contextmanager
    def _array(self, task: GPTTask, what: str, shared: bool = False):
        """An output array one rank computes whole: in memory and written in one go when small
        (one create, no msync: per-file costs dominate a blend of many small datasets), else a
        memory map of the preallocated file, so a huge one never has to fit in memory. A
        ``shared`` one, which other ranks read, is written under its temporary name."""
        final = task.entry.path(what)
        dtype, shape = array_shapes(task.plan)[what]
        if dtype.itemsize * math.prod(shape) <= IN_MEMORY_BYTES:
            file, out = npy_image(dtype, shape)
            yield out
            if shared:
                path = self.staging.path(final)
                with writing(path):
                    write_new_file(path, [file])
            else:
                self.staging.write(final, [file])
        else:
            path = self.staging.path(final)
            NpyWriter.create(path, dtype, shape)
            out = open_memmap(path)
            yield out
            out.flush()

    def _named(self, task: GPTTask, what: str) -> str:
        """The temporary name of a shared task's file, which every rank reads or writes rows into."""
        return self.staging.name(task.entry.path(what))

    def _pieces(self) -> list[tuple[GPTTask, int, int]]:
        """This rank's ``(task, p0, p1)`` pieces of the shared tasks' document indices laid end to end,
        each cut in steps of ``WALK_STEP`` positions (any cut gives the same rows: see
        ``sample_rows_in_piece``); an empty document index is one empty piece."""
        lengths = [j.plan.document_index_length for j in self.shared]
        mine = {i: (a, b) for i, a, b in even_pieces(lengths, self.comm.rank, self.comm.size)}
        # An empty document index still has its one sample-index row: the rank whose share starts
        # at or before its position writes it.
        starts = np.cumsum([0, *lengths[:-1]])
        bounds = np.arange(self.comm.size, dtype=np.int64) * sum(lengths) // self.comm.size  # even_slice starts
        for i, (s, n) in enumerate(zip(starts.tolist(), lengths)):
            if n == 0 and int(np.searchsorted(bounds, s, side="right")) - 1 == self.comm.rank:
                mine[i] = (0, 0)
        return [(self.shared[i], q, min(q + WALK_STEP, b)) for i, (a, b) in sorted(mine.items())
                for q in range(a, max(b, a + 1), WALK_STEP)]

    def _sample_index(self) -> None:
        # Collectives never sit behind fallible local work: a rank that failed would skip them and
        # pair the others' collectives with the wrong calls. So: local sums, agreement, one
        # allgather, then the rows.
        comm = self.comm
        sums = []
        pieces = self._pieces()
        with comm.agreed("summing tokens for the sample indices"):
            for task, p0, p1 in pieces:
                document_index = load_npy(self._named(task, "document_index.npy"))[p0:p1]
                sums.append(piece_tokens(self.datasets[task.data_path].sequence_lengths, document_index))
        # Tokens before this rank's first task's pieces: the pieces of the same task on lower ranks,
        # each of which holds it as its last task.
        first = pieces[0][0].index if pieces else None
        last = pieces[-1][0].index if pieces else None
        mine = (last, sum(t for (task, _, _), t in zip(pieces, sums) if task.index == last)) if pieces else None
        before = 0
        for item in comm.allgather(mine)[: comm.rank]:
            if item is not None and item[0] == first:
                before += item[1]
        with comm.agreed("writing the sample indices"):
            start, at = before, first  # the tokens before each piece in its task's document index
            for (task, p0, p1), total in zip(pieces, sums):
                if task.index != at:
                    start, at = 0, task.index
                self._write_sample_rows(task, p0, p1, total, start)
                start += total

    def _write_sample_rows(self, task: GPTTask, p0: int, p1: int, total: int, start: int) -> None:
        plan = task.plan
        k0, k1 = sample_rows_in_piece(plan, p0, p1, start, start + total)
        if k1 > k0:
            document_index = load_npy(self._named(task, "document_index.npy"))[p0:p1]
            rows = sample_index_rows(plan, self.datasets[task.data_path].sequence_lengths, document_index, start,
                                     p0, k0, k1)
            with NpyWriter(self._named(task, "sample_index.npy"), plan.sample_index_dtype,
                           plan.sample_index_shape) as w:
                w.write_rows(k0, rows)
            self.progress.add("sample index", k1 - k0)

    def publish(self) -> None:
        """This rank's tasks into place."""
        publish_entries((j.entry for j in self.mine), self.staging)
        self.published = True
        self.progress.add("publish", len(self.mine))

    def discard(self) -> None:
        """Drop this rank's unpublished files after a failure."""
        if not self.published:
            self.staging.discard()


@dataclass
class PhaseTimer:
    phases: dict[str, float] = field(default_factory=dict)
    since: float = field(default_factory=time.monotonic)

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.since
        self.since = now
