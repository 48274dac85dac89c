"""``megacache merge``: concatenate datasets, in the order given, into one.

The result equals Megatron's ``IndexedDatasetBuilder.add_index`` over the same prefixes (documents
appended, boundaries shifted, pointers recomputed), but written in parallel: each input is cut into
chunks of whole documents, chunks are parts for ``assemble``, and each rank copies its chunks'
tokens straight from the input ``.bin`` into place.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..blocks import first_bad
from ..comm import Comm, get_comm
from ..errors import MegacacheError
from ..formats.indexed import IndexedDataset, bin_path, idx_path
from .assemble import Part, PartCounts, assemble, discard, guarded_output
from .scheduling import contiguous_shares

DEFAULT_CHUNK_BYTES = 256 << 20


@dataclass(frozen=True)
class Chunk:
    source: int     # index into the input prefixes
    doc_start: int
    doc_stop: int


@dataclass
class MergeResult:
    output: str
    documents: int
    sequences: int
    tokens: int
    inputs: int
    seconds: float
    ranks: int


def _plan(prefixes: list[str], chunk_bytes: int) -> tuple[np.dtype, list[Chunk], list[PartCounts]]:
    if not prefixes:
        raise MegacacheError("merge: give at least one input prefix")
    if len(set(prefixes)) != len(prefixes):
        dup = sorted({p for p in prefixes if prefixes.count(p) > 1})
        raise MegacacheError(f"merge: input prefix given more than once: {', '.join(dup)}")
    chunks: list[Chunk] = []
    counts: list[PartCounts] = []
    dtype = None
    for j, prefix in enumerate(prefixes):
        ds = IndexedDataset(prefix)
        if dtype is None:
            dtype = ds.dtype
        elif ds.dtype != dtype:
            raise MegacacheError(f"merge: {prefix} holds {ds.dtype.name} tokens but {prefixes[0]} holds "
                                 f"{dtype.name}; datasets of different token dtypes cannot be merged")
        docs = ds.num_documents
        pieces = max(1, math.ceil(ds.bin_size / chunk_bytes))
        bounds = np.unique(np.linspace(0, docs, pieces + 1).astype(np.int64))
        if len(bounds) == 1:  # a dataset with no documents still contributes nothing, as a part
            bounds = np.array([0, 0])
        di, lengths, pointers = ds.document_indices, ds.sequence_lengths, ds.sequence_pointers
        for d0, d1 in zip(bounds[:-1], bounds[1:]):
            s0, s1 = int(di[d0]), int(di[d1])
            # From the pointers at the chunk's ends: O(1) per chunk, so rank 0 never reads every
            # length of every input. The chunk's owner checks the lengths agree (load below).
            tokens = ((int(pointers[s1 - 1]) - int(pointers[s0])) // ds.dtype.itemsize + int(lengths[s1 - 1])
                      if s1 > s0 else 0)
            chunks.append(Chunk(j, int(d0), int(d1)))
            counts.append(PartCounts(int(d1 - d0), s1 - s0, tokens))
    return dtype, chunks, counts


def merge(prefixes: list[str], output_prefix: str, comm: Comm | None = None,
          chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> MergeResult:
    comm = comm or get_comm()
    t0 = time.monotonic()
    if output_prefix in prefixes:
        raise MegacacheError(f"merge: the output prefix {output_prefix} is also an input")
    dtype, chunks, counts = comm.on_root(lambda: _plan(prefixes, chunk_bytes), "planning the merge")
    owner = contiguous_shares([c.tokens for c in counts], comm.size)
    mine = [i for i in range(len(chunks)) if owner[i] == comm.rank]
    opened: dict[int, IndexedDataset] = {}

    def load(i: int) -> Part:
        c = chunks[i]
        ds = opened.setdefault(c.source, IndexedDataset(prefixes[c.source]))
        di = ds.document_indices
        bounds = np.asarray(di[c.doc_start: c.doc_stop + 1])
        bad = first_bad(np.diff(bounds) < 0)
        if bad is not None:
            d = c.doc_start + bad + 1
            raise MegacacheError(f"{idx_path(prefixes[c.source])}: document_indices[{d}] = {int(bounds[bad + 1])} is "
                                 f"below document_indices[{d - 1}] = {int(bounds[bad])}; the index is damaged, run "
                                 f"megacache verify on it")
        s0, s1 = int(bounds[0]), int(bounds[-1])
        lengths = np.asarray(ds.sequence_lengths[s0:s1])
        if int(lengths.sum(dtype=np.int64)) != counts[i].tokens:
            raise MegacacheError(f"{prefixes[c.source]}.idx: the pointers of sequences {s0}..{s1} disagree with "
                                 f"their lengths; run megacache verify on it")
        return Part(sequence_lengths=lengths,
                    document_ends=np.asarray(di[c.doc_start + 1 : c.doc_stop + 1]) - s0,
                    token_file=bin_path(prefixes[c.source]),
                    token_offset=int(ds.sequence_pointers[s0]) if s1 > s0 else 0)

    with guarded_output(comm, output_prefix, [output_prefix], f"megacache merge into {output_prefix}") as guard:
        guard.enter("writing")
        try:
            layout = assemble(comm, output_prefix, dtype, counts, mine, load, guard.job)
        finally:
            discard(output_prefix, guard.job)
    return MergeResult(output=output_prefix, documents=layout.document_count - 1,
                       sequences=layout.sequence_count, tokens=sum(c.tokens for c in counts),
                       inputs=len(prefixes), seconds=time.monotonic() - t0, ranks=comm.size)
