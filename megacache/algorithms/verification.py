"""The checks of ``megacache verify`` that pass over large arrays, as kernels (one pass per block)
beside their numpy references: a document index's values inside the split and counted, a sample
index's rows, that an array is a permutation (a shuffle index), and that a blend draws each
dataset's samples in order 0, 1, 2, ... (its ``dataset_sample_index``).

Each takes a block at a time, carrying its state between blocks, so a pass over billions of
elements holds one block. The blend check also runs on a slice of the blend: it counts from zero
and records the sample each dataset's first element in the slice names, and the caller checks those
against the counts of the slices before it (``blend_verdict``), so ranks check their slices at once.
"""

from __future__ import annotations

import numpy as np

from ..runtime.kernels import kernel

#: a dataset's sequence lengths: a memory map of its .idx (at an offset that may leave them unaligned)
_LENGTHS = ("readonly(unaligned(int32[::1]))", "readonly(int32[::1])")


def count_documents(block: np.ndarray, lo: int, hi: int, counts: np.ndarray) -> int | None:
    """The first position of ``block`` (document index values) outside ``[lo, hi)``, or None after
    adding each value's occurrences to ``counts[value - lo]``."""
    bad = _count_documents(np.ascontiguousarray(block), lo, hi, counts)
    return None if bad < 0 else int(bad)


def count_documents_reference(block: np.ndarray, lo: int, hi: int, counts: np.ndarray) -> int | None:
    block = np.asarray(block)
    outside = np.flatnonzero((block < lo) | (block >= hi))
    if len(outside):
        return int(outside[0])
    counts += np.bincount(block - lo, minlength=hi - lo)
    return None


@kernel("readonly(int32[::1]), int64, int64, int64[::1]", "int32[::1], int64, int64, int64[::1]")
def _count_documents(block, lo, hi, counts):
    for k in range(block.shape[0]):
        v = np.int64(block[k])
        if v < lo or v >= hi:
            return k
    for k in range(block.shape[0]):
        counts[np.int64(block[k]) - lo] += 1
    return -1


def check_sample_rows(rows: np.ndarray, previous: int, doc: np.ndarray, lengths: np.ndarray) -> list[int | None]:
    """The first row of a block of sample index rows (position, offset) that: goes back from the
    row before (``previous``: its position); names a position outside ``doc``; has an offset outside
    what Megatron's walk records with add_extra_token 0, then 1 (see ``readers/verify``): four
    positions in the block, or None. ``lengths``: the dataset's sequence lengths."""
    found = np.full(4, -1, dtype=np.int64)
    _check_sample_rows(np.ascontiguousarray(rows), previous, doc, lengths, found)
    return [None if f < 0 else int(f) for f in found]


def check_sample_rows_reference(rows: np.ndarray, previous: int, doc: np.ndarray,
                                lengths: np.ndarray) -> list[int | None]:
    rows = np.asarray(rows, dtype=np.int64)
    positions, offsets = rows[:, 0], rows[:, 1]
    M = len(doc)
    found: list[int | None] = [_first(np.diff(positions, prepend=previous) < 0),
                               _first((positions < 0) | (positions >= M))]
    inside = (positions >= 0) & (positions < M)
    length = np.zeros(len(rows), dtype=np.int64)
    length[inside] = lengths[doc[positions[inside]]]
    for x in (0, 1):
        past_end = (positions == M - 1) & (offsets == length - x)
        found.append(_first(((offsets < 1 - x) | (offsets > length - x)) & ~past_end & inside))
    return found


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


@kernel(*(f"{r}, int64, readonly(int32[::1]), {lengths}, int64[::1]"
          for r in ("readonly(int32[:, ::1])", "readonly(int64[:, ::1])") for lengths in _LENGTHS))
def _check_sample_rows(rows, previous, doc, lengths, found):
    M = doc.shape[0]
    last = previous
    for k in range(rows.shape[0]):
        p = np.int64(rows[k, 0])
        o = np.int64(rows[k, 1])
        if p < last and found[0] < 0:
            found[0] = k
        last = p
        if p < 0 or p >= M:
            if found[1] < 0:
                found[1] = k
            continue
        length = np.int64(lengths[doc[p]])
        for x in range(2):
            if found[2 + x] < 0 and (o < 1 - x or o > length - x) and not (p == M - 1 and o == length - x):
                found[2 + x] = k


_MARKED = ("readonly(int64[::1]), int64, uint8[::1], int64[::1]", "readonly(uint32[::1]), int64, uint8[::1], int64[::1]",
           "int64[::1], int64, uint8[::1], int64[::1]", "uint32[::1], int64, uint8[::1], int64[::1]")


