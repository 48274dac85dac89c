"""Megatron's train/valid/test split string → split matrix → sequence ranges (docs/megatron.md §2.2).

The matrix is part of Megatron's cache key (it is serialised into the description JSON), so its
exact Python values matter: the first bookend is the *int* 0 and the rest are float cumulative
sums, e.g. ``"969,30,1"`` → ``[(0, 0.969), (0.969, 0.999), (0.999, 1.0)]``.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import MegacacheError

NUM_SPLITS = 3  # train, valid, test
_NUMBER = re.compile(r"[.0-9]+")


def parse_split(split: str) -> list[float]:
    """The normalised split weights of a split string such as ``"969, 30, 1"`` or ``"99,1"``.

    Like Megatron: every run of ``[.0-9]`` is a number (any other character separates, so no
    weight can be negative), missing weights are 0, and the weights are divided by their float64 sum.
    """
    if not isinstance(split, str):
        raise MegacacheError(f"--split must be a string such as '969,30,1', got {split!r}")
    runs = _NUMBER.findall(split)
    try:
        weights = [float(run) for run in runs]
    except ValueError:
        bad = next(run for run in runs if not _is_float(run))
        raise MegacacheError(f"--split {split!r}: {bad!r} is not a number") from None
    if len(weights) > NUM_SPLITS:
        raise MegacacheError(
            f"--split {split!r} has {len(weights)} weights; give at most {NUM_SPLITS} (train, valid, test)"
        )
    weights += [0.0] * (NUM_SPLITS - len(weights))
    # Megatron normalises with a float64 numpy sum; the digits of the result are in the cache key.
    w = np.array(weights, dtype=np.float64)
    if not w.sum() > 0:
        raise MegacacheError(f"--split {split!r}: the weights sum to 0; at least one must be positive")
    if not np.isfinite(w.sum()):
        raise MegacacheError(f"--split {split!r}: the weights are too large to add up in float64")
    return (w / w.sum()).tolist()


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def split_matrix(split: str) -> list[tuple | None]:
    """Megatron's ``split_matrix``: bookends ``(lo, hi)`` per split, ``None`` where a split is empty."""
    matrix: list[tuple | None] = []
    lo = 0  # the int 0, as in Megatron: it serialises as "0", not "0.0"
    for weight in parse_split(split):
        hi = lo + weight
        matrix.append((lo, hi) if hi > lo else None)
        lo = hi
    return matrix


def split_ranges(matrix: list[tuple | None], n_sequences: int) -> list[tuple[int, int] | None]:
    """The sequence range ``[beg, end)`` of each split of a dataset with ``n_sequences`` sequences.

    Megatron splits by *sequences* (not documents) and rounds with Python's ``round`` (half to
    even): split "1,1" of 5 sequences gives train [0, 2).
    """
    if n_sequences < 0:
        raise ValueError(f"n_sequences must be >= 0, got {n_sequences}")
    n = float(n_sequences)
    return [
        None if bookend is None else (int(round(bookend[0] * n)), int(round(bookend[1] * n)))
        for bookend in matrix
    ]
