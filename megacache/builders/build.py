"""``megacache build``: every cache megatron-core 0.16.1's BlendedMegatronDatasetBuilder would
write for a configuration (one prefix, a weighted or unweighted blend, per-split blends), built by
all ranks together.

Order of work, chosen so that nothing is wasted and nothing partial is visible:

1. Plan: parse and check the data flags, open every prefix, plan every GPTDataset job
   (``gpt.plan_jobs``) and every blend (sizes, weights as Megatron derives them), and ask rank 0
   which entries exist already.
2. Blends alongside the children: a blend needs only its weights and size (and, unweighted, its
   children's lengths, which the plan knows), so each rank computes its share on a background
   thread while it builds GPTDataset jobs (``gpt.GPTBuild``), which mostly wait on the filesystem.
   A long blend is cut into one chunk per rank, each started from a guessed state; the chunks are
   then repaired in order (``algorithms.blend``), exact by construction; a short one runs whole on
   one rank.
3. Megatron's oversampling check (an error naming the dataset), before anything is published.
4. Publish: every GPT entry, then the blends (a blend appears only after all its children).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..algorithms.blend import (DEFAULT_SURPLUS, DEFAULT_WARMUP, blend_chunk, blend_split_sizes,
                                build_exhaustive_blending_indices, find_oversampling,
                                first_unconfirmed_chunk, guess_counts, normalize, repair_chunk,
                                unweighted_blend_size)
from ..algorithms.checks import integer
from ..algorithms.splits import split_matrix
from ..megatron.blends import Blend
from ..comm import Comm, get_comm
from ..errors import MegacacheError
from ..megatron.cache import SPLIT_NAMES, CacheEntry, blend_entry, existing
from .publish import publish_entries, read_manifest, update_manifest
from ..formats.npy import NpyWriter, read_npy_header
from ..fsio import remove_quietly, sync_filesystems, tmp_path, write_atomic
from ..coordination import ALL, guarded, tidy
from ..megatron.sequences import default_path, sequences_json
from ..megatron.training import DEFAULT_SPLIT
from ..megatron.versions import resolve
from .gpt import (GPTBuild, GPTJob, GPTRequest, GPTSettings, PhaseTimer, array_records, open_datasets,
                  plan_jobs)
from .scheduling import even_slice, largest_first

#: a blend's arrays and their dtypes (each one sample long)
BLEND_ARRAYS = {"dataset_index.npy": np.dtype(np.int16), "dataset_sample_index.npy": np.dtype(np.int64)}
#: the lock key of a cache directory
CACHE_LOCK = "cache"


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
    seed: int = 1234
    cache_dir: str | None = None        # --data-cache-path
    add_extra_token: bool = True
    drop_last_partial_validation: bool = True
    surplus: float = DEFAULT_SURPLUS    # mid_level_dataset_surplus
    #: a blend is cut over ranks only when each rank's chunk is at least this long
    blend_min_chunk: int = 4 * DEFAULT_WARMUP
    #: greedy steps each chunk's guessed start state is run for
    blend_warmup: int = DEFAULT_WARMUP
    #: replace existing entries that megacache's manifest shows were built from other data or
    #: settings (else that is an error)
    rebuild_stale: bool = False
    #: where to write Megatron's --per-dataset-sequences-path JSON (default: in ``cache_dir``, as
    #: ``megatron.sequences.FILE_NAME``; "" writes none)
    sequences_path: str | None = None

    @classmethod
    def for_prefix(cls, data_path: str, **fields) -> "BuildConfig":
        """One prefix without a weight: plain GPTDatasets, as ``--data-path PREFIX``."""
        return cls(blend=Blend((data_path,)), **fields)

    @property
    def settings(self) -> GPTSettings:
        return GPTSettings(self.seq_length, self.tokenizer, self.seed, self.cache_dir, self.add_extra_token,
                           self.drop_last_partial_validation)


@dataclass
class BlendJob:
    """One BlendedDataset split: one cache entry."""

    index: int
    name: str
    entry: CacheEntry
    children: list[GPTJob]
    size: int                           # samples
    weights: np.ndarray | None          # the kernel's weights; None: exhaustive over ``lengths``
    lengths: np.ndarray                 # the children's lengths (samples)
    reused: bool = False
    counts: np.ndarray | None = None    # samples taken from each child, once blended
    chunks: int = 1                     # ranks that blended it
    recomputed: int = 0                 # samples recomputed by repairs of wrong chunk guesses

    @property
    def marker(self) -> dict:
        """What the blend depends on beyond its hashed description: its children's lengths."""
        return {"lengths": self.lengths.tolist(),
                "arrays": array_records({w: (d, (self.size,)) for w, d in BLEND_ARRAYS.items()})}

    @property
    def summary(self) -> str:
        state = "existing cache reused" if self.reused else "built"
        kind = "exhaustive" if self.weights is None else "weighted"
        return (f"  {self.name} blend: {len(self.children)} datasets, {self.size:,} samples, {kind} "
                f"({state})\n    {self.entry.hash}-BlendedDataset-{self.name}-*")


