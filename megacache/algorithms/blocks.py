"""Bounded-memory passes over arrays of any size (memory maps of datasets and caches), a block of
``BLOCK`` elements at a time."""

from __future__ import annotations

import numpy as np

BLOCK = 1 << 22  # elements per vectorized step


def first_bad(mask: np.ndarray) -> int | None:
    """Index of the first True in ``mask``, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None
