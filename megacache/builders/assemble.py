"""Parallel in-place assembly of one dataset, Megatron's ``.bin/.idx``, a ``.pbin``, a ``.ds`` or an OLMo
token file, from ordered parts.

Tokenize, merge and convert all end in this module. A *part* is a run of consecutive documents (a
tokenized work unit, or a chunk of an input dataset). Every rank knows every part's counts (documents,
sequences, tokens), so each part's global offsets are a prefix sum that every rank computes
identically. Rank 0 preallocates the output under a temporary name, each rank writes the parts it
owns at their offsets (tokens copied inside the kernel, index slices by pwrite), every rank fsyncs,
and rank 0 renames the output into place. No rank touches another rank's part.

A ``.pbin``'s index is a pickle whose frames depend on every byte before them: each rank encodes its
parts unframed, the frame cuts are found part after part in output order (one broadcast of a
position per owner, a few operations per 64 KiB of index), and then every rank writes its bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..algorithms.blocks import first_bad
from ..runtime.comm import Comm
from ..errors import MegacacheError
from ..formats import pickled_pairs
from ..formats.datatrove import DsWriter, index_path, is_ds, loss_path, metadata_path, metadata_text
from ..formats.indexed import IndexLayout, IndexWriter, bin_path, idx_path
from ..formats.olmo import OlmoWriter, is_olmo
from ..formats.pbin import TOKEN_DTYPES, PbinWriter, is_pbin
from ..runtime.fsio import (copy_range, fsync_dir, publish as publish_file, pwrite_all, remove_quietly, tmp_path,
                            write_new_file)
from ..runtime.coordination import guarded, tidy
from ..runtime.environment import upload_part_bytes
from ..runtime.object_storage import S3, MultipartUpload, delete, upload_file, write_from
from .scheduling import contiguous_shares
from .publish import record_path

#: tokens per block when a part's tokens change dtype on the way (convert)
_CONVERT_TOKENS = 1 << 22


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
    token_file: str               # tokens at [token_offset, +nbytes)
    token_offset: int = 0
    token_dtype: np.dtype | None = None  # the tokens' dtype in token_file, if not the output's

    def document_lengths(self) -> np.ndarray:
        """Tokens per document (its sequences together)."""
        ends = np.zeros(len(self.sequence_lengths) + 1, dtype=np.int64)
        np.cumsum(self.sequence_lengths, out=ends[1:])
        starts = np.zeros(len(self.document_ends) + 1, dtype=np.int64)
        starts[1:] = self.document_ends
        return np.diff(ends[starts])


def _untold(tokens: int) -> None:
    """Where no one follows an assembly's progress."""


def _write_tokens(part: Part, tokens: int, dtype: np.dtype, fd: int, offset: int, where: str) -> None:
    """Put a part's ``tokens`` tokens at byte ``offset`` of ``fd``, in ``dtype``."""
    if not tokens:
        return
    source = np.dtype(part.token_dtype or dtype)
    src = os.open(part.token_file, os.O_RDONLY)
    try:
        if source == dtype:
            copy_range(src, part.token_offset, fd, offset, tokens * dtype.itemsize)
            return
        info = np.iinfo(dtype)
        for t0 in range(0, tokens, _CONVERT_TOKENS):
            n = min(_CONVERT_TOKENS, tokens - t0)
            block = np.frombuffer(os.pread(src, n * source.itemsize, part.token_offset + t0 * source.itemsize),
                                  dtype=source)
            if len(block) != n:
                raise MegacacheError(f"{part.token_file}: ends before its index says (truncated file?)")
            bad = first_bad((block < info.min) | (block > info.max))
            if bad is not None:
                at = part.token_offset + (t0 + bad) * source.itemsize
                raise MegacacheError(f"{part.token_file}: byte {at}: token {int(block[bad])} does not fit "
                                     f"{where}'s {dtype.itemsize}-byte tokens; give a larger --vocab-size")
            pwrite_all(fd, block.astype(dtype), offset + t0 * dtype.itemsize)
    finally:
        os.close(src)


def _offsets(counts: list[PartCounts]) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Where each part starts in the output (rows of documents, sequences, tokens before it: the same
    on every rank) and the output's totals."""
    table = np.array([[c.documents, c.sequences, c.tokens] for c in counts], dtype=np.int64).reshape(-1, 3)
    starts = np.zeros_like(table)
    np.cumsum(table[:-1], axis=0, out=starts[1:])
    documents, sequences, tokens = (int(v) for v in table.sum(axis=0))
    return starts, (documents, sequences, tokens)


