"""``megacache verify``: full consistency checks of a dataset (``.bin/.idx``, ``.pbin``, ``.ds``) or a cache directory.

Megatron's reader checks little beyond the header (docs/megatron.md §1.5); a truncated ``.bin``
or shuffled boundaries load fine and train on garbage, and so does a cache whose arrays were
damaged or built from another version of the dataset. This walks every array in bounded blocks
(vectorized) and reports the first bad element of each check by file and position.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..algorithms.blocks import BLOCK, first_bad
from ..algorithms.checks import integer
from ..algorithms.gpt_index import INT32_MAX, GPTIndexPlan
from ..algorithms.verification import (
    BlendSlice,
    blend_verdict,
    check_blend_order,
    check_sample_rows,
    count_documents,
    mark_permutation,
    permutation_marks,
)
from ..builders.gpt import array_shapes
from ..errors import FormatError, MegacacheError
from ..formats.datatrove import DsFile
from ..formats.indexed import IndexCopies, IndexedDataset, bin_path, idx_path, read_layout
from ..formats.npy import load_npy
from ..formats.olmo import OlmoFile, given_eos, given_width
from ..formats import sft_packed
from ..formats.paths import DIRECTORY, DS, OLMO, PBIN, SFT_PACKED, Named, named, read_in_place
from ..formats.pbin import PackedFile, expected_offsets
from ..megatron.cache import describe, description_hash
from ..megatron.tokenizer import versions_of
from ..megatron.versions import resolve
from ..runtime.comm import Comm, SingleComm
from ..runtime.fsio import pread_into, read_ahead
from ..runtime.object_storage import ObjectArray, is_object_storage
from ..runtime.progress import BYTES, Progress, quiet
from .inspection import count_blend, in_order, list_cache, read_entry, split_range, tokenizer_note


def verify_dataset(prefix: str, vocab_size: int | None = None, check_tokens: bool = True) -> list[str]:
    """Every problem found (empty when the dataset is sound). Each names the file and the element.
    A dataset in a bucket is read where it is (``IndexCopies``)."""
    with IndexCopies() as copies:
        return _dataset_problems(copies, prefix, vocab_size, check_tokens)


def _dataset_problems(copies: IndexCopies, prefix: str, vocab_size: int | None, check_tokens: bool) -> list[str]:
    try:
        ds = copies.open(prefix, check_bin_size=False)  # checked below, after every pointer
    except FormatError as exc:
        return [str(exc)]
    problems: list[str] = []
    lay, idxf, binf = ds.layout, idx_path(prefix), bin_path(prefix)
    S, item = lay.sequence_count, lay.dtype.itemsize

    docs = ds.document_indices
    if docs[0] != 0:
        problems.append(f"{idxf}: document_indices[0] is {int(docs[0])}, expected 0")
    if docs[-1] != S:
        problems.append(f"{idxf}: document_indices[-1] is {int(docs[-1])}, expected the sequence count {S}")
    for a in range(0, len(docs) - 1, BLOCK):
        block = np.asarray(docs[a : a + BLOCK + 1])
        bad = first_bad(np.diff(block) < 0)
        if bad is not None:
            k = a + bad
            problems.append(f"{idxf}: document_indices not monotone at entry {k + 1}: "
                            f"{int(docs[k])} then {int(docs[k + 1])}")
            break

    expected = 0  # byte offset where the next sequence must start
    for a in range(0, S, BLOCK):
        lengths = np.asarray(ds.sequence_lengths[a : a + BLOCK], dtype=np.int64)
        pointers = np.asarray(ds.sequence_pointers[a : a + BLOCK])
        bad = first_bad(lengths < 0)
        if bad is not None:
            problems.append(f"{idxf}: sequence {a + bad} has negative length {int(lengths[bad])}")
            break
        want = expected + np.concatenate(([0], np.cumsum(lengths[:-1] * item)))
        bad = first_bad(pointers != want)
        if bad is not None:
            problems.append(f"{idxf}: pointer of sequence {a + bad} is {int(pointers[bad])}, but the lengths "
                            f"before it put it at byte {int(want[bad])}")
            break
        expected = int(want[-1] + lengths[-1] * item)
    else:
        if ds.bin_size != expected:
            what = "truncated" if ds.bin_size < expected else "longer than its index says"
            problems.append(f"{binf}: {ds.bin_size} bytes, but the index covers {expected}: the file is {what}")

    if check_tokens and vocab_size is not None and not problems:
        problems += _vocabulary_problems(binf, ds.tokens, vocab_size)
    return problems


def _vocabulary_problems(path: str, tokens: np.ndarray | ObjectArray, vocab_size: int | None) -> list[str]:
    """The first token of ``tokens`` (a mapped array, or an object's read a block at a time)
    outside the vocabulary, if any, by position; nothing is checked without a vocabulary size."""
    for a in range(0, len(tokens) if vocab_size is not None else 0, BLOCK):
        block = np.asarray(tokens[a : a + BLOCK])
        bad = first_bad((block < 0) | (block >= vocab_size))
        if bad is not None:
            return [f"{path}: token {a + bad} has id {int(block[bad])}, outside the vocabulary of size {vocab_size}"]
    return []


def verify_pbin(path: str, vocab_size: int | None = None) -> tuple[list[str], str]:
    """Every problem of a ``.pbin`` (none when sound), and its summary line: its header, every byte
    of its index (never unpickled), documents aligned, in order, contiguous and covering the data,
    tokens in the vocabulary. Each problem names the file and the byte or document. Read a block at
    a time."""
    try:
        f = PackedFile(path)
        expected = 0
        for first, offsets, lengths in f.windows(BLOCK):
            wanted = expected_offsets(lengths, expected)
            bad = first_bad(offsets != wanted)
            if bad is not None:
                d = first + bad
                if d == 0:
                    return [f"{path}: document 0 starts at token {int(offsets[0])}, not 0"], ""
                return [f"{path}: {int(offsets[bad] - wanted[bad])} token(s) between documents {d - 1} and {d}: the "
                        "documents do not follow each other"], ""
            expected = int(offsets[-1] + lengths[-1])
    except FormatError as exc:
        return [str(exc)], ""
    total = len(f.tokens)
    if expected != total:
        return [f"{path}: the documents cover {expected:,} of the data's {total:,} tokens"], ""
    problems = _vocabulary_problems(path, f.tokens, vocab_size)
    if problems:
        return problems, ""
    return [], f"{path}: {f.document_count:,} documents, {total:,} tokens ({f.token_size}-byte tokens)"


def verify_ds(path: str, vocab_size: int | None = None) -> tuple[list[str], str]:
    """Every problem of a datatrove ``.ds`` (none when sound), and its summary line: the sizes of
    the data, index and loss mask, the width, every document end (non-decreasing, covering the
    data), loss bytes 0 or 1, tokens in the vocabulary. Read a block at a time."""
    try:
        f = DsFile(path)
        for a in range(0, f.document_count, BLOCK):
            f.ends(a, min(f.document_count, a + BLOCK))
    except FormatError as exc:
        return [str(exc)], ""
    problems = _vocabulary_problems(path, f.tokens, vocab_size)
    if problems:
        return problems, ""
    for a in range(0, f.token_count if f.loss is not None else 0, BLOCK):
        bad = first_bad(np.asarray(f.loss[a : a + BLOCK]) > 1)
        if bad is not None:
            return [f"{f.loss_file}: byte {a + bad} is {int(f.loss[a + bad])}; a loss mask holds 0 (masked) or 1"], ""
    mask = ", a loss mask" if f.loss_file else ""
    return [], (f"{path}: {f.document_count:,} documents, {f.token_count:,} tokens ({f.token_size}-byte tokens"
                f"{mask}; datatrove .ds)")


def verify_olmo(path: str, dtype: np.dtype, eos_id: int, vocab_size: int | None = None) -> tuple[list[str], str]:
    """Every problem of an OLMo token file (none when sound) and its summary line: no numpy header,
    a size of whole tokens, the EOS inside the width, tokens in the vocabulary. Read a block at a time."""
    try:
        f = OlmoFile(path, dtype, eos_id)
    except FormatError as exc:
        return [str(exc)], ""
    problems = _vocabulary_problems(path, f.tokens, vocab_size)
    if problems:
        return problems, ""
    docs = sum(len(lengths) for lengths in f.document_lengths())
    tail = "" if f.terminated else ", the last without EOS"
    return [], (f"{path}: {docs:,} documents{tail}, {f.token_count:,} tokens ({f.dtype.name}, EOS {eos_id}; "
                "OLMo token file)")


def verify_sft_packed(path: str) -> tuple[list[str], str]:
    """Every problem of a Megatron-Bridge packed SFT file (none when sound) and its summary line:
    read without unpickling (``formats.sft_packed``), every pack's loss mask and seq_start_id checked."""
    try:
        rows = sft_packed.read_packed(path)
    except FormatError as exc:
        return [str(exc)], ""
    problems = sft_packed.problems(path, rows)
    if problems:
        return problems, ""
    return [], (f"{path}: {rows.packs:,} packs, {rows.examples:,} examples, {rows.tokens:,} tokens, longest pack "
                f"{rows.longest:,} (Megatron-Bridge packed SFT)")


def summarize_dataset(ds: IndexedDataset) -> str:
    tokens = int(ds.bin_size // ds.dtype.itemsize)
    return (f"{ds.prefix}: {ds.num_documents:,} documents, {len(ds):,} sequences, {tokens:,} tokens "
            f"({ds.dtype.name})")


# ---------------------------------------------------------------------------------------------
# Cache directories


@dataclass
class EntryVerdict:
    """The checks of one cache entry: a one-line summary when sound, else the problems."""

    hash: str
    class_name: str
    split_name: str
    summary: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.hash} {self.class_name} {self.split_name}"


def verify_cache(directory: str, megatron_version: str | None = None, comm: Comm | None = None,
                 progress: Progress | None = None) -> list[EntryVerdict]:
    """Every entry of a cache directory, checked against its description, its dataset and its blend's
    children (in the same directory), and its tokenizer identity against ``megatron_version``'s
    (default as ``versions.resolve``): an identity only other versions build is never found.

    Collective over ``comm``'s ranks: each reads a share of the entries and checks a share (balanced
    by their bytes), every rank checks a slice of each blend; every rank returns every verdict, in
    inspect's order. The verdicts do not depend on the number of ranks. ``progress`` counts the
    bytes of the entries checked whole and the draws of the blends checked in slices."""
    comm = comm or SingleComm()
    progress = progress or quiet()
    version = resolve(megatron_version)
    listed = comm.on_root(lambda: sorted(list_cache(directory).entries, key=_key), "listing the cache")
    with comm.agreed("reading the cache entries"):
        mine = listed[comm.rank :: comm.size]
        for e in mine:
            read_entry(e, count_whole_blends=False)  # whole blends are counted in slices below
    entries = in_order([e for part in comm.allgather(mine) for e in part])
    gpt = {e.hash: e for e in entries if e.class_name == "GPTDataset"}
    sliced = [e for e in entries if _sliceable(e)]
    alone = [e for e in entries if not _sliceable(e)]
    verdicts = {}
    progress.phase("cache entries", sum(_size(e) for e in alone), BYTES)
    progress.phase("blend draws", sum(e.arrays["dataset_index.npy"][0][0] for e in sliced), "samples")
    with comm.agreed("checking the cache entries"), IndexCopies() as copies:
        owned = [e for e, owner in zip(alone, _owners(alone, comm.size)) if owner == comm.rank]
        for i, e in enumerate(owned):
            if i + 1 < len(owned):
                _read_ahead(owned[i + 1])  # read while this one is checked
            verdicts[_key(e)] = _verify_entry(e, gpt, version, copies)
            progress.add("cache entries", _size(e))
    for e in sliced:
        verdicts[_key(e)] = _verify_blend_slices(e, gpt, comm, progress.counter("blend draws"))
    for part in comm.allgather({k: v for k, v in verdicts.items() if v is not None}):
        verdicts.update(part)
    return [verdicts[_key(e)] for e in entries]


def _read_ahead(e) -> None:
    """Start reading an entry's arrays, and its dataset's sequence lengths, into the page cache."""
    for what in e.arrays:
        read_ahead(e.path(what))
    path = e.description.get("dataset_path") if isinstance(e.description, dict) else None
    if is_object_storage(str(path)):
        return  # its index is copied from the bucket when the entry is checked
    try:
        layout = read_layout(idx_path(str(path)))
    except MegacacheError:
        return  # not a GPTDataset's, or a dataset the check reports
    read_ahead(idx_path(str(path)), layout.lengths_offset, 4 * layout.sequence_count)


def _key(e) -> tuple[str, str, str]:
    return e.hash, e.class_name, e.split_name


def _size(e) -> int:
    """The bytes of an entry's arrays."""
    return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in e.arrays.values())