@dataclass
class BuildResult:
    gpt: list[GPTJob]
    blends: list[BlendJob]
    seconds: float
    ranks: int
    megatron_version: str
    phases: dict[str, float] = field(default_factory=dict)
    sequences_path: str | None = None   # Megatron's per-dataset sequences file, when written


# ---------------------------------------------------------------------------------------------
# Plan


def _check_sizes(cfg: BuildConfig) -> None:
    if len(cfg.sizes) != 3:
        raise MegacacheError(f"sizes must give train, valid and test, got {cfg.sizes!r}")
    for name, n in zip(SPLIT_NAMES, cfg.sizes):
        if n is not None:
            integer(f"the {name} sample count", n)
    if not 0 <= cfg.surplus < 1e6:  # NaN fails this too
        raise MegacacheError(f"mid_level_dataset_surplus must be >= 0, got {cfg.surplus!r}")


def _plan_requests(cfg: BuildConfig) -> tuple[list[GPTRequest], list[tuple]]:
    """The GPTDataset requests and, per blended split, ``(split i, blend, request ids, targets)``
    where targets are the per-dataset target sizes (weighted) or None."""
    if (cfg.blend is None) == (cfg.blend_per_split is None):
        raise MegacacheError("give the data as one blend (--data-path) or per split (--train-data-path, ...)")
    requests: list[GPTRequest] = []
    blends: list[tuple] = []

    def add_blend(blend: Blend, bookends: tuple, sizes: tuple, split: str | None, hashed, splits) -> None:
        for i in splits:
            if sizes[i] is None and blend.weights is not None:
                raise MegacacheError(
                    f"the {SPLIT_NAMES[i]} split has weights but no sample count (full validation?): "
                    f"megatron-core asserts that splits without a size have no weights. Drop the weights "
                    f"or give the split a size")
        if blend.weights is None:
            per_dataset = [(None, None, None)] * len(blend.prefixes)
            targets = None
        else:
            w = normalize(blend.weights)
            bs = blend_split_sizes(w, [0 if s is None else s for s in sizes], cfg.surplus)
            per_dataset = [tuple(int(v) for v in row) for row in bs.per_dataset]
            targets = bs
        first = len(requests)
        for prefix, per in zip(blend.prefixes, per_dataset):
            requests.append(GPTRequest(prefix, bookends, per, split, hashed))
        for i in splits:
            blends.append((i, blend, list(range(first, len(requests))), targets))

    if cfg.blend is not None:
        matrix = split_matrix(cfg.split)
        hashed = [list(b) if b is not None else None for b in matrix]
        built = [i for i in range(3) if matrix[i] is not None]
        if cfg.blend.is_single:
            requests.append(GPTRequest(cfg.blend.prefixes[0], tuple(matrix), tuple(cfg.sizes), cfg.split, hashed))
        else:
            add_blend(cfg.blend, tuple(matrix), tuple(cfg.sizes), cfg.split, hashed, built)
        return requests, blends

    if cfg.split not in (None, DEFAULT_SPLIT):
        raise MegacacheError("--split does not apply to per-split data paths (megatron-core asserts)")
    if len(cfg.blend_per_split) != 3 or not any(cfg.blend_per_split):
        raise MegacacheError("per-split data needs a blend (or None) for each of train, valid and test")
    for i, blend in enumerate(cfg.blend_per_split):
        if blend is None:
            continue
        # Megatron builds each split in isolation: the whole prefix as split i, zero samples elsewhere.
        bookends = tuple((0.0, 1.0) if j == i else None for j in range(3))
        sizes = tuple(cfg.sizes[i] if j == i else 0 for j in range(3))
        if len(blend.prefixes) == 1:  # even with a weight: straight to a GPTDataset
            requests.append(GPTRequest(blend.prefixes[0], bookends, sizes, None, None))
        else:
            add_blend(blend, bookends, sizes, None, None, [i])
    return requests, blends


