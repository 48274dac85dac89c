"""Megatron-Bridge's offline SFT packing (megacache.algorithms.packing) equals Bridge 0.6.2's own:
its first fit algorithms on random lengths, and its ``prepare_gpt_sft_packed_data`` on random
datasets (which example lands where, each packed sequence's ``seq_start_id`` and token count, the
metadata file byte for byte, and where Bridge fails, a clear refusal). The oracle is
tests/support/oracles/bridge_packing_worker.py in the environment tests/bridge_oracle.sh builds (those tests
skip when it is not built); its answers are kept per machine, keyed by the cases. The kernels are
checked against their plain references both ways (JIT and compiled library) without it."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from megacache.algorithms import packing
from megacache.algorithms.permutation import MT19937, shuffle_segments
from megacache.errors import MegacacheError
from support.oracles.environments import SCRIPTS, bridge_answer

WORKER = os.path.join(SCRIPTS, "bridge_packing_worker.py")
SIZES = (0, 1, 2, 3, 17, 100, 1000, 5000, 20000)
PACK_SIZES = (1, 2, 7, 64, 512, 4096)


def random_lengths(rng, n: int, pack_size: int) -> np.ndarray:
    """n lengths in [0, pack_size]: spread evenly, mostly short, mostly long, or only the edges."""
    kind = rng.integers(4)
    if kind == 0:
        return rng.integers(0, pack_size + 1, n)
    if kind == 1:
        return rng.integers(0, pack_size // 8 + 1, n)
    if kind == 2:
        return rng.integers(pack_size // 2, pack_size + 1, n)
    return rng.choice(np.unique([0, 1, pack_size // 2, pack_size - 1, pack_size]), n)


def algorithm_cases() -> list[dict]:
    rng = np.random.default_rng(55)
    cases = []
    for i in range(54):
        pack_size = PACK_SIZES[i % len(PACK_SIZES)]
        n = SIZES[i % len(SIZES)]
        cases.append({"lengths": random_lengths(rng, n, pack_size).tolist(), "pack_size": pack_size,
                      "seed": int(rng.integers(2**32))})
    return cases


def prepare_cases() -> list[dict]:
    """Datasets of examples with every kind of token count: empty, one token (a sequence of length
    0), exactly packed_sequence_size + 1, longer than max_seq_length + 1 (left out), and, where
    max_seq_length exceeds packed_sequence_size, some in between (Bridge fails)."""
    rng = np.random.default_rng(5500)
    cases = []
    for i in range(40):
        pack_size = int(rng.choice([1, 2, 8, 33, 256, 1024]))
        n = int(rng.choice([s for s in SIZES if s * pack_size <= 4_000_000]))
        max_seq_length = pack_size + int(rng.choice([0, 0, -(pack_size // 2), 5]))
        max_seq_length = max(max_seq_length, 1)
        if max_seq_length > pack_size and i % 2:  # none in between: Bridge packs them
            tokens = random_lengths(rng, n, pack_size) + 1
        else:
            tokens = rng.integers(0, max_seq_length + 4, n)
        if n > 4:
            tokens[rng.integers(n, size=3)] = [0, 1, pack_size + 1]
        cases.append({"tokens": tokens.tolist(), "pack_size": pack_size, "max_seq_length": max_seq_length,
                      "seed": int(rng.choice([0, 2**32 - 1, int(rng.integers(2**32))])),
                      "algorithm": packing.ALGORITHMS[i % 2]})
    for pack_size, algorithm in ((512, "first_fit_shuffle"), (64, "first_fit_decreasing")):  # the largest
        cases.append({"tokens": rng.integers(0, pack_size + 4, 20000).tolist(), "pack_size": pack_size,
                      "max_seq_length": pack_size, "seed": 1234, "algorithm": algorithm})
    return cases


@pytest.fixture(scope="module")
def bridge():
    """Bridge's answers to ``algorithm_cases()`` and ``prepare_cases()``, asked once per machine."""
    request = {"algorithms": algorithm_cases(), "prepare": prepare_cases()}
    return request, bridge_answer(WORKER, "bridge-sft-packing", request)


