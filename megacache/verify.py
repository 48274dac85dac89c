"""``megacache verify``: full consistency checks of a dataset (``.bin/.idx``).

Megatron's reader checks little beyond the header (megatron-compat.md §1.5); a truncated ``.bin``
or shuffled boundaries load fine and train on garbage. This walks the whole index in bounded
chunks (vectorized) and reports the first bad element of each check by file and position.
"""

from __future__ import annotations

import os

import numpy as np

from .errors import FormatError
from .formats.indexed import IndexedDataset, bin_path, idx_path

CHUNK = 1 << 22  # elements per vectorized step: bounded memory for any dataset size


def _first_bad(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def verify_dataset(prefix: str, vocab_size: int | None = None, check_tokens: bool = True) -> list[str]:
    """Every problem found (empty when the dataset is sound). Each names the file and the element."""
    try:
        ds = IndexedDataset(prefix)
    except FormatError as exc:
        return [str(exc)]
    problems: list[str] = []
    lay, idxf, binf = ds.layout, idx_path(prefix), bin_path(prefix)
    S, item = lay.sequence_count, lay.dtype.itemsize
    extra = os.path.getsize(idxf) - lay.idx_size
    if extra:
        problems.append(f"{idxf}: {extra} unexpected trailing bytes after the document indices")

    docs = ds.document_indices
    if docs[0] != 0:
        problems.append(f"{idxf}: document_indices[0] is {int(docs[0])}, expected 0")
    if docs[-1] != S:
        problems.append(f"{idxf}: document_indices[-1] is {int(docs[-1])}, expected the sequence count {S}")
    for a in range(0, len(docs) - 1, CHUNK):
        chunk = np.asarray(docs[a : a + CHUNK + 1])
        bad = _first_bad(np.diff(chunk) < 0)
        if bad is not None:
            k = a + bad
            problems.append(f"{idxf}: document_indices not monotone at entry {k + 1}: "
                            f"{int(docs[k])} then {int(docs[k + 1])}")
            break

    expected = 0  # byte offset where the next sequence must start
    for a in range(0, S, CHUNK):
        lengths = np.asarray(ds.sequence_lengths[a : a + CHUNK], dtype=np.int64)
        pointers = np.asarray(ds.sequence_pointers[a : a + CHUNK])
        bad = _first_bad(lengths < 0)
        if bad is not None:
            problems.append(f"{idxf}: sequence {a + bad} has negative length {int(lengths[bad])}")
            break
        want = expected + np.concatenate(([0], np.cumsum(lengths[:-1] * item)))
        bad = _first_bad(pointers != want)
        if bad is not None:
            problems.append(f"{idxf}: pointer of sequence {a + bad} is {int(pointers[bad])}, but the lengths "
                            f"before it put it at byte {int(want[bad])}")
            break
        expected = int(want[-1] + lengths[-1] * item)
    else:
        if ds.bin_size != expected:
            what = "truncated" if ds.bin_size < expected else "longer than its index says"
            problems.append(f"{binf}: {ds.bin_size} bytes, but the index covers {expected}: the file is {what}")

    if check_tokens and vocab_size is not None and not problems:
        tokens = ds._bin
        for a in range(0, len(tokens), CHUNK):
            chunk = np.asarray(tokens[a : a + CHUNK])
            bad = _first_bad((chunk < 0) | (chunk >= vocab_size))
            if bad is not None:
                problems.append(f"{binf}: token {a + bad} has id {int(chunk[bad])}, outside the vocabulary "
                                f"of size {vocab_size}")
                break
    return problems


def summarize_dataset(prefix: str) -> str:
    ds = IndexedDataset(prefix)
    tokens = int(ds.bin_size // ds.dtype.itemsize)
    return (f"{prefix}: {ds.num_documents:,} documents, {len(ds):,} sequences, {tokens:,} tokens "
            f"({ds.dtype.name})")
