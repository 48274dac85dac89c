"""Parallel in-place assembly of one IndexedDataset from ordered parts.

Tokenize and merge both end here. A *part* is a run of consecutive documents (a tokenized work
unit, or a chunk of an input dataset). Every rank knows every part's counts (documents, sequences,
tokens), so each part's global offsets are a prefix sum that every rank computes identically. Rank
0 preallocates the final ``.bin``/``.idx`` under temporary names, each rank writes the parts it owns
at their offsets (tokens copied inside the kernel, index slices by pwrite), every rank fsyncs, and
rank 0 renames both files into place. No rank touches another rank's part.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..comm import Comm
from ..formats.indexed import IndexLayout, IndexWriter, bin_path, idx_path
from ..fsio import copy_range, fsync_dir, remove_quietly, tmp_path
from ..coordination import guarded


@dataclass(frozen=True)
class PartCounts:
    documents: int
    sequences: int
    tokens: int


@dataclass
class Part:
    """What a part contributes: its sequences, where its documents end, and where its tokens are."""

    sequence_lengths: np.ndarray  # int32[sequences]
    document_ends: np.ndarray     # int64[documents]: exclusive end of each document, as a sequence
                                  # index relative to the part's first sequence
    token_file: str               # tokens, in the output dtype, at [token_offset, +nbytes)
    token_offset: int = 0


def assemble(comm: Comm, prefix: str, dtype: np.dtype, counts: list[PartCounts],
             mine: list[int], load: Callable[[int], Part], tag: str) -> IndexLayout:
    """Write ``prefix.bin/.idx`` from ``counts`` (every part, in output order; the same list on
    every rank) where this rank writes the parts listed in ``mine`` (loaded with ``load``)."""
    dtype = np.dtype(dtype)
    table = np.array([[c.documents, c.sequences, c.tokens] for c in counts], dtype=np.int64).reshape(-1, 3)
    starts = np.zeros_like(table)
    np.cumsum(table[:-1], axis=0, out=starts[1:])
    documents, sequences, tokens = (int(v) for v in table.sum(axis=0))
    layout = IndexLayout(dtype, sequences, documents + 1)
    final_idx, final_bin = idx_path(prefix), bin_path(prefix)
    tmp_idx, tmp_bin = tmp_path(final_idx, tag), tmp_path(final_bin, tag)

    comm.on_root(lambda: IndexWriter.create(tmp_idx, tmp_bin, layout, tokens * dtype.itemsize),
                 "preallocating the output")
    with comm.agreed(f"writing {prefix}"):
        with IndexWriter.open(tmp_idx, tmp_bin, layout) as writer:
            for p in mine:
                doc0, seq0, tok0 = (int(v) for v in starts[p])
                part = load(p)
                if len(part.sequence_lengths) != counts[p].sequences or len(part.document_ends) != counts[p].documents:
                    raise RuntimeError(f"part {p} does not match its recorded counts {counts[p]}")
                writer.write_sequences(seq0, part.sequence_lengths, tok0 * dtype.itemsize)
                writer.write_documents(doc0 + 1, part.document_ends + seq0)
                nbytes = counts[p].tokens * dtype.itemsize
                if nbytes:
                    src = os.open(part.token_file, os.O_RDONLY)
                    try:
                        copy_range(src, part.token_offset, writer.bin_fd, tok0 * dtype.itemsize, nbytes)
                    finally:
                        os.close(src)
            # Each rank makes its own writes durable (on network filesystems only the writer can).
            os.fsync(writer.idx_fd)
            os.fsync(writer.bin_fd)

    def publish() -> None:
        # Drop the old index first: a crash between the renames then leaves a .bin without an .idx
        # (refused by every reader), never a new .bin paired with a stale .idx.
        remove_quietly(final_idx)
        os.replace(tmp_bin, final_bin)
        os.replace(tmp_idx, final_idx)
        fsync_dir(final_idx)

    comm.on_root(publish, f"publishing {prefix}")
    return layout


def discard(prefix: str, tag: str) -> None:
    """Remove the temporaries an ``assemble`` with this tag may have left."""
    remove_quietly(tmp_path(idx_path(prefix), tag))
    remove_quietly(tmp_path(bin_path(prefix), tag))


def temporaries(prefix: str) -> tuple[str, ...]:
    """Name prefixes of every temporary an ``assemble`` into ``prefix`` writes, whatever its tag."""
    return tuple(os.path.basename(tmp_path(path(prefix), "")) for path in (idx_path, bin_path))


def guarded_output(comm: Comm, output_prefix: str, prefixes: list[str], what: str, work_dirs=()):
    """``coordination.guarded`` for a job writing the datasets ``prefixes`` (named from ``output_prefix``,
    in its directory) and using ``work_dirs`` there: one such job at a time, after what dead ones
    left there (temporary files, work directories being deleted) is cleared."""
    directory = os.path.dirname(os.path.abspath(output_prefix))
    key = "prefix-" + os.path.basename(output_prefix)
    names = [t for p in prefixes for t in temporaries(p)] + [os.path.basename(tmp_path(w, "")) for w in work_dirs]
    return guarded(comm, [directory], key, tuple(names), what)