def _owners(entries: list, ranks: int) -> list[int]:
    """A rank for each entry: the largest first, each to the rank with the fewest bytes so far."""
    load = [0] * ranks
    owners = [0] * len(entries)
    sizes = [_size(e) for e in entries]
    for i in sorted(range(len(entries)), key=lambda i: (-sizes[i], i)):
        owners[i] = r = load.index(min(load))
        load[r] += sizes[i]
    return owners


def _verify_entry(e, gpt: dict, version: str, copies: IndexCopies) -> EntryVerdict:
    if e.class_name == "BlendedDataset" and e.whole:  # not counted when read (read_entry)
        count_blend(e, load_npy(e.path("dataset_index.npy")))
    v = EntryVerdict(e.hash, e.class_name, e.split_name, problems=list(e.problems))
    # Deeper checks need every array readable and a description to check them against.
    if e.whole and e.class_name == "GPTDataset":
        _verify_gpt(e, v, copies)
        tokenizer = e.description.get("tokenizer")
        others = versions_of(tokenizer) if isinstance(tokenizer, dict) else []
        if others and version not in others:
            v.problems.append(f"{e.path('description.txt')}: its tokenizer is {tokenizer_note(tokenizer, version)}; "
                              f"rebuild with --megatron-version {version}")
    elif e.whole:  # a blend found wrong before its draws could be checked (see _sliceable)
        v.problems += _blend_problems(e)
    return v