def _blend_jobs(cfg: BuildConfig, blends: list[tuple], jobs: list[GPTJob]) -> list[BlendJob]:
    by_request = {(j.request, j.name): j for j in jobs}
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
        out.append(BlendJob(len(out), name, entry, children,
                            int(lengths.sum()) if size is None else size, weights, lengths))
    return out


def _check_dtypes(datasets: dict) -> None:
    dtypes: dict = {}
    for prefix, ds in datasets.items():
        dtypes.setdefault(np.dtype(ds.dtype), prefix)
    if len(dtypes) > 1:
        shown = ", ".join(f"{p} holds {d}" for d, p in dtypes.items())
        raise MegacacheError(f"the blended datasets have different token dtypes ({shown}); tokenize them with "
                             f"one tokenizer (one vocabulary) before blending")


# ---------------------------------------------------------------------------------------------
# Blending


def confirm_chunks(comm: Comm, weights: np.ndarray, start: int, mine: tuple, rows, what: str) -> tuple[np.ndarray, int]:
    """The chunk protocol's second half, collective: every rank's ``(guessed start counts, end
    counts)`` gathered, the chunks confirmed in order; the first whose guessed start differs from
    its predecessor's true end is recomputed by its rank from there (usually a short stretch).
    ``rows()`` gives this rank's chunk arrays (a context manager). Returns the blend's final counts
    and the samples recomputed."""
    starts, ends = map(list, zip(*comm.allgather(mine)))
    recomputed = 0
    while (i := first_unconfirmed_chunk(starts, ends)) is not None:

        def repair() -> tuple[np.ndarray, int]:
            with rows() as (idx, sidx):
                return repair_chunk(weights, start, ends[i - 1], starts[i], ends[i], idx, sidx)

        ends[i], fixed = comm.on_root(repair, f"repairing chunk {i} of {what}", root=i)
        starts[i] = ends[i - 1]
        recomputed += fixed
    return ends[-1], recomputed


class Blending:
    """The blends to compute: each either chunked over all ranks or whole on one owner."""

    def __init__(self, todo: list[BlendJob], cfg: BuildConfig, comm: Comm, tag: str):
        self.todo, self.cfg, self.comm = todo, cfg, comm
        self.tmp = {(b.index, what): tmp_path(b.entry.path(what), tag) for b in todo
                    for what in (*BLEND_ARRAYS, "description.txt")}
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
            os.makedirs(self.cfg.cache_dir, exist_ok=True)
            for b in self.todo:
                for what, dtype in BLEND_ARRAYS.items():
                    NpyWriter.create(self.tmp[b.index, what], dtype, (b.size,))

        if self.todo:
            self.comm.on_root(preallocate, "preallocating the blend files")
        self._counts: dict[int, np.ndarray] = {}
        self._speculated: dict[int, tuple] = {}
        self._error: BaseException | None = None

        def work() -> None:
            try:
                for b in self.todo:
                    if self.owners.get(b.index) == self.comm.rank:
                        self._counts[b.index] = self._whole(b)
                for b in self.chunked:
                    self._speculated[b.index] = self._speculate(b)
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
            counts[b.index] = self._repair(b, self._speculated[b.index])
        with comm.agreed("syncing the blend files"):
            if self.todo:  # this rank's blend writes durable before rank 0 publishes (other nodes too)
                sync_filesystems([self.cfg.cache_dir])
        for part in comm.allgather({k: v for k, v in counts.items() if self.owners.get(k) == comm.rank}):
            counts.update(part)
        for b in self.todo:
            b.counts = counts[b.index]

    def _outputs(self, b: BlendJob) -> tuple[np.ndarray, np.ndarray]:
        return (np.lib.format.open_memmap(self.tmp[b.index, "dataset_index.npy"], mode="r+"),
                np.lib.format.open_memmap(self.tmp[b.index, "dataset_sample_index.npy"], mode="r+"))

    def _whole(self, b: BlendJob) -> np.ndarray:
        idx, sidx = self._outputs(b)
        if b.weights is None:
            i, s = build_exhaustive_blending_indices(b.lengths)
            idx[:], sidx[:] = i, s
            counts = b.lengths.copy()
        else:
            counts = blend_chunk(b.weights, 0, None, idx, sidx)
        idx.flush()
        sidx.flush()
        return counts

    def _chunk(self, b: BlendJob) -> tuple[int, int]:
        return even_slice(b.size, self.comm.rank, self.comm.size)

    def _speculate(self, b: BlendJob) -> tuple[np.ndarray, np.ndarray]:
        s0, s1 = self._chunk(b)
        idx, sidx = self._outputs(b)
        guess = guess_counts(b.weights, s0, self.cfg.blend_warmup)
        end = blend_chunk(b.weights, s0, guess, idx[s0:s1], sidx[s0:s1])
        idx.flush()
        sidx.flush()
        return guess, end

    def _repair(self, b: BlendJob, mine: tuple) -> np.ndarray:
        @contextmanager
        def rows():
            s0, s1 = self._chunk(b)
            idx, sidx = self._outputs(b)
            yield idx[s0:s1], sidx[s0:s1]
            idx.flush()
            sidx.flush()

        end, b.recomputed = confirm_chunks(self.comm, b.weights, self._chunk(b)[0], mine, rows, f"the {b.name} blend")
        b.chunks = self.comm.size
        return end

    def check_oversampling(self) -> None:
        """Megatron's IndexError, as an error naming the dataset, before anything else is built."""
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
        publish_entries((b.entry, {w: self.tmp[b.index, w] for w in (*BLEND_ARRAYS, "description.txt")})
                        for b in self.todo)

    def discard(self) -> None:
        """After a failure elsewhere: let the thread end (no work left running), remove the files."""
        if getattr(self, "_thread", None) is not None:
            self._thread.join()
        if self.comm.rank == 0:
            for path in self.tmp.values():
                remove_quietly(path)


