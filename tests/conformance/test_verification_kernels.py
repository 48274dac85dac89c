"""verify's kernels against their numpy references on random arrays with faults: document index
counts and sample index rows block by block, the permutation check block by block, and the blend's
sample order checked in slices (as ranks do) against one pass over the whole blend, with faults put
where slices and blocks meet."""

from __future__ import annotations

import numpy as np
import pytest

from megacache.algorithms.verification import (
    BlendSlice,
    blend_verdict,
    check_blend_order,
    check_blend_order_reference,
    check_sample_rows,
    check_sample_rows_reference,
    count_documents,
    count_documents_reference,
    mark_permutation,
    mark_permutation_reference,
    permutation_marks,
)


def cuts(rng, n: int, parts: int) -> list[int]:
    """``parts`` + 1 ascending bounds from 0 to n, some parts empty."""
    return [0, *sorted(rng.integers(0, n + 1, parts - 1).tolist()), n]


def readonly(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False  # as memory-mapped arrays are
    return array


def test_document_counts_equal_their_reference(kernel_mode):
    rng = np.random.default_rng(1)
    for case in range(300):
        lo, hi = sorted(rng.integers(0, 500, 2).tolist())
        hi += 1
        doc = rng.integers(lo, hi, int(rng.integers(0, 2000))).astype(np.int32)
        if case % 3 == 1 and len(doc):
            doc[int(rng.integers(0, len(doc)))] = rng.choice([lo - 1, hi, hi + 7])
        got, want = np.zeros(hi - lo, dtype=np.int64), np.zeros(hi - lo, dtype=np.int64)
        bounds = cuts(rng, len(doc), int(rng.integers(1, 4)))
        for a, b in zip(bounds, bounds[1:]):
            found = count_documents(readonly(doc[a:b].copy()), lo, hi, got)
            assert found == count_documents_reference(doc[a:b], lo, hi, want), case
            if found is not None:
                break
            assert got.tolist() == want.tolist()


def sample_rows_case(rng, case: int):
    """(rows, doc, lengths) of a random walk-like sample index with perhaps one fault."""
    lengths = rng.integers(0, 30, int(rng.integers(1, 300))).astype(np.int32)
    doc = rng.integers(0, len(lengths), int(rng.integers(1, 400))).astype(np.int32)
    n = int(rng.integers(1, 600))
    positions = np.sort(rng.integers(0, len(doc), n))
    x = int(case % 2)
    length = lengths[doc[positions]].astype(np.int64)
    offsets = np.array([rng.integers(1 - x, max(1 - x, l - x) + 1) for l in length], dtype=np.int64)
    rows = np.stack([positions, offsets], axis=1).astype(np.int32 if case % 4 < 2 else np.int64)
    fault, k = case % 7, int(rng.integers(0, n))
    if fault == 2 and k:
        rows[k, 0] = rows[k - 1, 0] - 1
    elif fault == 3:
        rows[k, 0] = len(doc) + int(rng.integers(0, 3))
    elif fault == 4:
        rows[k, 1] = length[k] - x + 1
    elif fault == 5:
        rows[k, 1] = -x - int(rng.integers(0, 2))
    elif fault == 6:  # past the last token: (M - 1, len - x) is allowed
        rows[-1] = (len(doc) - 1, int(lengths[doc[-1]]) - x)
    return rows, doc, lengths


def test_sample_rows_equal_their_reference(kernel_mode):
    rng = np.random.default_rng(2)
    found = 0
    for case in range(500):
        rows, doc, lengths = sample_rows_case(rng, case)
        previous = int(rng.integers(0, 3)) if case % 5 == 0 else 0
        bounds = cuts(rng, len(rows), int(rng.integers(1, 4)))
        for a, b in zip(bounds, bounds[1:]):
            block = readonly(rows[a:b].copy())
            got = check_sample_rows(block, previous, readonly(doc.copy()), readonly(lengths.copy()))
            assert got == check_sample_rows_reference(block, previous, doc, lengths), (case, a, b)
            found += any(f is not None for f in got)
            if b > a:
                previous = int(rows[b - 1, 0])
    assert found > 150


def permutation_case(rng, case: int) -> np.ndarray:
    n = int(rng.integers(1, 3000))
    values = rng.permutation(n).astype(np.int64 if case % 2 else np.uint32)
    fault = case % 5
    if fault in (1, 3) and n > 1:  # a repeat
        i, j = sorted(rng.choice(n, 2, replace=False))
        values[j] = values[i]
    if fault in (2, 3):  # a value outside, sometimes after the repeat
        values[int(rng.integers(0, n))] = n + int(rng.integers(0, 3))
    if fault == 4 and values.dtype == np.int64:
        values[int(rng.integers(0, n))] = -1
    return values


def test_permutation_check_equals_its_reference(kernel_mode):
    rng = np.random.default_rng(3)
    for case in range(400):
        values = permutation_case(rng, case)
        n = len(values)
        marks, seen = permutation_marks(n), np.zeros(n, dtype=bool)
        bounds = cuts(rng, n, int(rng.integers(1, 6)))
        for a, b in zip(bounds, bounds[1:]):
            block = values[a:b]
            block.flags.writeable = bool(case % 3)  # read-only like a memory map's blocks, or not
            got, want = mark_permutation(block, n, marks), mark_permutation_reference(block, n, seen)
            outside, repeat = got
            assert (outside, None if outside is not None else repeat) == want, (case, a, b)
            if outside is not None or repeat is not None:
                break


def blend_case(rng, case: int) -> tuple[np.ndarray, np.ndarray, int]:
    """A blend's (dataset_index, dataset_sample_index, datasets), perhaps with one fault."""
    D = int(rng.integers(1, 40))
    n = int(rng.integers(1, 4000))
    datasets = rng.integers(0, D, n).astype(np.int16)
    samples = np.zeros(n, dtype=np.int64)
    for d in range(D):
        where = np.flatnonzero(datasets == d)
        samples[where] = np.arange(len(where))
    fault = case % 6
    i = int(rng.integers(0, n))
    if fault == 1:
        samples[i] += int(rng.choice([-1, 1, 5]))
    elif fault == 2:  # two draws of one dataset swapped
        where = np.flatnonzero(datasets == datasets[i])
        if len(where) > 1:
            j, k = rng.choice(where, 2, replace=False)
            samples[[j, k]] = samples[[k, j]]
    elif fault == 3:
        datasets[i] = D if rng.integers(2) else -1
    elif fault == 4:  # every later draw of one dataset shifted: wrong where a later slice starts
        samples[np.flatnonzero(datasets == datasets[i])[1:]] += 1
    return datasets, samples, D


def reference_verdict(datasets: np.ndarray, samples: np.ndarray, D: int):
    outside = np.flatnonzero((datasets < 0) | (datasets >= D))
    if len(outside):
        return (int(outside[0]), int(datasets[outside[0]])), None
    counts = np.zeros(D, dtype=np.int64)
    bad = check_blend_order_reference(datasets, samples, counts)
    if bad is None:
        return None, None
    d = int(datasets[bad])
    want = int(np.count_nonzero(datasets[:bad] == d))
    return None, (bad, d, int(samples[bad]), want)


@pytest.mark.parametrize("slices", [1, 2, 3, 7])
def test_blend_order_in_slices_equals_one_pass(kernel_mode, slices):
    rng = np.random.default_rng(slices)
    found = 0
    for case in range(300):
        datasets, samples, D = blend_case(rng, case)
        n = len(datasets)
        states = []
        bounds = cuts(rng, n, slices) if case % 2 else [n * r // slices for r in range(slices + 1)]
        for lo, hi in zip(bounds, bounds[1:]):
            state = BlendSlice(D)
            inner = cuts(rng, hi - lo, int(rng.integers(1, 4)))
            for a, b in zip(inner, inner[1:]):
                check_blend_order(datasets[lo + a : lo + b], samples[lo + a : lo + b], lo + a, state)
            states.append(state)
        outside, unordered, counts = blend_verdict(states)
        assert (outside, unordered) == reference_verdict(datasets, samples, D), case
        if outside is None and unordered is None:
            assert counts.tolist() == np.bincount(datasets, minlength=D).tolist()
        found += outside is not None or unordered is not None
    assert found > 100  # the faults were there to find
