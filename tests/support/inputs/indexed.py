"""Megatron indexed datasets (.bin/.idx) made from sequence lengths alone (the .bin sparse)."""

from __future__ import annotations

import numpy as np

from megacache.formats.indexed import IndexLayout, IndexWriter


def write_lengths(prefix, lengths, dtype: str = "uint16", documents=None):
    """A dataset of these sequence lengths, zero-length ones included, its tokens ``dtype`` (uint16
    as Megatron stores a vocabulary under 65,500 tokens, int32 above), its documents starting at the
    sequence indices ``documents`` (0 to the count; by default one sequence per document). The
    .bin is sparse: the index arrays depend on lengths only."""
    lengths = np.asarray(lengths, dtype=np.int32)
    documents = np.arange(len(lengths) + 1) if documents is None else np.asarray(documents, dtype=np.int64)
    token = np.dtype(dtype)
    layout = IndexLayout(token, len(lengths), len(documents))
    IndexWriter.create(prefix + ".idx", prefix + ".bin", layout, token.itemsize * max(1, int(lengths.sum())))
    with IndexWriter.open(prefix + ".idx", prefix + ".bin", layout) as w:
        w.write_sequences(0, lengths, 0)
        w.write_documents(0, documents)


def random_lengths(rng, count):
    """Sequence lengths of several shapes: uniform, long-tailed, many empty, a few huge."""
    kind = int(rng.integers(0, 4))
    if kind == 0:
        lengths = rng.integers(1, 50, count)
    elif kind == 1:
        lengths = rng.geometric(1 / 200, count)
    elif kind == 2:
        lengths = np.where(rng.random(count) < 0.25, 0, rng.integers(0, 100, count))
    else:
        lengths = rng.integers(0, 30, count)
        lengths[rng.integers(0, count, 3)] = rng.integers(10**4, 10**5, 3)
    return lengths.astype(np.int32)
