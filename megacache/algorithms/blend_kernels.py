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
* Windows of K steps: at most K slots are picked in K steps, so among any K+1 slots one keeps its
  error all window long, and the maximum error never drops below that slot's (rising) error. With
  Q = the slots whose error at the window start is >= tau (|Q| > K), the maximum at step i of the
  window is >= min over Q of (E_q + w_q·i), a concave function of i that lies above its chord. A
  slot that stays below the chord for the whole window (check both ends: it is linear too) can
  never win or tie, so each step scans only the few candidates, with vectorised passes. Floating
  point errors are covered by a margin that only widens the candidate set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..errors import MegacacheError
from .blend_sizes import MAX_DATASETS
from .checks import integer

#: float64 counts are exact below this
_MAX_COUNT = 2**53

_NEG = -np.inf
_IMIN = np.int64(np.iinfo(np.int64).min)
_IMAX = np.int64(np.iinfo(np.int64).max)
_LOW63 = np.int64(0x7FFFFFFFFFFFFFFF)
_NOCAND = np.int64(1) << 62  # sorts after every (dataset << 16 | position)
# Relative size of the margin that covers rounding in the window bounds (generous: 2^-46).
_MARGIN = 2.0**-46
# Up to this many datasets the plain loop is as fast as anything.
_SCAN_DATASETS = 16
# Count passes spent at most per window narrowing Q down.
_BISECTIONS = 16


@intrinsic
def _float_bits(typingctx, x):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _bits_float(typingctx, x):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def _cttz(typingctx, x):
    """Trailing zero bits of a non-zero int64 (one tzcnt)."""

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(1)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.cttz.i64")
        return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 1)])

    return types.int64(types.int64), codegen


@numba.njit(cache=True, inline="always")
def _key(x):
    """An int64 that orders like the float64 x (-0.0 never occurs here). Integer max/min
    reductions vectorise; float ones do not without fastmath. The kernels write them as
    ``m = x if x > m else m``, a select that LLVM turns into vector max/min."""
    b = _float_bits(x)
    return b ^ ((b >> 63) & _LOW63)


@numba.njit(cache=True, inline="always")
def _unkey(k):
    return _bits_float(k ^ ((k >> 63) & _LOW63))


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, inline="always")
def _candidates(w, E, dt, lo0, lo1, cslot):
    """Slots that pass the window test, ascending, into ``cslot``; returns how many. Built as
    64-slot bit masks (a vectorisable loop), then their set bits."""
    nc = 0
    for base in range(0, w.shape[0], 64):
        Es = E[base : base + 64]
        ws = w[base : base + 64]
        mask = np.int64(0)
        for j in range(Es.shape[0]):
            e = Es[j]
            mask |= np.int64((e >= lo0) | (e + ws[j] * dt >= lo1)) << j
        while mask != 0:
            cslot[nc] = base + _cttz(mask)
            nc += 1
            mask &= mask - 1
    return nc


@numba.njit(cache=True, inline="always")
def _count_at_least(keys, lo):
    cnt = 0
    for g in range(keys.shape[0]):
        cnt += keys[g] >= lo
    return cnt


