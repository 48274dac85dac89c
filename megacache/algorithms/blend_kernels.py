"""Megatron's greedy blending kernels, bit-identical to megatron-core's helpers (docs/megatron.md §4).

* ``build_blending_indices``: ``helpers_cpp.build_blending_indices``. At step s (t = max(s, 1)) the
  error of dataset d is ``fl(fl(w_d·t) - c_d)``; the largest error wins, ties go to the lowest
  index, and ``(d, c_d)`` is written before ``c_d`` grows. The kernels compute exactly that
  expression in float64 without fused multiply-add (numba never contracts without fastmath; a test
  checks the machine code) and compare the results exactly.
* ``build_exhaustive_blending_indices``: ``helpers_cpp.build_exhaustive_blending_indices`` (weights
  ``sizes/total``; a dataset drops out once it has given ``sizes[d]`` samples).
* ``blend_chunk``: samples [s0, s1) of a blend from the counts at s0 (the primitive that
  ``blend_chunks`` cuts a blend over ranks with).

The fast kernel (used unless ``reference=True``) gives the same arrays with far less work:

* Datasets with bitwise-equal weights (and caps) form one *slot*: once their counts are
  [c+1]*k + [c]*(n-k) in index order (always true when starting from zero) they keep that shape,
  the slot's error is ``w·t - c`` and its next pick is member k. So equal weights cost O(1) per
  step whatever their number.
* Awake and asleep: errors spread over about one unit below the maximum, and a slot only gains
  (at rate w) until it is picked. Below a *level* a little under the maximum, a slot cannot win
  until its error reaches the level, at a step known in advance (rounded early, so rounding
  never makes it late); it sleeps in a bucket queue until then. Each step scans only the awake
  slots (a few dozen of a thousand), in one vectorised pass: while one of them is at or above the
  level, the maximum is theirs. When none is, the level drops and every slot is sorted afresh;
  so it is, with the level raised, every few thousand steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..errors import MegacacheError
from ..runtime.kernels import intrinsic, kernel
from .blend_sizes import MAX_DATASETS
from .checks import integer

#: float64 counts are exact below this
_MAX_COUNT = 2**53

_NEG = -np.inf
_IMIN = np.int64(np.iinfo(np.int64).min)
_IMAX = np.int64(np.iinfo(np.int64).max)
_LOW63 = np.int64(0x7FFFFFFFFFFFFFFF)
_NOCAND = np.int64(1) << 62  # sorts after every (dataset << 16 | position)
# A tie-break key fits in the low 32 bits (datasets < 2^15, positions < 2^16) ...
_LOW32 = np.int64(0xFFFFFFFF)
# ... under the high bits of an error's key (truncating keys keeps their order)
_HIGH = ~_LOW32
# Relative slack that covers rounding in a slot's wake step (generous: 2^-46).
_SLACK = 2.0**-46
# Up to this many datasets the plain loop is as fast as anything.
_SCAN_DATASETS = 16
# The level starts this far below the maximum error (errors spread over about one unit)...
_SPREAD = 0.05
# ... and is set again every this many steps.
_REBUILD = 4096
# The sleepers' queue: one bucket per step, this many (a power of two), used round and round.
_BUCKETS = 4096


@intrinsic
def _float_bits(typingctx, x):
    from llvmlite import ir
    from numba import types

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@kernel(inline=True)
def _key(x):
    """An int64 that orders like the float64 x (-0.0 never reaches it). Integer max/min
    reductions vectorise; float ones do not without fastmath. The kernels write them as
    ``m = x if x > m else m``, a select that LLVM turns into vector max/min."""
    b = _float_bits(x)
    return b ^ ((b >> 63) & _LOW63)


@kernel("float64[::1], float64[::1], float64[::1], int64, int16[::1], int64[::1]")
def _scan_kernel(w, c, cap, start, out_idx, out_sidx):
    """The helpers' loop, one dataset at a time. ``c`` holds float64 counts (+inf once a dataset
    is exhausted, i.e. its count reached ``cap``); updated in place."""
    D = w.shape[0]
    for i in range(out_idx.shape[0]):
        t = max(float(start + i), 1.0)
        best = _NEG
        d = 0
        for j in range(D):
            e = w[j] * t - c[j]
            if e > best:
                best = e
                d = j
        out_idx[i] = d
        out_sidx[i] = np.int64(c[d])
        c[d] += 1.0
        if c[d] == cap[d]:
            c[d] = np.inf


@kernel(inline=True)
def _wake_step(w, c, level, s):
    """The first step (from ``s`` on) at which a slot's error ``fl(fl(w·t) - c)`` may reach
    ``level``, rounded early: the slack covers every rounding of the error and of this quotient.
    ``_IMAX``: never (exhausted, or an error that cannot rise)."""
    if c == np.inf:
        return _IMAX
    if w == 0.0:
        return s if -c >= level else _IMAX
    t = (level + c - (c + 2.0) * _SLACK) / w
    t -= abs(t) * _SLACK + 2.0
    if t <= float(s):
        return s
    if t > 2.0**62:
        return _IMAX
    return np.int64(t)


@kernel(inline=True)
def _awaken(g, na, w, c, rep, aw, ac, ab, ag, pos):
    """Slot ``g`` awake, at position ``na`` of the awake slots; their count after."""
    aw[na] = w[g]
    ac[na] = c[g]
    ab[na] = (rep[g] << 16) | na
    ag[na] = g
    pos[g] = na
    return na + 1


@kernel(inline=True)
def _raised(count, cap):
    """A slot's count after its last member's pick: +inf once it reaches ``cap`` (exhausted)."""
    count += 1.0
    return np.inf if count == cap else count


@kernel("float64[::1], float64[::1], float64[::1], int64[::1], int64[::1], int64[::1], int64[::1], "
        "int64[::1], int64, int16[::1], int64[::1]")
def _wake_kernel(w, c, cap, k, n, off, members, rep, start, out_idx, out_sidx):
    """The greedy over slots (see the module docstring): each step scans only the awake slots;
    the others sleep in a bucket queue keyed by the step at which they may reach the level.
    Slot state (``c``: float64 count of member k, +inf once exhausted; ``k``; ``rep`` = member
    k) is updated in place.

    A vector load that overlaps a recent scalar store waits until that store is done, so stores
    made after a step's pick would chain its bookkeeping into the next scan. A step's stores into
    the awake slots therefore come right after its scan loop, before anything waits on the scan's
    maxima: a slot that falls asleep stays in place, masked out of the next scan in registers, and
    is moved out after that scan; slots due awake are added then too, a step ahead (waking early
    is harmless)."""
    G = w.shape[0]
    total = out_idx.shape[0]
    # the awake slots, dense, padded with entries that never win to a whole number of the
    # vectorised loop's 32-element iterations (its scalar remainder is slow)
    aw = np.zeros(G + 32)
    ac = np.full(G + 32, np.inf)
    ab = np.full(G + 32, _NOCAND)  # (member << 16) | position: the tie-break key
    ag = np.empty(G + 32, np.int64)  # the slot at each position
    pos = np.full(G, -1, np.int64)
    wake = np.empty(G, np.int64)
    head = np.full(_BUCKETS, -1, np.int64)
    nxt = np.empty(G, np.int64)
    na = 0
    lkey = _IMIN
    level = 0.0
    spread = _SPREAD
    rebuild = 0  # the step of the next rebuild
    # the position of the slot picked last if it sleeps from this step on (-1: none), and its
    # wake step; its count and place change after this step's scan (its member at the pick)
    p = np.int64(-1)
    px = np.int64(0)
    i = 0
    while i < total:
        s = start + i
        t = max(float(s), 1.0)
        if i == rebuild:
            # every slot awake or asleep afresh, the level just below the current maximum
            if p >= 0:
                ac[p] = _raised(ac[p], cap[ag[p]])
                p = -1
            for j in range(na):
                c[ag[j]] = ac[j]
                pos[ag[j]] = -1
                aw[j] = 0.0
                ac[j] = np.inf
                ab[j] = _NOCAND
            na = 0
            head[:] = -1
            top = _NEG
            for g in range(G):
                e = w[g] * t - c[g]
                top = e if e > top else top
            level = top - spread
            lkey = _key(level)
            for g in range(G):
                x = _wake_step(w[g], c[g], level, s)
                if x == s:
                    na = _awaken(g, na, w, c, rep, aw, ac, ab, ag, pos)
                elif x != _IMAX:
                    wake[g] = x
                    b = x & (_BUCKETS - 1)
                    nxt[g] = head[b]
                    head[b] = g
            rebuild = i + _REBUILD
        padded = (na + 31) & ~31
        # One pass, two independent maxima: the exact key m, and the key's high bits packed
        # with the complement of the tie-break key. A step that waited for m before looking for
        # its holders would run two reductions one after the other. Position p is masked with
        # integer operations, which vectorise where a comparison's select does not.
        m = _IMIN
        packed = _IMIN
        for j in range(padded):
            x = _key(aw[j] * t - ac[j])
            apart = np.int64(j) ^ p
            keep = (apart | -apart) >> 63  # all ones except at p
            x = (x & keep) | (_IMIN & ~keep)
            m = x if x > m else m
            y = (x & _HIGH) | (_LOW32 - (ab[j] & _LOW32))
            packed = y if y > packed else packed
        # This step's stores come before anything that waits on the scan's maxima, so that they
        # are done by the next scan: the last pick's slot out, if it sleeps (the last awake slot
        # taking its position), and the slots due at the next step in.
        moved = np.int64(-1)
        if p >= 0:
            g = ag[p]
            c[g] = _raised(ac[p], cap[g])
            na -= 1
            h = ag[na]
            aw[p] = aw[na]
            ac[p] = ac[na]
            ab[p] = (ab[na] & ~np.int64(0xFFFF)) | p
            ag[p] = h
            pos[h] = p
            pos[g] = -1
            aw[na] = 0.0
            ac[na] = np.inf
            ab[na] = _NOCAND
            if px != _IMAX:
                wake[g] = px
                b = px & (_BUCKETS - 1)
                nxt[g] = head[b]
                head[b] = g
            moved = na
        b = (s + 1) & (_BUCKETS - 1)
        g = head[b]
        head[b] = -1
        while g >= 0:
            later = nxt[g]
            if wake[g] <= s + 1:
                na = _awaken(g, na, w, c, rep, aw, ac, ab, ag, pos)
            else:  # due a lap of the queue later
                nxt[g] = head[b]
                head[b] = g
            g = later
        if m < lkey:
            # a sleeping slot may hold the maximum: rebuild now, with a lower level
            spread *= 2.0
            rebuild = i
            p = -1
            continue
        if i + 1 == rebuild:  # a whole period without that: try a higher level next
            spread = max(_SPREAD, spread * 0.5)
        # The packed maximum is the lowest tie-break key among the errors whose high bits are the
        # largest. Its error is exactly m only if it is the answer: every error equal to m shares
        # those high bits. Otherwise (errors within 2^32 ulps of each other) look again, exactly:
        # among every awake slot, the one masked out having gone, and the ones just woken below m.
        r = _LOW32 - (packed & _LOW32)
        j = r & 0xFFFF
        if j == moved:
            j = p
        p = -1
        if _key(aw[j] * t - ac[j]) != m:
            r = _NOCAND
            for q in range(na):
                x = ab[q] if _key(aw[q] * t - ac[q]) == m else _NOCAND
                r = x if x < r else r
            j = r & 0xFFFF
        out_idx[i] = r >> 16
        out_sidx[i] = np.int64(ac[j])
        g = ag[j]
        if k[g] + 1 == n[g]:
            # the slot's last member: its count rises, and it sleeps unless its error stays
            # within reach of the level
            k[g] = 0
            x = _wake_step(w[g], _raised(ac[j], cap[g]), level, s + 1)
            if x > s + 1:
                p = j
                px = x
            else:
                ac[j] = _raised(ac[j], cap[g])
        else:
            k[g] += 1
        rep[g] = members[off[g] + k[g]]
        if p != j:
            ab[j] = (rep[g] << 16) | j
        i += 1
    if p >= 0:
        ac[p] = _raised(ac[p], cap[ag[p]])
    for j in range(na):
        c[ag[j]] = ac[j]


class _Slots(NamedTuple):
    w: np.ndarray  # float64[G]
    c: np.ndarray  # float64[G]: count of member k (+inf when exhausted)
    cap: np.ndarray  # float64[G]: count at which members are exhausted (+inf: never)
    k: np.ndarray  # int64[G]: members [0, k) have count c + 1
    n: np.ndarray  # int64[G]
    off: np.ndarray  # int64[G]: first member in `members`
    members: np.ndarray  # int64[D]: dataset ids, ascending within each slot
    rep: np.ndarray  # int64[G]: member k, the slot's next pick

    @classmethod
    def build(cls, weights: np.ndarray, caps: np.ndarray, counts: np.ndarray) -> _Slots:
        """Group equal (weight, cap) datasets whose counts have the [c+1]*k + [c]*(n-k) shape;
        any other dataset is a slot of its own."""
        D = weights.shape[0]
        order = np.lexsort((np.arange(D), caps, -weights))
        ws, caps_s, cnt = weights[order], caps[order], counts[order]
        new = np.ones(D, dtype=bool)
        new[1:] = (ws[1:] != ws[:-1]) | (caps_s[1:] != caps_s[:-1])
        gid = np.cumsum(new) - 1
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], D)
        rises = np.zeros(len(starts), dtype=bool)
        rising = ~new[1:] & (cnt[1:] > cnt[:-1])
        rises[gid[1:][rising]] = True
        bad = rises | (cnt[starts] - cnt[ends - 1] > 1)
        new |= bad[gid]
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], D)
        n = ends - starts
        low = cnt[ends - 1]
        k = np.add.reduceat(cnt, starts) - n * low
        c = low.astype(np.float64)
        cap = caps_s[starts]
        c[c == cap] = np.inf
        return cls(ws[starts].copy(), c, cap.copy(), k, n, starts, order, order[starts + k])

    def counts(self) -> np.ndarray:
        """Per-dataset counts of the current state."""
        low = np.where(np.isinf(self.c), self.cap, self.c).astype(np.int64)
        position = np.arange(self.members.shape[0]) - np.repeat(self.off, self.n)
        per_member = np.repeat(low, self.n) + (position < np.repeat(self.k, self.n))
        out = np.empty_like(per_member)
        out[self.members] = per_member
        return out


def check_weights(weights) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or not 1 <= w.shape[0] <= MAX_DATASETS:
        raise MegacacheError(
            f"blend weights must be a list of 1 to {MAX_DATASETS} numbers, got shape {w.shape}"
        )
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        bad = int(np.flatnonzero(~np.isfinite(w) | (w < 0))[0])
        raise MegacacheError(
            f"blend weight {bad} is {float(w[bad])!r}: weights must be finite and non-negative"
        )
    if not np.any(w > 0):
        raise MegacacheError("blend weights are all zero: at least one dataset needs a positive weight")
    return np.ascontiguousarray(w)


def check_outputs(out_dataset_index, out_dataset_sample_index) -> int:
    for name, arr, dtype in (
        ("dataset_index", out_dataset_index, np.int16),
        ("dataset_sample_index", out_dataset_sample_index, np.int64),
    ):
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype != dtype:
            raise ValueError(f"{name} must be a 1-D {np.dtype(dtype)} array")
        if not arr.flags.writeable or not arr.flags.c_contiguous:
            raise ValueError(f"{name} must be writeable and contiguous")
    if out_dataset_index.shape != out_dataset_sample_index.shape:
        raise ValueError(
            f"dataset_index and dataset_sample_index differ in length: "
            f"{out_dataset_index.shape[0]} != {out_dataset_sample_index.shape[0]}"
        )
    return out_dataset_index.shape[0]


def check_start(start: int, counts: np.ndarray | None, num_datasets: int) -> np.ndarray:
    start = integer("chunk start", start)
    if counts is None:
        if start:
            raise MegacacheError(f"a chunk starting at sample {start} needs the counts at that sample")
        return np.zeros(num_datasets, dtype=np.int64)
    counts = np.asarray(counts)
    if counts.shape != (num_datasets,) or counts.dtype.kind not in "iu":
        raise MegacacheError(
            f"counts must be {num_datasets} integers (one per dataset), "
            f"got {counts.dtype}{list(counts.shape)}"
        )
    counts = counts.astype(np.int64)
    if np.any(counts < 0) or int(counts.sum()) != start:
        raise MegacacheError(
            f"counts at sample {start} must be non-negative and sum to {start}, "
            f"they sum to {int(counts.sum())}"
        )
    return counts


def blend_range(
    weights: np.ndarray,
    caps: np.ndarray,
    start: int,
    counts: np.ndarray,
    out_idx: np.ndarray,
    out_sidx: np.ndarray,
    reference: bool,
) -> np.ndarray:
    """Blend samples [start, start + len(out_idx)) from per-dataset ``counts``; returns the end
    counts."""
    if start + out_idx.shape[0] >= _MAX_COUNT:
        raise MegacacheError(
            f"blends of 2**53 samples or more are not supported (end {start + out_idx.shape[0]})"
        )
    # numba takes the plain ndarray view of a memory map
    out_idx, out_sidx = out_idx.view(np.ndarray), out_sidx.view(np.ndarray)
    if reference or weights.shape[0] <= _SCAN_DATASETS:
        c = counts.astype(np.float64)
        c[c == caps] = np.inf
        _scan_kernel(weights, c, caps, start, out_idx, out_sidx)
        return np.where(np.isinf(c), caps, c).astype(np.int64)
    slots = _Slots.build(weights, caps, counts)
    if out_idx.shape[0]:
        _wake_kernel(*slots, start, out_idx, out_sidx)
    return slots.counts()


def blend_chunk(
    weights: Sequence[float],
    start: int,
    start_counts: np.ndarray | None,
    out_dataset_index: np.ndarray,
    out_dataset_sample_index: np.ndarray,
    *,
    reference: bool = False,
) -> np.ndarray:
    """Blend samples [start, start + len(out)) into the given arrays (views of memory maps work)
    from ``start_counts`` (int64[D], samples per dataset before ``start``; None at 0). Returns
    the counts at the end of the chunk."""
    w = check_weights(weights)
    check_outputs(out_dataset_index, out_dataset_sample_index)
    counts = check_start(start, start_counts, w.shape[0])
    caps = np.full(w.shape[0], np.inf)
    return blend_range(w, caps, int(start), counts, out_dataset_index, out_dataset_sample_index, reference)


def build_blending_indices(
    weights: Sequence[float], size: int, *, reference: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset_index int16[size], dataset_sample_index int64[size])`` exactly as
    ``helpers_cpp.build_blending_indices(.., weights, len(weights), size, ..)``.

    ``weights`` are used as given (BlendedDataset passes normalized ones). ``reference=True`` runs
    the helpers' plain loop instead of the fast kernel (same output).
    """
    w = check_weights(weights)
    size = integer("blend size", size)
    idx = np.empty(size, dtype=np.int16)
    sidx = np.empty(size, dtype=np.int64)
    blend_chunk(w, 0, None, idx, sidx, reference=reference)
    return idx, sidx


