"""Split ranges, MT19937 shuffle and GPTDataset index arrays against their oracles: numpy's legacy
RandomState and megatron-core 0.16.1 itself (its GPTDataset built through its own dataset builder on
real .bin/.idx files, and its C++ helpers)."""

import dataclasses
import json
import os
import pickle
import shutil

import numpy as np
import pytest

from megacache.algorithms.gpt_index import (
    GPTIndexPlan,
    build_document_index,
    build_gpt_indices,
    build_sample_index,
    build_shuffle_index,
    num_epochs,
    piece_tokens,
    plan_epochs,
    sample_count,
    sample_index_dtype,
    sample_index_reference,
    sample_index_rows,
    sample_rows_in_piece,
    shuffle_index_dtype,
)
from megacache.algorithms import permutation
from megacache.algorithms.permutation import MT19937, random_interval, shuffle
from megacache.algorithms.splits import parse_split, split_matrix, split_ranges
from megacache.errors import MegacacheError
from megacache.formats.indexed import write_dataset
from support.inputs.indexed import random_lengths, write_lengths
from support.oracles.megatron_core import load_mcore, megatron_splits

# every test twice: kernels through numba's JIT, then from the compiled library
pytestmark = pytest.mark.usefixtures("kernel_mode")


@pytest.fixture(scope="session")
def mcore(megatron):
    return load_mcore()


FACT5_SIZES = np.array([5, 7, 3, 9, 4, 6, 8, 2, 10, 1], dtype=np.int32)


def running_documents(sizes):
    """Documents whose tokens are the running token count: document d holds its stream positions."""
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return [np.arange(s, s + n) for s, n in zip(starts, sizes)]


def raw_sample(documents, document_index, sample_index, k, x):
    """Sample k's tokens as GPTDataset reads them (before padding)."""
    (i0, o0), (i1, o1) = sample_index[k], sample_index[k + 1]
    if i0 == i1:
        return documents[document_index[i0]][o0 : o1 + x]
    parts = [documents[document_index[i0]][o0:]]
    parts += [documents[document_index[i]] for i in range(i0 + 1, i1)]
    parts.append(documents[document_index[i1]][: o1 + x])
    return np.concatenate(parts)


def assert_same_array(ours, theirs):
    assert ours.dtype == theirs.dtype
    assert ours.shape == theirs.shape
    assert np.array_equal(ours, theirs)


def assert_same_indices(ours, dataset):
    """Our (document, sample, shuffle) index arrays equal a megatron-core GPTDataset's."""
    for mine, megatrons in zip(ours, (dataset.document_index, dataset.sample_index, dataset.shuffle_index)):
        assert_same_array(mine, megatrons)


def whole_split_document_index(plan, seed):
    return build_document_index((0, plan.num_documents), plan.num_epochs, plan.separate_final_epoch, MT19937.from_seed(seed))


# ------------------------------------------------------------------------------------------------
# Splits


def test_split_worked_examples():
    # docs/megatron.md §7 fact 3 and §2.2
    matrix = split_matrix("969,30,1")
    assert json.dumps(matrix) == "[[0, 0.969], [0.969, 0.999], [0.999, 1.0]]"
    assert type(matrix[0][0]) is int
    assert split_ranges(matrix, 40) == [(0, 39), (39, 40), (40, 40)]
    assert split_ranges(matrix, 1000) == [(0, 969), (969, 999), (999, 1000)]
    assert split_ranges(split_matrix("1,1"), 5) == [(0, 2), (2, 5), None]
    assert split_matrix("99,1,0") == [(0, 0.99), (0.99, 1.0), None]
    assert split_matrix("90,5,5") == [(0, 0.9), (0.9, 0.9500000000000001), (0.9500000000000001, 1.0)]
    assert parse_split("969, 30, 1") == [0.969, 0.03, 0.001]


def test_split_strings_match_megatron(mcore):
    rng = np.random.default_rng(3)
    separators = [",", ", ", " , ", "/", ";"]
    for _ in range(300):
        count = int(rng.integers(1, 4))
        weights = [
            str(int(rng.integers(0, 1000)))
            if rng.random() < 0.6
            else f"{rng.random() * 10:.{rng.integers(1, 4)}f}"
            for _ in range(count)
        ]
        if all(float(w) == 0 for w in weights):
            weights[0] = "1"
        split = str(rng.choice(separators)).join(weights)
        vector = mcore.config.parse_and_normalize_split(split)
        theirs = mcore.config.convert_split_vector_to_split_matrix(vector)
        ours = split_matrix(split)
        assert json.dumps(ours) == json.dumps(theirs), split
        assert ours == theirs


