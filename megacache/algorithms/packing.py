"""Megatron-Bridge 0.6.2's offline packing of SFT examples (``prepare_gpt_sft_packed_data``), exactly:
which examples go into which packed sequence, and in which order. See docs/sft-packing.md.

An example of ``t`` tokens is a sequence of length ``t - 1`` (its inputs and its labels are each one
token shorter than it); every length below is such a sequence length.

* ``histogram``: the examples of each length up to ``max_seq_length``, in dataset order; longer ones
  and empty ones are left out, as Bridge's ``create_hist`` leaves them.
* ``first_fit_decreasing``, ``first_fit_shuffle``: the packs of those lengths (``Packs``), each
  length in the first pack with room for it, taken longest first or in a shuffled order.
* ``fill``: the example in each place of each pack: per length, a permutation of its examples,
  taken from the back as the packs ask for that length in turn.
* ``plan``: all of it, from the examples' token counts, with Bridge's metadata record.

Bridge draws every random number from numpy's global ``RandomState`` seeded with ``seed``; this module
draws from ``MT19937.from_seed(seed)``, the same stream, private to the call. The draws, in order:
``first_fit_shuffle``'s shuffle of the lengths (none with ``first_fit_decreasing``), then in
``fill`` a permutation of each length's examples, length 0, 1, ... up to ``pack_size``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import MegacacheError
from ..runtime.kernels import kernel
from .checks import integer
from .permutation import MT19937, shuffle, shuffle_segments

#: Bridge's ``PACKING_ALGOS``, under its names
ALGORITHMS = ("first_fit_decreasing", "first_fit_shuffle")


class Histogram(NamedTuple):
    counts: np.ndarray  # int64[max_seq_length + 1]: how many examples have each length
    examples: np.ndarray  # int64: the counted examples' indices, by length, each length's in dataset order
    skipped: int  # examples longer than max_seq_length, left out
    empty: int  # examples of no token (length -1), left out


class Packs(NamedTuple):
    offsets: np.ndarray  # int64[B + 1]: pack b holds places offsets[b]:offsets[b + 1]
    lengths: np.ndarray  # int64: each place's sequence length, pack after pack, each in the order placed


class PackingPlan(NamedTuple):
    offsets: np.ndarray  # int64[B + 1]: packed sequence b holds places offsets[b]:offsets[b + 1]
    examples: np.ndarray  # int64: each place's example (its index in the dataset)
    lengths: np.ndarray  # int64: each place's sequence length (its example's tokens - 1)
    metadata: dict  # Bridge's packing metadata record, its fields in Bridge's order
    skipped: int  # examples longer than max_seq_length, left out
    empty: int  # examples of no token, left out


def _token_counts(tokens) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not (tokens.size == 0 or np.issubdtype(tokens.dtype, np.integer)):
        raise MegacacheError(f"example token counts must be a 1-D array of integers, got {tokens.dtype} "
                             f"of shape {tokens.shape}")
    if tokens.size and tokens.min() < 0:
        raise MegacacheError(f"example {int(np.argmin(tokens))} has a negative token count, {int(tokens.min())}")
    return tokens.astype(np.int64)


def histogram(tokens, max_seq_length: int) -> Histogram:
    """The examples (``tokens[i]``: example i's token count) of each length up to ``max_seq_length``
    (Bridge's ``create_hist``). An empty example is left out too: Bridge counts it as length -1,
    which no later step reads."""
    max_seq_length = integer("max_seq_length", max_seq_length, 1)
    lengths = _token_counts(tokens) - 1
    counted = np.flatnonzero((lengths >= 0) & (lengths <= max_seq_length))
    by_length = _stable_order(lengths[counted], max_seq_length)
    return Histogram(np.bincount(lengths[counted], minlength=max_seq_length + 1).astype(np.int64),
                     counted[by_length], int(np.count_nonzero(lengths > max_seq_length)),
                     int(np.count_nonzero(lengths < 0)))


def _stable_order(values: np.ndarray, maximum: int) -> np.ndarray:
    """``argsort(values, kind="stable")`` of values in [0, maximum]: numpy radix-sorts 16-bit keys."""
    return np.argsort(values.astype(np.uint16) if maximum < 2**16 else values, kind="stable")


# lengths a call makes (writable) or is given (a read-only array: a memory map)
@kernel("int64[::1], int64, int64[::1], int64[::1]", "readonly(int64[::1]), int64, int64[::1], int64[::1]")
def _first_fit(lengths, pack_size, packs, places):
    """packs[i] = the pack of lengths[i], places[i] its place in that pack; returns how many packs.
    A max-tree over the packs' room (-1 for a pack not opened: no length fits it) finds the first
    pack with room in O(log B)."""
    n = lengths.shape[0]
    size = 1
    while size < n:
        size *= 2
    room = np.full(2 * size, -1, dtype=np.int64)
    held = np.zeros(size, dtype=np.int64)
    opened = 0
    for i in range(n):
        need = lengths[i]
        if room[1] >= need:
            node = 1
            while node < size:  # down to the leftmost leaf with room >= need
                node *= 2
                if room[node] < need:
                    node += 1
        else:
            node = size + opened
            opened += 1
            room[node] = pack_size
        room[node] -= need
        b = node - size
        packs[i] = b
        places[i] = held[b]
        held[b] += 1
        node //= 2
        while node >= 1:  # up while the most room below a node changes
            most = max(room[2 * node], room[2 * node + 1])
            if room[node] == most:
                break
            room[node] = most
            node //= 2
    return opened


def first_fit_reference(lengths: np.ndarray, pack_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``_first_fit`` as the plain serial loop over every open pack: (each length's pack, its place
    in it, how many packs)."""
    room: list[int] = []
    held: list[int] = []
    packs, places = [], []
    for need in lengths.tolist():
        for b, left in enumerate(room):
            if left >= need:
                break
        else:
            b = len(room)
            room.append(pack_size)
            held.append(0)
        room[b] -= need
        packs.append(b)
        places.append(held[b])
        held[b] += 1
    return np.array(packs, dtype=np.int64), np.array(places, dtype=np.int64), len(room)


def first_fit(lengths, pack_size: int) -> Packs:
    """Each length, in the order given, into the first pack with room for it, or a new pack
    (Bridge's ``first_fit``, for lengths in [0, pack_size])."""
    pack_size = integer("packed_sequence_size", pack_size, 1)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 0 or lengths.max() > pack_size):
        wrong = lengths.max() if lengths.max() > pack_size else lengths.min()
        raise MegacacheError(f"a sequence of length {int(wrong)} cannot be packed into packed_sequence_size "
                             f"{pack_size}")
    packs = np.empty(lengths.shape[0], dtype=np.int64)
    places = np.empty(lengths.shape[0], dtype=np.int64)
    count = int(_first_fit(lengths, np.int64(pack_size), packs, places))
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(packs, minlength=count), out=offsets[1:])
    placed = np.empty_like(lengths)
    placed[offsets[packs] + places] = lengths
    return Packs(offsets, placed)


