"""numpy's legacy ``RandomState`` shuffle, bit for bit: MT19937 plus the masked Fisher–Yates loop.

Megatron draws every permutation (document index, shuffle index) with
``numpy.random.RandomState(seed).shuffle``. To write those arrays without numpy (in place into a
memory map, or continuing on another rank) we need the same generator and the same bounded draws:

* MT19937 exactly as numpy implements it: legacy ``init_genrand`` seeding of a 32-bit seed, the
  624-word twist, tempering. The state is 624 key words plus a position, like
  ``RandomState.get_state()``.
* ``shuffle``: for i = n-1 … 1, ``j`` is drawn by numpy's legacy ``random_interval(i)``: mask = the
  smallest 2^k - 1 >= i, draw masked outputs until one is <= i. Draws are 32-bit while
  i <= 2^32 - 1 and 64-bit (two 32-bit outputs, the first one high) beyond, as numpy does.

What makes it faster than numpy while drawing the same numbers: the rejection sampling is
branch-free (each raw output either advances i or not). An array small enough to stay in the
caches and within the TLB's reach (``_FUSED_BYTES``) is drawn and swapped in one pass, a rejected
output swapping ``a[i]`` with itself. A larger one has its random accesses miss: since the sequence
of ``j`` does not depend on the array, it is drawn a block at a time apart from the swaps (on a
second thread, a block ahead, for the largest arrays), and while swapping the kernel prefetches the
element ``_AHEAD`` swaps ahead, so many cache misses are in flight at once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from ..errors import MegacacheError
from ..runtime.kernels import kernel, prefetch_write
from .checks import integer

_N = 624  # MT19937 state words
_M = 397
_MATRIX_A = 0x9908B0DF
_UPPER = 0x80000000
_LOWER = 0x7FFFFFFF
_U32 = 0xFFFFFFFF
# Arrays spanning at most this many bytes draw and swap in one pass (faster per element than
# drawing in blocks while the array is within the TLB's reach; beyond it the unprefetched swaps
# cost more than the blocks).
_FUSED_BYTES = 1 << 22
# Draw this many j's before swapping: big enough to keep many misses in flight, small enough for L1.
_BLOCK = 1024
# Prefetch the element this many swaps ahead: with fewer, a swap still waits on its element's miss.
_AHEAD = 64
# Arrays of at least this many elements draw on a second thread, this many j's a block.
_PIPELINE_BLOCK = 1 << 20
# The arrays builds shuffle (document indices, shuffle indices): compiled natively for these.
_SHUFFLED = ("int32[::1]", "int64[::1]", "uint32[::1]")


class MT19937:
    """A mutable MT19937 state, interchangeable with ``numpy.random.RandomState``'s.

    ``words`` is uint32[625]: the 624 key words, then the position. It is plain data: pickle it,
    broadcast it, or round-trip it through ``to_numpy``/``from_numpy`` to continue elsewhere.
    ``has_gauss``/``gauss`` are carried only so that the round trip through numpy is lossless.
    """

    __slots__ = ("words", "has_gauss", "gauss")

    def __init__(self, words: np.ndarray, has_gauss: int = 0, gauss: float = 0.0):
        words = np.asarray(words)
        if words.shape != (_N + 1,) or words.dtype != np.uint32:
            raise ValueError(f"MT19937 words must be uint32[{_N + 1}], got {words.dtype}{list(words.shape)}")
        if words[_N] > _N:
            raise MegacacheError(f"MT19937 position must be in [0, {_N}], got {int(words[_N])}")
        self.words = words
        self.has_gauss, self.gauss = int(has_gauss), float(gauss)

    @classmethod
    def from_seed(cls, seed: int) -> "MT19937":
        """The state of ``numpy.random.RandomState(seed)`` for an integer seed in [0, 2^32 - 1]."""
        seed = integer("random seed", seed, 0, _U32)
        words = np.empty(_N + 1, dtype=np.uint32)
        _init_genrand(words, seed)
        return cls(words)

    @classmethod
    def from_numpy(cls, state) -> "MT19937":
        """From ``RandomState.get_state()`` (the legacy tuple or the ``legacy=False`` dict)."""
        if isinstance(state, dict):
            if state.get("bit_generator") != "MT19937":
                raise MegacacheError(f"not an MT19937 state: {state.get('bit_generator')!r}")
            key, pos = state["state"]["key"], state["state"]["pos"]
            has_gauss, gauss = state.get("has_gauss", 0), state.get("gauss", 0.0)
        else:
            name, key, pos, has_gauss, gauss = state
            if name != "MT19937":
                raise MegacacheError(f"not an MT19937 state: {name!r}")
        key = np.asarray(key)
        if key.shape != (_N,):
            raise MegacacheError(f"MT19937 key must have {_N} words, got shape {key.shape}")
        words = np.empty(_N + 1, dtype=np.uint32)
        words[:_N] = key.astype(np.uint32)
        if not 0 <= int(pos) <= _N:
            raise MegacacheError(f"MT19937 position must be in [0, {_N}], got {pos}")
        words[_N] = pos
        return cls(words, has_gauss, gauss)

    def to_numpy(self) -> tuple:
        """The legacy ``get_state()`` tuple: ``('MT19937', key uint32[624], pos, has_gauss, gauss)``."""
        return ("MT19937", self.words[:_N].copy(), int(self.words[_N]), self.has_gauss, self.gauss)

    def to_random_state(self) -> np.random.RandomState:
        rs = np.random.RandomState()
        rs.set_state(self.to_numpy())
        return rs

    def copy(self) -> "MT19937":
        return MT19937(self.words.copy(), self.has_gauss, self.gauss)

    def __eq__(self, other) -> bool:
        if not isinstance(other, MT19937):
            return NotImplemented
        return (
            np.array_equal(self.words, other.words)
            and (self.has_gauss, self.gauss) == (other.has_gauss, other.gauss)
        )

    def __repr__(self) -> str:
        return f"MT19937(pos={int(self.words[_N])}, key[:2]={self.words[:2].tolist()})"


def shuffle(arr: np.ndarray, state: MT19937, block: int = _PIPELINE_BLOCK,
            progress: Callable[[int], None] | None = None) -> None:
    """Shuffle the 1-D ``arr`` in place exactly as ``RandomState.shuffle`` would, advancing ``state``
    exactly as far. Any element dtype; views and memory maps work (only ``arr`` is touched).
    Arrays of more than ``block`` elements draw their j's on a second thread, a block ahead.
    ``progress`` is told the elements shuffled, a block at a time (``len(arr)`` in all)."""
    if not isinstance(arr, np.ndarray) or arr.ndim != 1:
        raise ValueError(f"shuffle needs a 1-D numpy array, got {type(arr).__name__} of ndim {np.ndim(arr)}")
    if not arr.flags.writeable:
        raise ValueError("shuffle needs a writeable array")
    # np.memmap is an ndarray subclass; numba wants the plain ndarray view of the same memory.
    a = arr.view(np.ndarray)
    told = _shuffle(a, state.words, block, progress)
    if progress is not None and told < a.shape[0]:
        progress(a.shape[0] - told)


def _shuffle(a: np.ndarray, words: np.ndarray, block: int, progress: Callable[[int], None] | None) -> int:
    """``shuffle``'s work; returns the elements it told ``progress`` of on the way."""
    if a.shape[0] < 2:
        return 0
    if a.shape[0] <= block and a.shape[0] * abs(a.strides[0]) <= _FUSED_BYTES:
        _shuffle_small(a, words)
        return 0
    hi = int(_shuffle_above_u32(a, words))
    tempered = np.empty(_N, dtype=np.int64)
    _temper_all(words, tempered)
    if hi <= block:
        _shuffle_blocks(a, words, tempered, hi)
        return 0
    told = 0
    # Double-buffered: block k+1's j's are drawn (the RNG alone) while this thread swaps block k.
    buffers = (np.empty(block, dtype=np.int64), np.empty(block, dtype=np.int64))
    with ThreadPoolExecutor(1, thread_name_prefix="shuffle-draws") as drawer:
        m = min(block, hi)
        _draw_block(words, tempered, hi, m, buffers[0])
        k = 0
        while hi >= 1:
            after = hi - m
            following = min(block, after)
            drawing = (drawer.submit(_draw_block, words, tempered, after, following, buffers[1 - k])
                       if following else None)
            _swap_block(a, buffers[k], hi, m)
            if progress is not None:
                progress(m)
                told += m
            if drawing is not None:
                drawing.result()
            hi, m, k = after, following, 1 - k
    return told


