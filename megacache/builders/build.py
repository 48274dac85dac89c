"""``megacache build``, the orchestrator: every cache megatron-core's BlendedMegatronDatasetBuilder
would write for a configuration (one prefix, a weighted or unweighted blend, per-split blends), built
by all ranks together; the GPTDataset entries by ``gpt``, the BlendedDataset entries by ``blend``.

Order of work, chosen so that nothing is wasted and nothing partial is visible:

1. Plan: parse and check the data flags, survey every prefix (``gpt.survey_datasets``: each by
   one rank, from its index's header and pointers), plan every GPTDataset task (``gpt.plan_tasks``)
   and every blend (sizes, weights as Megatron derives them), and ask rank 0 which entries exist
   already (their lengths are read for the drift check).
2. Blends alongside the children: a blend needs only its weights and size (and, unweighted, its
   children's lengths, which the plan knows), so each rank computes its share on a background
   thread while it builds GPTDataset tasks (``gpt.GPTBuild``), which mostly wait on the filesystem.
   A long blend is cut into one chunk per rank, each started from a guessed state; the chunks are
   then repaired in order (``blend.Blending``, ``algorithms.blend_chunks``), exact by construction;
   a short one runs whole on one rank.
3. Megatron's oversampling check (an error naming the dataset), before anything is published.
4. Publish: every GPT entry, then the blends (a blend appears only after all its children).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from itertools import chain
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..algorithms.blend_sizes import blend_split_sizes, normalize
from ..algorithms.checks import integer
from ..algorithms.splits import split_matrix
from ..runtime.comm import Comm, get_comm
from ..runtime.coordination import ALL, guarded, tidy
from ..errors import CacheDamaged, FormatError, MegacacheError
from ..formats.npy import NpyLayout, npy_header, read_npy_layout
from ..runtime.file_states import directory_states
from ..runtime.fsio import make_directories, write_atomic
from ..runtime.log import LOG
from ..runtime.object_storage import is_object_storage
from ..runtime.progress import Progress
from ..megatron.blends import Blend
from ..megatron.cache import SPLIT_NAMES, existing, nearest_built, present_files
from ..megatron.sequences import default_path, sequences_json
from ..megatron.training import DEFAULT_SPLIT
from ..megatron.versions import resolve
from .blend import BlendTask, Blending, plan_blends
from .gpt import (Datasets, GPTBuild, GPTTask, GPTRequest, PhaseTimer, Survey, array_records,
                  measure_lengths, plan_tasks, survey_datasets)
from .config import BuildConfig
from .publish import manifest_bytes, manifest_path, read_manifest, size_and_time, write_manifest

#: the lock key of a cache directory
CACHE_LOCK = "cache"


@dataclass(repr=False)
class BuildResult:
    gpt: list[GPTTask]
    blends: list[BlendTask]
    seconds: float
    ranks: int
    megatron_version: str
    phases: dict[str, float] = field(default_factory=dict)
    sequences_path: str | None = None   # Megatron's per-dataset sequences file, when written

    @property
    def prefixes(self) -> list[str]:
        """The datasets built for, in order, each once."""
        return list(dict.fromkeys(j.data_path for j in self.gpt))

    def headline(self) -> str:
        """What was built, in one line."""
        entries = len(self.gpt) + len(self.blends)
        reused = sum(j.reused for j in self.gpt) + sum(b.reused for b in self.blends)
        return (f"{len(self.prefixes)} dataset(s), {len(self.gpt)} GPTDataset and {len(self.blends)} BlendedDataset "
                f"cache entries ({entries - reused} built, {reused} already there) for megatron-core "
                f"{self.megatron_version} in {self.seconds:.1f} s on {self.ranks} rank(s)")

    def __repr__(self) -> str:
        return f"BuildResult({self.headline()})"


# ---------------------------------------------------------------------------------------------
# Plan


def _is_other_than_directory(path: str) -> bool:
    """Whether ``path`` is there and is not a directory: one look, so a path removed or made by
    another node meanwhile is judged as it is at that moment (what does not exist is made later)."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:  # not there (or not reachable): making it later says why
        return False


