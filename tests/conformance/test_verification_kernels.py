"""verify's sequential checks against their numpy references: the permutation check block by block,
and the blend's sample order checked in slices (as ranks do) against one pass over the whole blend,
on random arrays with faults put where slices and blocks meet."""

from __future__ import annotations

import numpy as np
import pytest

from megacache.algorithms.verification import (
    BlendSlice,
    blend_verdict,
    check_blend_order,
    check_blend_order_reference,
    mark_permutation,
    mark_permutation_reference,
    permutation_marks,
)


def cuts(rng, n: int, parts: int) -> list[int]:
    """``parts`` + 1 ascending bounds from 0 to n, some parts empty."""
    return [0, *sorted(rng.integers(0, n + 1, parts - 1).tolist()), n]


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