@pytest.mark.parametrize(
    "split, message",
    [
        ("1,2,3,4", "has 4 weights"),
        ("0,0,0", "sum to 0"),
        ("", "sum to 0"),
        ("1..2,3", "'1..2' is not a number"),
        ("9" * 400, "too large"),
    ],
)
def test_bad_splits_are_named(split, message):
    with pytest.raises(MegacacheError, match=message):
        split_matrix(split)


# ------------------------------------------------------------------------------------------------
# MT19937 and the legacy shuffle


@pytest.mark.parametrize("seed", [0, 1, 1234, 5489, 2**31, 2**32 - 1, np.uint32(77)])
def test_seeding_matches_randomstate(seed):
    assert MT19937.from_seed(seed) == MT19937.from_numpy(np.random.RandomState(seed).get_state())


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True, "1"])
def test_bad_seeds_are_rejected(seed):
    with pytest.raises(MegacacheError, match="seed"):
        MT19937.from_seed(seed)


def test_state_round_trips_through_numpy_and_pickle():
    rs = np.random.RandomState(99)
    rs.shuffle(np.arange(1000))
    state = MT19937.from_numpy(rs.get_state())
    assert MT19937.from_numpy(rs.get_state(legacy=False)) == state
    assert pickle.loads(pickle.dumps(state)) == state
    fork = state.copy()
    shuffle(np.arange(10), fork)
    assert fork != state and state == MT19937.from_numpy(rs.get_state())
    name, key, pos, has_gauss, gauss = state.to_numpy()
    expected = rs.get_state()
    assert (name, pos, has_gauss, gauss) == (expected[0], expected[2], expected[3], expected[4])
    assert key.dtype == np.uint32 and np.array_equal(key, expected[1])
    assert state.to_random_state().randint(0, 2**31, 10).tolist() == rs.randint(0, 2**31, 10).tolist()
    with pytest.raises(MegacacheError, match="not an MT19937 state"):
        MT19937.from_numpy(("PCG64", key, pos, 0, 0.0))


@pytest.mark.parametrize("block", [None, 1000, 4097])  # None: one thread below 2^20 elements; else drawn ahead
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_shuffle_matches_randomstate(dtype, block):
    lengths = [0, 1, 2, 3, 5, 64, 1000, 1001, 4097, 8195, 65537, 10**6]
    for seed in [0, 1234, 2**32 - 1]:
        ours, theirs = MT19937.from_seed(seed), np.random.RandomState(seed)
        # One state through every length: each shuffle continues where the previous one stopped.
        for n in lengths:
            a = np.arange(n, dtype=dtype)
            b = a.copy()
            shuffle(a, ours) if block is None else shuffle(a, ours, block)
            theirs.shuffle(b)
            assert np.array_equal(a, b), (seed, n)
            assert ours == MT19937.from_numpy(theirs.get_state()), (seed, n)


def test_shuffle_continues_on_another_process(tmp_path):
    rs = np.random.RandomState(1234)
    first, second = np.arange(5000, dtype=np.int32), np.arange(777, dtype=np.int32)
    rs.shuffle(first)
    rs.shuffle(second)

    state = MT19937.from_seed(1234)
    a = np.arange(5000, dtype=np.int32)
    shuffle(a, state)
    handed_over = pickle.loads(pickle.dumps(state.to_numpy()))  # e.g. broadcast to another rank
    b = np.memmap(tmp_path / "b", dtype=np.int32, mode="w+", shape=777)
    b[:] = np.arange(777)
    shuffle(b, MT19937.from_numpy(handed_over))
    assert np.array_equal(a, first) and np.array_equal(b, second)


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.float64])
def test_shuffle_any_dtype_and_strided_views(dtype):
    a = (np.arange(3001) % 100).astype(dtype)
    b = a.copy()
    state, rs = MT19937.from_seed(5), np.random.RandomState(5)
    shuffle(a[::3], state)
    rs.shuffle(b[::3])
    assert np.array_equal(a, b)
    assert state == MT19937.from_numpy(rs.get_state())


def test_shuffle_rejects_what_it_cannot_shuffle():
    with pytest.raises(ValueError, match="1-D"):
        shuffle(np.zeros((3, 3)), MT19937.from_seed(0))
    frozen = np.arange(5)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        shuffle(frozen, MT19937.from_seed(0))