def _check_sizes(cfg: BuildConfig) -> None:
    if len(cfg.sizes) != 3:
        raise MegacacheError(f"sizes must give train, valid and test, got {cfg.sizes!r}")
    for name, n in zip(SPLIT_NAMES, cfg.sizes):
        if n is not None:
            integer(f"the {name} sample count", n)
    if not 0 <= cfg.surplus < 1e6:  # NaN fails this too
        raise MegacacheError(f"--mid-level-dataset-surplus (mid_level_dataset_surplus) must be >= 0, "
                             f"got {cfg.surplus!r}")


def _check_object_storage(cfg: BuildConfig, requests: list[GPTRequest]) -> None:
    """Datasets in buckets need a local directory for their ``.idx`` copies and one for the caches,
    as Megatron does; a sequences file asked for by name needs a prefix it can list."""
    remote = next((r.data_path for r in requests if is_object_storage(r.data_path)), None)
    if remote is None:
        return
    if cfg.sequences_path and all(is_object_storage(r.data_path) for r in requests):
        raise MegacacheError(f"--per-dataset-sequences-path {cfg.sequences_path}: every dataset is in a bucket, and "
                             f"megatron-core reads that file only for local prefixes (a prefix in a bucket has its "
                             f".idx header read from the copy); leave the flag out")
    if cfg.object_cache is None:
        raise MegacacheError(f"{remote}: a dataset in a bucket needs --object-storage-cache-path DIR, as training "
                             f"does (each .idx is copied there and read)")
    if cfg.cache_dir is None:
        raise MegacacheError(f"{remote}: a dataset in a bucket needs --data-cache-path DIR, a local directory for "
                             f"the caches (give training the same)")


def _plan_requests(cfg: BuildConfig) -> tuple[list[GPTRequest], list[tuple]]:
    """The GPTDataset requests and, per blended split, ``(split i, blend, request ids, targets)``
    where targets are the per-dataset target sizes (weighted) or None."""
    if (cfg.blend is None) == (cfg.blend_per_split is None):
        raise MegacacheError("give the data as one blend (--data-path) or per split (--train-data-path, ...)")
    requests: list[GPTRequest] = []
    blends: list[tuple] = []

    def add_blend(blend: Blend, bookends: tuple, sizes: tuple, split: str | None, hashed, splits) -> None:
        for i in range(3):  # megatron-core asserts this of every split, even one --split leaves empty
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


def _check_dtypes(surveys: dict) -> None:
    dtypes: dict = {}
    for prefix, survey in surveys.items():
        dtypes.setdefault(np.dtype(survey.dtype), prefix)
    if len(dtypes) > 1:
        shown = ", ".join(f"{p} holds {d}" for d, p in dtypes.items())
        raise MegacacheError(f"the blended datasets have different token dtypes ({shown}); tokenize them with "
                             f"one tokenizer (one vocabulary) before blending")


# ---------------------------------------------------------------------------------------------
# Build


@dataclass
class Plan:
    """Every cache entry a configuration needs, whether it exists, its datasets (each opened when
    first read) and their surveys."""

    gpt: list[GPTTask]
    blends: list[BlendTask]
    datasets: Datasets
    surveys: dict[str, Survey]
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
        found = array_records({w: read_npy_layout(item.entry.path(w))[:2] for w in expected["arrays"]})
        record = {"arrays": found}
        expected = {"arrays": expected["arrays"]}
    return [f"{key}: built with {record.get(key)!r}, this configuration gives {value!r}"
            for key, value in expected.items() if record.get(key) != value]