def permutation_marks(size: int) -> np.ndarray:
    """The bit set ``mark_permutation`` carries between the blocks of a permutation of ``size``."""
    return np.zeros((size + 7) // 8, dtype=np.uint8)


def mark_permutation(block: np.ndarray, size: int, marks: np.ndarray) -> tuple[int | None, int | None]:
    """``(first value outside [0, size), first value seen before)`` of ``block``, positions in the
    block or None, marking its values in ``marks`` (``permutation_marks(size)``, carried between the
    blocks of one array). After a block with either, ``marks`` is no longer meaningful."""
    found = np.full(2, -1, dtype=np.int64)
    _mark_permutation(np.ascontiguousarray(block), size, marks, found)
    return tuple(None if f < 0 else int(f) for f in found)


def mark_permutation_reference(block: np.ndarray, size: int, seen: np.ndarray) -> tuple[int | None, int | None]:
    """``mark_permutation`` in numpy, with ``seen`` a bool array of ``size``."""
    block = np.asarray(block, dtype=np.int64)
    outside = np.flatnonzero((block < 0) | (block >= size))
    if len(outside):
        return int(outside[0]), None
    earlier = np.flatnonzero(seen[block])
    order = np.argsort(block, kind="stable")  # the first of equal values stays first
    ordered = block[order]
    within = order[1:][ordered[1:] == ordered[:-1]]
    repeats = earlier[:1].tolist() + within.tolist()
    seen[block] = True
    return None, (min(repeats) if repeats else None)


@kernel(*_MARKED)
def _mark_permutation(block, size, marks, found):
    for k in range(block.shape[0]):
        v = np.int64(block[k])
        if v < 0 or v >= size:
            found[0] = k
            return
        byte, bit = v >> 3, np.uint8(1 << (v & 7))
        if marks[byte] & bit:
            if found[1] < 0:
                found[1] = k  # the rest of the block is still searched for a value outside
        else:
            marks[byte] |= bit


class BlendSlice:
    """What ``check_blend_order`` learns of one slice of a blend: per dataset, the samples drawn
    (``counts``), the sample its first draw names and where (``first_sample``, ``first_position``);
    the first draw outside the datasets (``outside``: position, value) and the first draw that does
    not follow its dataset's first in the slice (``unordered``: position, dataset, value, expected
    value). Positions are the blend's."""

    def __init__(self, datasets: int):
        self.counts = np.zeros(datasets, dtype=np.int64)
        self.first_sample = np.zeros(datasets, dtype=np.int64)
        self.first_position = np.zeros(datasets, dtype=np.int64)
        self.found = np.full(6, -1, dtype=np.int64)  # outside: position, value; unordered: position, d, got, want

    @property
    def outside(self) -> tuple[int, int] | None:
        return None if self.found[0] < 0 else (int(self.found[0]), int(self.found[1]))

    @property
    def unordered(self) -> tuple[int, int, int, int] | None:
        return None if self.found[2] < 0 else tuple(int(x) for x in self.found[2:])


def check_blend_order(datasets: np.ndarray, samples: np.ndarray, position: int, state: BlendSlice) -> None:
    """One block (``dataset_index`` and ``dataset_sample_index`` at blend position ``position``) of a
    slice, into ``state``; blocks of a slice in order. Once a draw outside the datasets is found the
    slice is settled; after an unordered draw only the datasets are still checked."""
    if state.found[0] < 0:
        _check_blend_order(np.ascontiguousarray(datasets), np.ascontiguousarray(samples), position, state.counts,
                           state.first_sample, state.first_position, state.found)


@kernel("readonly(int16[::1]), readonly(int64[::1]), int64, int64[::1], int64[::1], int64[::1], int64[::1]",
        "int16[::1], int64[::1], int64, int64[::1], int64[::1], int64[::1], int64[::1]")
def _check_blend_order(datasets, samples, position, counts, first_sample, first_position, found):
    D = counts.shape[0]
    ordered = found[2] < 0
    for k in range(datasets.shape[0]):
        d = np.int64(datasets[k])
        if d < 0 or d >= D:
            found[0] = position + k
            found[1] = d
            return
        if ordered:
            c = counts[d]
            if c == 0:
                first_sample[d] = samples[k]
                first_position[d] = position + k
            elif samples[k] != first_sample[d] + c:
                found[2] = position + k
                found[3] = d
                found[4] = samples[k]
                found[5] = first_sample[d] + c
                ordered = False
            counts[d] = c + 1


def blend_verdict(slices: list[BlendSlice]) -> tuple[tuple | None, tuple | None, np.ndarray]:
    """From the slices of one blend in order: ``(outside, unordered, counts)``: the first draw outside
    the datasets (position, value) or None; else the first draw out of order (position, dataset,
    value, expected value) or None; and each dataset's samples (meaningful when neither is found).

    Slice r's draws of dataset d must start at the samples d drew in slices 0..r-1. The first slice
    that breaks this or its own order holds the blend's first bad draw: every slice before it was
    counted whole."""
    outside = [s.outside for s in slices if s.outside is not None]
    if outside:
        return min(outside), None, np.zeros_like(slices[0].counts)
    before = np.zeros_like(slices[0].counts)
    for s in slices:
        shifted = np.flatnonzero((s.counts > 0) & (s.first_sample != before))
        candidates = [(int(s.first_position[d]), int(d), int(s.first_sample[d]), int(before[d])) for d in shifted]
        if s.unordered is not None:
            candidates.append(s.unordered)
        if candidates:
            return None, min(candidates), before
        before = before + s.counts
    return None, None, before


def check_blend_order_reference(datasets: np.ndarray, samples: np.ndarray, counts: np.ndarray) -> int | None:
    """The first position of a block whose sample is not its dataset's next (``counts``: each
    dataset's samples before the block, advanced past it), in numpy: rank each draw among its
    dataset's in the block with a stable sort."""
    block = np.asarray(datasets, dtype=np.int64)
    order = np.argsort(block, kind="stable")
    grouped = block[order]
    group_start = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    rank = np.arange(len(grouped)) - np.repeat(group_start, np.diff(np.r_[group_start, len(grouped)]))
    want = np.empty(len(block), dtype=np.int64)
    want[order] = counts[grouped] + rank
    bad = np.flatnonzero(np.asarray(samples) != want)
    counts += np.bincount(block, minlength=len(counts))
    return int(bad[0]) if len(bad) else None