def _dtype_problem(path: str, dtype: np.dtype, shape: tuple, dtypes: tuple, ndim: int, what: str) -> str | None:
    if dtype in dtypes and len(shape) == ndim:
        return None
    allowed = " or ".join(np.dtype(d).name for d in dtypes)
    return f"{path}: {dtype.name}{list(shape)}, expected {what} of {allowed}"


def _matching_plans(e, lengths: np.ndarray, split_range: tuple[int, int], shapes: dict) -> list[GPTIndexPlan]:
    """The plans whose arrays have these lengths, shapes and dtypes. The description does not record
    add_extra_token or drop_last (Megatron's hash ignores them), so every setting Megatron can use
    is tried: drop_last is configurable for the valid split only."""
    ids = e.description
    drop_lasts = (True, False) if e.split_name == "valid" else (True,)
    if len(lengths) == 0:  # megatron-core builds no GPTDataset on an empty dataset
        return []
    try:  # the description's sequence length: a plan of Megatron's has one within int32
        seq_length = integer("sequence_length", ids.get("sequence_length"), 1, INT32_MAX)
    except MegacacheError:
        return []
    # The lengths are read once, not once per setting tried (each a pass over the whole dataset).
    beg, end = split_range
    tokens, longest = int(np.sum(lengths[beg:end], dtype=np.int64)), int(np.max(lengths))
    plans = []
    for x in (1, 0):
        for drop_last in drop_lasts:
            if seq_length + x > INT32_MAX:
                continue
            try:
                p = GPTIndexPlan.from_counts(num_documents=end - beg, tokens_per_epoch=tokens,
                                             num_samples=ids.get("num_samples"), seq_length=seq_length,
                                             add_extra_token=x, drop_last=drop_last, longest_document=longest)
            except MegacacheError:
                continue
            if shapes == {what: (shape, dtype) for what, (dtype, shape) in array_shapes(p).items()}:
                plans.append(p)
    return plans