def _document_lengths(part: Part, count: PartCounts, p: int) -> np.ndarray:
    """A loaded part's tokens per document, which must be what its counts recorded."""
    lengths = part.document_lengths()
    if len(lengths) != count.documents or int(lengths.sum()) != count.tokens:
        raise RuntimeError(f"part {p} does not match its recorded counts {count}")
    return lengths


def assemble(comm: Comm, prefix: str, dtype: np.dtype, counts: list[PartCounts], mine: list[int],
             load: Callable[[int], Part], tag: str, written: Callable[[int], None] = _untold) -> IndexLayout:
    """Write ``prefix.bin/.idx`` from ``counts`` (every part, in output order; the same list on
    every rank) where this rank writes the parts listed in ``mine`` (loaded with ``load``), telling
    ``written`` the tokens of each once they are (progress)."""
    dtype = np.dtype(dtype)
    starts, (documents, sequences, tokens) = _offsets(counts)
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
                _write_tokens(part, counts[p].tokens, dtype, writer.bin_fd, tok0 * dtype.itemsize, prefix)
                written(counts[p].tokens)
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


def assemble_pbin(comm: Comm, path: str, token_size: int, counts: list[PartCounts], mine: list[int],
                  load: Callable[[int], Part], tag: str, written: Callable[[int], None] = _untold) -> int:
    """Write the ``.pbin`` ``path`` from ``counts`` and this rank's parts ``mine`` (as ``assemble``);
    every rank's parts must be a contiguous run, in rank order. Returns the documents written."""
    dtype = TOKEN_DTYPES[token_size]
    starts, (documents, _, tokens) = _offsets(counts)
    last = len(counts) - 1

    encoded = {}
    for p in mine:
        doc0, _, tok0 = (int(v) for v in starts[p])
        part = load(p)
        lengths = _document_lengths(part, counts[p], p)
        offsets = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        offsets += tok0
        payload, boundaries = pickled_pairs.encode(offsets * token_size, lengths * token_size, doc0, documents,
                                                   opens=p == 0, closes=p == last)
        encoded[p] = (part, payload, boundaries)
    sizes = {}
    for gathered in comm.allgather({p: len(e[1]) for p, e in encoded.items()}):
        sizes.update(gathered)
    payload_at = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum([sizes[p] for p in range(len(counts))], out=payload_at[1:])
    payload_total = int(payload_at[-1])

    # Frame cuts in output order: each rank continues from where the ranks before it left the open frame.
    frame_start, cuts = 0, []
    for owner, parts in enumerate(comm.allgather(sorted(mine))):
        if owner == comm.rank:
            for p in parts:
                found, frame_start = pickled_pairs.frame_cuts(encoded[p][2] + payload_at[p], frame_start)
                cuts.append(found)
        if parts:
            frame_start = comm.bcast(frame_start, root=owner)
    mine_cuts = np.concatenate(cuts) if cuts else np.zeros(0, dtype=np.int64)
    frames = pickled_pairs.frame_starts(np.concatenate(comm.allgather(mine_cuts)), payload_total)
    index_bytes = pickled_pairs.pickle_size(payload_total, len(frames))

    tmp = tmp_path(path, tag)
    comm.on_root(lambda: PbinWriter.create(tmp, tokens * token_size, token_size, index_bytes),
                 "preallocating the output")
    with comm.agreed(f"writing {path}"):
        with PbinWriter.open(tmp, tokens * token_size) as writer:
            for p, (part, payload, _) in encoded.items():
                start = int(payload_at[p])
                before = int(np.count_nonzero(frames < start))
                writer.write_index(pickled_pairs.output_position(start, before),
                                   pickled_pairs.assemble_frames(payload, start, frames, payload_total, before))
                _write_tokens(part, counts[p].tokens, dtype, writer.fd,
                              writer.data_offset(int(starts[p][2]) * token_size), path)
                written(counts[p].tokens)
            os.fsync(writer.fd)

    def publish() -> None:
        os.replace(tmp, path)
        fsync_dir(path)

    comm.on_root(publish, f"publishing {path}")
    return documents


