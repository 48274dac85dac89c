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
    weights = _read_weights(split)
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


def _read_weights(split: str) -> list[float]:
    """The weights megatron-core reads in a split string, before it pads and normalises them: every
    run of ``[.0-9]``, whatever is around it."""
    if not isinstance(split, str):
        raise MegacacheError(f"--split must be a string such as '969,30,1', got {split!r}")
    runs = _NUMBER.findall(split)
    try:
        return [float(run) for run in runs]
    except ValueError:
        bad = next(run for run in runs if not _is_float(run))
        raise MegacacheError(f"--split {split!r}: {bad!r} is not a number") from None


#: what megatron-core drops that belongs to how a number is written: a letter (an exponent, nan,
#: inf, a typo), a sign, an underscore, a digit other than 0-9
_PART_OF_A_NUMBER = re.compile(r"[^\W0-9]|[+-]")
#: a place left empty before a weight: a list separator first, or two with no number between
#: (megatron-core then reads the weights after it one place early); none at the end shifts any
_EMPTY_PLACE = re.compile(r"(?:^|[,;/])[^0-9.]*[,;/](?=.*[0-9])")
#: as documented: weights separated by commas (Megatron-LM's default is '969, 30, 1')
_WEIGHT = r"\s*(?:[0-9]+\.?[0-9]*|\.[0-9]+)\s*"
_DOCUMENTED = re.compile(rf"{_WEIGHT}(?:,{_WEIGHT})*")


def check_split_string(split: str) -> str | None:
    """The warning to print for a split string that megatron-core reads otherwise than it is written,
    or as written though not as documented (``'99/1/0'``); None for a plain one. A string it cannot
    use at all (more than three weights, or weights that sum to 0) is refused, saying how it reads it.

    megatron-core keeps each run of digits and dots and drops the rest without a word: it reads
    ``'-1,50,51'`` as 1, 50, 51 and ``'a1,b'`` as 1, 0, 0. The cache is named after the string as
    given and training reads it the same way, so megacache builds what Megatron reads, and says so."""
    raw = _read_weights(split)  # a run that is no number: megatron-core fails on it too
    padded = raw + [0.0] * (NUM_SPLITS - len(raw))
    dropped = dict.fromkeys(_PART_OF_A_NUMBER.findall(split))
    if dropped or _EMPTY_PLACE.search(split):
        unusable = len(raw) > NUM_SPLITS or not sum(padded) > 0
        if len(raw) > NUM_SPLITS:
            read = f"{len(raw)} weights, {_weights_text(raw)}, which it refuses (at most {NUM_SPLITS})"
        else:
            read = f"{_weights_text(padded)} (train, valid, test)"
            if not sum(padded) > 0:
                read += ", weights that sum to 0, which it cannot normalise"
        why = (f"ignoring {', '.join(map(repr, dropped))}" if dropped else
               "an empty place being no weight, not 0")
        said = (f"--split {split!r}: megatron-core reads only the runs of digits and dots in a split, so it "
                f"{'would read' if unusable else 'reads'} this as {read}, {why}.")
        if unusable:
            raise MegacacheError(f"{said} Give megacache and training alike 1 to {NUM_SPLITS} non-negative numbers "
                                 f"separated by commas, such as '969,30,1'")
        return (f"{said} The caches are built for that, as training will read it; if you meant otherwise, give "
                f"megacache and training alike numbers separated by commas, such as '969,30,1'")
    parse_split(split)  # at most three, not all 0: else its own error
    if _DOCUMENTED.fullmatch(split):
        return None
    return (f"--split {split!r}: megatron-core reads the numbers only, whatever is around them: "
            f"{_weights_text(padded)} (train, valid, test); the cache name hashes "
            f"the string as given, so give training this same --split")


def _weights_text(weights: list[float]) -> str:
    """``[1.0, 50.0, 0.5]`` as ``1, 50, 0.5``."""
    return ", ".join(repr(w).removesuffix(".0") for w in weights)


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