def _verify_gpt(e, v: EntryVerdict, copies: IndexCopies) -> None:
    ids = e.description
    doc_path, sample_path, shuffle_path = (e.path(w) for w in ("document_index.npy", "sample_index.npy",
                                                               "shuffle_index.npy"))
    doc, samples, shuffled = load_npy(doc_path), load_npy(sample_path), load_npy(shuffle_path)
    bad_dtypes = [p for p in (
        _dtype_problem(doc_path, doc.dtype, doc.shape, (np.int32,), 1, "1-D"),
        _dtype_problem(sample_path, samples.dtype, samples.shape, (np.int32, np.int64), 2, "rows of 2"),
        _dtype_problem(shuffle_path, shuffled.dtype, shuffled.shape, (np.uint32, np.int64), 1, "1-D"),
    ) if p]
    if samples.ndim == 2 and samples.shape[1] != 2:
        bad_dtypes.append(f"{sample_path}: shape {list(samples.shape)}, expected rows of 2 (position, offset)")
    if bad_dtypes:
        v.problems += bad_dtypes
        return
    try:
        dataset = copies.open(str(ids["dataset_path"]))
    except (MegacacheError, KeyError) as exc:
        v.problems.append(f"{e.path('description.txt')}: its dataset cannot be read ({exc}); run verify where "
                          f"the description's dataset_path resolves")
        return
    lengths = dataset.sequence_lengths
    try:
        lo, hi = split_range(ids, e.split_name, len(lengths))
    except (TypeError, IndexError, ValueError):
        v.problems.append(f"{e.path('description.txt')}: split_matrix {ids.get('split_matrix')!r} gives the "
                          f"{e.split_name} split no sequence range")
        return
    plans = _matching_plans(e, lengths, (lo, hi), {w: e.arrays[w] for w in e.arrays})
    if not plans:
        v.problems.append(f"{sample_path}: shapes match no plan for this dataset: the dataset changed since the "
                          f"cache was built, or the cache is corrupt")
    doc_problems = _check_document_index(doc_path, doc, lo, hi)
    v.problems += doc_problems
    n = len(samples) - 1
    if not doc_problems:  # the offsets are checked against the documents the index names
        # The exact offset rule depends on add_extra_token: the rows must obey it for one setting
        # (a matching plan's, or either when none matches).
        extra_tokens = list(dict.fromkeys(p.add_extra_token for p in plans)) or [1, 0]
        sample_problems, viable = _check_sample_index(sample_path, samples, doc, lengths, extra_tokens)
        v.problems += sample_problems
        plans = [p for p in plans if p.add_extra_token in viable]
    v.problems += _check_shuffle_index(shuffle_path, shuffled, n)
    if not v.problems:
        matched = " or ".join(f"add_extra_token={bool(p.add_extra_token)} drop_last={p.drop_last}" for p in plans)
        epochs = len(doc) // (hi - lo) if hi > lo else 0
        v.summary = (f"{n:,} samples, {epochs} epoch(s) of sequences [{lo:,}, {hi:,}) of {ids['dataset_path']}; "
                     f"plan matches {matched}")