def damage(item) -> list[str]:
    """How the files of an entry that is there differ from what ``item`` says they hold (empty:
    intact): the description's bytes, and each array's header (the exact bytes numpy writes for
    its dtype and shape) and length. One open and read per file, no parsing unless a header
    differs: cheap for tens of thousands of files."""
    e = item.entry
    stem = os.path.join(e.directory, e.stem)
    out = []
    expected = e.description.encode("utf-8")
    try:
        found = _read_start(f"{stem}-description.txt", len(expected) + 1)[0]
    except OSError as exc:
        out.append(f"description.txt: cannot be read ({exc.strerror})")
    else:
        if found != expected:
            out.append("description.txt: not this entry's description")
    for what, (dtype, shape) in item.arrays.items():
        header = npy_header(dtype, shape)
        try:
            start, size = _read_start(f"{stem}-{what}", len(header))
        except OSError as exc:
            out.append(f"{what}: cannot be read ({exc.strerror})")
            continue
        if start == header:
            problem = NpyLayout(dtype, tuple(shape), len(header), size).problem
            if problem:
                out.append(f"{what}: {problem}")
            continue
        try:  # say what is there instead
            layout = read_npy_layout(e.path(what))
        except FormatError:
            out.append(f"{what}: not a readable .npy file")
            continue
        out.append(f"{what}: holds {layout.dtype.str} {layout.shape}, the entry's array is {dtype.str} {tuple(shape)}")
    return out


def _read_start(path: str, length: int) -> tuple[bytes, int]:
    """The first ``length`` bytes of a file and its size."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, 0), os.fstat(fd).st_size
    finally:
        os.close(fd)


def damages_since(items: list, stems: list[str], records: list) -> list[list[str]]:
    """``damage`` of each item, unless its files are as its manifest record saw them published
    (``records``, each from ``with_files``): the same size and modification time. ``stems``: the
    items' ``entry.stem``, as the rank that looked for them named them (the md5 of each
    description, which takes time to compute again)."""
    same = _as_recorded(items, stems, records)
    return [[] if unchanged else damage(item) for item, unchanged in zip(items, same)]


def _as_recorded(items: list, stems: list[str], records: list) -> list[bool]:
    """Whether each item's files are as ``records`` saw them: one stat per file, by name within its
    directory, opened once (a path resolved for each file costs more), the files of a directory's
    entries of one class in one ``directory_states`` call."""
    groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}  # (directory, file kinds) -> items
    for i, item in enumerate(items):
        groups.setdefault((item.entry.directory, item.entry.names), []).append(i)
    same = np.zeros(len(items), bool)
    for (d, whats), members in groups.items():
        try:
            recorded = [records[i][what] for i in members for what in whats]
            if set(map(len, recorded)) != {2}:
                raise ValueError
            expected = np.fromiter(chain.from_iterable(recorded), np.int64, 2 * len(recorded)).reshape(-1, 2)
        except (KeyError, TypeError, ValueError):  # some record missing or of another form
            if len(members) > 1:  # each item on its own, to find which
                for i in members:
                    same[i] = _as_recorded([items[i]], [stems[i]], [records[i]])[0]
            continue
        try:
            sizes, mtimes = directory_states(d, [f"{stems[i]}-{what}" for i in members for what in whats])
        except OSError:  # gone: ``damage`` says so, file by file
            continue
        differs = (sizes != expected[:, 0]) | (mtimes != expected[:, 1])
        same[members] = ~differs.reshape(len(members), len(whats)).any(axis=1)
    return same.tolist()


def _records(items: list, present: list[bool]) -> list[dict | None]:
    """For each entry there, megacache's manifest record of it (None: none, or not there)."""
    manifests = {d: read_manifest(d) for d in {item.entry.directory for item, hit in zip(items, present) if hit}}
    return [manifests[item.entry.directory].get(item.entry.stem) if hit else None for item, hit in zip(items, present)]


def _listed(entries: list) -> str:
    """Entries with their problems, one line each, the first five."""
    shown = "\n".join(f"  {item.entry.path('description.txt')}: " + "; ".join(problems)
                       for item, problems in entries[:5])
    return shown + (f"\n  ... and {len(entries) - 5} more" if len(entries) > 5 else "")