def shuffle_segments(arr: np.ndarray, bounds: np.ndarray, state: MT19937) -> None:
    """Shuffle each segment ``arr[bounds[k]:bounds[k + 1]]`` in place, in turn, exactly as
    ``RandomState.shuffle`` of each would, from one ``state`` (as a loop of ``shuffle`` calls, one
    kernel call for them all). ``arr`` is int64; ``bounds`` non-decreasing, from 0 to ``len(arr)``."""
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    if not (isinstance(arr, np.ndarray) and arr.ndim == 1 and arr.dtype == np.int64 and arr.flags.c_contiguous
            and arr.flags.writeable):
        raise ValueError("shuffle_segments needs a writeable contiguous 1-D int64 array")
    sizes = np.diff(bounds)
    if bounds.size == 0 or bounds[0] != 0 or bounds[-1] != arr.shape[0] or (sizes < 0).any():
        raise ValueError(f"segment bounds must rise from 0 to {arr.shape[0]}")
    if sizes.size and sizes.max() - 1 > _U32:  # the fused loop draws 32-bit only
        raise ValueError(f"a segment of {int(sizes.max())} elements is more than shuffle_segments draws for")
    _shuffle_segments(arr, bounds, state.words)


def random_interval(state: MT19937, max_value: int) -> int:
    """One legacy bounded draw in [0, max_value] (numpy's ``random_interval``, used by shuffle)."""
    if not 0 <= max_value <= np.iinfo(np.int64).max:
        raise ValueError(f"max_value must be in [0, 2**63 - 1], got {max_value}")
    return int(_interval_kernel(state.words, np.int64(max_value)))