def pack_lists(offsets: np.ndarray, values: np.ndarray) -> list[list[int]]:
    """Bridge's form: a list per pack."""
    return [values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


@pytest.mark.oracle_environments
def test_first_fit_algorithms_equal_bridges(bridge):
    request, answer = bridge
    for case, theirs in zip(request["algorithms"], answer["algorithms"], strict=True):
        decreasing = packing.first_fit_decreasing(case["lengths"], case["pack_size"])
        assert pack_lists(*decreasing) == theirs["decreasing"], (len(case["lengths"]), case["pack_size"])
        shuffled = packing.first_fit_shuffle(case["lengths"], case["pack_size"], MT19937.from_seed(case["seed"]))
        assert pack_lists(*shuffled) == theirs["shuffle"], (len(case["lengths"]), case["pack_size"], case["seed"])


@pytest.mark.oracle_environments
def test_packing_equals_bridges(bridge):
    request, answer = bridge
    failures = {"KeyError": 0, "ZeroDivisionError": 0}
    for case, theirs in zip(request["prepare"], answer["prepare"], strict=True):
        args = (case["tokens"], case["pack_size"], case["max_seq_length"], case["seed"], case["algorithm"])
        where = (len(case["tokens"]), case["pack_size"], case["max_seq_length"], case["seed"], case["algorithm"])
        if "error" in theirs:
            kind = theirs["error"].split(":")[0]
            failures[kind] += 1
            wanted = {"KeyError": "are longer than packed_sequence_size", "ZeroDivisionError": "no example to pack"}
            with pytest.raises(MegacacheError, match=wanted[kind]):
                packing.plan(*args)
            continue
        ours = packing.plan(*args)
        assert pack_lists(ours.offsets, ours.examples) == theirs["examples"], where
        assert pack_lists(ours.offsets, packing.sequence_starts(ours.offsets, ours.lengths)) == theirs["seq_start_id"]
        packed_tokens = np.add.reduceat(ours.lengths + 1, ours.offsets[:-1]).tolist()
        assert packed_tokens == theirs["tokens"], where
        assert json.dumps([ours.metadata]) == theirs["metadata"], where
        tokens = np.array(case["tokens"])
        assert (ours.skipped, ours.empty) == (np.sum(tokens > case["max_seq_length"] + 1), np.sum(tokens == 0))
    assert all(failures.values()), f"the cases must include each way Bridge fails: {failures}"


def test_examples_longer_than_the_pack_are_refused():
    """Bridge 0.6.2 packs an example whose sequence is longer than packed_sequence_size but not than
    max_seq_length, then fails in its fill step (KeyError); megacache says why, before packing."""
    tokens = [5, 13, 12, 13, 2]  # sequences of 4, 12, 11, 12, 1
    with pytest.raises(MegacacheError) as refused:
        packing.plan(tokens, 10, 12, 1234, "first_fit_shuffle")
    assert str(refused.value) == (
        "3 example(s) are longer than packed_sequence_size 10, the longest example 1 (13 tokens, a sequence of 12); "
        "Bridge 0.6.2 fails on them with a KeyError. Raise packed_sequence_size to 12, or lower max_seq_length "
        "(max_single_sequence_length, else seq_length) to 10, which leaves longer examples out")
    # longer than max_seq_length + 1 tokens: left out, as Bridge leaves them out
    plan = packing.plan(tokens, 10, 10, 1234, "first_fit_shuffle")
    assert (sorted(plan.examples.tolist()), plan.skipped, plan.empty) == ([0, 4], 3, 0)


def test_bad_arguments_are_refused():
    with pytest.raises(MegacacheError, match="packing_algorithm must be one of first_fit_decreasing, "
                                             "first_fit_shuffle, got 'first_fit'"):
        packing.plan([3], 8, 8, 0, "first_fit")
    with pytest.raises(MegacacheError, match=r"seed must be an integer between 0 and 4294967295, got -1"):
        packing.plan([3], 8, 8, -1, "first_fit_shuffle")
    with pytest.raises(MegacacheError, match="packed_sequence_size must be a positive integer, got 0"):
        packing.plan([3], 0, 8, 0, "first_fit_shuffle")
    with pytest.raises(MegacacheError, match="example 1 has a negative token count, -3"):
        packing.plan([3, -3], 8, 8, 0, "first_fit_shuffle")
    with pytest.raises(MegacacheError, match="no example to pack: there are none"):
        packing.plan([], 8, 8, 0, "first_fit_decreasing")
    with pytest.raises(MegacacheError, match="a sequence of length 9 cannot be packed into packed_sequence_size 8"):
        packing.first_fit_decreasing([3, 9], 8)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 100, 2000])
def test_first_fit_kernel_equals_reference(kernel_mode, n):
    rng = np.random.default_rng(n)
    for pack_size in (1, 5, 64, 4096):
        lengths = random_lengths(rng, n, pack_size)
        packs, places = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        expected = packing.first_fit_reference(lengths, pack_size)
        for given in (lengths, np.frombuffer(lengths.tobytes(), np.int64)):  # writable, read-only
            count = packing._first_fit(given, np.int64(pack_size), packs, places)
            assert count == expected[2], (n, pack_size)
            assert np.array_equal(packs, expected[0]) and np.array_equal(places, expected[1]), (n, pack_size)
        # every pack within its size
        room = pack_size - np.bincount(packs, weights=lengths, minlength=count)
        assert (room >= 0).all()


@pytest.mark.parametrize("sizes", [[], [0], [1], [5], [0, 3, 0, 1, 2, 700, 1, 0, 40], list(range(60))])
def test_segment_shuffles_equal_numpys_permutations(kernel_mode, sizes):
    """One permutation per segment, in turn, from one state: Bridge's fill step draws
    ``np.random.permutation(count)`` for each length with examples, in increasing length."""
    bounds = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    values = np.arange(bounds[-1], dtype=np.int64) * 7 + 3
    for seed in (0, 1234, 2**32 - 1):
        rs = np.random.RandomState(seed)
        expected = np.concatenate([values[a:b][rs.permutation(b - a)] for a, b in zip(bounds[:-1], bounds[1:])
                                   if b > a] or [values[:0]])
        state = MT19937.from_seed(seed)
        shuffled = values.copy()
        shuffle_segments(shuffled, bounds, state)
        assert np.array_equal(shuffled, expected)
        assert state == MT19937.from_numpy(rs.get_state())


def test_fill_takes_each_lengths_permuted_examples_from_the_back():
    """Bridge's fill step, spelled out: per length in increasing order a permutation of its examples
    (in dataset order), then ``pop()`` from that list at each place asking for the length."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(1, 18, 500)
    hist = packing.histogram(tokens, 16)
    rs = np.random.RandomState(77)
    state = MT19937.from_seed(77)
    lengths = np.repeat(np.arange(17), hist.counts)
    packs = packing.first_fit_shuffle(lengths, 16, state)
    rs.shuffle(lengths.tolist())  # the draws of Bridge's first_fit_shuffle, which come first
    queues = {}
    for length in range(17):
        mine = np.flatnonzero(tokens - 1 == length).tolist()
        if mine:
            queues[length] = [mine[k] for k in rs.permutation(len(mine))]
    expected = [queues[length].pop() for length in packs.lengths.tolist()]
    assert packing.fill(hist, packs, state).tolist() == expected
