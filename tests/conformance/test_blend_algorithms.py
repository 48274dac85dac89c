"""Blending sizes, indices and chunks against their oracle, megatron-core 0.16.1 itself: its C++
helpers (``build_blending_indices``, ``build_exhaustive_blending_indices``) and the builder's
``normalize`` and ``_get_size_per_split_per_dataset``."""

import itertools
import os
import re
import subprocess
import warnings
from types import SimpleNamespace

import numba
import numpy as np
import pytest

from megacache.algorithms import blend_chunks, blend_kernels
from megacache.algorithms.blend_chunks import (build_blending_indices_chunked, guess_counts, repair_rounds, unconfirmed_chunks,
                                               repair_chunk)
from megacache.algorithms.blend_kernels import blend_chunk, build_blending_indices, build_exhaustive_blending_indices
from megacache.algorithms.blend_sizes import (MAX_DATASETS, Oversample, blend_split_sizes, find_oversampling,
                                              normalize, size_per_split_per_dataset, unweighted_blend_size)
from megacache.errors import MegacacheError
from megacache.runtime import kernels

# every test twice: kernels through numba's JIT, then from the compiled library
pytestmark = pytest.mark.usefixtures("kernel_mode")


@pytest.fixture(scope="session")
def mcore(megatron):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import helpers_cpp, utils
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            _get_size_per_split_per_dataset,
        )

    def blending(weights, size):
        idx = np.zeros(size, dtype=np.int16)
        sidx = np.zeros(size, dtype=np.int64)
        helpers_cpp.build_blending_indices(idx, sidx, weights, len(weights), size, False)
        return idx, sidx

    def exhaustive(sizes):
        idx = np.zeros(int(np.sum(sizes)), dtype=np.int16)
        sidx = np.zeros(int(np.sum(sizes)), dtype=np.int64)
        helpers_cpp.build_exhaustive_blending_indices(idx, sidx, sizes, len(sizes))
        return idx, sidx

    return SimpleNamespace(
        blending=blending,
        exhaustive=exhaustive,
        normalize=utils.normalize,
        sizes=_get_size_per_split_per_dataset,
    )


FAMILIES = ["random", "equal", "decimal", "integer", "lognormal", "dirichlet", "near-equal", "geometric"]


def raw_weights(rng, family, D):
    """Weight families that stress different things: ties (equal, decimal, integer ratios),
    wide ranges (lognormal, sparse Dirichlet, geometric), near ties (near-equal)."""
    if family == "random":
        return rng.random(D) + 1e-3
    if family == "equal":
        return np.full(D, float(rng.choice([1.0, 0.3, 7.0])))
    if family == "decimal":
        return rng.choice([0.1, 0.2, 0.3, 0.7], D)
    if family == "integer":
        return rng.integers(1, 6, D).astype(float)
    if family == "lognormal":
        return rng.lognormal(0.0, 2.0, D)
    if family == "dirichlet":
        return rng.dirichlet(np.full(D, 0.3)) + 1e-9
    if family == "near-equal":
        return 1.0 + 1e-7 * rng.random(D)
    return 0.9 ** np.arange(D) + 1e-6  # geometric


def blend_weights(weights):
    # BlendedMegatronDatasetBuilder normalizes, then BlendedDataset normalizes again
    return normalize(normalize(weights))


def assert_same(actual, expected, what):
    idx, sidx = actual
    assert idx.dtype == np.int16 and sidx.dtype == np.int64, what
    if not np.array_equal(idx, expected[0]) or not np.array_equal(sidx, expected[1]):
        bad = np.flatnonzero((idx != expected[0]) | (sidx != expected[1]))
        raise AssertionError(f"{what}: {bad.size} samples differ, first at {bad[:5].tolist()}")


def run_chunked(weights, size, bounds, warmups, rng):
    """The distributed protocol by hand: speculate every chunk (some from deliberately wrong
    guesses, some from non-conforming ones), then repair in rounds."""
    D = len(weights)
    idx = np.empty(size, dtype=np.int16)
    sidx = np.empty(size, dtype=np.int64)
    starts, ends = [], []
    for (s0, s1), warmup in zip(itertools.pairwise(bounds), warmups):
        guess = guess_counts(weights, s0, warmup)
        if s0 and rng.random() < 0.3:
            # a wrong guess: move samples between datasets, keeping the total
            for _ in range(int(rng.integers(1, 4))):
                a, b = rng.integers(0, D, 2)
                moved = min(int(guess[a]), int(rng.integers(1, 3)))
                guess[a] -= moved
                guess[b] += moved
        starts.append(guess)
        ends.append(blend_chunk(weights, s0, guess, idx[s0:s1], sidx[s0:s1]))
    wrong = len(unconfirmed_chunks(starts, ends))
    recomputed = repair_rounds(weights, bounds, starts, ends, idx, sidx)
    assert (recomputed > 0) == (wrong > 0)
    assert not unconfirmed_chunks(starts, ends)
    assert np.array_equal(ends[-1], np.bincount(idx, minlength=D))
    return idx, sidx