@numba.njit(cache=True, inline="always")
def _select(EK, need, mk, lo):
    """A key threshold with at least ``need`` keys >= it (there are more than ``need``), and
    preferably not more than 5/4 of that (fewer candidates): from the guess ``lo``, widen until
    enough, then bisect."""
    cnt = _count_at_least(EK, lo)
    top = _unkey(mk)
    gap = top - _unkey(lo)
    if not gap > 0.0:
        gap = 1.0 / EK.shape[0]
    while cnt < need:
        gap *= 2.0
        lo = _key(top - gap)
        cnt = _count_at_least(EK, lo)
    hi = mk + 1
    for _ in range(_BISECTIONS):
        mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # no overflow, whatever the signs
        if 4 * cnt <= 5 * need or mid == lo:
            break
        m = _count_at_least(EK, mid)
        if m >= need:
            lo = mid
            cnt = m
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True)
def _window_kernel(w, c, cap, k, n, off, members, rep, window, start, out_idx, out_sidx):
    """The greedy over slots (see the module docstring), evaluating per step only the candidates
    of the current window. Slot state (``c``: float64 count of member k, +inf once exhausted;
    ``k``; ``rep`` = member k) is updated in place."""
    G = w.shape[0]
    E = np.empty(G)
    EK = np.empty(G, np.int64)
    cslot = np.empty(G, np.int64)
    cw = np.empty(G + 16)
    cc = np.empty(G + 16)
    cb = np.empty(G + 16, np.int64)
    xk = np.empty(G + 16, np.int64)  # the candidates' keys at the current step
    wtop = 0.0
    for g in range(G):
        wtop = max(wtop, w[g])
    mscale = (wtop + 2.0) * _MARGIN
    total = out_idx.shape[0]
    tau = _NEG
    s = 0
    while s < total:
        steps = min(window, total - s)
        need = steps + 1
        t0 = max(float(start + s), 1.0)
        dt = max(float(start + s + steps - 1), 1.0) - t0
        margin = (t0 + dt + 1.0) * mscale
        # errors at the window start
        mk = _IMIN
        finite = 0
        for g in range(G):
            e = w[g] * t0 - c[g]
            E[g] = e
            x = _key(e)
            EK[g] = x
            mk = x if x > mk else mk
            finite += e > _NEG
        if finite <= need:
            lo0 = _NEG
            lo1 = _NEG
        else:
            # Q: the slots at or above tau, a threshold carried over from window to window
            lo = _select(EK, need, mk, _key(tau))
            tau = _unkey(lo)
            q = _IMAX
            for g in range(G):
                x = _key(E[g] + w[g] * dt) if EK[g] >= lo else _IMAX
                q = x if x < q else q
            lo0 = tau - margin
            lo1 = _unkey(q) - margin
        nc = _candidates(w, E, dt, lo0, lo1, cslot)
        for j in range(nc):
            g = cslot[j]
            cw[j] = w[g]
            cc[j] = c[g]
            cb[j] = (rep[g] << 16) | j
        # pad to whole vectors with entries that never win
        padded = (nc + 15) & ~15
        for j in range(nc, padded):
            cw[j] = 0.0
            cc[j] = np.inf
            cb[j] = _NOCAND
        ws = cw[:padded]
        cs = cc[:padded]
        bs = cb[:padded]
        xs = xk[:padded]
        for i in range(steps):
            t = max(float(start + s + i), 1.0)
            m = _IMIN
            for j in range(padded):
                x = _key(ws[j] * t - cs[j])
                xs[j] = x
                m = x if x > m else m
            r = _NOCAND
            for j in range(padded):
                x = bs[j] if xs[j] == m else _NOCAND
                r = x if x < r else r
            j = r & 0xFFFF
            g = cslot[j]
            out_idx[s + i] = r >> 16
            out_sidx[s + i] = np.int64(cs[j])
            k[g] += 1
            if k[g] == n[g]:
                k[g] = 0
                cs[j] += 1.0
                if cs[j] == cap[g]:
                    cs[j] = np.inf
            rep[g] = members[off[g] + k[g]]
            bs[j] = (rep[g] << 16) | j
        for j in range(nc):
            c[cslot[j]] = cs[j]
        s += steps


def _window_size(slots: int) -> int:
    """Steps per window. A window's setup costs O(slots) and each of its steps O(window), so
    about 1.5·sqrt(slots) balances them (measured); small blends are one window over all slots."""
    if slots <= 128:
        return 1 << 62
    return int(min(64, math.isqrt(slots) * 3 // 2))


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
        _window_kernel(*slots, _window_size(slots.w.shape[0]), start, out_idx, out_sidx)
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