def _stale_error(stale: list) -> MegacacheError:
    return MegacacheError(
        f"{len(stale)} existing cache entr{'y was' if len(stale) == 1 else 'ies were'} built from other data or "
        f"settings than this configuration's, which megatron-core's hash does not cover (it would reuse "
        f"them silently):\n{_listed(stale)}\nPass --rebuild-stale (BuildConfig.rebuild_stale) to replace them, "
        f"or use another --data-cache-path")


def plan(cfg: BuildConfig, comm: Comm | None = None, decide_reuse: bool = True) -> Plan:
    """The entries of ``cfg`` (identical on every rank of ``comm``; a ``SingleComm`` plans alone,
    with no collective) and, unless told otherwise, which of them to reuse. Only the lengths of
    entries that exist already are read (their drift check)."""
    comm = comm or get_comm()
    version = resolve(cfg.megatron_version)
    _check_sizes(cfg)
    if cfg.cache_dir == "":
        raise MegacacheError("--data-cache-path '': megatron-core caches nothing under an empty path (every rank "
                             "builds the indices in memory); give a directory, or leave the flag out for the "
                             "default under each prefix")
    if cfg.cache_dir is not None and _is_other_than_directory(cfg.cache_dir):
        raise MegacacheError(f"--data-cache-path {cfg.cache_dir}: exists and is not a directory; give a directory")
    sequences = _sequences_path(cfg)
    # An early, clear refusal only: a directory made there later fails the publish's rename.
    if sequences is not None and os.path.isdir(sequences):
        raise MegacacheError(f"--per-dataset-sequences-path {sequences}: is a directory; give the path of the JSON "
                             f"file to write, or '' for none")
    requests, blend_specs = _plan_requests(cfg)
    if blend_specs and cfg.cache_dir is None:
        raise MegacacheError(
            "a blend is only cached under --data-cache-path (without it megatron-core rebuilds the blend "
            "in memory on every rank): give --data-cache-path, and the same to training")
    _check_object_storage(cfg, requests)
    datasets = Datasets((r.data_path for r in requests), cfg.object_cache)
    surveys = survey_datasets(requests, datasets, comm)
    if blend_specs:
        _check_dtypes(surveys)
    tasks = plan_tasks(requests, cfg, surveys)
    planned = Plan(tasks, plan_blends(cfg, blend_specs, tasks), datasets, surveys, version)
    if decide_reuse:
        _decide_reuse(planned, cfg, comm)
    return planned


def _decide_reuse(planned: Plan, cfg: BuildConfig, comm: Comm, say: bool = False,
                  timer: PhaseTimer | None = None) -> None:
    """Which entries to reuse: those there, intact and built from this configuration; ``say``: warn
    of the damaged ones being rebuilt; ``timer`` as ``_check_existing``'s."""
    items = planned.items
    present = comm.on_root(lambda: existing([item.entry for item in items]), "looking for existing caches")
    checked = _check_existing(planned, present, comm, timer)
    stale = [(item, problems) for item, (problems, _) in zip(items, checked) if problems]
    if stale and not cfg.rebuild_stale:
        raise _stale_error(stale)  # on every rank alike: the drifts were broadcast
    damaged = [(item, problems) for item, (_, problems) in zip(items, checked) if problems]
    if damaged:
        if not cfg.rebuild_damaged:
            it = "it" if len(damaged) == 1 else "them"
            raise CacheDamaged(f"{len(damaged)} existing cache entr{'y is' if len(damaged) == 1 else 'ies are'} "
                               f"damaged (training would fail on {it}):\n{_listed(damaged)}\n"
                               f"`megacache build` without --no-rebuild (BuildConfig.rebuild_damaged) rebuilds {it}")
        if say and comm.rank == 0:
            LOG.warning(f"megacache: warning: rebuilding {len(damaged)} damaged cache "
                        f"entr{'y' if len(damaged) == 1 else 'ies'}:\n{_listed(damaged)}")
    for item, hit, (problems, broken) in zip(items, present, checked):
        item.reused = hit and not problems and not broken