# ---------------------------------------------------------------------------------------------
# Build


@dataclass
class Plan:
    """Every cache entry a configuration needs, whether it exists, and the opened datasets."""

    gpt: list[GPTJob]
    blends: list[BlendJob]
    datasets: dict
    megatron_version: str

    @property
    def items(self) -> list:
        return [*self.gpt, *self.blends]

    @property
    def todo(self) -> list:
        return [item for item in self.items if not item.reused]


def drift(item, record: dict | None) -> list[str]:
    """How an existing entry differs from what ``item`` would build: against megacache's manifest
    record when there is one, else (an entry megatron-core or an older tool wrote) by the arrays'
    dtypes and shapes, read from their headers."""
    expected = item.marker
    if record is None:
        found = array_records({w: read_npy_header(item.entry.path(w)) for w in expected["arrays"]})
        record = {"arrays": found}
        expected = {"arrays": expected["arrays"]}
    return [f"{key}: built with {record.get(key)!r}, this configuration gives {value!r}"
            for key, value in expected.items() if record.get(key) != value]


def _reuse(items: list, rebuild_stale: bool) -> list[bool]:
    """Which entries exist and may be reused (rank 0). An existing entry that drifted is an error,
    or (``rebuild_stale``) rebuilt."""
    hits = existing([item.entry for item in items])
    manifests = {d: read_manifest(d) for d in {item.entry.directory for item, hit in zip(items, hits) if hit}}
    stale = []
    for n, (item, hit) in enumerate(zip(items, hits)):
        if hit:
            problems = drift(item, manifests[item.entry.directory].get(item.entry.stem))
            if problems:
                stale.append((item, problems))
                hits[n] = False
    if stale and not rebuild_stale:
        shown = "\n".join(f"  {item.entry.path('description.txt')}: " + "; ".join(problems)
                           for item, problems in stale[:5])
        more = f"\n  ... and {len(stale) - 5} more" if len(stale) > 5 else ""
        raise MegacacheError(
            f"{len(stale)} existing cache entr{'y was' if len(stale) == 1 else 'ies were'} built from other data or "
            f"settings than this configuration's, which megatron-core's hash does not cover (it would reuse "
            f"them silently):\n{shown}{more}\nPass --rebuild-stale (BuildConfig.rebuild_stale) to replace them, "
            f"or use another --data-cache-path")
    return hits


def plan(cfg: BuildConfig, comm: Comm | None = None) -> Plan:
    """The entries of ``cfg`` (identical on every rank of ``comm``; a ``SingleComm`` plans alone,
    reading every sequence length itself, with no collective)."""
    comm = comm or get_comm()
    version = resolve(cfg.megatron_version)
    settings = cfg.settings
    settings.validate()
    _check_sizes(cfg)
    if cfg.cache_dir is not None and os.path.exists(cfg.cache_dir) and not os.path.isdir(cfg.cache_dir):
        raise MegacacheError(f"--data-cache-path {cfg.cache_dir}: exists and is not a directory; give a directory")
    requests, blend_specs = _plan_requests(cfg)
    if blend_specs and cfg.cache_dir is None:
        raise MegacacheError(
            "a blend is only cached under --data-cache-path (without it megatron-core rebuilds the blend "
            "in memory on every rank): give --data-cache-path, and the same to training")
    datasets = open_datasets([r.data_path for r in requests], comm)
    if blend_specs:
        _check_dtypes(datasets)
    jobs = plan_jobs(requests, settings, datasets, comm)
    planned = Plan(jobs, _blend_jobs(cfg, blend_specs, jobs), datasets, version)
    _decide_reuse(planned, cfg, comm)
    return planned


