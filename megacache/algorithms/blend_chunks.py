"""A blend cut into chunks over ranks, exact by construction (docs/megatron.md §4).

Samples [s0, s1) of a blend depend only on the weights and the counts at s0. A distributed
build gives chunk i to rank i, which
  1. guesses its start counts with ``guess_counts(weights, s_i)`` (exact for s_i <= warmup, so the
     first chunk is exact), and runs ``blend_chunk`` from them into its slice of the outputs;
  2. allgathers (start, end) counts of all chunks (2·P·D int64);
  3. in rounds, every chunk i whose start differs from the end of chunk i-1 as it stands
     (``unconfirmed_chunks``) is recomputed by its rank from that end, all at once (``repair_chunk``:
     starts[i] = the old ends[i-1], ends[i] = the repaired end); the new ends are shared, and the
     rounds go on until no chunk is unconfirmed.
A chunk's output is always the greedy run from its recorded start, so once every start equals its
predecessor's end (chunk 0's is exact) the blend is exact, whatever the guesses were. A wrong guess
usually merges with the true trajectory within a few thousand steps, after which the speculative
output is already right: a repair rarely recomputes much, and the end of a chunk that started wrong
is usually right already, so one round usually confirms every chunk; k chunks in a row whose
trajectories never merge take k rounds, the serial protocol's worst case.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from ..errors import MegacacheError
from .blend_kernels import blend_chunk, blend_range, check_outputs, check_start, check_weights
from .checks import integer

#: greedy steps a chunk's guessed start state is run for before the chunk (see guess_counts)
DEFAULT_WARMUP = 200_000


def guess_counts(weights: Sequence[float], start: int, warmup: int = DEFAULT_WARMUP) -> np.ndarray:
    """A guess at the counts at sample ``start`` from the weights alone: exact (the greedy run
    from zero) when ``start <= warmup``; otherwise the largest-remainder apportionment of
    ``start - warmup`` samples, then ``warmup`` greedy steps, which usually lands on the true state."""
    w = check_weights(weights)
    start = integer("chunk start", start)
    begin = max(0, start - integer("warmup", warmup))
    counts = _largest_remainder(w, begin)
    steps = start - begin
    caps = np.full(w.shape[0], np.inf)
    return blend_range(w, caps, begin, counts, np.empty(steps, np.int16), np.empty(steps, np.int64), False)


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """``total`` samples apportioned by weight: floors, then one more to the largest fractional
    parts, ties to the lowest index (which keeps equal-weight datasets in the greedy's shape)."""
    if total == 0:
        return np.zeros(weights.shape[0], dtype=np.int64)
    share = weights / weights.sum() * total
    counts = np.floor(share).astype(np.int64)
    frac = share - counts
    rest = total - int(counts.sum())
    D = weights.shape[0]
    if rest > 0:
        counts += rest // D
        counts[np.lexsort((np.arange(D), -frac))[: rest % D]] += 1
    elif rest < 0:
        # rounding gave too many: take them back from the smallest fractions, highest index first
        order = np.lexsort((-np.arange(D), frac))
        order = order[counts[order] > 0]
        counts[order[:-rest]] -= 1
    return counts


class Repair(NamedTuple):
    #: true counts at the end of the chunk
    end_counts: np.ndarray
    #: samples rewritten from the start of the chunk (0: the guess was right)
    recomputed: int


def repair_chunk(
    weights: Sequence[float],
    start: int,
    true_start_counts: np.ndarray,
    guessed_start_counts: np.ndarray,
    guessed_end_counts: np.ndarray,
    out_dataset_index: np.ndarray,
    out_dataset_sample_index: np.ndarray,
) -> Repair:
    """Make a chunk computed by ``blend_chunk`` from ``guessed_start_counts`` (with end
    ``guessed_end_counts``) exact, given the true counts at its start.

    Recomputes in doubling segments from the true state and stops as soon as the true and the
    speculative counts agree: both runs are then in the same state, so the rest of the chunk is
    already right and its end is ``guessed_end_counts``."""
    w = check_weights(weights)
    length = check_outputs(out_dataset_index, out_dataset_sample_index)
    D = w.shape[0]
    true = check_start(start, true_start_counts, D)
    diff = true - check_start(start, guessed_start_counts, D)
    guessed_end = check_start(start + length, guessed_end_counts, D)
    caps = np.full(D, np.inf)
    state = true
    done = 0
    segment = 4096
    while diff.any() and done < length:
        stop = min(length, done + segment)
        speculative = np.bincount(out_dataset_index[done:stop], minlength=D)
        state = blend_range(
            w,
            caps,
            int(start) + done,
            state,
            out_dataset_index[done:stop],
            out_dataset_sample_index[done:stop],
            False,
        )
        diff += np.bincount(out_dataset_index[done:stop], minlength=D) - speculative
        done = stop
        segment *= 2
    return Repair(guessed_end if not diff.any() else state, done)


def unconfirmed_chunks(start_counts: Sequence[np.ndarray], end_counts: Sequence[np.ndarray]) -> list[int]:
    """Every chunk i >= 1 whose start counts differ from the end counts of chunk i-1, in order
    (empty when every guess is confirmed; chunk 0 must start from exact counts)."""
    if len(start_counts) != len(end_counts):
        raise ValueError(f"{len(start_counts)} start states for {len(end_counts)} chunks")
    return [i for i in range(1, len(start_counts)) if not np.array_equal(end_counts[i - 1], start_counts[i])]


def repair_rounds(weights: Sequence[float], bounds: Sequence[int], starts: list, ends: list,
                  out_dataset_index: np.ndarray, out_dataset_sample_index: np.ndarray, mapper=map) -> int:
    """Step 3 in one process: repair rounds over the chunks [b_i, b_i+1) of the arrays, each round's
    repairs through ``mapper`` (a thread pool's map runs them at once: disjoint slices, and the
    kernels release the GIL). Updates ``starts``/``ends``; returns the samples recomputed."""
    recomputed = 0
    while todo := unconfirmed_chunks(starts, ends):
        before = list(ends)

        def repair(i: int) -> Repair:
            s0, s1 = bounds[i], bounds[i + 1]
            return repair_chunk(weights, s0, before[i - 1], starts[i], ends[i], out_dataset_index[s0:s1],
                                out_dataset_sample_index[s0:s1])

        for i, repaired in zip(todo, list(mapper(repair, todo))):
            starts[i], ends[i] = before[i - 1], repaired.end_counts
            recomputed += repaired.recomputed
    return recomputed


def build_blending_indices_chunked(
    weights: Sequence[float],
    size: int,
    boundaries: Sequence[int],
    warmup: int = DEFAULT_WARMUP,
    max_workers: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """``build_blending_indices`` by the chunk protocol above, the chunks [b_i, b_i+1) of
    ``boundaries`` (0 first, ``size`` last) run speculatively and then repaired in rounds, both on
    ``max_workers`` threads (the kernels release the GIL)."""
    w = check_weights(weights)
    bounds = [int(b) for b in boundaries]
    if (
        len(bounds) < 2
        or bounds[0] != 0
        or bounds[-1] != size
        or any(a > b for a, b in itertools.pairwise(bounds))
    ):
        raise MegacacheError(
            f"chunk boundaries must rise from 0 to the blend size {size}, got {list(boundaries)}"
        )
    idx = np.empty(size, dtype=np.int16)
    sidx = np.empty(size, dtype=np.int64)
    chunks = list(itertools.pairwise(bounds))

    def speculate(chunk):
        s0, s1 = chunk
        guess = guess_counts(w, s0, warmup)
        return guess, blend_chunk(w, s0, guess, idx[s0:s1], sidx[s0:s1])

    with ThreadPoolExecutor(max_workers) as pool:
        starts, ends = map(list, zip(*pool.map(speculate, chunks)))
        repair_rounds(w, bounds, starts, ends, idx, sidx, pool.map)
    return idx, sidx