def test_bounded_draws_match_numpy_including_64_bit():
    # Arrays over 2^32 - 1 elements draw j with 64-bit outputs; numpy's masked randint uses the same
    # draw (next_uint64 & mask, rejection), so it is the oracle for those without a 16 GiB array.
    state, rs = MT19937.from_seed(7), np.random.RandomState(7)
    maxima = [1, 2, 5, 2**31, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1, 2**33 + 5, 2**40, 2**62 + 3, 2**63 - 2]
    for max_value in maxima:
        for _ in range(40):
            assert random_interval(state, max_value) == int(rs.randint(0, max_value + 1, dtype=np.uint64))
        assert state == MT19937.from_numpy(rs.get_state())


def test_block_draws_equal_one_bounded_draw_at_a_time():
    # The shuffle draws a block of j's in one kernel call, its mask falling as i crosses powers of
    # two; the reference is one random_interval(i) per swap. Blocks start just above, at and just
    # below powers of two, and in the middle, up to 2^32 - 1.
    rng = np.random.default_rng(3)
    state, reference = MT19937.from_seed(11), MT19937.from_seed(11)
    tempered = np.empty(624, dtype=np.int64)
    for k in range(1, 33):
        for hi in {2**k - 2, 2**k - 1, 2**k, 2**k + 1, 3 * 2 ** (k - 1)}:
            hi = min(max(hi, 1), 2**32 - 1)
            m = int(rng.integers(1, min(hi, 3000) + 1))
            permutation._temper_all(state.words, tempered)
            js = np.empty(m, dtype=np.int64)
            permutation._draw_block(state.words, tempered, hi, m, js)
            assert js.tolist() == [random_interval(reference, i) for i in range(hi, hi - m, -1)], (hi, m)
            assert state == reference, (hi, m)


# ------------------------------------------------------------------------------------------------
# Plan


def test_fact5_plan():
    plan = GPTIndexPlan.for_split(FACT5_SIZES, (0, 10), 7, 8, True, True)
    assert (plan.num_epochs, plan.samples_sans_final_epoch, plan.separate_final_epoch) == (2, 6, True)
    assert plan.num_samples == 13 and plan.sample_index_shape == (14, 2)
    assert plan.document_index_length == 20
    assert (plan.shuffle_first_range, plan.shuffle_index_length) == (6, 13)
    assert plan.sample_index_dtype == np.int32 and plan.shuffle_index_dtype == np.uint32
    assert plan_epochs(55, 12, 8, 1) == (2, False, 6)


def test_epoch_count_is_megatrons_loop_in_closed_form():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        T, L, x = int(rng.integers(1, 500)), int(rng.integers(1, 100)), int(rng.integers(0, 2))
        N = int(rng.integers(0, 20 * T // L + 3))
        E, tokens = 1, T
        while tokens < N * L + x:
            E, tokens = E + 1, tokens + T
        assert num_epochs(T, N, L, x) == E


def test_empty_split_with_samples_raises_instead_of_looping():
    with pytest.raises(MegacacheError, match="loop forever"):
        num_epochs(0, 5, 8, 1)
    with pytest.raises(MegacacheError, match="loop forever"):
        num_epochs(0, 0, 8, 1)  # N·L + x = 1 > 0 tokens: megatron-core loops on it too
    assert num_epochs(0, 0, 8, 0) == 1  # 0 >= 0: megatron-core returns at once
    assert num_epochs(0, None, 8, 1) == 1
    assert GPTIndexPlan.for_split(FACT5_SIZES, (3, 3), None, 8, 1, True).num_samples == 0


def test_float32_row_count():
    # §7 fact 11: single precision loses the last partial sample; drop_last is exact.
    assert sample_count(1, 16_781_314, 4096, 1, False) == 4097
    assert sample_count(1, 16_781_314, 4096, 1, True) == 4097
    assert sample_count(1, 0, 4096, 1, True) == 0  # C++ truncates -1/4096 toward zero
    assert sample_count(1, 0, 4096, 1, False) == 0
    # ...and in the other direction: 16777227 rounds *up* in float32, one row too many.
    assert sample_count(1, 16_777_228, 3, 1, False) == 5_592_410


def test_dtype_thresholds():
    assert sample_index_dtype(2**31 - 1, 2**31 - 1) == np.int32
    assert sample_index_dtype(2**31, 5) == np.int64
    assert shuffle_index_dtype(2**32 - 3) == np.uint32
    assert shuffle_index_dtype(2**32 - 2) == np.int64
    plan = GPTIndexPlan.from_counts(num_documents=5, tokens_per_epoch=2**33, num_samples=None, seq_length=2,
                                    add_extra_token=0, drop_last=True, longest_document=2**31 - 1)
    assert plan.num_samples == 2**32 and plan.shuffle_index_dtype == np.int64
    assert plan.sample_index_dtype == np.int32


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(add_extra_token=2), "add_extra_token must be 0 or 1"),
        (dict(num_samples=-1), "num_samples must be a non-negative integer, got -1"),
        (dict(num_samples=2.0), "num_samples must be a non-negative integer, got 2.0"),
        (dict(tokens_per_epoch=1, num_samples=2**31, seq_length=1), "int32"),
        (dict(tokens_per_epoch=0, num_samples=None, seq_length=1), "no sample"),
    ],
)
def test_bad_plans_are_named(kwargs, message):
    args = dict(
        num_documents=10, tokens_per_epoch=55, longest_document=10, num_samples=None,
        seq_length=8, add_extra_token=1, drop_last=True,
    )
    with pytest.raises(MegacacheError, match=message):
        GPTIndexPlan.from_counts(**{**args, **kwargs})