def _check_document_index(path: str, doc: np.ndarray, lo: int, hi: int) -> list[str]:
    """Values inside the split's sequences, each sequence as often as the others (once per epoch)."""
    counts = np.zeros(hi - lo, dtype=np.int64)
    for a in range(0, len(doc), BLOCK):
        block = np.asarray(doc[a : a + BLOCK])
        bad = count_documents(block, lo, hi, counts)
        if bad is not None:
            return [f"{path}: document_index[{a + bad}] is {int(block[bad])}, outside the split's sequences "
                    f"[{lo}, {hi})"]
    epochs = len(doc) // (hi - lo) if hi > lo else 0
    bad = first_bad(counts != epochs)
    if bad is not None:
        return [f"{path}: sequence {lo + bad} appears {int(counts[bad])} times, but {len(doc):,} positions over "
                f"{hi - lo:,} sequences make {len(doc) / max(hi - lo, 1):g} epochs: each must appear once per epoch"]
    return []


def _check_sample_index(path: str, samples: np.ndarray, doc: np.ndarray, lengths: np.ndarray,
                        extra_tokens: list[int]) -> tuple[list[str], list[int]]:
    """Row 0 is (0, 0); positions rise and stay inside the document index; each offset is one Megatron's
    walk records. Sample k starts at stream token k·L; with S[i] the tokens before position i, its row
    is the smallest i with S[i+1] >= k·L + x, so 1 - x <= offset <= len(document i) - x. Rows past the
    last token (no drop_last) repeat (M-1, len(last document) - x), which is -x for an empty one.
    The problems, and the settings of x (from ``extra_tokens``, in order of preference) all rows obey."""
    M = len(doc)
    if len(samples) and (samples[0, 0] != 0 or samples[0, 1] != 0):
        return [f"{path}: sample_index[0] is ({int(samples[0, 0])}, {int(samples[0, 1])}), expected (0, 0)"], []
    previous = 0
    viable = list(extra_tokens)
    for a in range(1, len(samples), BLOCK):
        rows = np.asarray(samples[a : a + BLOCK])
        unordered, outside, *bad_offsets = check_sample_rows(rows, previous, doc, lengths)
        if unordered is not None:
            before = previous if unordered == 0 else int(rows[unordered - 1, 0])
            return [f"{path}: sample_index not monotone at row {a + unordered}: document position "
                    f"{before} then {int(rows[unordered, 0])}"], []
        if outside is not None:
            return [f"{path}: sample_index[{a + outside}] has document position {int(rows[outside, 0])}, outside the "
                    f"document index of {M:,} positions"], []
        failures = [(x, bad_offsets[x]) for x in viable if bad_offsets[x] is not None]
        viable = [x for x in viable if bad_offsets[x] is None]
        if not viable:
            x, bad = failures[0]
            p, offset = int(rows[bad, 0]), int(rows[bad, 1])
            length = int(lengths[doc[p]])
            return [f"{path}: sample_index[{a + bad}] is ({p}, {offset}), but the document at position "
                    f"{p} (sequence {int(doc[p])}) has {length} tokens: offsets lie in "
                    f"[{1 - x}, {length - x}]"], []
        previous = int(rows[-1, 0])
    return [], viable