def assemble_ds(comm: Comm, path: str, dtype: np.dtype, counts: list[PartCounts], mine: list[int],
                load: Callable[[int], Part], tag: str, written: Callable[[int], None] = _untold) -> int:
    """Write datatrove's ``path`` (``.ds``, ``.ds.index``, ``.ds.metadata``) from ``counts`` and this
    rank's parts ``mine`` (as ``assemble``); each document one run of tokens. Returns the documents."""
    starts, (documents, _, tokens) = _offsets(counts)
    tmp_data, tmp_index, tmp_meta = (tmp_path(p, tag) for p in (path, index_path(path), metadata_path(path)))

    def create() -> None:
        DsWriter.create(tmp_data, tmp_index, tokens * dtype.itemsize, documents)
        write_new_file(tmp_meta, [metadata_text(dtype.itemsize, tokens).encode()])

    comm.on_root(create, "preallocating the output")
    with comm.agreed(f"writing {path}"):
        with DsWriter(tmp_data, tmp_index) as writer:
            for p in mine:
                doc0, _, tok0 = (int(v) for v in starts[p])
                part = load(p)
                lengths = _document_lengths(part, counts[p], p)
                writer.write_ends(doc0, tok0 + np.cumsum(lengths))
                _write_tokens(part, counts[p].tokens, dtype, writer.data_fd, tok0 * dtype.itemsize, path)
                written(counts[p].tokens)
            writer.sync()

    def publish() -> None:
        # The old index and loss mask go first: a crash midway leaves a .ds without an index (refused
        # by every reader), never new tokens under a stale index or another file's loss mask.
        remove_quietly(index_path(path))
        remove_quietly(loss_path(path))
        os.replace(tmp_data, path)
        publish_file(tmp_meta, metadata_path(path))
        os.replace(tmp_index, index_path(path))
        fsync_dir(path)

    comm.on_root(publish, f"publishing {path}")
    return documents


def assemble_olmo(comm: Comm, path: str, dtype: np.dtype, counts: list[PartCounts], mine: list[int],
                  load: Callable[[int], Part], tag: str, written: Callable[[int], None] = _untold) -> int:
    """Write the OLMo token file ``path`` from ``counts`` and this rank's parts ``mine`` (as
    ``assemble``): the parts' tokens back to back, nothing else (each document must already end with
    the EOS: the caller checks). Returns the documents."""
    starts, (documents, _, tokens) = _offsets(counts)
    tmp = tmp_path(path, tag)
    comm.on_root(lambda: OlmoWriter.create(tmp, tokens * dtype.itemsize), "preallocating the output")
    with comm.agreed(f"writing {path}"):
        with OlmoWriter(tmp) as writer:
            for p in mine:
                part = load(p)
                if int(part.sequence_lengths.sum(dtype=np.int64)) != counts[p].tokens:
                    raise RuntimeError(f"part {p} does not match its recorded counts {counts[p]}")
                _write_tokens(part, counts[p].tokens, dtype, writer.fd, int(starts[p][2]) * dtype.itemsize, path)
                written(counts[p].tokens)
            writer.sync()

    def publish() -> None:
        os.replace(tmp, path)
        fsync_dir(path)

    comm.on_root(publish, f"publishing {path}")
    return documents


def upload_groups(sizes: list[int], target: int) -> list[list[int]]:
    """Consecutive parts grouped in order, each group but the last at least ``target`` bytes, and
    the last not empty where another group can take it (S3's rule for the parts of an upload)."""
    groups, held = [[]], 0
    for p, size in enumerate(sizes):
        groups[-1].append(p)
        held += size
        if held >= target and p < len(sizes) - 1:
            groups.append([])
            held = 0
    if len(groups) > 1 and not held:
        groups[-2].extend(groups.pop())
    return groups