def test_empty_dataset_is_named():
    with pytest.raises(MegacacheError, match="no sequences"):
        GPTIndexPlan.for_split(np.zeros(0, np.int32), (0, 0), None, 8, 1, True)


# ------------------------------------------------------------------------------------------------
# Worked examples through megatron-core's own builder


def test_fact4_one_epoch_document_index():
    index = build_document_index((0, 10), 1, False, MT19937.from_seed(1234))
    assert index.dtype == np.int32
    assert index.tolist() == [7, 2, 9, 1, 0, 8, 4, 5, 6, 3]


@pytest.mark.parametrize(
    "N, document_index, sample_index, shuffle_index",
    [
        (  # §7 fact 5: separated final epoch
            7,
            [7, 2, 9, 1, 0, 8, 4, 5, 6, 3, 7, 3, 5, 1, 4, 8, 0, 2, 6, 9],
            [[0, 0], [3, 2], [4, 3], [5, 6], [7, 0], [8, 2], [9, 2], [10, 1], [11, 7], [13, 0], [14, 1],
             [15, 5], [16, 3], [18, 3]],
            [5, 1, 4, 3, 0, 2, 11, 7, 6, 10, 9, 12, 8],
        ),
        (  # §7 fact 6: not separated
            12,
            [3, 3, 2, 6, 4, 5, 4, 0, 8, 8, 7, 1, 0, 9, 7, 1, 9, 2, 6, 5],
            None,
            [7, 10, 4, 1, 11, 8, 3, 9, 6, 12, 5, 0, 2],
        ),
    ],
)
def test_facts_5_and_6(tmp_path, mcore, N, document_index, sample_index, shuffle_index):
    documents = running_documents(FACT5_SIZES)
    prefix = str(tmp_path / "d")
    write_dataset(prefix, documents, np.uint16)
    theirs = megatron_splits(mcore, prefix, "1,0,0", [N, None, None], 1234, 8, 1, True)[0]
    plan = GPTIndexPlan.for_split(FACT5_SIZES, (0, 10), N, 8, 1, True)
    ours = build_gpt_indices(FACT5_SIZES, (0, 10), plan, 1234)
    assert ours[0].tolist() == document_index
    if sample_index is not None:
        assert ours[1].tolist() == sample_index
    assert ours[2].tolist() == shuffle_index and ours[2].dtype == np.uint32
    assert plan.num_samples == len(theirs) == 13
    assert_same_indices(ours, theirs)
    if N == 12:  # fact 6: dataset[0] (sample-index row shuffle_index[0]) is L + 1 = 9 running token ids
        first = int(ours[2][0])
        sample = raw_sample(documents, ours[0], ours[1], first, 1)
        assert sample.tolist() == [52, 53, 44, 45, 46, 47, 48, 49, 50]


def test_fact7_sample_index_walk(mcore):
    sizes, document_index = np.array([5, 7, 3], np.int32), np.array([0, 1, 2], np.int32)
    plan = GPTIndexPlan.for_split(sizes, (0, 3), None, 4, 1, True)
    expected = [[0, 0], [0, 4], [1, 3], [2, 0]]
    assert build_sample_index(sizes, document_index, plan).tolist() == expected
    assert sample_index_reference(sizes, document_index, plan).tolist() == expected
    assert mcore.helpers.build_sample_idx(sizes, document_index, 4, 1, 15, True, True).tolist() == expected