def _check_shuffle_index(path: str, shuffled: np.ndarray, num_samples: int) -> list[str]:
    """A permutation of [0, len) covering at least every sample."""
    if len(shuffled) < num_samples:
        return [f"{path}: {len(shuffled):,} entries, fewer than the sample index's {num_samples:,} samples"]
    marks = permutation_marks(len(shuffled))
    for a in range(0, len(shuffled), BLOCK):
        block = np.asarray(shuffled[a : a + BLOCK])
        outside, repeat = mark_permutation(block, len(shuffled), marks)
        if outside is not None:
            return [f"{path}: shuffle_index[{a + outside}] is {int(block[outside])}, outside [0, {len(shuffled):,})"]
        if repeat is not None:
            return [f"{path}: shuffle_index[{a + repeat}] is {int(block[repeat])}, which appears earlier too: not a "
                    f"permutation"]
    return []


def _blend_problems(e) -> list[str]:
    """What keeps a whole blend entry's draws from being checked: its arrays' types, its description's
    datasets, its size."""
    ids = e.description
    index_path, sample_path = e.path("dataset_index.npy"), e.path("dataset_sample_index.npy")
    (index_shape, index_dtype), (sample_shape, sample_dtype) = (e.arrays["dataset_index.npy"],
                                                                e.arrays["dataset_sample_index.npy"])
    bad_dtypes = [p for p in (_dtype_problem(index_path, index_dtype, index_shape, (np.int16,), 1, "1-D"),
                              _dtype_problem(sample_path, sample_dtype, sample_shape, (np.int64,), 1, "1-D")) if p]
    if bad_dtypes:
        return bad_dtypes
    datasets, size, weights = ids.get("datasets"), ids.get("size"), ids.get("weights")
    if not isinstance(datasets, list):
        return [f"{e.path('description.txt')}: no list of datasets"]
    if size is None and isinstance(weights, list) and all(isinstance(w, int) for w in weights):
        size = sum(weights)  # an unweighted blend takes every sample of every dataset
    return [f"{path}: {shape[0]:,} samples, but the description's size is {size}"
            for path, shape in ((index_path, index_shape), (sample_path, sample_shape)) if shape[0] != size]


