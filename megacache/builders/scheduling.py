"""Who does what: deterministic assignments of work to ranks (the same on every rank)."""

from __future__ import annotations

import heapq

import numpy as np


def contiguous_shares(sizes, ranks: int) -> np.ndarray:
    """Owner rank of each item when ordered items are cut into ``ranks`` contiguous runs of about
    equal total size (each item goes to the rank whose share holds its midpoint)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    if len(sizes) == 0:
        return np.zeros(0, dtype=np.int64)
    total = sizes.sum()
    if total <= 0:
        return (np.arange(len(sizes)) * ranks // len(sizes)).astype(np.int64)
    mid = np.cumsum(sizes) - sizes / 2
    return np.minimum((mid * ranks / total).astype(np.int64), ranks - 1)


def largest_first(costs, ranks: int) -> list[int]:
    """Owner rank of each job: jobs in decreasing cost, each to the least-loaded rank (ties to the
    lower rank), so one huge job never waits behind many small ones."""
    owners = [0] * len(costs)
    loads = [(0.0, r) for r in range(ranks)]
    for job in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        load, rank = heapq.heappop(loads)
        owners[job] = rank
        heapq.heappush(loads, (load + costs[job], rank))
    return owners


def largest_first_groups(costs, groups, ranks: int) -> list[int]:
    """``largest_first`` over groups of jobs: the jobs that share a group key go to one rank
    together, the groups in decreasing total cost."""
    members: dict = {}
    for job, key in enumerate(groups):
        members.setdefault(key, []).append(job)
    owners = [0] * len(costs)
    lists = list(members.values())
    for jobs, rank in zip(lists, largest_first([sum(costs[j] for j in jobs) for jobs in lists], ranks)):
        for job in jobs:
            owners[job] = rank
    return owners


def even_slice(length: int, rank: int, ranks: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share of ``range(length)``."""
    return rank * length // ranks, (rank + 1) * length // ranks


def even_pieces(lengths, rank: int, ranks: int) -> list[tuple[int, int, int]]:
    """Rank ``rank``'s share of items laid end to end and cut evenly (``even_slice`` of their total):
    ``(item, lo, hi)`` for each item it holds part of, ``0 <= lo < hi <= length``, in item order."""
    starts = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).tolist()
    g0, g1 = even_slice(starts[-1], rank, ranks)
    pieces = []
    for i in range(max(int(np.searchsorted(starts, g0, side="right")) - 1, 0), len(starts) - 1):
        if starts[i] >= g1:
            break
        lo, hi = max(g0, starts[i]) - starts[i], min(g1, starts[i + 1]) - starts[i]
        if lo < hi:
            pieces.append((i, lo, hi))
    return pieces