@pytest.mark.parametrize(
    "x, drop_last, row4, length", [(1, True, [7, 0], 6), (0, True, [6, 4], 6), (1, False, [7, 0], 7)]
)
def test_facts_7_and_8_valid_split(tmp_path, mcore, x, drop_last, row4, length):
    # The fact-5 data as the valid split, N=None: x=0 ends a sample exactly at a document end,
    # recorded as (i, len_i); without drop_last the partial last sample is kept (fact 8).
    documents = running_documents(FACT5_SIZES)
    prefix = str(tmp_path / "d")
    write_dataset(prefix, documents, np.uint16)
    theirs = megatron_splits(mcore, prefix, "0,1,0", [None, None, None], 1234, 8, x, drop_last)[1]
    valid = split_ranges(split_matrix("0,1,0"), 10)[1]
    plan = GPTIndexPlan.for_split(FACT5_SIZES, valid, None, 8, x, drop_last)
    ours = build_gpt_indices(FACT5_SIZES, (0, 10), plan, 1234)
    assert ours[1][4].tolist() == row4 and plan.num_samples == length == len(theirs)
    assert_same_indices(ours, theirs)
    if not drop_last:
        assert ours[1].tolist() == [[0, 0], [3, 2], [4, 3], [5, 6], [7, 0], [8, 2], [9, 2], [9, 8]]
        assert raw_sample(documents, ours[0], ours[1], 6, 1).tolist() == list(range(17, 24))


# ------------------------------------------------------------------------------------------------
# Each array against megatron-core's function for it


def test_document_index_matches_megatron(mcore, tmp_path):
    rng = np.random.default_rng(11)
    for _ in range(150):
        D, E, separated = int(rng.integers(0, 300)), int(rng.integers(1, 7)), bool(rng.integers(0, 2))
        seed = int(rng.integers(0, 2**32))
        beg = int(rng.integers(0, 1000))
        indices = np.arange(beg, beg + D, dtype=np.int32)
        rs, state = np.random.RandomState(seed), MT19937.from_seed(seed)
        theirs = mcore.gpt._build_document_index(indices, E, rs, separated)
        assert_same_array(build_document_index((beg, beg + D), E, separated, state), theirs)
        assert state == MT19937.from_numpy(rs.get_state())
    # In place into a memory map: the same array.
    out = np.memmap(tmp_path / "doc", dtype=np.int32, mode="w+", shape=(3 * 40,))
    build_document_index((0, 40), 3, True, MT19937.from_seed(9), out=out)
    theirs = mcore.gpt._build_document_index(np.arange(40, dtype=np.int32), 3, np.random.RandomState(9), True)
    assert np.array_equal(out, theirs)


def test_shuffle_index_matches_megatron(mcore):
    rng = np.random.default_rng(12)
    for _ in range(150):
        total = int(rng.integers(0, 3000))
        first = total if rng.random() < 0.4 else int(rng.integers(0, total + 1))
        seed = int(rng.integers(0, 2**32))
        rs, state = np.random.RandomState(seed), MT19937.from_seed(seed)
        theirs = mcore.gpt._build_shuffle_index(first, total, rs)
        assert_same_array(build_shuffle_index(total, first, shuffle_index_dtype(total), state), theirs)
        assert state == MT19937.from_numpy(rs.get_state())


def megatron_sample_index(mcore, sizes, document_index, plan):
    try:
        return mcore.helpers.build_sample_idx(
            sizes, document_index, plan.seq_length, plan.num_epochs, plan.tokens_per_epoch,
            plan.drop_last, bool(plan.add_extra_token),
        )
    except AssertionError:  # its int32 path rejects a negative offset
        return None