def _sliceable(e) -> bool:
    """A blend whose draws are checked in slices over the ranks: nothing found wrong before."""
    return e.class_name == "BlendedDataset" and e.whole and not e.problems and not _blend_problems(e)


def _verify_blend_slices(e, gpt: dict, comm: Comm, checked: Callable[[int], None]) -> EntryVerdict:
    """A sliceable blend's verdict, every rank checking a slice of its draws (the same verdict on
    every rank), telling ``checked`` the draws of each block."""
    v = EntryVerdict(e.hash, e.class_name, e.split_name)
    datasets = e.description["datasets"]
    index_path, sample_path = e.path("dataset_index.npy"), e.path("dataset_sample_index.npy")
    n = e.arrays["dataset_index.npy"][0][0]
    with comm.agreed("checking a blend's draws"):
        mine = BlendSlice(len(datasets))
        lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
        for a, indices, samples in _blocks(((index_path, np.int16), (sample_path, np.int64)), lo, hi):
            check_blend_order(indices, samples, a, mine)
            checked(len(indices))
    outside, unordered, counts = blend_verdict(comm.allgather(mine))
    if outside is not None:
        a, value = outside
        v.problems.append(f"{index_path}: dataset_index[{a}] is {value}, outside the description's {len(datasets)} "
                          f"datasets")
        return v
    if unordered is not None:
        a, d, got, want = unordered
        v.problems.append(f"{sample_path}: dataset_sample_index[{a}] is {got}, but it is sample {want} drawn from "
                          f"dataset {d}: each dataset's samples must be 0, 1, 2, ... in order")
        return v
    for d, child in enumerate(datasets):
        child_hash = description_hash(describe(child))
        entry = gpt.get(child_hash)
        name = child.get("dataset_path") if isinstance(child, dict) else child
        if entry is None or "sample_index.npy" not in entry.arrays:
            v.problems.append(f"{e.path('description.txt')}: dataset {d} ({name}) has no GPTDataset entry "
                              f"{child_hash} in {e.directory}: rebuild the cache")
        elif counts[d] > entry.samples:
            v.problems.append(f"{index_path}: {int(counts[d]):,} samples drawn from dataset {d} ({name}), but its "
                              f"entry {child_hash} has only {entry.samples:,}")
    if not v.problems:
        spread = f" (per dataset: min {int(counts.min()):,}, max {int(counts.max()):,})" if len(counts) else ""
        v.summary = f"{n:,} samples from {len(datasets):,} datasets{spread}"
    return v


def _blocks(files, lo: int, hi: int):
    """``(position, block of each file, ...)`` over elements ``[lo, hi)`` of same-length ``.npy`` arrays,
    ``BLOCK`` at a time, read into buffers reused from block to block (memory per rank is a block,
    whatever the arrays' size)."""
    fds, offsets, buffers = [], [], []
    try:
        for path, dtype in files:
            offsets.append(load_npy(path).offset)
            fds.append(os.open(path, os.O_RDONLY))
            buffers.append(np.empty(min(BLOCK, hi - lo), dtype=dtype))
        for a in range(lo, hi, BLOCK):
            m = min(BLOCK, hi - a)
            for (path, _), buf, off in zip(files, buffers, offsets):  # the next block, while this one is checked
                if a + m < hi:
                    read_ahead(path, off + (a + m) * buf.itemsize, min(BLOCK, hi - a - m) * buf.itemsize)
            yield (a, *(pread_into(fd, buf[:m], off + a * buf.itemsize)
                        for fd, buf, off in zip(fds, buffers, offsets)))
    finally:
        for fd in fds:
            os.close(fd)