def _decide_reuse(planned: Plan, cfg: BuildConfig, comm: Comm) -> None:
    items = planned.items
    hits = comm.on_root(lambda: _reuse(items, cfg.rebuild_stale), "looking for existing caches")
    for item, hit in zip(items, hits):
        item.reused = hit


def _manifest_records(items: list, version: str) -> dict[str, dict[str, dict]]:
    """Per directory, the manifest records of the entries just built."""
    out: dict[str, dict[str, dict]] = {}
    for item in items:
        e = item.entry
        out.setdefault(e.directory, {})[e.stem] = {"description_md5": e.hash, "megatron_version": version,
                                                   **item.marker}
    return out


def build(cfg: BuildConfig, comm: Comm | None = None) -> BuildResult:
    """Build every missing cache entry of ``cfg`` with all ranks of ``comm``.

    One job at a time builds into a cache directory (``coordination.guarded``): a job that finds another
    building the same directory waits, then reuses what that one built."""
    comm = comm or get_comm()
    t0 = time.monotonic()
    timer = PhaseTimer()
    planned = plan(cfg, comm)
    timer.mark("plan")
    if not planned.todo:
        comm.on_root(lambda: tidy({i.entry.directory for i in planned.items}, CACHE_LOCK, ALL), "tidying up")
        return BuildResult(planned.gpt, planned.blends, time.monotonic() - t0, comm.size, planned.megatron_version,
                           timer.phases, _write_sequences(planned, cfg, comm))

    directories = [item.entry.directory for item in planned.todo]
    entries = len(planned.todo)
    with guarded(comm, directories, CACHE_LOCK, ALL, f"megacache build of {entries} entries") as guard:
        _decide_reuse(planned, cfg, comm)  # what a job we waited for built is reused now
        timer.mark("lock")
        _build_locked(planned, cfg, comm, guard, timer)
    sequences = _write_sequences(planned, cfg, comm)
    return BuildResult(planned.gpt, planned.blends, time.monotonic() - t0, comm.size, planned.megatron_version,
                       timer.phases, sequences)


def _write_sequences(planned: Plan, cfg: BuildConfig, comm: Comm) -> str | None:
    """Megatron's per-dataset sequences file for this configuration's prefixes (rank 0; the plan
    lists the datasets in the order Megatron's tool does), unless it holds that already. Its path."""
    path = default_path(cfg.cache_dir) if cfg.sequences_path is None else cfg.sequences_path or None
    if path is None:
        return None

    def write() -> None:
        data = sequences_json({p: (d.layout.sequence_count, d.layout.document_count)
                               for p, d in planned.datasets.items()})
        try:
            with open(path, "rb") as f:
                if f.read() == data:
                    return
        except FileNotFoundError:
            pass
        write_atomic(path, data)

    comm.on_root(write, f"writing {path}")
    return path


def _build_locked(planned: Plan, cfg: BuildConfig, comm: Comm, guard, timer: PhaseTimer) -> None:
    jobs, blends, datasets = planned.gpt, planned.blends, planned.datasets
    blending = Blending([b for b in blends if not b.reused], cfg, comm, guard.job)
    gpt = GPTBuild(jobs, datasets, cfg.settings, comm, guard.job)
    try:
        def make_directories() -> None:
            for d in sorted({j.entry.directory for j in gpt.todo}):
                os.makedirs(d, exist_ok=True)

        comm.on_root(make_directories, "creating the cache directories")
        if blending.todo:
            guard.enter("blend (start)")
        blending.start()
        if blending.todo:
            timer.mark("blend_start")
        gpt.build(timer.phases, guard.enter)
        timer.since = time.monotonic()
        guard.enter("blend (finish)")
        blending.finish()
        blending.check_oversampling()
        if blending.todo:
            timer.mark("blend_wait")
        timer.since = time.monotonic()
        guard.enter("publish")
        with comm.agreed("publishing the GPTDataset caches"):
            guard.check_held()
            gpt.publish()
        comm.on_root(blending.publish, "publishing the blend caches")

        def write_manifests() -> None:
            for directory, records in _manifest_records([*gpt.todo, *blending.todo], planned.megatron_version).items():
                update_manifest(directory, records)

        comm.on_root(write_manifests, "writing the manifest")
        timer.mark("publish")
    finally:
        gpt.discard()
        blending.discard()