def _check_existing(planned: Plan, present: list[bool], comm: Comm,
                    timer: PhaseTimer | None = None) -> list[tuple[list[str], list[str]]]:
    """For each entry, how it drifted from this configuration (``drift``) and, if it is there and
    did not, how its files are damaged (``damage``), on every rank. The drift check compares what
    an entry was built from, its lengths' checksum included: the lengths of the entries found are
    read (collectively), no others. Rank 0 checks drifts while the other ranks share the damage
    checks of every entry there; one rank alone checks the undrifted ones after. ``timer`` gets
    both checks' phases as rank 0 sees them: the damage check's is what it adds to rank 0's time."""
    timer = timer or PhaseTimer()
    found = [j for j, hit in zip(planned.gpt, present) if hit and j.length_checksum is None]
    measure_lengths(found, planned.datasets, comm)
    items = planned.items
    records: list[dict | None] = []  # rank 0's: the others need only each record's files

    def read_records() -> list[tuple[str, dict | None] | None]:
        records.extend(_records(items, present))
        return [(item.entry.stem, (record or {}).get("files")) if hit else None
                for item, hit, record in zip(items, present, records)]

    files = comm.on_root(read_records, "reading the cache's manifests")
    there = [i for i, hit in enumerate(present) if hit]

    def damages(chosen: list[int]) -> list[tuple[int, list[str]]]:
        """The damaged ones of ``chosen``, with their problems."""
        stems, recorded = zip(*(files[i] for i in chosen)) if chosen else ((), ())
        return [(i, problems) for i, problems in zip(chosen, damages_since([items[i] for i in chosen], stems, recorded))
                if problems]

    def drifts_on_root() -> list[list[str]]:
        out = [drift(item, record) if hit else [] for item, hit, record in zip(items, present, records)]
        timer.mark("drift_check")  # what rank 0 then waits for is the damage checks'
        return out

    checked = damages(there[comm.rank - 1 :: comm.size - 1]) if comm.rank else []
    drifts = comm.on_root(drifts_on_root, "checking existing caches")
    intact = {i for i in there if not drifts[i]}
    if comm.size == 1:
        # Alone, after the drift check: on a thread beside it the check saves nothing (the two
        # share the GIL, and their system calls slow each other down)
        checked = damages(sorted(intact))
    found_damaged: list[list[str]] = [[] for _ in items]
    for from_rank in comm.allgather(checked):
        for i, problems in from_rank:
            if i in intact:
                found_damaged[i] = problems
    timer.mark("damage_check")
    return list(zip(drifts, found_damaged))


@dataclass
class EntryState:
    """One cache entry a configuration names, and what of it is on disk (``inventory``)."""

    item: GPTTask | BlendTask
    present: tuple[bool, ...]           # per file, in ``item.entry.names`` order
    problems: list[str]                 # how a complete entry drifted from this configuration
    damage: list[str]                   # how the files of a complete entry are damaged (``damage``)
    #: for a missing entry, a complete one differing in one field only (``nearest_built``)
    near: str | None = None

    @property
    def state(self) -> str:
        """complete (a build reuses it), missing, partial (a build replaces it: Megatron's cache
        hit needs every file), stale (complete, but built from other data or settings: a build
        refuses it, or replaces it with --rebuild-stale), or damaged (its files are not what its
        plan says: a build replaces it, or refuses it with --no-rebuild)."""
        if all(self.present):
            return "stale" if self.problems else "damaged" if self.damage else "complete"
        return "partial" if any(self.present) else "missing"

    @property
    def samples(self) -> int:
        """Samples the entry's index holds (a GPTDataset's: whole epochs, at least those asked for)."""
        return self.item.size if isinstance(self.item, BlendTask) else self.item.plan.num_samples