def test_sample_index_matches_megatron_helper(mcore):
    rng = np.random.default_rng(13)
    rejected = 0
    for case in range(400):
        sizes = random_lengths(rng, int(rng.integers(1, 300)))
        if sizes.sum() == 0:
            continue
        L, x, drop_last = int(rng.choice([1, 2, 3, 7, 64])), int(rng.integers(0, 2)), bool(rng.integers(0, 2))
        N = None if rng.random() < 0.3 else int(rng.integers(0, 4 * int(sizes.sum()) // L + 2))
        plan = GPTIndexPlan.for_split(sizes, (0, len(sizes)), N, L, x, drop_last)
        document_index = whole_split_document_index(plan, case)
        theirs = megatron_sample_index(mcore, sizes, document_index, plan)
        if theirs is None:
            rejected += 1
            for build in (build_sample_index, sample_index_reference):
                with pytest.raises(MegacacheError, match="offset -1"):
                    build(sizes, document_index, plan)
            continue
        assert_same_array(build_sample_index(sizes, document_index, plan), theirs)
        assert_same_array(sample_index_reference(sizes, document_index, plan), theirs)
    assert 0 < rejected < 40


def test_int64_sample_index_keeps_the_negative_offset(mcore):
    # An empty last document and no drop_last: Megatron's int64 path records offset -1 (its int32
    # path asserts). The int64 path is only chosen past 2^31 entries, so this test forces the dtype.
    sizes, document_index = np.array([5, 7, 0], np.int32), np.array([0, 1, 2], np.int32)
    plan = dataclasses.replace(
        GPTIndexPlan.for_split(sizes, (0, 3), None, 4, 1, False), sample_index_dtype=np.dtype(np.int64)
    )
    theirs = mcore.helpers.build_sample_idx_int64(sizes, document_index, 4, 1, 12, False, 1)
    assert theirs[-1].tolist() == [2, -1]
    assert_same_array(build_sample_index(sizes, document_index, plan), theirs)
    assert_same_array(sample_index_reference(sizes, document_index, plan), theirs)


@pytest.mark.parametrize("tokens, L, x", [(16_781_314, 4096, 1), (16_777_228, 3, 1)])
def test_float32_row_count_against_megatron(mcore, tokens, L, x):
    # One document past 2^24 tokens: Megatron's row count is one short (fact 11) or one over.
    sizes, document_index = np.array([tokens], np.int32), np.array([0], np.int32)
    plan = GPTIndexPlan.for_split(sizes, (0, 1), None, L, x, False)
    theirs = mcore.helpers.build_sample_idx(sizes, document_index, L, 1, tokens, False, bool(x))
    assert_same_array(build_sample_index(sizes, document_index, plan), theirs)
    assert_same_array(sample_index_reference(sizes, document_index, plan), theirs)


def random_partition(rng, stop, parts):
    cuts = np.sort(rng.integers(0, stop + 1, parts - 1))
    return np.concatenate([[0], cuts, [stop]]).astype(np.int64)


def test_sample_index_slices_equal_serial(tmp_path):
    rng = np.random.default_rng(14)
    for case in range(200):
        sizes = random_lengths(rng, int(rng.integers(1, 400)))
        if sizes.sum() == 0 or (sizes[-1] == 0 and rng.random() < 0.5):
            sizes[-1] = 1 + case % 5
        L, x, drop_last = int(rng.choice([1, 2, 5, 33])), int(rng.integers(0, 2)), bool(rng.integers(0, 2))
        N = None if rng.random() < 0.3 else int(rng.integers(0, 3 * int(sizes.sum()) // L + 2))
        plan = GPTIndexPlan.for_split(sizes, (0, len(sizes)), N, L, x, drop_last)
        document_index = whole_split_document_index(plan, case)
        try:
            serial = sample_index_reference(sizes, document_index, plan)
        except MegacacheError:
            continue
        M, rows = plan.document_index_length, plan.num_samples + 1

        # Tokens per slice of the document index, offsets by an exscan of the slice totals.
        bounds = random_partition(rng, M, int(rng.integers(1, 8)))
        slices = list(zip(bounds[:-1], bounds[1:]))
        pieces = [piece_tokens(sizes, document_index[a:b]) for a, b in slices]
        assert pieces == [int(np.take(sizes, document_index[a:b]).sum(dtype=np.int64)) for a, b in slices]
        starts = np.concatenate([[0], np.cumsum(pieces)[:-1]]).astype(np.int64)
        all_ends = np.cumsum(sizes[document_index], dtype=np.int64)

        # A builder's way: each document slice computes the rows it owns.
        owned = [
            sample_rows_in_piece(plan, int(a), int(b), int(s), int(s + p))
            for a, b, s, p in zip(bounds[:-1], bounds[1:], starts, pieces)
        ]
        assert owned[0][0] == 0 and owned[-1][1] == rows
        assert all(prev[1] == nxt[0] for prev, nxt in zip(owned, owned[1:]))
        # ... writing them in place into the preallocated output file.
        result = np.memmap(tmp_path / f"s{case}", dtype=plan.sample_index_dtype, mode="w+", shape=(rows, 2))
        for (k0, k1), s, (a, b) in zip(owned, starts, slices):
            sample_index_rows(plan, sizes, document_index[a:b], int(s), int(a), k0, k1, out=result[k0:k1])
        assert np.array_equal(result, serial)

        # Any row partition, from the whole prefix or from the smallest window holding its rows.
        row_bounds = random_partition(rng, rows, int(rng.integers(1, 10)))
        pieces = []
        for k0, k1 in zip(row_bounds[:-1], row_bounds[1:]):
            whole = sample_index_rows(plan, sizes, document_index, 0, 0, int(k0), int(k1))
            if k1 > k0:
                p0, p1 = int(serial[k0, 0]), int(serial[k1 - 1, 0]) + 1
                before = int(all_ends[p0 - 1]) if p0 else 0
                window = sample_index_rows(plan, sizes, document_index[p0:p1], before, p0, int(k0), int(k1))
                assert_same_array(window, whole)
            pieces.append(whole)
        assert_same_array(np.concatenate(pieces), serial)


@pytest.mark.parametrize("L, first, m, wrong", [
    (4093, 4092, 2_200_635_048_736, "high"),  # counts one short of a multiple of L, just below 2^53
    (1_016_164_992, 1_016_164_992, 8_354_189, "low"),  # counts on a multiple of L
])
def test_sample_index_rows_far_into_the_token_stream(L, first, m, wrong):
    # Rows depend on the tokens before a window only through whole samples: starting m·L tokens
    # later moves every row number up by m and changes no row. The walk estimates (count - x) // L
    # in float64, then corrects it; these counts are ones where the estimate is one off.
    for x in (0, 1):
        sizes = np.full(64, L, np.int32)
        sizes[0] = first + x
        document_index = np.arange(len(sizes), dtype=np.int32)
        counts = m * L + np.cumsum(sizes, dtype=np.int64) - x
        estimate = (counts.astype(np.float64) * (1.0 / L)).astype(np.int64)
        assert (estimate > counts // L if wrong == "high" else estimate < counts // L).all()
        assert counts[-1] < 2**53
        plan = GPTIndexPlan.for_split(sizes, (0, len(sizes)), None, L, x, False)
        far = dataclasses.replace(plan, num_samples=plan.num_samples + m, sample_index_dtype=np.dtype(np.int64))
        rows = plan.num_samples + 1
        near = sample_index_rows(far, sizes, document_index, 0, 0, 1, rows - 1)
        shifted = sample_index_rows(far, sizes, document_index, m * L, 0, 1 + m, rows - 1 + m)
        assert_same_array(shifted, near)
        expected = sample_index_reference(sizes, document_index, plan)[1 : rows - 1].astype(np.int64)
        assert_same_array(near, expected)


def test_sample_index_rows_outside_the_window_are_refused():
    sizes = np.array([5, 7, 3, 9], np.int32)
    document_index = np.arange(4, dtype=np.int32)
    plan = GPTIndexPlan.for_split(sizes, (0, 4), None, 4, 1, False)
    with pytest.raises(ValueError, match="beyond the window"):
        sample_index_rows(plan, sizes, document_index[:2], 0, 0, 1, 5)
    with pytest.raises(ValueError, match="before the window"):
        sample_index_rows(plan, sizes, document_index[2:], 12, 2, 1, 3)
    with pytest.raises(ValueError, match="outside"):
        sample_index_rows(plan, sizes, document_index, 0, 0, 0, plan.num_samples + 2)
    # a split's own lengths (sequences from `first` on) give the same rows as the whole dataset's
    assert_same_array(sample_index_rows(plan, sizes[1:], document_index[1:], 5, 1, 2, 5, first=1),
                      sample_index_rows(plan, sizes, document_index, 0, 0, 2, 5))


# ------------------------------------------------------------------------------------------------
# Random configurations through megatron-core's GPTDataset


SPLITS = ["969,30,1", "969, 30, 1", "1,1", "99,1,0", "0,1,0", "1,0,1", "100", "80,10,10", "2.5,1.25,0.5", "3,3"]


def compare_random_configs(mcore, tmp_path, count, seed):
    rng = np.random.default_rng(seed)
    seen = dict(separated=0, multi_epoch=0, x0=0, kept_partial=0, rejected=0, splits=0)
    for case in range(count):
        # Each case's dataset and megatron-core's cache go once compared: the slow sweeps would
        # otherwise leave gigabytes on the tests' tmpfs.
        shutil.rmtree(tmp_path / "case", ignore_errors=True)
        S = int(rng.integers(1, 5001))
        lengths = random_lengths(rng, S)
        if lengths.sum() == 0:
            lengths[0] = 1
        prefix = str(tmp_path / "case" / "d")
        os.makedirs(os.path.dirname(prefix))
        write_lengths(prefix, lengths)
        split = str(rng.choice(SPLITS))
        L = int(rng.choice([2, 3, 8, 64, 1000]))
        x, drop_last = int(rng.integers(0, 2)), bool(rng.integers(0, 2))
        ranges = split_ranges(split_matrix(split), S)
        sizes = []
        for r in ranges:
            T = 0 if r is None else int(lengths[r[0] : r[1]].sum())
            if T == 0 or rng.random() < 0.25:
                sizes.append(None)  # an integer N on an empty split would hang megatron-core
                continue
            max_epochs = int(rng.choice([1, 2, 5, 30]))
            max_epochs = max(1, min(max_epochs, 300_000 // max(1, r[1] - r[0])))
            sizes.append(int(rng.integers(0, max_epochs * max(1, (T - x) // L) + 2)))
        random_seed = int(rng.choice([0, 1234, 2**32 - 1, int(rng.integers(0, 2**32))]))
        try:
            theirs = megatron_splits(mcore, prefix, split, sizes, random_seed, L, x, drop_last)
        except AssertionError:
            # Its int32 sample index rejected an offset of -1 (empty last document, valid split
            # without drop_last); ours says so.
            seen["rejected"] += 1
            plan = GPTIndexPlan.for_split(lengths, ranges[1], sizes[1], L, x, drop_last)
            assert not drop_last
            with pytest.raises(MegacacheError, match="offset -1"):
                build_gpt_indices(lengths, ranges[1], plan, random_seed)
            continue
        for i, (r, dataset) in enumerate(zip(ranges, theirs)):
            if r is None:
                assert dataset is None
                continue
            assert np.array_equal(dataset.indices, np.arange(*r))
            plan = GPTIndexPlan.for_split(lengths, r, sizes[i], L, x, drop_last if i == 1 else True)
            ours = build_gpt_indices(lengths, r, plan, random_seed)
            assert_same_indices(ours, dataset)
            assert plan.num_samples == len(dataset)
            assert_same_array(sample_index_reference(lengths, ours[0], plan), dataset.sample_index)
            seen["splits"] += 1
            seen["separated"] += plan.separate_final_epoch
            seen["multi_epoch"] += plan.num_epochs > 1
            seen["x0"] += x == 0
            seen["kept_partial"] += not plan.drop_last
    return seen


# the slow sweep in two halves, which two workers run side by side
@pytest.mark.parametrize("count, seed", [(220, 2024)] + [pytest.param(1500, seed, marks=pytest.mark.slow)
                                                         for seed in (7, 8)])
def test_random_configurations_match_megatron(mcore, tmp_path, count, seed):
    seen = compare_random_configs(mcore, tmp_path, count, seed)
    assert seen["splits"] >= count
    assert seen["separated"] >= count // 20 and seen["multi_epoch"] >= count // 5
    assert seen["x0"] >= count // 5 and seen["kept_partial"] >= count // 20
    assert seen["rejected"] <= count // 10


def test_length_stats_kernel_equals_its_reference_and_adds_over_slices():
    from megacache.algorithms.gpt_index import length_stats, length_stats_reference

    rng = np.random.default_rng(9)
    lengths = rng.integers(0, 2**31 - 1, 100_003).astype(np.int32)
    for first in (0, 17, 2**40):
        whole = length_stats(lengths, first)
        assert whole == length_stats_reference(lengths, first)
        cut = 31_337
        a, b = length_stats(lengths[:cut], first), length_stats(lengths[cut:], first + cut)
        assert (a[0] + b[0], max(a[1], b[1]), (a[2] + b[2]) % 2**64) == whole
    swapped = lengths.copy()
    swapped[[5, 6]] = lengths[[6, 5]]
    assert length_stats(swapped, 0)[:2] == length_stats(lengths, 0)[:2]
    assert length_stats(swapped, 0)[2] != length_stats(lengths, 0)[2]
    assert length_stats(lengths[:0], 5) == length_stats_reference(lengths[:0], 5) == (0, 0, 0)


def test_numba_kernels_load_without_scipy_linalg_or_numba_extensions():
    # megacache build's processes skip numba's BLAS probe (it imports scipy.linalg on every rank)
    # and third-party numba extensions (gigatoken's dependency awkward registers one); the kernels
    # still load, and scipy still imports and works afterwards.
    import subprocess
    import sys
    from importlib.metadata import entry_points

    extensions = sorted({e.value.split(":")[0].split(".")[0] for e in entry_points(group="numba_extensions")})
    assert "awkward" in extensions  # installed with gigatoken: the check below can fail
    code = f"""
import sys
from megacache.runtime.startup import import_numba_for_kernels
import_numba_for_kernels()
import numpy as np
from megacache.algorithms.gpt_index import length_stats
assert length_stats(np.array([3, 4], np.int32), 0)[:2] == (7, 4)
assert "scipy.linalg" not in sys.modules, "numba imported scipy.linalg"
loaded = [m for m in {extensions!r} if m in sys.modules]
assert not loaded, f"numba loaded the extensions of {{loaded}}"
try:
    import scipy.linalg
except ImportError:
    pass  # scipy not installed: nothing more to check
else:
    assert scipy.linalg.det(np.eye(2)) == 1.0
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MEGACACHE_KERNEL_DIR": "jit"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
