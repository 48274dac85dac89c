"""The one check of an integer argument: a whole number (not a bool, not a float) in range, or an
error naming the argument and what it must be."""

from __future__ import annotations

import numpy as np

from ..errors import MegacacheError


def integer(name: str, value, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as an ``int`` when it is an integer in ``[minimum, maximum]``; else a
    ``MegacacheError`` such as "num_samples must be a non-negative integer, got -1"."""
    whole = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not whole or value < minimum or (maximum is not None and value > maximum):
        if maximum is not None:
            wanted = f"an integer between {minimum} and {maximum}"
        else:
            wanted = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
        raise MegacacheError(f"{name} must be {wanted}, got {value!r}")
    return int(value)