def inventory(cfg: BuildConfig, comm: Comm | None = None) -> tuple[Plan, list[EntryState], list[str]]:
    """What ``build(cfg)`` would do, without doing it: every entry it names with its files' state,
    and the other files it writes (megacache's manifests, Megatron's per-dataset sequences file).
    Reads the datasets' indices and the cache directory; takes no lock and writes nothing."""
    comm = comm or get_comm()
    planned = plan(cfg, comm, decide_reuse=False)
    items = planned.items
    files = comm.on_root(lambda: present_files([item.entry for item in items]), "looking for existing caches")
    checked = _check_existing(planned, [all(f) for f in files], comm)
    near = comm.on_root(lambda: nearest_built([item.entry for item in items], [any(f) for f in files]),
                        "looking for entries built with other settings")
    states = [EntryState(item, f, d, b, n) for item, f, (d, b), n in zip(items, files, checked, near)]
    others = sorted({manifest_path(s.item.entry.directory) for s in states if s.state != "complete"})
    update = comm.on_root(lambda: _sequences_update(planned, cfg), "reading Megatron's per-dataset sequences file")
    return planned, states, others + ([update[0]] if update else [])


def _manifests(items: list, version: str) -> dict[str, dict]:
    """Per directory, its manifest's entries with the records of the entries about to be published
    (``with_files`` adds their files once they are)."""
    records: dict[str, dict[str, dict]] = {}
    for item in items:
        e = item.entry
        records.setdefault(e.directory, {})[e.stem] = {"description_md5": e.hash, "megatron_version": version,
                                                       **item.marker}
    return {directory: {**read_manifest(directory), **part} for directory, part in records.items()}


def with_files(entries: dict[str, dict], items: list) -> dict[str, dict]:
    """``entries`` with each published item's files as they are now (size, modification time): a
    later reuse check reads an array's header only where that changed (``damages_since``). The
    items are one directory's; there, the files are stat'ed by one ``directory_states`` call, as the
    reuse check reads them (the build's last step, on rank 0 while the others wait)."""
    if not items or is_object_storage(items[0].entry.directory):
        for item in items:
            e = item.entry
            entries[e.stem]["files"] = {what: size_and_time(e.path(what)) for what in e.names}
        return entries
    directory = items[0].entry.directory
    names = [item.entry.file_name(what) for item in items for what in item.entry.names]
    sizes, mtimes = directory_states(directory, names)
    if (sizes < 0).any():  # as os.stat says it
        missing = os.path.join(directory, names[int(np.argmax(sizes < 0))])
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), missing)
    states = iter(zip(sizes.tolist(), mtimes.tolist()))
    for item in items:
        entries[item.entry.stem]["files"] = {what: list(next(states)) for what in item.entry.names}
    return entries


def build(cfg: BuildConfig, comm: Comm | None = None) -> BuildResult:
    """Build every missing cache entry of ``cfg`` with all ranks of ``comm``.

    One job at a time builds into a cache directory (``coordination.guarded``): a job that finds another
    building the same directory waits, then reuses what that one built."""
    comm = comm or get_comm()
    t0 = time.monotonic()
    timer = PhaseTimer()
    planned = plan(cfg, comm, decide_reuse=False)
    timer.mark("plan")
    _decide_reuse(planned, cfg, comm, timer=timer)
    if not planned.todo:
        comm.on_root(lambda: tidy({i.entry.directory for i in planned.items}, CACHE_LOCK, ALL), "tidying up")
        return BuildResult(planned.gpt, planned.blends, time.monotonic() - t0, comm.size, planned.megatron_version,
                           timer.phases, _write_sequences(planned, cfg, comm))

    directories = [item.entry.directory for item in planned.todo]
    entries = len(planned.todo)
    with guarded(comm, directories, CACHE_LOCK, ALL, f"megacache build of {entries} entries") as guard:
        _decide_reuse(planned, cfg, comm, say=True, timer=timer)  # what a job we waited for built is reused now
        timer.mark("lock")
        with Progress(comm, guard.directory, "build", cfg.progress_interval_s) as progress:
            _build_locked(planned, cfg, comm, guard, timer, progress)
        sequences = _write_sequences(planned, cfg, comm)  # still watched: a rank that hangs now is seen
    return BuildResult(planned.gpt, planned.blends, time.monotonic() - t0, comm.size, planned.megatron_version,
                       timer.phases, sequences)