def random_bounds(rng, size):
    cuts = {0, size}
    cuts.update(int(x) for x in rng.choice([0, 1, 2], int(rng.integers(0, 3))) if x <= size)
    cuts.update(int(x) for x in rng.integers(0, size + 1, int(rng.integers(0, 6))))
    return sorted(cuts) if size else [0, 0]


# ------------------------------------------------------------------------------------------------
# Worked examples (docs/megatron.md §4.1, §4.4, §7 fact 9)


@pytest.mark.parametrize("reference", [False, True])
def test_fact9_blending_examples(mcore, reference):
    idx, sidx = build_blending_indices([0.5, 0.25, 0.25], 8, reference=reference)
    assert idx.tolist() == [0, 1, 2, 0, 0, 1, 2, 0] and idx.dtype == np.int16
    assert sidx.tolist() == [0, 0, 0, 1, 2, 1, 1, 3] and sidx.dtype == np.int64
    assert build_blending_indices([0.999, 0.001], 10, reference=reference)[0].tolist() == [0, 1] + [0] * 8
    idx, _ = build_blending_indices(normalize([0.3, 0.7]), 100, reference=reference)
    assert idx[:12].tolist() == [1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1]
    for weights, size in [([0.5, 0.25, 0.25], 8), ([0.999, 0.001], 10), (normalize([0.3, 0.7]), 100)]:
        assert_same(
            build_blending_indices(weights, size, reference=reference),
            mcore.blending(weights, size),
            "fact 9",
        )


def test_fact9_sizes(mcore):
    assert size_per_split_per_dataset([0.3, 0.7], [1000, 10, 1], 0.005).tolist() == [[302, 4, 2], [704, 8, 2]]
    assert mcore.sizes([0.3, 0.7], [1000, 10, 1], 0.005) == [[302, 4, 2], [704, 8, 2]]
    sizes = blend_split_sizes(normalize([0.3, 0.7]), [100])
    assert sizes.per_dataset.tolist() == [[31], [71]] and sizes.blend.tolist() == [100]
    # the blend can be longer than asked for: 10 samples over three equal weights
    assert blend_split_sizes(normalize([1, 1, 1]), [10]).blend.tolist() == [12]


# ------------------------------------------------------------------------------------------------
# Random blends against the helper