# ---------------------------------------------------------------------------------------------
# The paths given to ``megacache verify``


@dataclass(frozen=True)
class Verdict:
    """One dataset's or cache entry's outcome: its name, its summary line when sound, else its
    problems."""

    name: str
    summary: str
    problems: list[str]


def _check_dataset(found: Named, vocab_size: int | None, dtype: str | None, eos_id: int | None) -> Verdict:
    path = found.path
    if found.kind in (PBIN, DS):
        problems, summary = (verify_ds if found.kind == DS else verify_pbin)(path, vocab_size=vocab_size)
        return Verdict(path, summary, problems)
    if found.kind == SFT_PACKED:
        return Verdict(path, *reversed(verify_sft_packed(path)))
    if found.kind == OLMO:
        problems, summary = verify_olmo(path, given_width(f"verify: {path}", dtype, vocab_size),
                                        given_eos(eos_id, "verify"), vocab_size=vocab_size)
        return Verdict(path, summary, problems)
    with IndexCopies() as copies:  # a MISSING one's problem says what is missing
        problems = _dataset_problems(copies, path, vocab_size, check_tokens=True)
        return Verdict(path, "" if problems else summarize_dataset(copies.open(path)), problems)


def verify_paths(paths: list[str], megatron_version: str | None = None, comm: Comm | None = None, *,
                 vocab_size: int | None = None, dtype: str | None = None, eos_id: int | None = None,
                 progress_interval_s: float | None = None,
                 report: Callable[[Verdict], None] | None = None) -> list[Verdict]:
    """The verdicts on ``paths`` (as ``formats.paths.named`` reads them: datasets of any format, cache
    directories checked by ``verify_cache`` as ``megatron_version``), in order, a cache directory's
    entries in inspect's order, one failing verdict for a directory without entries. ``vocab_size``
    as ``verify_dataset``'s; ``dtype`` and ``eos_id`` describe OLMo files. ``report`` is called with
    each verdict as soon as it is known, in that order.

    Collective over ``comm``'s ranks: they share out the datasets, then check each cache together;
    every rank returns every verdict. ``progress_interval_s``: seconds between progress lines on
    stderr (``runtime.progress``; None: its default, 0: none)."""
    comm = comm or SingleComm()
    report = report or (lambda verdict: None)
    found = comm.on_root(lambda: [read_in_place(named(path)) for path in paths], "finding the caches")
    datasets = [i for i, f in enumerate(found) if f.kind != DIRECTORY]
    # the ranks' progress files go beside the first path, unless it is in a bucket
    first = (paths[0] if found[0].kind == DIRECTORY else None if is_object_storage(paths[0]) else
             os.path.dirname(os.path.abspath(paths[0])))
    verdicts = []
    with Progress.beside(comm, first, "verify", progress_interval_s) as progress:
        progress.phase("datasets", len(datasets), "datasets")
        with comm.agreed("checking the datasets"):
            mine = {}
            for i in datasets[comm.rank :: comm.size]:
                mine[i] = _check_dataset(found[i], vocab_size, dtype, eos_id)
                progress.add("datasets", 1)
        checked = {i: v for part in comm.allgather(mine) for i, v in part.items()}
        for i, path in enumerate(paths):
            if i in checked:
                ours = [checked[i]]
            else:
                entries = verify_cache(path, megatron_version, comm, progress)
                ours = ([Verdict(v.title, f"{v.title}: {v.summary}", v.problems) for v in entries] or
                        [Verdict(path, "", [f"{path}: no cache entries in this directory"])])
            for verdict in ours:
                report(verdict)
            verdicts += ours
    return verdicts
