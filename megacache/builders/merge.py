"""``megacache merge`` and ``megacache convert``: datasets copied, in the order given, into one.

A dataset is a Megatron prefix (``.bin/.idx``), a Modalities ``.pbin`` (a path ending in ``.pbin``),
a datatrove ``.ds`` (a path ending in ``.ds``, beside its ``.ds.index``) or an OLMo token file (a
path ending in ``.npy``, without numpy's header; convert only). Merge concatenates
datasets of one format into that format: for Megatron prefixes the result equals Megatron's
``IndexedDatasetBuilder.add_index`` over them (documents appended, boundaries shifted, pointers
recomputed); for ``.pbin`` files the offsets of each file are shifted by the data before it
(docs/modalities.md §4), for ``.ds`` files the document ends. Convert writes one dataset in another
format (docs/datatrove.md §2 and docs/olmo.md §2 for what maps to what).

Both run in parallel the same way: each input is cut into chunks of whole documents, chunks are
parts for ``assemble``, and each rank copies its chunks' tokens from the input into place (inside
the kernel when the token size stays, a block at a time when it changes). A ``.pbin`` or ``.ds``
input's index is read by one rank per file, a window at a time, to plan its chunks (an OLMo file's
tokens are scanned for the EOS a block at a time instead); each chunk's owner then reads its window
again (a ``.pbin``'s decoded from the nearest decoder checkpoint, an OLMo file's scanned again).
Memory per rank follows its chunks and windows.
"""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..algorithms.blocks import BLOCK, first_bad
from ..runtime import object_storage
from ..runtime.comm import Comm, SingleComm, get_comm
from ..errors import MegacacheError
from ..formats.datatrove import TOKEN_DTYPES as DS_DTYPES, DsFile, loss_path
from ..formats.datatrove import token_size as ds_token_size
from ..formats.indexed import IndexedDataset, bin_path, idx_path, optimal_dtype
from ..formats.olmo import TOKEN_DTYPES as OLMO_DTYPES, OlmoFile, check_eos, dtype_for_vocab, given_eos, given_width
from ..formats.paths import DIRECTORY, format_of, named
from ..formats.pbin import (CHECKPOINT_ITEMS, HEADER_SIZE, TOKEN_DTYPES, PackedFile, expected_offsets, merge_bug_hint,
                            token_size)
from ..runtime.progress import Progress
from .assemble import Part, PartCounts, assemble, assemble_ds, assemble_olmo, assemble_pbin, discard, guarded_output
from .scheduling import contiguous_shares

DEFAULT_CHUNK_BYTES = 256 << 20

#: a Megatron token dtype -> the .pbin token size that holds it, when no --vocab-size says otherwise
_PBIN_SIZE_OF = {np.dtype(np.uint8): 1, np.dtype(np.uint16): 2, np.dtype(np.int32): 4}
#: a token width -> the .ds dtype, when no --vocab-size says otherwise (a .ds holds 2 or 4 bytes)
_DS_DTYPE_OF = {1: DS_DTYPES[2], 2: DS_DTYPES[2], 4: DS_DTYPES[4]}
#: the same for an OLMo token file
_OLMO_DTYPE_OF = {1: OLMO_DTYPES["uint16"], 2: OLMO_DTYPES["uint16"], 4: OLMO_DTYPES["uint32"]}
_NAMES = {"megatron": "Megatron prefix", "pbin": ".pbin file", "ds": ".ds file", "olmo": "OLMo token file"}
_SUFFIXES = {"pbin": ".pbin", "ds": ".ds", "olmo": ".npy"}
#: the token dtypes each output format holds (merge's --dtype)
_DTYPES_OF = {"megatron": [np.dtype(t) for t in ("uint8", "int8", "uint16", "int16", "int32", "int64")],
              "pbin": list(TOKEN_DTYPES.values()), "ds": list(DS_DTYPES.values()), "olmo": list(OLMO_DTYPES.values())}
#: a .pbin token size -> the Megatron dtype, when no --vocab-size says otherwise (Megatron's rule
#: gives uint16 to every vocabulary a 1- or 2-byte .pbin can hold, except 65500..65536)
_MEGATRON_DTYPE_OF = {1: np.dtype(np.uint16), 2: np.dtype(np.uint16), 4: np.dtype(np.int32)}


@dataclass(frozen=True)
class Chunk:
    source: int     # index into the inputs
    doc_start: int
    doc_stop: int
    token_start: int = 0  # where doc_start begins, in tokens (an OLMo file's chunk: no index says)