def build_exhaustive_blending_indices(
    sizes: Sequence[int], *, reference: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``helpers_cpp.build_exhaustive_blending_indices``: exactly ``sizes[d]`` samples of dataset
    d, sum(sizes) in all (a blend without weights or size: ``sizes`` are the dataset lengths)."""
    sizes = np.asarray(sizes)
    if sizes.ndim != 1 or not 1 <= sizes.shape[0] <= MAX_DATASETS or sizes.dtype.kind not in "iu":
        raise MegacacheError(
            f"exhaustive blend sizes must be 1 to {MAX_DATASETS} integers, "
            f"got {sizes.dtype}{list(sizes.shape)}"
        )
    sizes = sizes.astype(np.int64)
    if np.any(sizes <= 0):
        bad = int(np.flatnonzero(sizes <= 0)[0])
        # megatron-core asserts this (a dataset of length 0 would never drop out of its loop)
        raise MegacacheError(
            f"dataset {bad} has {int(sizes[bad])} samples: every blended dataset needs at least one"
        )
    total = int(sizes.sum())
    weights = sizes.astype(np.float64) / np.float64(total)
    idx = np.empty(total, dtype=np.int16)
    sidx = np.empty(total, dtype=np.int64)
    blend_range(weights, sizes.astype(np.float64), 0, np.zeros_like(sizes), idx, sidx, reference)
    return idx, sidx
