"""The three index arrays of Megatron's GPTDataset, bit-identical to megatron-core's (the same in 0.16 to 0.19).

See docs/megatron.md §2.4–2.8. Notation: D documents (sequences) in the split, T tokens per
epoch, E epochs, L = ``seq_length`` (a sample's tokens; the kernels' name for it), N requested
samples, x = add_extra_token_to_sequence (0/1), M = E·D the document-index length, n the number
of samples (the sample index has n + 1 rows).

* ``GPTIndexPlan``: everything that is cheap to know before building (E, separation, n, array
  lengths and dtypes), so a builder can preallocate the output files.
* Document index: the split's sequence ids tiled E times and shuffled (MT19937, one serial pass).
* Sample index, row k = (i, off): sample k starts at token ``off`` of the document at position i
  of the document index. Sample k starts at stream position k·L, so with S[i] the number of tokens
  in positions < i, row k is the *smallest* i with S[i+1] >= k·L + x and off = k·L - S[i]. Rows
  past the last token (only without drop_last) read (M-1, len(M-1) - x). So no row depends on the
  previous one: ``sample_index_rows`` computes any row range from a window of the document index
  and the tokens before it (a walk that keeps S running, no array of it), ``piece_tokens`` gives a
  window's tokens (a builder exscans the per-piece totals), and ``sample_rows_in_piece`` says
  which rows a piece of positions owns.
  ``sample_index_reference`` is Megatron's sequential walk, kept as the reference.
* Shuffle index: ``arange(n)`` shuffled (two ranges when the final epoch is separated), continuing
  the RNG after the document index.

The RNG order for one split is: document index (first E-1 epochs, then the last if separated),
then the shuffle index (first range, then the second), all from ``MT19937.from_seed(seed)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from ..errors import MegacacheError
from ..runtime.kernels import kernel, prefetch_read
from .checks import integer
from .permutation import MT19937, shuffle

INT32_MAX = int(np.iinfo(np.int32).max)
UINT32_MAX = int(np.iinfo(np.uint32).max)
# sample index rows, as Megatron's versions write them: compiled natively for these
_ROWS = ("int32[:, ::1]", "int64[:, ::1]")
# (sequence lengths, document index) as a walk gets them: read into memory (a rank's own task), or
# memory-mapped from the .idx and the shared document index (a task all ranks share)
_LENGTHS = ("int32[::1], int32[::1]", "readonly(unaligned(int32[::1])), readonly(int32[::1])")
#: Megatron separates the final epoch when it contributes fewer than int(0.80 * per_epoch) samples.
SEPARATION_THRESHOLD = 0.80
#: positions per block of the sample-index walk (its buffers stay in L1)
_WALK_BLOCK = 2048
#: the walk asks for the length of the document this many positions ahead: a dataset's lengths
#: outgrow the caches, and the document index visits them in random order
_GATHER_AHEAD = 64


class EpochPlan(NamedTuple):
    num_epochs: int
    separate_final_epoch: bool
    #: ((E-1)·T - x) // L, the samples before the final epoch; None when E == 1
    samples_sans_final_epoch: int | None


def num_epochs(
    tokens_per_epoch: int, num_samples: int | None, seq_length: int, add_extra_token: int
) -> int:
    """Megatron's epoch count: 1 if N is None, else the smallest E >= 1 with E·T >= N·L + x."""
    if num_samples is None:
        return 1
    requested = num_samples * seq_length + add_extra_token
    if tokens_per_epoch >= requested:
        return 1
    if tokens_per_epoch <= 0:
        # Megatron adds T until it reaches the request: with T = 0 it never returns (issue #957).
        raise MegacacheError(
            f"the split has no tokens, so num_samples={num_samples} can never be reached "
            f"(megatron-core would loop forever here): give this split a non-empty range in "
            f"--split, or request no samples from it (num_samples=None)"
        )
    return -(-requested // tokens_per_epoch)


def plan_epochs(
    tokens_per_epoch: int, num_samples: int | None, seq_length: int, add_extra_token: int
) -> EpochPlan:
    """E, whether the final epoch is shuffled separately, and the samples before the final epoch."""
    T, x = tokens_per_epoch, add_extra_token
    E = num_epochs(T, num_samples, seq_length, x)
    if E == 1:
        return EpochPlan(1, False, None)
    sans = ((E - 1) * T - x) // seq_length
    per_epoch = (T - x) // seq_length
    # Megatron asserts 0 <= N - sans <= per_epoch + 1; that holds for every E computed as above.
    separate = num_samples - sans < int(SEPARATION_THRESHOLD * per_epoch)
    return EpochPlan(E, separate, sans)


def sample_count(
    num_epochs: int, tokens_per_epoch: int, seq_length: int, add_extra_token: int, drop_last: bool
) -> int:
    """n, the number of samples in the sample index, computed as Megatron's C++ does.

    drop_last: ``(E·T - x) / L`` in C++ integer division, which truncates toward zero (an empty
    split gives 0, not -1). Otherwise ``ceil(float(E·T - x) / L)`` in *single* precision: above
    2^24 tokens this can be one short (T=16781314, L=4096 gives 4097, exactly 4098).
    """
    total = num_epochs * tokens_per_epoch - add_extra_token
    if drop_last:
        quotient = abs(total) // seq_length
        return quotient if total >= 0 else -quotient
    ratio = np.array([total], dtype=np.int64).astype(np.float32) / np.float32(seq_length)
    return int(np.ceil(ratio)[0])


def sample_index_dtype(document_index_length: int, longest_document: int) -> np.dtype:
    """int32 if ``max(M, the longest document of the WHOLE dataset) <= 2^31 - 1``, else int64."""
    if max(document_index_length, longest_document) <= INT32_MAX:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


def shuffle_index_dtype(num_samples: int) -> np.dtype:
    """uint32 unless n >= 2^32 - 2, then int64 (Megatron's threshold, not 2^32)."""
    return np.dtype(np.int64) if num_samples >= UINT32_MAX - 1 else np.dtype(np.uint32)


@dataclass(frozen=True)
class GPTIndexPlan:
    """Everything about one split's GPTDataset indices that is known before building them."""

    num_documents: int  # D, sequences in the split
    tokens_per_epoch: int  # T
    requested_samples: int | None  # N
    seq_length: int  # L
    add_extra_token: int  # x, 0 or 1
    drop_last: bool
    num_epochs: int  # E
    separate_final_epoch: bool
    samples_sans_final_epoch: int | None
    num_samples: int  # n = len(GPTDataset); the sample index has n + 1 rows
    sample_index_dtype: np.dtype
    shuffle_index_dtype: np.dtype

    @classmethod
    def from_counts(
        cls,
        *,
        num_documents: int,
        tokens_per_epoch: int,
        num_samples: int | None,
        seq_length: int,
        add_extra_token: bool | int,
        drop_last: bool,
        longest_document: int = 0,
    ) -> "GPTIndexPlan":
        """The plan from D, T and the longest document of the whole dataset (not the split).

        ``seq_length`` is checked where it enters (``BuildConfig``; a description's by the reader
        that reads it): a positive integer, ``seq_length + add_extra_token`` within int32. The
        other arguments are checked by this function: a reader passes values read from a description file.
        Megatron's dtype rule reads ``longest_document``, but an int32 length never exceeds
        INT32_MAX, so it never decides the dtype and 0 (unknown) gives the same plan."""
        if add_extra_token not in (0, 1):
            raise MegacacheError(f"add_extra_token must be 0 or 1, got {add_extra_token!r}")
        x = int(add_extra_token)
        D = integer("num_documents", num_documents, 0)
        T = integer("tokens_per_epoch", tokens_per_epoch, 0)
        integer("longest_document", longest_document, 0)
        N = None if num_samples is None else integer("num_samples", num_samples, 0)
        E, separate, sans = plan_epochs(T, N, seq_length, x)
        if E > INT32_MAX:
            raise MegacacheError(
                f"num_samples={N} needs {E} epochs of {T} tokens; Megatron passes the epoch count "
                f"as an int32 (at most {INT32_MAX})"
            )
        n = sample_count(E, T, seq_length, x, drop_last)
        if n < 0:
            # Only an empty split with L = 1 and x = 1 gets this far; megatron-core fails on it too.
            raise MegacacheError(
                f"the split has {T} tokens: no sample of seq_length {seq_length} (+{x}) can be built"
            )
        return cls(
            num_documents=D,
            tokens_per_epoch=T,
            requested_samples=N,
            seq_length=seq_length,
            add_extra_token=x,
            drop_last=bool(drop_last),
            num_epochs=E,
            separate_final_epoch=separate,
            samples_sans_final_epoch=sans,
            num_samples=n,
            sample_index_dtype=sample_index_dtype(E * D, longest_document),
            shuffle_index_dtype=shuffle_index_dtype(n),
        )

    @classmethod
    def for_split(
        cls,
        sequence_lengths: np.ndarray,
        split_range: tuple[int, int],
        num_samples: int | None,
        seq_length: int,
        add_extra_token: bool | int,
        drop_last: bool,
    ) -> "GPTIndexPlan":
        """The plan for sequences ``[beg, end)`` of a dataset with these (whole) sequence lengths."""
        beg, end = split_range
        if not 0 <= beg <= end <= len(sequence_lengths):
            raise ValueError(f"split range {split_range} is outside [0, {len(sequence_lengths)}]")
        if len(sequence_lengths) == 0:
            raise MegacacheError(
                "the dataset has no sequences; megatron-core cannot build a GPTDataset on it"
            )
        return cls.from_counts(
            num_documents=end - beg,
            tokens_per_epoch=int(np.sum(sequence_lengths[beg:end], dtype=np.int64)),
            longest_document=int(np.max(sequence_lengths)),
            num_samples=num_samples,
            seq_length=seq_length,
            add_extra_token=add_extra_token,
            drop_last=drop_last,
        )

    @property
    def document_index_length(self) -> int:
        """M = E·D."""
        return self.num_epochs * self.num_documents

    @property
    def sample_index_shape(self) -> tuple[int, int]:
        return (self.num_samples + 1, 2)

    @property
    def shuffle_first_range(self) -> int:
        """Size of the first shuffled range of the shuffle index: sans if separated, else n."""
        return self.samples_sans_final_epoch if self.separate_final_epoch else self.num_samples

    @property
    def shuffle_index_length(self) -> int:
        # max(): the first range could only exceed n through the float32 row count at > 2^24
        # epochs; Megatron then keeps it whole, so do we.
        return max(self.shuffle_first_range, self.num_samples)


# --------------------------------------------------------------------------------------------
# Document index


def build_document_index(
    split_range: tuple[int, int],
    num_epochs: int,
    separate_final_epoch: bool,
    state: MT19937,
    out: np.ndarray | None = None,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """The split's sequence ids ``[lo, hi)`` tiled ``num_epochs`` times (epoch-major) as int32,
    shuffled with ``state``.

    Separated: the first E-1 epochs are shuffled together, then the last epoch on its own. ``out``
    (int32, length E·D, e.g. a memory map) is filled in place instead of allocating. ``progress``
    is told the positions shuffled, a block at a time.
    """
    lo, hi = (int(v) for v in split_range)
    if not 0 <= lo <= hi <= INT32_MAX + 1:
        raise ValueError(f"split range {split_range} is not a range of int32 sequence ids")
    length = num_epochs * (hi - lo)
    if out is None:
        out = np.empty(length, dtype=np.int32)
    elif out.dtype != np.int32 or out.shape != (length,):
        raise ValueError(f"out must be int32[{length}], got {out.dtype}{list(out.shape)}")
    _tile_range(out.view(np.ndarray), lo, hi)
    if separate_final_epoch and num_epochs > 1:
        first = length - (hi - lo)
        shuffle(out[:first], state, progress=progress)
        shuffle(out[first:], state, progress=progress)
    else:
        shuffle(out, state, progress=progress)
    return out


@kernel("int32[::1], int64, int64", "uint32[::1], int64, int64", "int64[::1], int64, int64")
def _tile_range(out, lo, hi):
    # One pass, no temporary: numpy's arange is several times slower than a store loop once
    # its result no longer fits in cache.
    D = hi - lo
    if D == 0:
        return
    for e in range(out.shape[0] // D):
        base = e * D
        for i in range(D):
            out[base + i] = lo + i


# --------------------------------------------------------------------------------------------
# Sequence length statistics

#: odd 64-bit multiplier (2**64 / golden ratio) spreading sequence positions over all 64 bits
_POSITION_MIX = np.uint64(0x9E3779B97F4A7C15)


def length_stats(lengths: np.ndarray, first: int) -> tuple[int, int, int]:
    """``(tokens, longest, checksum)`` of ``lengths``, the sequences from position ``first`` on.

    The checksum, sum of ``length * (position * MIX + 1)`` modulo 2**64, adds over disjoint
    pieces, so each rank computes it over its own; it changes when any length changes or two move, which is
    what a cache built from these lengths depends on (megacache's drift check)."""
    tokens, longest, checksum = _length_stats(np.asarray(lengths), np.uint64(first))
    return int(tokens), int(longest), int(checksum)


def length_stats_reference(lengths: np.ndarray, first: int) -> tuple[int, int, int]:
    lengths = np.asarray(lengths)
    if len(lengths) == 0:
        return 0, 0, 0
    positions = np.arange(first, first + len(lengths), dtype=np.uint64)
    with np.errstate(over="ignore"):
        weights = positions * _POSITION_MIX + np.uint64(1)
        checksum = int(np.sum(lengths.astype(np.uint64) * weights, dtype=np.uint64))
    return int(lengths.sum(dtype=np.int64)), int(lengths.max()), checksum


@kernel("int32[::1], uint64")
def _length_stats(lengths, first):
    tokens = 0
    longest = 0
    checksum = np.uint64(0)
    position = first
    for k in range(lengths.shape[0]):
        v = lengths[k]
        tokens += v
        longest = max(longest, v)
        checksum += np.uint64(v) * (position * _POSITION_MIX + np.uint64(1))
        position += np.uint64(1)
    return tokens, longest, checksum


# --------------------------------------------------------------------------------------------
# Sample index


def piece_tokens(sizes: np.ndarray, document_index: np.ndarray, first: int = 0) -> int:
    """The tokens of the documents in a piece of the document index; ``sizes`` holds the
    lengths of sequences ``first…`` (a split's own, say)."""
    return int(_piece_tokens(np.asarray(sizes), np.asarray(document_index), np.int64(first)))


@kernel(*(f"{lengths}, int64" for lengths in _LENGTHS))
def _piece_tokens(sizes, document_index, first):
    total = 0
    for p in range(document_index.shape[0]):
        total += sizes[document_index[p] - first]
    return total


def sample_rows_in_piece(
    plan: GPTIndexPlan, first_position: int, stop_position: int, start: int, end: int
) -> tuple[int, int]:
    """The rows ``[k0, k1)`` that document-index positions ``[p0, p1)`` own, given ``start = S[p0]``
    and ``end = S[p1]``. A row is owned by the position it records (row 0 by position 0, the rows
    past the last token by M-1), so pieces that partition ``[0, M)`` partition the rows, and each
    piece computes its rows with ``sample_index_rows`` from its own window and ``piece_tokens``."""
    if stop_position == plan.document_index_length:
        return _first_row_at(plan, first_position, start), plan.num_samples + 1
    return _first_row_at(plan, first_position, start), _first_row_at(plan, stop_position, end)


def _first_row_at(plan: GPTIndexPlan, position: int, tokens_before: int) -> int:
    """The first row recorded at a document-index position >= ``position``."""
    if position == 0:
        return 0
    if position >= plan.document_index_length:
        return plan.num_samples + 1
    # Row k >= 1 is at the first position whose tokens reach its target k·L + x.
    return min(plan.num_samples + 1, max(1, (tokens_before - plan.add_extra_token) // plan.seq_length + 1))


def sample_index_rows(
    plan: GPTIndexPlan,
    sizes: np.ndarray,
    document_index: np.ndarray,
    start: int,
    first_position: int,
    k0: int,
    k1: int,
    first: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Rows ``[k0, k1)`` of the sample index, from a window of the document index.

    ``document_index`` = positions ``[first_position, first_position + len)``, ``start`` = the tokens
    before ``first_position``, ``sizes`` the lengths of sequences ``first…``. The window must hold
    every row's document. Work: one walk from the window's start over the positions up to the last
    row's (no prefix-sum array). Any row partition gives the serial result.
    """
    seq_length, x, M = plan.seq_length, plan.add_extra_token, plan.document_index_length
    if not 0 <= k0 <= k1 <= plan.num_samples + 1:
        raise ValueError(f"rows [{k0}, {k1}) are outside [0, {plan.num_samples + 1})")
    document_index = np.asarray(document_index)
    window_stop = first_position + len(document_index)
    if out is None:
        out = np.empty((k1 - k0, 2), dtype=plan.sample_index_dtype)
    elif out.shape != (k1 - k0, 2) or out.dtype != plan.sample_index_dtype:
        raise ValueError(
            f"out must be {plan.sample_index_dtype}[{k1 - k0}, 2], got {out.dtype}{list(out.shape)}"
        )
    if k0 == 0 and k1 > 0:
        out[0] = 0  # row 0 is (0, 0), whatever the documents
    first_k = max(k0, 1)
    if first_k >= k1:
        return out
    if first_position > 0 and first_k * seq_length + x <= start:
        raise ValueError(f"row {first_k} starts before the window at position {first_position}")
    rows = out[first_k - k0 :]
    found = _rows_from_lengths(np.asarray(sizes), document_index, np.int64(first), np.int64(start),
                               np.int64(first_position), first_k, seq_length, x, rows.view(np.ndarray))
    if found < len(rows):
        # Past the window: only legal past the last token, where Megatron records (M-1, len - x).
        if window_stop != M or len(document_index) == 0:
            raise ValueError(
                f"row {first_k + found} lies beyond the window ending at position {window_stop} of {M}"
            )
        last_length = int(sizes[document_index[-1] - first])
        rows[found:, 0] = M - 1
        rows[found:, 1] = last_length - x
        _check_int32_offsets(plan, last_length - x)
    return out


@kernel(*(f"{lengths}, int64, int64, int64, int64, int64, int64, {r}" for lengths in _LENGTHS for r in _ROWS))
def _rows_from_lengths(sizes, document_index, first, start, first_position, first_k, L, x, rows):
    # Row k >= 1 is at the first position whose running token count reaches its target k·L + x.
    # A comparison per position would mispredict at every row; instead, per block of positions:
    # their lengths (gathered with prefetches ahead, so that reads from an array larger than the
    # caches overlap instead of each waiting on memory), running counts, the last row each reaches
    # (vectorised), the positions that reach a new one (compacted without branches), and only their
    # rows.
    # The last row, (count - x) // L, from a float64 estimate (off by at most one for counts below
    # 2^53) corrected with integers: vectorised where an integer division is not. Returns the rows
    # found inside the window.
    R = rows.shape[0]
    n = document_index.shape[0]
    base = sizes.ctypes.data - first * 4  # the address of sequence 0's length (int32)
    size = np.empty(_WALK_BLOCK, np.int64)
    reach = np.empty(_WALK_BLOCK, np.int64)
    last = np.empty(_WALK_BLOCK, np.int64)
    owner = np.empty(_WALK_BLOCK, np.int64)
    per_token = 1.0 / float(L)
    total = start
    reached = (start - x) // L  # the last row reached before the position at hand
    stop = first_k + R - 1
    for p in range(0, n, _WALK_BLOCK):
        m = min(_WALK_BLOCK, n - p)
        for j in range(m):
            prefetch_read(base + np.int64(document_index[min(p + j + _GATHER_AHEAD, n - 1)]) * 4)
            size[j] = sizes[document_index[p + j] - first]
        for j in range(m):
            total += size[j]
            reach[j] = total
        for j in range(m):
            v = reach[j] - x
            q = np.int64(float(v) * per_token)
            r = v - q * L
            q = q - 1 if r < 0 else q
            last[j] = q + 1 if r >= L else q
        owners = 0
        previous = reached
        for j in range(m):
            owner[owners] = j
            owners += last[j] != previous
            previous = last[j]
        for i in range(owners):
            j = owner[i]
            k0 = max(first_k, (last[j - 1] if j else reached) + 1)
            before = reach[j] - size[j]
            for k in range(k0, min(last[j], stop) + 1):
                rows[k - first_k, 0] = first_position + p + j
                rows[k - first_k, 1] = k * L - before
        reached = last[m - 1]
        if reached >= stop:
            return R
    return max(0, reached - first_k + 1)


def _check_int32_offsets(plan: GPTIndexPlan, offset: int) -> None:
    # An empty last document with x = 1 records offset -1. megatron-core's int32 path asserts
    # that offsets are >= 0 and the build fails; its int64 path keeps the -1.
    if offset < 0 and plan.sample_index_dtype == np.int32:
        raise MegacacheError(
            "the last document of the shuffled document index is empty, so the last partial "
            "sample would start at offset -1; megatron-core fails on this (AssertionError in "
            "build_sample_idx). Drop empty sequences from the dataset or keep drop_last on"
        )


def build_sample_index(
    sizes: np.ndarray, document_index: np.ndarray, plan: GPTIndexPlan, first: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The whole sample index (the piece form over one piece); ``sizes`` holds the lengths of
    sequences ``first…``; ``out``, if given, is filled instead of a new array."""
    return sample_index_rows(plan, sizes, document_index, 0, 0, 0, plan.num_samples + 1, first, out=out)


def sample_index_reference(sizes: np.ndarray, document_index: np.ndarray, plan: GPTIndexPlan) -> np.ndarray:
    """Megatron's sequential walk (helpers.cpp ``build_sample_idx``), step by step."""
    out = np.empty(plan.sample_index_shape, dtype=plan.sample_index_dtype)
    _walk(np.asarray(sizes), np.asarray(document_index), plan.seq_length, plan.add_extra_token, out)
    if plan.num_samples:
        _check_int32_offsets(plan, int(out[-1, 1]))
    return out


@kernel(*(f"int32[::1], int32[::1], int64, int64, {r}" for r in _ROWS))
def _walk(sizes, document_index, L, x, out):
    i = 0
    offset = 0
    out[0, 0] = 0
    out[0, 1] = 0
    last = document_index.shape[0] - 1
    for k in range(1, out.shape[0]):
        need = L + x
        while need != 0:
            length = np.int64(sizes[document_index[i]]) - offset
            need -= length
            if need <= 0:
                offset += need + length - x
                need = 0
            elif i == last:
                # Out of documents: only the last, partial sample (no drop_last) ends this way.
                offset = np.int64(sizes[document_index[last]]) - x
                break
            else:
                i += 1
                offset = 0
        out[k, 0] = i
        out[k, 1] = offset


# --------------------------------------------------------------------------------------------
# Shuffle index


def build_shuffle_index(
    num_samples: int,
    first_range: int,
    dtype: np.dtype,
    state: MT19937,
    out: np.ndarray | None = None,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """``arange(first_range)`` shuffled, then ``arange(first_range, num_samples)`` shuffled.

    ``first_range`` is the plan's ``shuffle_first_range`` (sans if separated, else n). ``progress``
    is told the elements shuffled, a block at a time.
    """
    length = max(first_range, num_samples)
    if out is None:
        out = np.empty(length, dtype=dtype)
    elif out.shape != (length,) or out.dtype != dtype:
        raise ValueError(f"out must be {np.dtype(dtype)}[{length}], got {out.dtype}{list(out.shape)}")
    _tile_range(out.view(np.ndarray), 0, length)
    shuffle(out[:first_range], state, progress=progress)
    shuffle(out[first_range:], state, progress=progress)
    return out


def build_gpt_indices(
    sequence_lengths: np.ndarray, split_range: tuple[int, int], plan: GPTIndexPlan, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All three arrays of one split in one process, as megatron-core's GPTDataset builds them."""
    state = MT19937.from_seed(seed)
    document_index = build_document_index(split_range, plan.num_epochs, plan.separate_final_epoch, state)
    sample_index = build_sample_index(sequence_lengths, document_index, plan)
    shuffle_index = build_shuffle_index(
        plan.num_samples, plan.shuffle_first_range, plan.shuffle_index_dtype, state
    )
    return document_index, sample_index, shuffle_index