@dataclass(repr=False)
class MergeResult:
    output: str
    documents: int
    sequences: int
    tokens: int
    inputs: int
    seconds: float
    ranks: int
    joined: int  # documents of several sequences that became one (a .pbin or .ds has no sentence boundaries)
    loss_masks: int = 0  # inputs with a .ds.loss (never carried: no output format holds one)
    loss_masks_dropped: bool = False  # some masked tokens were written without their mask (--drop-loss-mask)
    unterminated: int = 0  # OLMo inputs whose last document has no EOS (kept as a document all the same)
    outputs: list[str] = field(default_factory=list)  # the datasets written: ``output``, or its --max-size parts

    def __repr__(self) -> str:
        written = self.output if len(self.outputs) <= 1 else f"{len(self.outputs)} datasets {self.outputs[0]} ..."
        return (f"MergeResult({self.inputs} dataset(s) -> {written}: {self.documents:,} documents, "
                f"{self.tokens:,} tokens, in {self.seconds:.1f} s on {self.ranks} rank(s))")


def _check_inputs(inputs: list[str], outputs: list[str], verb: str) -> None:
    if not inputs:
        raise MegacacheError(f"{verb}: give at least one input")
    if len(set(inputs)) != len(inputs):
        seen: set = set()
        dup = sorted({p for p in inputs if p in seen or seen.add(p)})
        raise MegacacheError(f"{verb}: input given more than once: {', '.join(dup)}")
    given = set(inputs)
    both = next((o for o in outputs if o in given), None)
    if both is not None:
        raise MegacacheError(f"{verb}: the output {both} is also an input")