def _sequences_update(planned: Plan, cfg: BuildConfig) -> tuple[str, bytes] | None:
    """Megatron's per-dataset sequences file for this configuration's local prefixes (the plan lists the
    datasets in the order Megatron's tool does): its path and bytes, unless it holds them already
    or none is asked for."""
    path = _sequences_path(cfg)
    counts = _sequences_counts(planned)
    if path is None or not counts:
        return None
    data = sequences_json(counts)
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return None
    except FileNotFoundError:
        pass
    return path, data


def _write_sequences(planned: Plan, cfg: BuildConfig, comm: Comm) -> str | None:
    """``_sequences_update`` written (rank 0); the file's path."""
    def write() -> None:
        update = _sequences_update(planned, cfg)
        if update is not None:
            write_atomic(*update)

    comm.on_root(write, "writing Megatron's per-dataset sequences file")
    return _sequences_path(cfg) if _sequences_counts(planned) else None


def _sequences_counts(planned: Plan) -> dict[str, tuple[int, int]]:
    """The sequences file's entries: the local prefixes' counts. megatron-core never looks up a
    prefix in a bucket there (GPTDataset opens such a dataset from its ``.idx`` copy before it
    consults the file), and Megatron-LM's tool, which opens each ``PREFIX.idx`` with ``open``,
    cannot read one."""
    return {p: (s.sequence_count, s.document_count) for p, s in planned.surveys.items() if not is_object_storage(p)}


def _sequences_path(cfg: BuildConfig) -> str | None:
    return default_path(cfg.cache_dir) if cfg.sequences_path is None else cfg.sequences_path or None


def _build_locked(planned: Plan, cfg: BuildConfig, comm: Comm, guard, timer: PhaseTimer, progress: Progress) -> None:
    tasks, blends, datasets = planned.gpt, planned.blends, planned.datasets
    blending = Blending([b for b in blends if not b.reused], cfg, comm, guard.job, progress)
    gpt = GPTBuild(tasks, datasets, cfg.seed, comm, guard.job, progress)
    try:
        def make_cache_directories() -> None:
            for d in sorted({j.entry.directory for j in gpt.todo}):
                make_directories(d)

        comm.on_root(make_cache_directories, "creating the cache directories")
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
        progress.phase("publish", len(gpt.todo) + len(blending.todo), "entries")
        # Rank 0 makes the manifests' records (thousands) while the entries are linked, which wait
        # on the directory's lock more than they use a core; they are written last, with the
        # published files' sizes and times.
        with ThreadPoolExecutor(1, thread_name_prefix="manifest") as helper:
            manifests = (helper.submit(_manifests, [*gpt.todo, *blending.todo], planned.megatron_version)
                         if comm.is_root() else None)
            with comm.agreed("publishing the GPTDataset caches"):
                guard.check_held()
                gpt.publish()
            comm.on_root(blending.publish, "publishing the blend caches")

            def write_manifests() -> None:
                published: dict[str, list] = {}
                for item in [*gpt.todo, *blending.todo]:
                    published.setdefault(item.entry.directory, []).append(item)
                for directory, entries in manifests.result().items():
                    write_manifest(directory, manifest_bytes(with_files(entries, published[directory])))

            comm.on_root(write_manifests, "writing the manifest")
        timer.mark("publish")
    finally:
        gpt.discard()
        blending.discard()