@kernel("uint32[::1], int64")
def _init_genrand(words, seed):
    words[0] = seed
    for k in range(1, _N):
        prev = np.int64(words[k - 1])
        words[k] = (1812433253 * (prev ^ (prev >> 30)) + k) & _U32
    words[_N] = _N


@kernel(inline=True)
def _twisted(key, k, k1, km):
    y = (np.int64(key[k]) & _UPPER) | (np.int64(key[k1]) & _LOWER)
    return np.int64(key[km]) ^ (y >> 1) ^ ((y & 1) * _MATRIX_A)


@kernel()
def _twist(key):
    # Regenerate all 624 words in place (numpy's mt19937_gen). Three loops instead of one with
    # "% 624" indices: the modulo made this many times slower.
    for k in range(_N - _M):
        key[k] = _twisted(key, k, k + 1, k + _M)
    for k in range(_N - _M, _N - 1):
        key[k] = _twisted(key, k, k + 1, k + _M - _N)
    key[_N - 1] = _twisted(key, _N - 1, 0, _M - 1)


@kernel(inline=True)
def _temper(y):
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return y


@kernel(inline=True)
def _next32(words, pos):
    """(32-bit output as int64, new position)."""
    if pos == _N:
        _twist(words)
        pos = 0
    return _temper(np.int64(words[pos])), pos + 1


@kernel(inline=True)
def _smear(x):
    """The smallest 2^k - 1 >= x (numpy's rejection mask)."""
    x |= x >> 1
    x |= x >> 2
    x |= x >> 4
    x |= x >> 8
    x |= x >> 16
    x |= x >> 32
    return x


@kernel(inline=True)
def _bounded(words, pos, max_value):
    """numpy's legacy random_interval(max_value) for max_value >= 1: (value, new position)."""
    mask = _smear(max_value)
    if max_value <= _U32:
        while True:
            y, pos = _next32(words, pos)
            value = y & mask
            if value <= max_value:
                return value, pos
    while True:
        # numpy's next_uint64 for MT19937: first output is the high word. mask < 2^63, so
        # masking the high word first keeps the shift inside int64.
        hi, pos = _next32(words, pos)
        lo, pos = _next32(words, pos)
        value = ((hi & (mask >> 32)) << 32) | lo
        if value <= max_value:
            return value, pos


@kernel("uint32[::1], int64")
def _interval_kernel(words, max_value):
    if max_value == 0:
        return np.int64(0)
    value, pos = _bounded(words, np.int64(words[_N]), max_value)
    words[_N] = pos
    return value


@kernel("uint32[::1], int64[::1]")
def _temper_all(key, out):
    for k in range(_N):
        out[k] = _temper(np.int64(key[k]))