def first_fit_decreasing(lengths, pack_size: int) -> Packs:
    """First fit of the lengths longest first."""
    return first_fit(np.sort(np.asarray(lengths, dtype=np.int64))[::-1], pack_size)


def first_fit_shuffle(lengths, pack_size: int, state: MT19937) -> Packs:
    """First fit of the lengths in the order ``RandomState.shuffle`` gives them (drawn from ``state``)."""
    shuffled = np.array(lengths, dtype=np.int64)
    shuffle(shuffled, state)
    return first_fit(shuffled, pack_size)


def fill(hist: Histogram, packs: Packs, state: MT19937) -> np.ndarray:
    """The example in each place of ``packs`` (Bridge's ``fill_packing_strategy``). Each length's
    examples are permuted (one ``RandomState.permutation`` each, in increasing length), then taken
    from the back: the k-th place of length L, counting pack after pack, gets the k-th from the end.
    ``packs`` must hold exactly the lengths ``hist`` counts."""
    bounds = np.zeros(hist.counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(hist.counts, out=bounds[1:])
    permuted = hist.examples.copy()
    shuffle_segments(permuted, bounds, state)
    by_length = _stable_order(packs.lengths, hist.counts.shape[0] - 1)  # places by (length, k)
    length = packs.lengths[by_length]
    examples = np.empty_like(permuted)
    examples[by_length] = permuted[bounds[length] + bounds[length + 1] - 1 - np.arange(length.shape[0])]
    return examples


def sequence_starts(offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each place's first token within its packed sequence (Bridge's ``seq_start_id``, pack after
    pack): an example of length L holds L + 1 tokens."""
    tokens = lengths + 1
    before = np.cumsum(tokens) - tokens
    return before - np.repeat(before[offsets[:-1]], np.diff(offsets))


def metadata(packs: Packs, pack_size: int) -> dict:
    """Bridge's packing metadata record of ``packs`` (``create_packing_strategy``), its floats
    computed in Bridge's order of operations."""
    packed = np.concatenate(([0], np.cumsum(packs.lengths)))
    per_pack = packed[packs.offsets[1:]] - packed[packs.offsets[:-1]]
    count = per_pack.shape[0]
    return {
        "dataset_max_seqlen": int(packs.lengths.max()),
        "max_samples_per_bin": int(np.diff(packs.offsets).max()),
        "packing_factor": round(packs.lengths.shape[0] / count, 2),
        "packing_efficiency": round(int(per_pack.sum()) / count / pack_size * 100, 2),
        "pack_size": pack_size,
        "min_packed_seqlen": int(per_pack.min()),
    }


def plan(tokens, pack_size: int, max_seq_length: int, seed: int, algorithm: str) -> PackingPlan:
    """Bridge's packing of examples of ``tokens[i]`` tokens each into sequences of ``pack_size``
    (``prepare_gpt_sft_packed_data`` with ``packed_sequence_size``, ``max_seq_length``, ``seed`` and
    ``packing_algorithm``), where Bridge packs them; a MegacacheError where Bridge fails."""
    pack_size = integer("packed_sequence_size", pack_size, 1)
    seed = integer("seed", seed, 0, 2**32 - 1)
    if algorithm not in ALGORITHMS:
        raise MegacacheError(f"packing_algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    hist = histogram(tokens, max_seq_length)
    if hist.examples.size == 0:
        left_out = (f"{hist.empty} are empty and {hist.skipped} have more than max_seq_length + 1 = "
                    f"{max_seq_length + 1} tokens" if hist.skipped + hist.empty else "there are none")
        raise MegacacheError(f"no example to pack: {left_out} (Bridge 0.6.2 fails on this with a ZeroDivisionError)")
    over = int(hist.counts[pack_size + 1:].sum())
    if over:
        longest = int(np.flatnonzero(hist.counts)[-1])
        example = int(hist.examples[hist.examples.size - hist.counts[longest]])
        raise MegacacheError(
            f"{over} example(s) are longer than packed_sequence_size {pack_size}, the longest example {example} "
            f"({longest + 1} tokens, a sequence of {longest}); Bridge 0.6.2 fails on them with a KeyError. Raise "
            f"packed_sequence_size to {longest}, or lower max_seq_length (max_single_sequence_length, else "
            f"seq_length) to {pack_size}, which leaves longer examples out")
    state = MT19937.from_seed(seed)
    lengths = np.repeat(np.arange(hist.counts.shape[0], dtype=np.int64), hist.counts)
    packs = first_fit_decreasing(lengths, pack_size) if algorithm == "first_fit_decreasing" else \
        first_fit_shuffle(lengths, pack_size, state)
    return PackingPlan(packs.offsets, fill(hist, packs, state), packs.lengths, metadata(packs, pack_size),
                       hist.skipped, hist.empty)


def packed_tokens(packing: PackingPlan, example_offsets: np.ndarray, first: int = 0,
                  stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Where the tokens of packed sequences ``first`` to ``stop`` (all by default) come from, given
    each example's place in a flat array of all examples' tokens (example i:
    ``example_offsets[i]:example_offsets[i + 1]``): (int64[stop - first + 1], packed sequence
    ``first + b``'s tokens are ``b``'s slice of the second; int64, each of those tokens' index in
    the flat array). A packed sequence is its examples' tokens one after another (Bridge's fill)."""
    stop = packing.offsets.size - 1 if stop is None else stop
    places = packing.offsets[first:stop + 1]
    counts = packing.lengths[places[0]:places[-1]] + 1
    ends = np.cumsum(counts)
    index = np.repeat(example_offsets[packing.examples[places[0]:places[-1]]] - ends + counts, counts) + \
        np.arange(int(ends[-1]) if ends.size else 0)
    return np.concatenate(([0], ends))[places - places[0]], index
