"""How long a Megatron blend is and how many samples each dataset builds for it (megatron-core's
``BlendedMegatronDatasetBuilder`` and ``BlendedDataset`` sizing; docs/megatron.md §4): ``normalize``,
``size_per_split_per_dataset``, ``blend_split_sizes``, ``unweighted_blend_size``; and
``find_oversampling``, Megatron's check that no dataset gives more samples than it has."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..errors import MegacacheError
from .checks import integer

#: dataset ids are written as int16; BlendedDataset asserts fewer than 32767 datasets
MAX_DATASETS = 32766
#: BlendedMegatronDatasetConfig.mid_level_dataset_surplus
DEFAULT_SURPLUS = 0.005


def normalize(weights: Sequence[float]) -> np.ndarray:
    """Megatron's ``normalize``: float64 weights divided by their ``numpy.sum``.

    The builder normalizes the blend weights once for the sizes and BlendedDataset normalizes
    them again before blending, so the kernel weights of a weighted blend are
    ``normalize(normalize(w))``, which can differ from ``normalize(w)`` in the last bit.
    """
    w = np.array(weights, dtype=np.float64)
    return w / np.sum(w)


def size_per_split_per_dataset(
    normalized_weights: Sequence[float], target_sizes: Sequence[int], surplus: float = 0.0
) -> np.ndarray:
    """``_get_size_per_split_per_dataset``: int64[datasets, splits] of
    ``ceil(ceil(size·w) · (1 + surplus))``.

    Python computes ``int·float`` and ``int(ceil)·float`` in float64 exactly as numpy does
    (``ceil`` of a float64 is an integer-valued float64, so going through int changes nothing).
    """
    w = np.asarray(normalized_weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise MegacacheError(f"blend weights must be a non-empty list of numbers, got {normalized_weights!r}")
    if not np.isclose(np.sum(w), 1.0):
        raise MegacacheError(
            f"blend weights must be normalized (sum to 1), they sum to {np.sum(w)!r}: use normalize()"
        )
    sizes = []
    for i, size in enumerate(target_sizes):
        if size is None:
            raise MegacacheError(
                f"split {i} has weights but no size: a weighted blend needs a sample count for every split"
            )
        sizes.append(integer(f"split {i} size", size))
    target = np.ceil(np.array(sizes, dtype=np.float64)[None, :] * w[:, None])
    return np.ceil(target * (1.0 + surplus)).astype(np.int64)


class BlendSizes(NamedTuple):
    #: int64[datasets, splits]: num_samples each dataset's split is built with (target + surplus)
    per_dataset: np.ndarray
    #: int64[splits]: the BlendedDataset size of each split, the sum of ceil(size·w)
    blend: np.ndarray


def blend_split_sizes(
    normalized_weights: Sequence[float], target_sizes: Sequence[int], surplus: float = DEFAULT_SURPLUS
) -> BlendSizes:
    """The builder's sizes for a weighted blend: each dataset is built with
    ``ceil(ceil(size·w)·(1+surplus))`` samples and the blend has ``sum(ceil(size·w))``, which can
    exceed the requested size (10 samples over three equal weights give 12)."""
    target = size_per_split_per_dataset(normalized_weights, target_sizes)
    buffer = size_per_split_per_dataset(normalized_weights, target_sizes, surplus)
    return BlendSizes(buffer, target.sum(axis=0))


def unweighted_blend_size(size: int | None, lengths: Sequence[int]) -> int | None:
    """A blend without weights: every dataset is built for one epoch and blended by its length,
    ``min(size, sum(lengths))`` samples, or exhaustively (None) when the split has no size."""
    return None if size is None else min(int(size), int(np.sum(lengths, dtype=np.int64)))


class Oversample(NamedTuple):
    dataset: int  # index in the blend
    requested: int  # samples the blend takes from it
    available: int  # its length

    @property
    def excess(self) -> int:
        return self.requested - self.available


def find_oversampling(counts: Sequence[int], lengths: Sequence[int]) -> list[Oversample]:
    """The datasets a blend asks for more samples than they have, by ascending index (megatron
    raises IndexError for the first). ``counts`` are samples per dataset
    (``np.bincount(dataset_index, minlength=D)`` or a chunk's end counts)."""
    counts = np.asarray(counts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if counts.shape != lengths.shape or counts.ndim != 1:
        raise ValueError(f"counts {counts.shape} and lengths {lengths.shape} must be 1-D and of equal length")
    over = np.flatnonzero(counts > lengths)
    return [Oversample(int(d), int(counts[d]), int(lengths[d])) for d in over]