@kernel(*(f"{a}, uint32[::1]" for a in _SHUFFLED))
def _shuffle_above_u32(a, words):
    """The swaps of i > 2^32 - 1 (64-bit draws, one at a time: rare); the i to continue from."""
    pos = np.int64(words[_N])
    hi = np.int64(a.shape[0] - 1)
    while hi > _U32:
        j, pos = _bounded(words, pos, hi)
        tmp = a[j]
        a[j] = a[hi]
        a[hi] = tmp
        hi -= 1
    words[_N] = pos
    return hi


@kernel("uint32[::1], int64[::1], int64, int64, int64[::1]")
def _draw_block(words, tempered, hi, m, js):
    """The j's of swaps i = hi, hi-1, ..., hi-m+1 (hi <= 2^32 - 1) into ``js``, advancing ``words``
    (``tempered`` holds its words tempered, and is kept so)."""
    pos = np.int64(words[_N])
    i = hi
    t = 0
    while t < m:
        if pos == _N:
            _twist(words)
            _temper_all(words, tempered)
            pos = 0
        # A run of constant mask: i goes down to (mask >> 1) + 1 at most. Within it, a value is
        # accepted iff value <= i = c - t, i.e. value + t <= c: the loop-carried count is the only
        # dependency chain, one add and one compare long.
        mask = _smear(i)
        end = t + min(m - t, i - (mask >> 1))
        c = i + t
        while pos < _N and t < end:
            value = tempered[pos] & mask
            js[t] = value
            t += np.int64(value + t <= c)
            pos += 1
        i = c - t
    words[_N] = pos


@kernel(*(f"{a}, int64[::1], int64, int64" for a in _SHUFFLED))
def _swap_block(a, js, hi, m):
    """Swap a[i] with a[js[t]] for i = hi - t, t = 0..m-1, prefetching ``_AHEAD`` swaps ahead."""
    base, stride = a.ctypes.data, a.strides[0]
    for t in range(min(_AHEAD, m)):
        prefetch_write(base + js[t] * stride)
    for t in range(m):
        if t + _AHEAD < m:
            prefetch_write(base + js[t + _AHEAD] * stride)
        i = hi - t
        j = js[t]
        tmp = a[j]
        a[j] = a[i]
        a[i] = tmp


@kernel()
def _shuffle_fused(a, words, tempered, hi):
    """Swaps i = hi … 1 (hi <= 2^32 - 1), each raw output drawn and swapped at once: an accepted
    one with a[i], a rejected one as a[i] with itself, so no branch depends on the draw."""
    pos = np.int64(words[_N])
    i = hi
    while i >= 1:
        if pos == _N:
            _twist(words)
            _temper_all(words, tempered)
            pos = 0
        mask = _smear(i)
        floor = mask >> 1  # named: the loop below compiles to faster code than with the expression
        while pos < _N and i > floor:
            value = tempered[pos] & mask
            accepted = value <= i
            j = value if accepted else i
            tmp = a[j]
            a[j] = a[i]
            a[i] = tmp
            i -= np.int64(accepted)
            pos += 1
    words[_N] = pos


@kernel(*(f"{a}, uint32[::1]" for a in _SHUFFLED))
def _shuffle_small(a, words):
    """``shuffle`` of an array within ``_FUSED_BYTES`` (hence under 2^32 elements) in one call: a
    blend shuffles thousands of such arrays, and each call from Python costs microseconds."""
    tempered = np.empty(_N, dtype=np.int64)
    _temper_all(words, tempered)
    _shuffle_fused(a, words, tempered, a.shape[0] - 1)


@kernel("int64[::1], int64[::1], uint32[::1]")
def _shuffle_segments(a, bounds, words):
    tempered = np.empty(_N, dtype=np.int64)
    _temper_all(words, tempered)
    for k in range(bounds.shape[0] - 1):
        _shuffle_fused(a[bounds[k]:bounds[k + 1]], words, tempered, bounds[k + 1] - bounds[k] - 1)


@kernel(*(f"{a}, uint32[::1], int64[::1], int64" for a in _SHUFFLED))
def _shuffle_blocks(a, words, tempered, hi):
    """Swaps i = hi … 1 on this thread: a block of j's drawn, then its swaps, in turn."""
    js = np.empty(min(hi, _BLOCK), dtype=np.int64)
    while hi >= 1:
        m = min(_BLOCK, hi)
        _draw_block(words, tempered, hi, m, js)
        _swap_block(a, js, hi, m)
        hi -= m