def assemble_object(comm: Comm, prefix: str, dtype: np.dtype, counts: list[PartCounts],
                    tokens_at: Callable[[int], str], load: Callable[[int], Part], scratch: str,
                    written: Callable[[int], None] = _untold) -> IndexLayout:
    """Upload ``prefix.bin/.idx`` (objects) from ``counts`` and every part's tokens (the object
    ``tokens_at(p)``): the ``.bin`` one multipart upload (``s3://``) whose parts are runs of
    consecutive parts of about ``MEGACACHE_UPLOAD_PART_BYTES``, in output order, each uploaded by one
    rank through a file in its local directory ``scratch``, and completed by rank 0; one upload by
    rank 0 where a single such run holds them all (or for ``msc://``). Then rank 0 writes the
    ``.idx`` (from ``load``: every part's index, one part at a time) and uploads it, so that an
    ``.idx`` is never seen beside a ``.bin`` it does not describe: the old ``.idx`` goes first. On a
    failure the multipart upload is aborted; one a killed job left is aborted by the next."""
    dtype = np.dtype(dtype)
    starts, (documents, sequences, tokens) = _offsets(counts)
    layout = IndexLayout(dtype, sequences, documents + 1)
    final_idx, final_bin = idx_path(prefix), bin_path(prefix)
    sizes = [c.tokens * dtype.itemsize for c in counts]
    groups = upload_groups(sizes, max(upload_part_bytes(), -(-sum(sizes) // MultipartUpload.MAX_PARTS)))
    if not final_bin.startswith(S3):
        groups = [list(range(len(counts)))]
    owner = contiguous_shares([sum(sizes[p] for p in g) for g in groups], comm.size)

    def begin() -> str | None:
        delete([final_idx])
        if final_bin.startswith(S3):
            MultipartUpload.abort_unfinished(final_bin)
        return MultipartUpload.start(final_bin).upload_id if len(groups) > 1 else None

    upload_id = comm.on_root(begin, f"starting the upload of {final_bin}")
    upload = None if upload_id is None else MultipartUpload(final_bin, upload_id)
    try:
        etags = {}
        with comm.agreed(f"uploading {final_bin}"):
            for g, members in enumerate(groups):
                if owner[g] != comm.rank:
                    continue
                path = os.path.join(scratch, f"part-{g + 1}")
                try:
                    with open(path, "wb") as f:
                        for p in members:
                            write_from(tokens_at(p), sizes[p], f)
                    if upload is None:
                        upload_file(path, final_bin)
                    else:
                        etags[g] = upload.upload_part(g + 1, path)
                finally:
                    remove_quietly(path)
                written(sum(counts[p].tokens for p in members))
        for gathered in comm.allgather(etags):
            etags.update(gathered)

        def finish() -> None:
            if upload is not None:
                upload.complete([etags[g] for g in range(len(groups))])
            index = os.path.join(scratch, "index")
            IndexWriter.create(index, None, layout, 0)
            try:
                with IndexWriter.open(index, None, layout) as writer:
                    for p in range(len(counts)):
                        doc0, seq0, tok0 = (int(v) for v in starts[p])
                        part = load(p)
                        if len(part.sequence_lengths) != counts[p].sequences or \
                                len(part.document_ends) != counts[p].documents:
                            raise RuntimeError(f"part {p} does not match its recorded counts {counts[p]}")
                        writer.write_sequences(seq0, part.sequence_lengths, tok0 * dtype.itemsize)
                        writer.write_documents(doc0 + 1, part.document_ends + seq0)
                upload_file(index, final_idx)
            finally:
                remove_quietly(index)

        comm.on_root(finish, f"publishing {prefix}")
    except BaseException:
        if upload is not None and comm.rank == 0:
            try:
                upload.abort()  # after a completed upload, there is none to abort
            except MegacacheError:
                pass
        raise
    return layout


def discard(output: str, tag: str) -> None:
    """Remove the temporaries an assembly of ``output`` (a prefix, a ``.pbin``, a ``.ds`` or an OLMo
    file) with this tag may have left."""
    for path in dataset_files(output):
        remove_quietly(tmp_path(path, tag))


def dataset_files(output: str) -> tuple[str, ...]:
    """The files of the dataset ``output`` (a prefix, a ``.pbin``, a ``.ds`` or an OLMo file)."""
    if is_ds(output):
        return output, index_path(output), metadata_path(output)
    return (output,) if is_pbin(output) or is_olmo(output) else (idx_path(output), bin_path(output))


def temporaries(output: str) -> tuple[str, ...]:
    """Name prefixes of every temporary an assembly of ``output`` writes, whatever its tag."""
    return tuple(os.path.basename(tmp_path(path, "")) for path in dataset_files(output))


def _output_lock(output_prefix: str, prefixes: list[str], work_dirs) -> tuple[str, str, tuple[str, ...]]:
    """The directory, lock key and temporaries' names of a job writing the datasets ``prefixes``
    (named from ``output_prefix``, in its directory), their records, and using ``work_dirs`` there."""
    directory = os.path.dirname(os.path.abspath(output_prefix))
    key = "prefix-" + os.path.basename(output_prefix)
    others = [record_path(p) for p in prefixes] + list(work_dirs)
    names = [t for p in prefixes for t in temporaries(p)] + [os.path.basename(tmp_path(w, "")) for w in others]
    return directory, key, tuple(names)


def guarded_output(comm: Comm, output_prefix: str, prefixes: list[str], what: str, work_dirs=()):
    """``coordination.guarded`` for a job writing the datasets ``prefixes`` (named from ``output_prefix``,
    in its directory) and using ``work_dirs`` there: one such job at a time, after what dead ones
    left there (temporary files, work directories being deleted) is cleared."""
    directory, key, names = _output_lock(output_prefix, prefixes, work_dirs)
    return guarded(comm, [directory], key, names, what)


def tidy_output(output_prefix: str, prefixes: list[str], work_dirs=()) -> None:
    """``coordination.tidy`` for such a job that finds nothing to write: what dead ones left cleared."""
    directory, key, names = _output_lock(output_prefix, prefixes, work_dirs)
    tidy([directory], key, names)