def _plan_megatron_file(prefix: str, source: int, chunk_bytes: int) -> tuple[np.dtype, list[Chunk], list[PartCounts]]:
    """One Megatron dataset's chunks of whole documents, each of at most ``chunk_bytes`` of tokens (or one
    document that alone holds more), found by binary searches in its memory-mapped index: the planner
    never reads every length. The chunk's owner checks the lengths agree with the pointers (load below)."""
    ds = IndexedDataset(prefix)
    di, lengths, pointers = ds.document_indices, ds.sequence_lengths, ds.sequence_pointers
    docs, sequences = ds.num_documents, len(lengths)
    size = ds.dtype.itemsize
    end = int(pointers[-1]) + int(lengths[-1]) * size if sequences else 0

    def at(s: int) -> int:  # the byte where sequence s starts (the end of the data for s == sequences)
        return int(pointers[s]) if s < sequences else end

    chunks, counts = [], []
    d0 = 0
    while d0 < docs or not chunks:  # a dataset with no documents still contributes nothing, as a part
        s0 = int(di[d0])
        limit = at(s0) + chunk_bytes
        if end <= limit:
            d1 = docs
        else:
            # the documents whose sequences all start at or before the limit, the last of them
            # ending where the next one starts
            d1 = max(d0 + 1, int(np.searchsorted(di, np.searchsorted(pointers, limit, side="right"))) - 1)
            d1 = min(d1, docs)
        s1 = int(di[d1])
        chunks.append(Chunk(source, d0, d1))
        counts.append(PartCounts(d1 - d0, s1 - s0, (at(s1) - at(s0)) // size))
        d0 = d1
    return ds.dtype, chunks, counts


class _Opened:
    """The input whose chunks are being loaded, opened once for its consecutive chunks and let go at
    the next input's: a rank loads its chunks in input order, and tens of thousands of inputs kept
    open would use up the process's memory maps."""

    def __init__(self, open_input):
        self.open_input, self.source, self.value = open_input, None, None

    def __call__(self, source: int, path: str):
        if source != self.source:
            self.value = None
            self.value, self.source = self.open_input(path), source
        return self.value


def _load_megatron(prefixes: list[str], opened: _Opened, chunk: Chunk, count: PartCounts) -> Part:
    c = chunk
    ds = opened(c.source, prefixes[c.source])
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
    if int(lengths.sum(dtype=np.int64)) != count.tokens:
        raise MegacacheError(f"{prefixes[c.source]}.idx: the pointers of sequences {s0}..{s1} disagree with "
                             f"their lengths; run megacache verify on it")
    return Part(sequence_lengths=lengths, document_ends=np.asarray(di[c.doc_start + 1 : c.doc_stop + 1]) - s0,
                token_file=bin_path(prefixes[c.source]),
                token_offset=int(ds.sequence_pointers[s0]) if s1 > s0 else 0, token_dtype=ds.dtype)


def _contiguous(f: PackedFile, offsets: np.ndarray, lengths: np.ndarray, first: int, start: int) -> None:
    """A .pbin's documents must follow each other without gaps to be copied as one run."""
    expected = expected_offsets(lengths, start)
    bad = first_bad(offsets != expected)
    if bad is not None:
        hint = merge_bug_hint(int(expected[bad] - offsets[bad]) * f.token_size)
        raise MegacacheError(f"{f.path}: document {first + bad} starts at token {int(offsets[bad])}, not where the "
                             f"one before it ends ({int(expected[bad])}){hint}")


def _plan_pbin_file(path: str, source: int, chunk_bytes: int) -> tuple[np.dtype, list[Chunk], list[PartCounts]]:
    """One file's chunks of about ``chunk_bytes`` of data, its index read a window at a time."""
    f = PackedFile(path)
    per_chunk = max(1, chunk_bytes // f.token_size)
    chunks, counts = [], []
    start = docs = sequences = tokens = expected = 0
    for first, offsets, lengths in f.windows(CHECKPOINT_ITEMS):
        _contiguous(f, offsets, lengths, first, expected)
        expected = int(offsets[-1] + lengths[-1])
        at = 0
        while at < len(lengths):  # one pass per chunk closed in this window
            filled = tokens + np.cumsum(lengths[at:])
            close = int(np.searchsorted(filled, per_chunk))  # the document that fills the chunk
            take = min(close + 1, len(lengths) - at)
            docs += take
            sequences += int(np.count_nonzero(lengths[at : at + take]))
            tokens = int(filled[take - 1])
            at += take
            if tokens >= per_chunk:
                chunks.append(Chunk(source, start, start + docs))
                counts.append(PartCounts(docs, sequences, tokens))
                start, docs, sequences, tokens = start + docs, 0, 0, 0
    if docs or not chunks:  # the rest; a file of no documents is one empty part
        chunks.append(Chunk(source, start, start + docs))
        counts.append(PartCounts(docs, sequences, tokens))
    return f.dtype, chunks, counts


def _plan_files(comm: Comm, paths: list[str], plan_file, what: str
                ) -> tuple[list[np.dtype], list[Chunk], list[PartCounts]]:
    """Every file's token dtype and chunks, planned by one rank per file with ``plan_file(path, source)``:
    tens of thousands of inputs are opened once each, by P ranks at a time."""
    with comm.agreed(f"reading the {what}"):
        mine = {j: plan_file(paths[j], j) for j in range(comm.rank, len(paths), comm.size)}
    planned: dict = {}
    for from_rank in comm.allgather(mine):
        planned.update(from_rank)
    order = range(len(paths))
    return ([planned[j][0] for j in order], [c for j in order for c in planned[j][1]],
            [c for j in order for c in planned[j][2]])


def _plan_ds_file(path: str, source: int, chunk_bytes: int) -> tuple[np.dtype, list[Chunk], list[PartCounts]]:
    """One datatrove file's chunks of about ``chunk_bytes`` of tokens, its ends checked a block at a time."""
    f = DsFile(path)
    n, all_ends = f.document_count, f.document_ends
    per_chunk = max(1, chunk_bytes // f.token_size)
    # A chunk closes with the document that reaches the next multiple of per_chunk tokens. Cut on
    # ends not yet checked: the pass below refuses the file if they are out of order.
    targets = np.arange(1, f.token_count // per_chunk + 1, dtype=np.uint64) * np.uint64(per_chunk)
    bounds = np.unique(np.concatenate(([0], np.minimum(np.searchsorted(all_ends, targets) + 1, n), [n])))
    nonempty_before = np.zeros(len(bounds), dtype=np.int64)  # non-empty documents before each bound
    running = 0
    for a in range(0, n, BLOCK):
        b = min(n, a + BLOCK)
        lengths = np.diff(f.ends(a, b))
        if int(lengths.max()) > np.iinfo(np.int32).max:
            d = a + int(np.argmax(lengths))
            raise MegacacheError(f"{path}: document {d} holds {int(lengths.max()):,} tokens, more than a Megatron "
                                 "sequence's length (int32) holds")
        filled = running + np.cumsum(lengths > 0)
        inside = (bounds > a) & (bounds <= b)
        nonempty_before[inside] = filled[bounds[inside] - a - 1]
        running = int(filled[-1])
    at = np.zeros(len(bounds), dtype=np.int64)  # the token where each bound falls
    at[bounds > 0] = all_ends[bounds[bounds > 0] - 1].astype(np.int64)
    chunks = [Chunk(source, int(d0), int(d1)) for d0, d1 in zip(bounds[:-1], bounds[1:])]
    counts = [PartCounts(int(bounds[k + 1] - bounds[k]), int(nonempty_before[k + 1] - nonempty_before[k]),
                         int(at[k + 1] - at[k])) for k in range(len(chunks))]
    return f.dtype, chunks or [Chunk(source, 0, 0)], counts or [PartCounts(0, 0, 0)]


def _load_ds(paths: list[str], opened: _Opened, chunk: Chunk, count: PartCounts, drop_loss_mask: bool) -> Part:
    f = opened(chunk.source, paths[chunk.source])
    ends = f.ends(chunk.doc_start, chunk.doc_stop)
    if int(ends[-1] - ends[0]) != count.tokens:
        raise MegacacheError(f"{f.path}: documents {chunk.doc_start}..{chunk.doc_stop} changed since the "
                             "copy was planned")
    if f.loss is not None and not drop_loss_mask:
        masked = first_bad(np.asarray(f.loss[ends[0] : ends[-1]]) == 0)
        if masked is not None:
            token = int(ends[0]) + masked
            d = chunk.doc_start + int(np.searchsorted(ends[1:], token, side="right"))
            raise MegacacheError(f"{f.loss_file}: token {token} (document {d}) is masked from the loss; megacache "
                                 "writes no loss mask (Megatron's and Modalities' formats have none), so the output "
                                 "would train on it. Pass --drop-loss-mask to write the tokens without their mask")
    lengths = np.diff(ends)
    nonempty = lengths > 0
    return Part(sequence_lengths=lengths[nonempty].astype(np.int32), document_ends=np.cumsum(nonempty, dtype=np.int64),
                token_file=f.path, token_offset=int(ends[0]) * f.token_size, token_dtype=f.dtype)


def _plan_olmo_file(path: str, source: int, chunk_bytes: int, dtype: np.dtype, eos_id: int
                    ) -> tuple[np.dtype, list[Chunk], list[PartCounts]]:
    """One OLMo file's chunks of whole documents, each closed by the first EOS at or past about
    ``chunk_bytes`` of tokens, found by scanning the file a block at a time for the EOS."""
    f = OlmoFile(path, dtype, eos_id)
    per_chunk = max(1, chunk_bytes // f.dtype.itemsize)
    chunks, counts = [], []
    start_doc = start_tok = pending = 0  # the open chunk: its first document and token, documents in it
    for ends in f.document_ends(0, f.token_count):
        at = 0
        while True:  # one pass per chunk closed in this block
            k = at + int(np.searchsorted(ends[at:], start_tok + per_chunk))
            if k == len(ends):
                break
            docs = pending + k - at + 1
            chunks.append(Chunk(source, start_doc, start_doc + docs, start_tok))
            counts.append(PartCounts(docs, docs, int(ends[k]) - start_tok))
            start_doc, start_tok, pending, at = start_doc + docs, int(ends[k]), 0, k + 1
        pending += len(ends) - at
    pending += not f.terminated  # the ids after the last EOS: one more document
    if pending:
        chunks.append(Chunk(source, start_doc, start_doc + pending, start_tok))
        counts.append(PartCounts(pending, pending, f.token_count - start_tok))
    return f.dtype, chunks, counts


def _load_olmo(paths: list[str], opened: _Opened, chunk: Chunk, count: PartCounts, tails: list[int]) -> Part:
    """A chunk of an OLMo file, its EOS found again; ``tails[0]`` counts the chunks that end with
    ids after the file's last EOS."""
    f = opened(chunk.source, paths[chunk.source])
    stop = chunk.token_start + count.tokens
    ends = np.concatenate([[chunk.token_start], *f.document_ends(chunk.token_start, stop)], dtype=np.int64)
    if ends[-1] != stop:  # the file's last document, without EOS
        ends = np.append(ends, stop)
        tails[0] += 1
    if len(ends) - 1 != count.documents:
        raise MegacacheError(f"{f.path}: tokens {chunk.token_start}..{stop} changed since the copy was planned")
    lengths = np.diff(ends)
    if int(lengths.max()) > np.iinfo(np.int32).max:
        d = chunk.doc_start + int(np.argmax(lengths))
        raise MegacacheError(f"{f.path}: document {d} holds {int(lengths.max()):,} tokens, more than a Megatron "
                             "sequence's length (int32) holds")
    return Part(sequence_lengths=lengths.astype(np.int32), document_ends=np.arange(1, len(lengths) + 1),
                token_file=f.path, token_offset=chunk.token_start * f.dtype.itemsize, token_dtype=f.dtype)


def _check_terminated(part: Part, eos_id: int, source: str, doc_start: int) -> None:
    """Each of a part's documents must end with the EOS to become an OLMo document: OLMo finds
    documents by it alone, and megacache adds no token."""
    lengths = part.document_lengths()
    ends = np.cumsum(lengths)
    found = np.full(len(lengths), -1, dtype=np.int64)  # an empty document ends with no id
    full = lengths > 0
    if full.any():  # one id read per document
        tokens = np.memmap(part.token_file, dtype=np.dtype(part.token_dtype), mode="r", offset=part.token_offset,
                           shape=(int(ends[-1]),))
        found[full] = tokens[ends[full] - 1]
    bad = first_bad(found != eos_id)
    if bad is not None:
        what = "is empty" if lengths[bad] == 0 else f"ends with token {int(found[bad])}"
        raise MegacacheError(f"{source}: document {doc_start + bad} {what}, not with --eos-id {eos_id}; an OLMo "
                             "file's documents are found by their EOS alone, so every document must end with it "
                             "(tokenize with --append-eod, or check --eos-id)")


def _load_pbin(paths: list[str], opened: _Opened, chunk: Chunk, count: PartCounts) -> Part:
    f = opened(chunk.source, paths[chunk.source])
    offsets, lengths = f.document_window(chunk.doc_start, chunk.doc_stop - chunk.doc_start)
    start = int(offsets[0]) if len(offsets) else 0
    _contiguous(f, offsets, lengths, chunk.doc_start, start)
    if int(lengths.sum()) != count.tokens:
        raise MegacacheError(f"{paths[chunk.source]}: documents {chunk.doc_start}..{chunk.doc_stop} changed since "
                             "the merge was planned")
    nonempty = lengths > 0
    return Part(sequence_lengths=lengths[nonempty].astype(np.int32), document_ends=np.cumsum(nonempty, dtype=np.int64),
                token_file=paths[chunk.source], token_offset=HEADER_SIZE + start * f.token_size, token_dtype=f.dtype)


def _output_dtype(kind: str, source_kind: str, sources: list[str], dtypes: list[np.dtype], vocab_size: int | None,
                  chosen: np.dtype | None, verb: str) -> np.dtype:
    """The output's token dtype: ``chosen`` (merge's --dtype), else by its format's rule from
    ``vocab_size``, else from the sources' one width (sources of several widths need one of the two)."""
    if chosen is not None:
        allowed = _DTYPES_OF[kind]
        if chosen not in allowed:
            raise MegacacheError(f"{verb}: --dtype {chosen.name}: a {_NAMES[kind]} holds tokens of "
                                 f"{', '.join(d.name for d in allowed)}")
        return chosen
    if vocab_size is not None:
        if kind == "pbin":
            return TOKEN_DTYPES[token_size(vocab_size)]
        if kind == "olmo":
            return dtype_for_vocab(vocab_size)
        return DS_DTYPES[ds_token_size(vocab_size)] if kind == "ds" else optimal_dtype(vocab_size)
    other = next((j for j, d in enumerate(dtypes) if d != dtypes[0]), None)
    if other is not None:
        flag = "--dtype" if verb == "merge" else "--vocab-size"
        raise MegacacheError(f"{verb}: {sources[other]} holds {dtypes[other].name} tokens but {sources[0]} holds "
                             f"{dtypes[0].name}; give {flag} to write every token in one width (each id is checked "
                             "to fit it)")
    source_dtype = dtypes[0]
    if kind == source_kind:
        return source_dtype
    width = _PBIN_SIZE_OF.get(source_dtype) if source_kind == "megatron" else source_dtype.itemsize
    if width is None:
        raise MegacacheError(f"{verb}: {sources[0]} holds {source_dtype.name} tokens, which a {_NAMES[kind]} does "
                             "not hold as they are; give --vocab-size to choose the token size")
    by_width = {"megatron": _MEGATRON_DTYPE_OF, "pbin": TOKEN_DTYPES, "ds": _DS_DTYPE_OF, "olmo": _OLMO_DTYPE_OF}
    return by_width[kind][width]


def part_name(output: str, k: int, n: int) -> str:
    """The name of part ``k`` of ``n`` of a ``--max-size`` output: ``OUT-00003-of-00012`` (a prefix),
    ``OUT-00003-of-00012.pbin`` / ``.ds`` / ``.npy``: names that sort in the parts' order."""
    stem, suffix = (output[: -len(s)], s) if (s := _SUFFIXES.get(format_of(output))) else (output, "")
    return f"{stem}-{k:05d}-of-{n:05d}{suffix}"


def _groups(input_tokens: list[int], itemsize: int, max_size: int | None) -> list[tuple[int, int]]:
    """Consecutive inputs ``[a, b)`` per output: all of them, or as many whole inputs as fit in
    ``max_size`` bytes of tokens (an input larger than that alone)."""
    if max_size is None:
        return [(0, len(input_tokens))]
    groups, start, filled = [], 0, 0
    for j, tokens in enumerate(input_tokens):
        size = tokens * itemsize
        if j > start and filled + size > max_size:
            groups.append((start, j))
            start, filled = j, 0
        filled += size
    return groups + [(start, len(input_tokens))]


def _copy(inputs: list[str], output: str, comm: Comm, chunk_bytes: int, verb: str, *, vocab_size: int | None = None,
          dtype: np.dtype | None = None, max_size: int | None = None, drop_loss_mask: bool = False,
          eos_id: int | None = None, olmo_input_dtype: np.dtype | None = None,
          progress_interval_s: float | None = None) -> MergeResult:
    t0 = time.monotonic()
    in_kind, out_kind = format_of(inputs[0]), format_of(output)
    planner = {"pbin": lambda p, j: _plan_pbin_file(p, j, chunk_bytes),
               "ds": lambda p, j: _plan_ds_file(p, j, chunk_bytes),
               "olmo": lambda p, j: _plan_olmo_file(p, j, chunk_bytes, olmo_input_dtype, eos_id),
               "megatron": lambda p, j: _plan_megatron_file(p, j, chunk_bytes)}[in_kind]
    what = "OLMo token files' documents" if in_kind == "olmo" else f"{_NAMES[in_kind]} indices"
    dtypes, chunks, counts = _plan_files(comm, inputs, planner, what)
    dtype = _output_dtype(out_kind, in_kind, inputs, dtypes, vocab_size, dtype, verb)
    if out_kind == "olmo":
        check_eos(eos_id, dtype, output)

    input_tokens = [0] * len(inputs)
    for c, n in zip(chunks, counts):
        input_tokens[c.source] += n.tokens
    groups = _groups(input_tokens, dtype.itemsize, max_size)
    outputs = [output] if max_size is None else [part_name(output, k, len(groups)) for k in range(len(groups))]
    _check_inputs(inputs, outputs, verb)
    first_chunk = np.searchsorted([c.source for c in chunks], [a for a, _ in groups] + [len(inputs)])
    opened = _Opened({"pbin": PackedFile, "ds": DsFile, "megatron": IndexedDataset,
                      "olmo": lambda p: OlmoFile(p, olmo_input_dtype, eos_id)}[in_kind])
    joined, unterminated = [0], [0]

    def read(i: int) -> Part:
        if in_kind == "pbin":
            return _load_pbin(inputs, opened, chunks[i], counts[i])
        if in_kind == "ds":
            return _load_ds(inputs, opened, chunks[i], counts[i], drop_loss_mask)
        if in_kind == "olmo":
            return _load_olmo(inputs, opened, chunks[i], counts[i], unterminated)
        part = _load_megatron(inputs, opened, chunks[i], counts[i])
        joined[0] += int(np.count_nonzero(np.diff(part.document_ends, prepend=0) > 1))
        return part

    def load(i: int) -> Part:
        part = read(i)
        if out_kind == "olmo":
            _check_terminated(part, eos_id, inputs[chunks[i].source], chunks[i].doc_start)
        return part

    documents = sequences = 0
    with (guarded_output(comm, output, outputs, f"megacache {verb} into {output}") as guard,
          Progress(comm, guard.directory, verb, progress_interval_s) as progress):
        guard.enter("writing")
        progress.phase("writing", sum(c.tokens for c in counts), "tokens")
        written = progress.counter("writing")
        for out, c0, c1 in zip(outputs, first_chunk[:-1].tolist(), first_chunk[1:].tolist()):
            # parts are numbered within their output
            owner = contiguous_shares([c.tokens for c in counts[c0:c1]], comm.size)
            mine = [i for i in range(c1 - c0) if owner[i] == comm.rank]

            def group(i: int, c0: int = c0) -> Part:
                return load(c0 + i)

            try:
                if out_kind == "pbin":
                    n = assemble_pbin(comm, out, dtype.itemsize, counts[c0:c1], mine, group, guard.job, written)
                    documents, sequences = documents + n, sequences + n
                elif out_kind == "ds":
                    n = assemble_ds(comm, out, dtype, counts[c0:c1], mine, group, guard.job, written)
                    documents, sequences = documents + n, sequences + n
                elif out_kind == "olmo":
                    n = assemble_olmo(comm, out, dtype, counts[c0:c1], mine, group, guard.job, written)
                    documents, sequences = documents + n, sequences + n
                else:
                    layout = assemble(comm, out, dtype, counts[c0:c1], mine, group, guard.job, written)
                    documents += layout.document_count - 1
                    sequences += layout.sequence_count
            finally:
                discard(out, guard.job)
    # one rank asks the filesystem about every input, not each rank
    losses = (comm.on_root(lambda: [p for p in inputs if os.path.exists(loss_path(p))], "finding loss masks")
              if in_kind == "ds" else [])
    return MergeResult(output=output, documents=documents, sequences=sequences, tokens=sum(c.tokens for c in counts),
                       inputs=len(inputs), seconds=time.monotonic() - t0, ranks=comm.size,
                       joined=comm.allreduce(joined[0]) if out_kind != "megatron" else 0,
                       loss_masks=len(losses), loss_masks_dropped=drop_loss_mask and bool(losses), outputs=outputs,
                       unterminated=comm.allreduce(unterminated[0]) if in_kind == "olmo" else 0)


#: the files beside a .ds that a glob may also match
_COMPANIONS = (".ds.index", ".ds.loss", ".ds.metadata")


def _folder(path: str) -> list[str]:
    """The datasets in a folder, in name order: its ``.ds`` files, its ``.pbin`` files, its OLMo
    token files (``.npy``) or its Megatron prefixes (``.idx``), the one kind it holds. datatrove
    names a job's files by zero-padded task number, so name order is its task order."""
    names = sorted(os.listdir(path))
    found = {kind: [os.path.join(path, n) for n in names if n.endswith(suffix)]
             for kind, suffix in (("ds", ".ds"), ("pbin", ".pbin"), ("olmo", ".npy"), ("megatron", ".idx"))}
    found["megatron"] = [idx[:-4] for idx in found["megatron"]]
    kinds = [kind for kind, files in found.items() if files]
    if len(kinds) != 1:
        what = "no" if not kinds else "several kinds of"
        raise MegacacheError(f"{path}: a folder of {what} datasets (.ds files, .pbin files, OLMo .npy files, "
                             "Megatron .idx/.bin prefixes); give a folder of one kind, or the datasets one by one")
    return found[kinds[0]]


def _matches(pattern: str) -> list[str]:
    """The datasets a glob pattern names, in name order: a Megatron prefix once for its ``.bin`` and
    ``.idx``, a ``.ds`` without its companion files."""
    out: dict[str, None] = {}
    # A pattern may name files, folders or Megatron prefixes (which no file is named)
    for path in sorted(glob.glob(pattern) + glob.glob(pattern + ".idx")):
        if path.endswith(_COMPANIONS):
            continue
        found = named(path)
        if found.kind == DIRECTORY:
            out.update(dict.fromkeys(_folder(path)))
        else:
            out[found.path] = None
    if not out:
        raise MegacacheError(f"{pattern}: the pattern matches no dataset")
    return list(out)


def expand_inputs(paths: list[str], input_list: str | None = None) -> list[str]:
    """The datasets named by ``paths`` then by the lines of ``input_list`` (blank lines and lines
    starting with # skipped), in that order: a folder (one that is not also a Megatron prefix)
    stands for the datasets in it and a glob pattern (``*``, ``?``, ``[``; quoted, so that no shell
    limit on arguments applies) for those it matches, each in name order."""
    given = list(paths)
    if input_list is not None:
        try:
            with open(input_list, encoding="utf-8") as f:
                given += [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
        except OSError as exc:
            raise MegacacheError(f"--input-list {input_list}: cannot read it: {exc.strerror}") from None
    out = []
    # Inputs are only read while a job runs: judging a path before opening it is safe, and one
    # that vanishes after is reported when it is planned.
    for path in given:
        if object_storage.is_object_storage(path):
            raise MegacacheError(f"{object_storage.shown(path)}: merge and convert read datasets from local or shared "
                                 "paths only; copy it from the bucket first (aws s3 cp, or msc's own copy)")
        if named(path).kind == DIRECTORY:
            out += _folder(path)
        elif glob.has_magic(path) and not os.path.exists(path) and not os.path.exists(idx_path(path)):
            out += _matches(path)
        else:
            out.append(path)
    return out


def merge(inputs: list[str], output: str, comm: Comm | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
          drop_loss_mask: bool = False, input_list: str | None = None, dtype: str | None = None,
          max_size: int | None = None, progress_interval_s: float | None = None) -> MergeResult:
    """Concatenate datasets of one format (Megatron prefixes, ``.pbin`` or ``.ds`` files; folders and
    glob patterns as ``expand_inputs`` reads them) into ``output``, or into parts of at most
    ``max_size`` bytes of tokens (``part_name``; whole inputs each). Inputs of several token widths
    need ``dtype``, the output's (every id checked to fit). ``progress_interval_s``: seconds between
    progress lines on stderr (``runtime.progress``; None: its default, 0: none)."""
    comm = comm or get_comm()
    inputs = comm.on_root(lambda: expand_inputs(inputs, input_list), "listing the inputs")
    _check_inputs(inputs, [output], "merge")
    kinds = {format_of(p) for p in inputs + [output]}
    if "olmo" in kinds:
        raise MegacacheError("merge: OLMo token files are not merged (OLMo-core takes a list of them; `cat` joins "
                             "them); megacache convert turns them into another format")
    if len(kinds) > 1:
        raise MegacacheError("merge: the inputs and the output must all be .pbin files, all .ds files or all "
                             "Megatron prefixes; megacache convert changes the format")
    return _copy(inputs, output, comm, chunk_bytes, "merge", dtype=None if dtype is None else np.dtype(dtype),
                 max_size=max_size, drop_loss_mask=drop_loss_mask, progress_interval_s=progress_interval_s)


def convert(sources: str | list[str], output: str, comm: Comm | None = None, vocab_size: int | None = None,
            chunk_bytes: int = DEFAULT_CHUNK_BYTES, drop_loss_mask: bool = False, input_list: str | None = None,
            max_size: int | None = None, eos_id: int | None = None, dtype: str | None = None,
            per_file: bool = False, progress_interval_s: float | None = None) -> MergeResult:
    """Datasets of one format (folders and glob patterns as ``expand_inputs`` reads them), in order,
    as one dataset in another format: a Megatron prefix, a ``.pbin`` (Modalities), a ``.ds``
    (datatrove) or an OLMo token file (``.npy``); or as parts of at most ``max_size`` bytes of
    tokens, as ``merge``; or, ``per_file``, each as its own dataset named by ``output``, a pattern
    whose ``*`` stands for the input's name (``per_file_names``). ``vocab_size`` picks the output's
    token size by the output format's rule; without it the sources' tokens decide. A ``.ds.loss``
    mask is not carried: a mask that masks a token is refused unless ``drop_loss_mask``. OLMo token
    files (docs/olmo.md), as input or output, need ``eos_id``; ``dtype`` (uint16 or uint32) is their
    width, else ``vocab_size`` gives it by OLMo's rule; an OLMo input needs one of them, an OLMo
    output takes the sources' width without. ``progress_interval_s`` as ``merge``'s."""
    comm = comm or get_comm()
    given = [sources] if isinstance(sources, str) else list(sources)
    inputs = comm.on_root(lambda: expand_inputs(given, input_list), "listing the inputs")
    if ("*" in output) != per_file:
        raise MegacacheError(f"convert: --per-file takes an output pattern whose * stands for each input's name "
                             f"(such as out/*.pbin), and only it does; {output!r} "
                             + ("has no *" if per_file else "has one"))
    options = dict(vocab_size=vocab_size, chunk_bytes=chunk_bytes, drop_loss_mask=drop_loss_mask, max_size=max_size,
                   eos_id=eos_id, dtype=dtype)
    if not per_file:
        return _convert(inputs, output, comm, **options, progress_interval_s=progress_interval_s)
    t0 = time.monotonic()
    outputs = per_file_names(inputs, output)
    _check_inputs(inputs, outputs, "convert")
    # Files are independent: each rank converts its share alone, and the ranks agree at the end.
    # The job's progress counts files; no file's own is shown.
    mine = []
    with Progress.beside(comm, os.path.dirname(os.path.abspath(output)), "convert",
                         progress_interval_s) as progress:
        progress.phase("converting", len(inputs), "files")
        with comm.agreed("converting each file"):
            for j in range(comm.rank, len(inputs), comm.size):
                mine.append(_convert([inputs[j]], outputs[j], SingleComm(), **options, progress_interval_s=0))
                progress.add("converting", 1)
    done = [r for from_rank in comm.allgather(mine) for r in from_rank]
    order = {name: j for j, name in enumerate(outputs)}
    return MergeResult(output=output, documents=sum(r.documents for r in done),
                       sequences=sum(r.sequences for r in done), tokens=sum(r.tokens for r in done),
                       inputs=len(inputs), seconds=time.monotonic() - t0, ranks=comm.size,
                       joined=sum(r.joined for r in done), loss_masks=sum(r.loss_masks for r in done),
                       loss_masks_dropped=any(r.loss_masks_dropped for r in done),
                       unterminated=sum(r.unterminated for r in done),
                       outputs=[o for r in sorted(done, key=lambda r: order[r.output]) for o in r.outputs])


def per_file_names(inputs: list[str], pattern: str) -> list[str]:
    """Each input's output under ``--per-file``: ``pattern`` with its ``*`` replaced by the input's
    name without its format's suffix (``shards/part_07.ds`` and ``out/*.pbin`` give ``out/part_07.pbin``)."""
    if pattern.count("*") != 1 or "*" in os.path.dirname(pattern):
        raise MegacacheError(f"convert: --per-file output {pattern!r}: one * in the file name (such as out/*.pbin, "
                             "or out/* for Megatron prefixes)")
    names = []
    for path in inputs:
        name = os.path.basename(path)
        suffix = _SUFFIXES.get(format_of(path))
        names.append(pattern.replace("*", name[: -len(suffix)] if suffix else name))
    seen: dict[str, str] = {}
    for path, name in zip(inputs, names):
        if name in seen:
            raise MegacacheError(f"convert: --per-file: {seen[name]} and {path} would both be written to {name}; "
                                 "give inputs of different names")
        seen[name] = path
    return names


def _convert(inputs: list[str], output: str, comm: Comm, *, vocab_size: int | None, chunk_bytes: int,
             drop_loss_mask: bool, max_size: int | None, eos_id: int | None, dtype: str | None,
             progress_interval_s: float | None) -> MergeResult:
    """``convert`` of listed inputs into one ``output`` (or its parts)."""
    _check_inputs(inputs, [output], "convert")
    kinds = {format_of(p) for p in inputs}
    if len(kinds) > 1:
        other = next(p for p in inputs if format_of(p) != format_of(inputs[0]))
        raise MegacacheError(f"convert: the inputs must all be of one format, .pbin files, .ds files, OLMo .npy "
                             f"files or Megatron prefixes; {inputs[0]} and {other} "
                             "are not")
    if format_of(inputs[0]) == format_of(output):
        raise MegacacheError(f"convert: {inputs[0]} and {output} are in one format ({_NAMES[format_of(output)]}); give "
                             "the output in another: a path ending in .pbin (Modalities), in .ds (datatrove), in "
                             ".npy (OLMo), or a Megatron prefix (megacache merge copies within a format)")
    in_kind, out_kind = format_of(inputs[0]), format_of(output)
    if "olmo" not in (in_kind, out_kind):
        if eos_id is not None or dtype is not None:
            raise MegacacheError("convert: --eos-id and --dtype are for OLMo token files (.npy), and neither the "
                                 "inputs nor the output is one")
        return _copy(inputs, output, comm, chunk_bytes, "convert", vocab_size=vocab_size, max_size=max_size,
                     drop_loss_mask=drop_loss_mask, progress_interval_s=progress_interval_s)
    eos_id = given_eos(eos_id, "convert")
    if in_kind == "olmo":
        return _copy(inputs, output, comm, chunk_bytes, "convert", vocab_size=vocab_size, max_size=max_size,
                     eos_id=eos_id, olmo_input_dtype=given_width(f"convert: {inputs[0]}", dtype, vocab_size),
                     progress_interval_s=progress_interval_s)
    return _copy(inputs, output, comm, chunk_bytes, "convert", vocab_size=vocab_size,
                 dtype=None if dtype is None else OLMO_DTYPES[dtype], max_size=max_size,
                 drop_loss_mask=drop_loss_mask, eos_id=eos_id, progress_interval_s=progress_interval_s)
