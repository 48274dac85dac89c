"""``megacache inspect``: a readable summary of a dataset prefix or of a cache directory.

For a cache directory it groups the files by entry (``<md5>-<Class>-<split>-<what>``, see
docs/megatron.md §3.2), says whether each entry is whole (Megatron's cache-hit rule) and whether
its description still hashes to its name (an edited description is never looked up again), and
gives the training flags that reproduce the key, so a user can tell which run a cache belongs to.
Everything is read through headers and memory maps; the reductions are numpy's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass, field

import numpy as np

from ..algorithms.splits import split_ranges
from ..algorithms.blocks import BLOCK, first_bad
from ..errors import MegacacheError
from ..megatron.cache import ENTRY_FILES, SPLIT_NAMES, describe, description_hash
from ..formats.datatrove import DsFile
from ..formats.indexed import IndexCopies, idx_path, read_layout
from ..formats.npy import load_npy, read_npy_layout
from ..formats.olmo import OlmoFile, given_eos, given_width
from ..formats import sft_packed
from ..formats.paths import DIRECTORY, DS, MEGATRON, MISSING, OLMO, PBIN, SFT_PACKED, named, read_in_place
from ..formats.pbin import PackedFile
from ..megatron.tokenizer import tokenizer_flags, versions_of
from ..megatron.versions import resolve
from ..runtime.object_storage import is_object_storage

ENTRY_NAME = re.compile(r"([0-9a-f]{32})-(GPTDataset|BlendedDataset)-(train|valid|test)-(.+)")
#: datasets of a blend spelled out in its flags; longer blends are elided
SHOWN_DATASETS = 4


@dataclass(frozen=True)
class DatasetSummary:
    prefix: str
    dtype: np.dtype
    sequences: int
    documents: int
    tokens: int
    min_length: int
    mean_length: float
    max_length: int
    empty_sequences: int
    bin_size: int


def inspect_dataset(prefix: str) -> DatasetSummary:
    """A dataset's numbers, from its index (in a bucket: copied whole, once) and its ``.bin``'s size."""
    with IndexCopies() as copies:
        ds = copies.open(prefix)
        lengths = ds.sequence_lengths
        sequences = len(ds)
        tokens = int(lengths.sum(dtype=np.int64))
        return DatasetSummary(
            prefix=prefix, dtype=ds.dtype, sequences=sequences, documents=ds.num_documents, tokens=tokens,
            min_length=int(lengths.min()) if sequences else 0,
            mean_length=tokens / sequences if sequences else 0.0,
            max_length=int(lengths.max()) if sequences else 0,
            empty_sequences=sequences - int(np.count_nonzero(lengths)),
            bin_size=ds.bin_size,
        )


def format_dataset(s: DatasetSummary) -> str:
    return "\n".join([
        f"dataset {s.prefix}",
        f"  dtype {s.dtype.name}, {s.sequences:,} sequences, {s.documents:,} documents, {s.tokens:,} tokens",
        (f"  sequence length min {s.min_length:,} / mean {s.mean_length:,.2f} / max {s.max_length:,}; "
         f"{s.empty_sequences:,} empty"),
        f"  .bin {s.bin_size:,} bytes",
    ])


@dataclass
class EntrySummary:
    """One cache entry (one split of one dataset or blend) as found on disk."""

    directory: str
    hash: str
    class_name: str
    split_name: str
    present: set[str]
    md5_ok: bool | None = None          # None: no readable description
    description: dict | None = None
    arrays: dict[str, tuple[tuple[int, ...], np.dtype]] = field(default_factory=dict)
    samples: int | None = None
    epochs: int | None = None           # GPTDataset: document index length / documents in the split
    dataset_counts: tuple[int, int] | None = None  # blends: fewest and most samples from one dataset
    problems: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        return [w for w in ENTRY_FILES[self.class_name] if w not in self.present]

    @property
    def whole(self) -> bool:
        """Every file present, every array readable, a description to check them against."""
        return not self.missing and len(self.arrays) == len(self.present) - 1 and isinstance(self.description, dict)

    def path(self, what: str) -> str:
        return os.path.join(self.directory, f"{self.hash}-{self.class_name}-{self.split_name}-{what}")


@dataclass
class CacheSummary:
    directory: str
    entries: list[EntrySummary]
    temporary_files: int
    other_files: int

    @property
    def problems(self) -> list[str]:
        return [p for e in self.entries for p in e.problems]


def read_entry(e: EntrySummary, count_whole_blends: bool = True) -> None:
    """Its description and array headers into ``e``, and its problems. A blend's draws per dataset
    are counted by this function (a pass over its ``dataset_index``) unless it is whole and
    ``count_whole_blends`` is False: verify counts those over its ranks."""
    if e.missing:
        e.problems.append(f"{e.path(e.missing[0])}: incomplete entry, missing {', '.join(e.missing)} "
                          f"(Megatron rebuilds it); rebuild or delete its files")
    if "description.txt" in e.present:
        with open(e.path("description.txt"), "rb") as f:
            raw = f.read()
        actual = hashlib.md5(raw).hexdigest()  # Megatron hashes the text's utf-8 bytes
        e.md5_ok = actual == e.hash
        if not e.md5_ok:
            e.problems.append(f"{e.path('description.txt')}: md5 of the description is {actual}, not the "
                              f"name's {e.hash}: the file was changed; rebuild or delete the entry")
        try:
            e.description = json.loads(raw)
        except ValueError as exc:
            e.problems.append(f"{e.path('description.txt')}: not valid JSON ({exc})")
    for what in sorted(e.present - {"description.txt"}):
        try:
            size_problem = read_npy_layout(e.path(what)).problem
            array = load_npy(e.path(what))
        except MegacacheError as exc:
            e.problems.append(str(exc))
            continue
        if size_problem:  # extended: the array reads, but the file is not what was written
            e.problems.append(f"{e.path(what)}: {size_problem}; rebuild or delete the entry")
        e.arrays[what] = (array.shape, array.dtype)
        if what == "sample_index.npy":
            e.samples = max(array.shape[0] - 1, 0)
        elif what == "dataset_index.npy":
            e.samples = len(array)
            counted_at = len(e.problems)
            if count_whole_blends:
                count_blend(e, array)
    if not count_whole_blends and "dataset_index.npy" in e.arrays and not e.whole:
        later = e.problems[counted_at:]  # its problems go where counting in turn would have put them
        del e.problems[counted_at:]
        count_blend(e, load_npy(e.path("dataset_index.npy")))
        e.problems += later


def _epochs(e: EntrySummary, sequence_counts: dict[str, int | None]) -> int | None:
    """Epochs of a read GPTDataset entry, from its dataset's sequence count and split (None when
    the dataset is not readable). ``sequence_counts``: each dataset's, its index's header read once
    for all its entries (one ranged read for a dataset in a bucket)."""
    ids = e.description if isinstance(e.description, dict) else {}
    if "document_index.npy" not in e.arrays or "dataset_path" not in ids:
        return None
    path = str(ids["dataset_path"])
    if path not in sequence_counts:
        try:
            sequence_counts[path] = read_layout(idx_path(path)).sequence_count
        except MegacacheError:
            sequence_counts[path] = None
    if sequence_counts[path] is None:
        return None
    try:
        lo, hi = split_range(ids, e.split_name, sequence_counts[path])
    except (TypeError, IndexError, ValueError):
        return None
    return e.arrays["document_index.npy"][0][0] // (hi - lo) if hi > lo else None


def split_range(ids: dict, split_name: str, n_sequences: int) -> tuple[int, int]:
    """The sequences ``[beg, end)`` a GPTDataset description's split covers in a dataset of
    ``n_sequences`` (TypeError when the description's matrix leaves this split empty)."""
    matrix = ids.get("split_matrix")
    # per-split data hashes no matrix: the split is the whole dataset
    bookend = (0.0, 1.0) if matrix is None else matrix[SPLIT_NAMES.index(split_name)]
    return split_ranges([bookend], n_sequences)[0]


def count_blend(e: EntrySummary, dataset_index: np.ndarray) -> None:
    """Fewest and most samples drawn from one dataset; counted in bounded blocks (a blend can hold
    billions of samples)."""
    datasets = e.description.get("datasets") if isinstance(e.description, dict) else None
    if not isinstance(datasets, list) or not len(dataset_index):
        return
    d = len(datasets)
    counts = np.zeros(d, dtype=np.int64)
    for a in range(0, len(dataset_index), BLOCK):
        block = np.asarray(dataset_index[a : a + BLOCK])
        bad = first_bad((block < 0) | (block >= d))
        if bad is not None:
            e.problems.append(f"{e.path('dataset_index.npy')}: dataset_index[{a + bad}] is {int(block[bad])}, "
                              f"outside the description's {d} datasets")
            return
        counts += np.bincount(block, minlength=d)
    e.dataset_counts = (int(counts.min()), int(counts.max()))


def list_cache(directory: str) -> CacheSummary:
    """The entries of a cache directory by their names alone (nothing read), in no order."""
    found: dict[tuple[str, str, str], set[str]] = {}
    temporary = other = 0
    for item in os.scandir(directory):
        if not item.is_file():
            continue
        if item.name.startswith("."):
            temporary += 1
            continue
        m = ENTRY_NAME.fullmatch(item.name)
        if m is None or m.group(4) not in ENTRY_FILES[m.group(2)]:
            other += 1
            continue
        found.setdefault(m.group(1, 2, 3), set()).add(m.group(4))
    entries = [EntrySummary(directory, h, c, s, present) for (h, c, s), present in found.items()]
    return CacheSummary(directory, entries, temporary, other)


def in_order(entries: list[EntrySummary]) -> list[EntrySummary]:
    """Read entries as inspect and verify show them: GPTDatasets, then blends, by dataset and split."""
    return sorted(entries, key=lambda e: (e.class_name, _dataset_path(e), SPLIT_NAMES.index(e.split_name), e.hash))


def inspect_cache(directory: str) -> CacheSummary:
    cache = list_cache(directory)
    sequence_counts: dict[str, int | None] = {}
    for e in cache.entries:
        read_entry(e)
        e.epochs = _epochs(e, sequence_counts)
    cache.entries = in_order(cache.entries)
    return cache


def _dataset_path(e: EntrySummary) -> str:
    return str((e.description or {}).get("dataset_path", ""))


def _blend_parents(entries: list[EntrySummary]) -> dict[str, EntrySummary]:
    """Hash of each blend child's description -> its blend: such a GPTDataset is keyed by the blend's
    flags (it carries the blend's surplus size), not by a one-prefix run."""
    parents = {}
    for b in entries:
        if b.class_name == "BlendedDataset" and isinstance(b.description, dict):
            for child in b.description.get("datasets", []):
                parents[description_hash(describe(child))] = b
    return parents


def _common_flags(ids: dict, directory: str) -> str:
    split = f" --split {shlex.quote(ids['split'])}" if ids.get("split") is not None else ""
    return (f"{split} --seq-length {ids.get('sequence_length')} --seed {ids.get('random_seed')} "
            f"--data-cache-path {shlex.quote(directory)}")


def _gpt_config(e: EntrySummary) -> str:
    ids = e.description
    path = shlex.quote(str(ids.get("dataset_path")))
    # Per-split blends hash no split string (and spoof the split matrix).
    data = f"--data-path {path}" if ids.get("split") is not None else f"--{e.split_name}-data-path {path}"
    return data + _common_flags(ids, e.directory)


def _blend_config(e: EntrySummary) -> str:
    children, weights = e.description.get("datasets", []), e.description.get("weights", [])
    if not children:
        return "a blend of no datasets"
    first = children[0]
    paths = [shlex.quote(str(c.get("dataset_path"))) for c in children]
    # Megatron gives an unweighted blend's datasets one epoch each (num_samples null) and weighs them
    # by length; given weights always come with sizes (docs/megatron.md §4.4).
    if all(c.get("num_samples") is None for c in children):
        form = "unweighted (weights are the datasets' lengths): "
        words = paths
    else:
        form = "weighted (weights normalised): "
        words = [f"{w!r} {p}" for w, p in zip(weights, paths)]
    shown = " ".join(words[:SHOWN_DATASETS]) + (" …" if len(words) > SHOWN_DATASETS else "")
    flag = "--data-path" if first.get("split") is not None else f"--{e.split_name}-data-path"
    return f"a blend of {len(children):,} datasets, {form}{flag} {shown}" + _common_flags(first, e.directory)


def tokenizer_note(ids: dict, version: str) -> str:
    """The Megatron ``version`` tokenizer flags an entry's identity comes from, or which versions'
    flags give it when ``version``'s cannot (that Megatron hashes another name and will not find it)."""
    flags = tokenizer_flags(ids, version)
    if flags is not None:
        return f"megatron-core {version} flags {flags}"
    others = versions_of(ids)
    if others:
        return (f"NOT what megatron-core {version} builds from any flags (that identity is megatron-core "
                f"{', '.join(others)}'s): a {version} run looks for another name")
    return f"class {ids.get('class')!r}, given verbatim (not a type megacache derives)"


def _format_entry(e: EntrySummary, parents: dict[str, EntrySummary], version: str) -> list[str]:
    state = (f"INCOMPLETE (missing {', '.join(e.missing)})" if e.missing else
             "DAMAGED (problems below)" if e.problems else "complete")
    md5 = {True: "md5 ok", False: "md5 MISMATCH", None: "md5 unknown (no description)"}[e.md5_ok]
    lines = [f"{e.hash} {e.class_name} {e.split_name}: {state}, {md5}"]
    ids = e.description if isinstance(e.description, dict) else None
    if ids is not None and e.class_name == "GPTDataset":
        requested = "null (one epoch)" if ids.get("num_samples") is None else f"{ids['num_samples']} requested"
        lines.append(f"  dataset_path {ids.get('dataset_path')}, num_samples {requested}, sequence_length "
                     f"{ids.get('sequence_length')}, random_seed {ids.get('random_seed')}, split "
                     f"{ids.get('split')!r}")
    elif ids is not None:
        lines.append(f"  {len(ids.get('datasets', [])):,} datasets, size {ids.get('size')}, "
                     f"split {ids.get('split')}")
    if e.arrays:
        lines.append("  " + ", ".join(f"{w[:-4]} {dt.name}{list(shape)}" for w, (shape, dt) in e.arrays.items()))
    if e.samples is not None:
        counts = ""
        if e.dataset_counts is not None:
            counts = f" (per dataset: min {e.dataset_counts[0]:,}, max {e.dataset_counts[1]:,})"
        epochs = f", {e.epochs} epoch(s)" if e.epochs is not None else ""
        lines.append(f"  {e.samples:,} samples{epochs}{counts}")
    if ids is not None:
        if e.hash in parents:
            parent = parents[e.hash]
            lines.append(f"  Megatron config: a dataset of blend {parent.hash} ({parent.split_name}); see there")
        elif e.class_name == "GPTDataset":
            lines.append(f"  Megatron config: {_gpt_config(e)}")
        if e.class_name == "GPTDataset" and isinstance(ids.get("tokenizer"), dict):
            lines.append(f"  tokenizer: {tokenizer_note(ids['tokenizer'], version)}")
        else:
            lines.append(f"  Megatron config: {_blend_config(e)}")
    lines += [f"  problem: {p}" for p in e.problems]
    return lines


def format_cache(c: CacheSummary, version: str) -> str:
    counts = {name: sum(e.class_name == name for e in c.entries) for name in ENTRY_FILES}
    lines = [(f"cache directory {c.directory}: {len(c.entries)} entries ({counts['GPTDataset']} GPTDataset, "
              f"{counts['BlendedDataset']} BlendedDataset)")]
    if c.temporary_files:
        lines.append(f"  {c.temporary_files} temporary files (an unfinished or crashed build: a rerun, or "
                     f"megacache clean {c.directory}, removes them)")
    if c.other_files:
        lines.append(f"  {c.other_files} other files ignored")
    parents = _blend_parents(c.entries)
    for e in c.entries:
        lines += _format_entry(e, parents, version)
    return "\n".join(lines)


@dataclass(frozen=True)
class Report:
    text: str
    problems: list[str]


def format_pbin(path: str) -> str:
    f = PackedFile(path)
    docs, tokens = f.document_count, len(f.tokens)
    shortest, longest, empty = None, 0, 0
    for _, _, lengths in f.windows(BLOCK):
        shortest = int(lengths.min()) if shortest is None else min(shortest, int(lengths.min()))
        longest = max(longest, int(lengths.max()))
        empty += len(lengths) - int(np.count_nonzero(lengths))
    return "\n".join([
        f"packed file {path} (Modalities .pbin)",
        f"  {f.token_size}-byte tokens, {docs:,} documents, {tokens:,} tokens",
        (f"  document length min {shortest or 0:,} / mean {tokens / docs if docs else 0:,.2f} / max {longest:,}; "
         f"{empty:,} empty"),
        f"  data {f.layout.data_bytes:,} bytes, index {len(f.index_bytes):,} bytes (pickle protocol "
        f"{int(f.index_bytes[1])}, read without unpickling)",
    ])


def format_ds(path: str) -> str:
    f = DsFile(path)
    docs, tokens = f.document_count, f.token_count
    shortest, longest, empty, masked = None, 0, 0, 0
    for a in range(0, docs, BLOCK):
        lengths = np.diff(f.ends(a, min(docs, a + BLOCK)))
        shortest = int(lengths.min()) if shortest is None else min(shortest, int(lengths.min()))
        longest = max(longest, int(lengths.max()))
        empty += len(lengths) - int(np.count_nonzero(lengths))
    for a in range(0, tokens if f.loss is not None else 0, BLOCK):
        masked += int(np.count_nonzero(np.asarray(f.loss[a : a + BLOCK]) == 0))
    width = f"{f.token_size}-byte tokens" + (f" (tokenizer {f.tokenizer})" if f.tokenizer else
                                             " (no .metadata: width from the data's size over the last end)")
    return "\n".join([
        f"datatrove file {path} (.ds)",
        f"  {width}, {docs:,} documents, {tokens:,} tokens",
        (f"  document length min {shortest or 0:,} / mean {tokens / docs if docs else 0:,.2f} / max {longest:,}; "
         f"{empty:,} empty"),
        f"  loss mask {f.loss_file}: {masked:,} token(s) masked" if f.loss_file else "  no loss mask",
    ])


def format_olmo(f: OlmoFile) -> str:
    docs, shortest, longest = 0, None, 0
    for lengths in f.document_lengths():
        docs += len(lengths)
        shortest = int(lengths.min()) if shortest is None else min(shortest, int(lengths.min()))
        longest = max(longest, int(lengths.max()))
    return "\n".join([
        f"OLMo token file {f.path} (headerless {f.dtype.name} ids, documents ending with EOS {f.eos_id})",
        f"  {docs:,} documents, {f.token_count:,} tokens"
        + ("" if f.terminated else "; the last document has no EOS (OLMo's document-aware datasets drop it)"),
        f"  document length min {shortest:,} / mean {f.token_count / docs:,.2f} / max {longest:,} (EOS included)",
    ])


def inspect_sft_packed(path: str) -> Report:
    """A Megatron-Bridge packed SFT file, read without unpickling; a damaged one is refused
    (FormatError), its rows' problems are the report's."""
    rows = sft_packed.read_packed(path)
    tokens = np.diff(rows.token_offsets)
    kind = "Parquet" if sft_packed.is_parquet(path) else ".npy of pickled rows, read without unpickling"
    text = "\n".join([
        f"packed SFT file {path} (Megatron-Bridge, {kind})",
        f"  {rows.packs:,} packs, {rows.examples:,} examples, {rows.tokens:,} tokens; "
        f"{int(np.count_nonzero(rows.loss_mask)):,} in the loss",
        f"  pack length min {int(tokens.min()) if rows.packs else 0:,} / mean "
        f"{rows.tokens / rows.packs if rows.packs else 0:,.2f} / max {rows.longest:,}; examples per pack max "
        f"{int(np.diff(rows.place_offsets).max()) if rows.packs else 0:,}",
    ])
    problems = sft_packed.problems(path, rows)
    return Report("\n".join([text, *(f"  problem: {p}" for p in problems)]), problems)


def inspect_path(path: str, megatron_version: str | None = None, eos_id: int | None = None,
                 dtype: str | None = None) -> Report:
    """A packed SFT file, a ``.pbin``, ``.ds`` or OLMo (``.npy``, of ``dtype`` ids ending documents
    with ``eos_id``) file, a dataset prefix or a cache directory, as ``formats.paths.named`` tells
    them apart (a cache's tokenizer identities read as ``megatron_version``'s flags; default as
    ``versions.resolve``)."""
    found = read_in_place(named(path))
    if found.kind == SFT_PACKED:
        return inspect_sft_packed(path)
    if found.kind == PBIN:
        return Report(format_pbin(path), [])
    if found.kind == DS:
        return Report(format_ds(path), [])
    if found.kind == OLMO:
        return Report(format_olmo(OlmoFile(path, given_width(f"inspect: {path}", dtype, None),
                                           given_eos(eos_id, "inspect"))), [])
    # a prefix missing from its bucket too: the error of its index's download names the bucket and key
    if found.kind == MEGATRON or (found.kind == MISSING and is_object_storage(path)):
        return Report(format_dataset(inspect_dataset(found.path)), [])
    if found.kind == DIRECTORY:
        cache = inspect_cache(path)
        return Report(format_cache(cache, resolve(megatron_version)), cache.problems)
    raise MegacacheError(f"{path}: not a dataset prefix (no {path}.idx) nor a cache directory")