def random_case(rng, max_size, budget):
    family = FAMILIES[int(rng.integers(len(FAMILIES)))]
    D = int(np.exp(rng.uniform(np.log(2), np.log(2000))))
    size = int(np.exp(rng.uniform(0, np.log(max_size))))
    size = min(size, max(1, budget // D))  # keep size x datasets (the helper's work) bounded
    return family, D, int(rng.choice([0, 1, 2, size])) if rng.random() < 0.05 else size


@pytest.mark.parametrize(
    "seed, cases, max_size, budget",
    [(seed, 25, 10**6, 15 * 10**6) for seed in range(8)]
    + [pytest.param(100 + seed, 25, 10**7, 10**9, marks=pytest.mark.slow) for seed in range(4)],
)
def test_random_blends_match_megatron(mcore, seed, cases, max_size, budget):
    rng = np.random.default_rng(seed)
    for case in range(cases):
        family, D, size = random_case(rng, max_size, budget)
        raw = raw_weights(rng, family, D)
        assert normalize(raw).tolist() == mcore.normalize(raw.tolist())
        weights = blend_weights(raw)
        expected = mcore.blending(weights, size)
        what = f"seed {seed} case {case}: {family} D={D} size={size}"
        assert_same(build_blending_indices(weights, size), expected, what)
        assert_same(build_blending_indices(weights, size, reference=True), expected, what + " (reference)")
        bounds = random_bounds(rng, size)
        warmups = [int(rng.choice([0, 1, 50, 1000, blend_chunks.DEFAULT_WARMUP])) for _ in bounds[1:]]
        assert_same(run_chunked(weights, size, bounds, warmups, rng), expected, f"{what} chunks {bounds}")


def test_exact_tie_families(mcore):
    """Ties are decided by the exact float64 value of w*t - c: any fused multiply-add or other
    rounding difference would show (equal, decimal and integer-ratio weights, long runs). Weights
    a few ulps apart, the larger after the smaller, make near ties the fast kernel's first look
    gets wrong at almost every step (errors within 2^32 ulps), which its exact second look mends."""
    for raw, size in [
        ([1, 1, 1], 100_007),
        ([1] * 7, 100_003),
        ([1] * 100, 100_001),
        ([0.1, 0.2, 0.7], 100_000),
        ([0.2, 0.1, 0.7, 0.1, 0.2], 99_999),
        ([1, 2, 3], 100_000),
        ([3, 1, 1, 2, 2, 1], 77_777),
        ([0.3] * 50 + [0.7] * 50, 100_000),
        ([1, 1 + 2**-40, 0.5], 100_000),
        ([1 + k * 2**-42 for k in range(50)], 100_000),
    ]:
        weights = blend_weights(raw)
        expected = mcore.blending(weights, size)
        for reference in (False, True):
            assert_same(
                build_blending_indices(weights, size, reference=reference), expected, f"{raw[:6]} {size}"
            )
        assert_same(
            build_blending_indices_chunked(weights, size, [0, 1, size // 3, size], warmup=10),
            expected,
            "chunks",
        )


def test_kernels_contain_no_fused_multiply_add(compiled_kernels):
    """numba compiles without fast-math, so LLVM may not contract w*t - c into an FMA; check the
    machine code: the JIT's (cached kernels cannot be disassembled, so compile the same functions
    afresh) and the compiled library's (for this CPU, which has FMA)."""
    w = np.full(300, 1 / 300)
    slots = blend_kernels._Slots.build(w, np.full(300, np.inf), np.zeros(300, np.int64))
    out = np.empty(10, np.int16), np.empty(10, np.int64)
    for kernel, args in [
        (blend_kernels._scan_kernel, (w, np.zeros(300), np.full(300, np.inf), 0, *out)),
        (blend_kernels._wake_kernel, (*slots, 0, *out)),
    ]:
        fresh = numba.njit(nogil=True)(kernel.dispatcher().py_func)
        fresh(*args)
        asm = fresh.inspect_asm(fresh.signatures[0])
        assert re.search(r"\bv?mul[sp]d\b", asm), "disassembly looks wrong"
        assert not re.search(r"\bv?fn?m(add|sub)", asm), f"{kernel.__name__} uses fused multiply-add"
    # these sources' parts (another checkout's library may be beside them)
    parts = [path for path in (kernels.library_path(compiled_kernels, i) for i in range(kernels._MAX_PARTS))
             if os.path.isfile(path)]
    asm = subprocess.run(["objdump", "-d", *parts], capture_output=True, text=True, check=True).stdout
    assert re.search(r"\bv?mul[sp]d\b", asm), "disassembly looks wrong"
    assert not re.search(r"\bv?fn?m(add|sub)", asm), "the compiled library uses fused multiply-add"


# ------------------------------------------------------------------------------------------------
# Exhaustive blending


@pytest.mark.parametrize("seed", range(4))
def test_exhaustive_blends_match_megatron(mcore, seed):
    rng = np.random.default_rng(1000 + seed)
    for case in range(25):
        D = int(np.exp(rng.uniform(0, np.log(1500))))
        kind = case % 5
        if kind == 0:
            sizes = np.full(D, int(rng.integers(1, 200)))
        elif kind == 1:
            sizes = rng.integers(1, 5, D)
        elif kind == 2:
            sizes = np.exp(rng.uniform(0, np.log(20000), D)).astype(np.int64) + 1
        elif kind == 3:
            sizes = rng.choice([1, 10, 1000], D)
        else:
            sizes = rng.integers(1, 3000, D)
        while sizes.sum() * D > 10**7:  # the helper's work
            sizes = np.maximum(sizes // 2, 1)
            if D * D > 10**7:
                break
        expected = mcore.exhaustive(sizes.astype(np.int64))
        what = f"seed {seed} case {case}: D={D} total={sizes.sum()}"
        assert_same(build_exhaustive_blending_indices(sizes), expected, what)
        assert_same(build_exhaustive_blending_indices(sizes, reference=True), expected, what + " (reference)")
        assert np.array_equal(np.bincount(expected[0], minlength=D), sizes)


def test_exhaustive_rejects_empty_datasets():
    with pytest.raises(MegacacheError, match="dataset 1 has 0 samples"):
        build_exhaustive_blending_indices([3, 0, 2])
    with pytest.raises(MegacacheError, match="integers"):
        build_exhaustive_blending_indices([1.5, 2.0])


# ------------------------------------------------------------------------------------------------
# Sizes


def test_sizes_match_megatron(mcore):
    rng = np.random.default_rng(7)
    for case in range(300):
        D = int(rng.integers(1, 300))
        weights = normalize(raw_weights(rng, FAMILIES[case % len(FAMILIES)], D))
        splits = [int(x) for x in np.exp(rng.uniform(0, np.log(10**10), int(rng.integers(1, 4))))]
        splits += [0] * int(rng.integers(0, 2))
        surplus = [0.0, 0.005, float(rng.random())][case % 3]
        expected = mcore.sizes(weights.tolist(), splits, surplus)
        assert size_per_split_per_dataset(weights, splits, surplus).tolist() == expected
        sizes = blend_split_sizes(weights, splits, surplus)
        assert sizes.per_dataset.tolist() == expected
        assert sizes.blend.tolist() == [sum(col) for col in zip(*mcore.sizes(weights.tolist(), splits))]


def test_normalize_twice_can_change_the_last_bit(mcore):
    # why blend_weights normalizes twice, as megatron does
    rng = np.random.default_rng(0)
    changed = 0
    for _ in range(200):
        raw = rng.random(int(rng.integers(2, 50)))
        once = normalize(raw)
        assert once.tolist() == mcore.normalize(raw.tolist())
        assert normalize(once).tolist() == mcore.normalize(mcore.normalize(raw.tolist()))
        changed += not np.array_equal(normalize(once), once)
    assert changed > 0


def test_size_errors_are_named():
    with pytest.raises(MegacacheError, match="sum to 1"):
        size_per_split_per_dataset([0.5, 0.6], [10])
    with pytest.raises(MegacacheError, match="split 1 has weights but no size"):
        size_per_split_per_dataset([0.5, 0.5], [10, None])
    with pytest.raises(MegacacheError, match="split 0 size"):
        size_per_split_per_dataset([1.0], [-1])


def test_unweighted_blend_size():
    assert unweighted_blend_size(100, [30, 50]) == 80
    assert unweighted_blend_size(60, [30, 50]) == 60
    assert unweighted_blend_size(None, [30, 50]) is None


# ------------------------------------------------------------------------------------------------
# Chunks


def test_guess_is_exact_within_the_warmup():
    weights = blend_weights(np.random.default_rng(3).lognormal(0, 2, 40))
    idx, _ = build_blending_indices(weights, 5000)
    for start in [0, 1, 2, 3, 17, 4999, 5000]:
        assert np.array_equal(
            guess_counts(weights, start, warmup=5000), np.bincount(idx[:start], minlength=40)
        )
    guess = guess_counts(weights, 5000, warmup=100)
    assert guess.sum() == 5000 and guess.dtype == np.int64


def test_confirmed_guess_is_not_recomputed():
    weights = blend_weights(np.random.default_rng(4).random(300))
    expected = build_blending_indices(weights, 20_000)
    idx, sidx = np.empty(10_000, np.int16), np.empty(10_000, np.int64)
    true_start = np.bincount(expected[0][:10_000], minlength=300)
    end = blend_chunk(weights, 10_000, true_start, idx, sidx)
    assert unconfirmed_chunks([np.zeros(300, np.int64), true_start], [true_start, end]) == []
    repaired = repair_chunk(weights, 10_000, true_start, true_start, end, idx, sidx)
    assert repaired.recomputed == 0 and np.array_equal(repaired.end_counts, end)
    assert np.array_equal(idx, expected[0][10_000:]) and np.array_equal(sidx, expected[1][10_000:])


def test_repair_from_a_guess_the_greedy_can_never_reach():
    """Equal weights with counts out of the greedy's shape still blend exactly once repaired."""
    weights = blend_weights([1.0] * 6 + [2.0] * 3)
    size = 30_000
    expected = build_blending_indices(weights, size)
    start = 999
    guess = np.array([0, 200, 0, 150, 0, 0, 300, 0, 349])  # sums to 999
    idx, sidx = np.empty(size - start, np.int16), np.empty(size - start, np.int64)
    end = blend_chunk(weights, start, guess, idx, sidx)
    true_start = np.bincount(expected[0][:start], minlength=9)
    repaired = repair_chunk(weights, start, true_start, guess, end, idx, sidx)
    assert repaired.recomputed > 0
    assert_same((idx, sidx), (expected[0][start:], expected[1][start:]), "repaired")
    assert np.array_equal(repaired.end_counts, np.bincount(expected[0], minlength=9))


def test_chunked_on_threads(mcore):
    weights = blend_weights(np.random.default_rng(5).random(500))
    size = 200_000
    bounds = [0, 1, 2, 50_000, 50_001, 120_000, size]
    assert_same(
        build_blending_indices_chunked(weights, size, bounds, warmup=20_000, max_workers=2),
        mcore.blending(weights, size),
        "threads",
    )


def test_chunks_write_into_memory_maps(tmp_path):
    """What a distributed builder does: each rank writes its slice of .npy files opened as memory
    maps; the files equal np.save of the serial arrays."""
    weights = blend_weights(np.random.default_rng(6).lognormal(0, 1, 200))
    size = 50_000
    expected = build_blending_indices(weights, size)
    idx = np.lib.format.open_memmap(tmp_path / "dataset_index.npy", "w+", np.int16, (size,))
    sidx = np.lib.format.open_memmap(tmp_path / "dataset_sample_index.npy", "w+", np.int64, (size,))
    bounds = [0, 12_345, 30_000, size]
    starts = [guess_counts(weights, b, warmup=5000) for b in bounds[:-1]]
    ends = [
        blend_chunk(weights, a, g, idx[a:b], sidx[a:b])
        for (a, b), g in zip(itertools.pairwise(bounds), starts)
    ]
    repair_rounds(weights, bounds, starts, ends, idx, sidx)
    idx.flush()
    sidx.flush()
    del idx, sidx
    np.save(tmp_path / "expected_index.npy", expected[0])
    np.save(tmp_path / "expected_sample_index.npy", expected[1])
    assert (tmp_path / "dataset_index.npy").read_bytes() == (tmp_path / "expected_index.npy").read_bytes()
    assert (tmp_path / "dataset_sample_index.npy").read_bytes() == (
        tmp_path / "expected_sample_index.npy"
    ).read_bytes()


def test_chunk_errors_are_named():
    w = [0.5, 0.5]
    idx, sidx = np.empty(4, np.int16), np.empty(4, np.int64)
    with pytest.raises(MegacacheError, match="sum to 10"):
        blend_chunk(w, 10, np.array([3, 3]), idx, sidx)
    with pytest.raises(MegacacheError, match="needs the counts"):
        blend_chunk(w, 10, None, idx, sidx)
    with pytest.raises(MegacacheError, match="2 integers"):
        blend_chunk(w, 0, np.zeros(3, np.int64), idx, sidx)
    with pytest.raises(ValueError, match="int16"):
        blend_chunk(w, 0, None, np.empty(4, np.int32), sidx)
    with pytest.raises(ValueError, match="differ in length"):
        blend_chunk(w, 0, None, idx, np.empty(5, np.int64))
    with pytest.raises(MegacacheError, match="boundaries"):
        build_blending_indices_chunked(w, 10, [0, 5])
    with pytest.raises(MegacacheError, match="warmup"):
        guess_counts(w, 10, warmup=-1)


@pytest.mark.parametrize(
    "weights, message",
    [
        ([], "1 to 32766"),
        ([1.0] * (MAX_DATASETS + 1), "1 to 32766"),
        ([0.5, -0.1], "blend weight 1 is -0.1"),
        ([0.5, float("nan")], "blend weight 1 is nan"),
        ([[0.5, 0.5]], "1 to 32766"),
    ],
)
def test_bad_weights_are_named(weights, message):
    with pytest.raises(MegacacheError, match=message):
        build_blending_indices(weights, 3)


def test_bad_size_is_named():
    with pytest.raises(MegacacheError, match="blend size"):
        build_blending_indices([1.0], -1)


# ------------------------------------------------------------------------------------------------
# Oversampling


def test_oversampling_names_the_dataset():
    # [0.999, 0.001] over 10 samples takes one sample of dataset 1 (docs/megatron.md §4.5)
    idx, _ = build_blending_indices([0.999, 0.001], 10)
    counts = np.bincount(idx, minlength=2)
    assert find_oversampling(counts, [9, 1]) == []
    found = find_oversampling(counts, [8, 0])
    assert found == [Oversample(0, 9, 8), Oversample(1, 1, 0)]
    assert [o.excess for o in found] == [1, 1]
    # what megatron-core checks: counts of np.unique(dataset_index) against len(dataset)
    values, sizes = np.unique(idx, return_counts=True)
    assert [int(v) for v, s in zip(values, sizes) if s > [8, 0][v]] == [o.dataset for o in found]
