"""Megatron's IndexedDataset on disk: ``<prefix>.bin`` (tokens) and ``<prefix>.idx`` (index).

``.idx`` layout (little-endian): magic ``MMIDIDX\\0\\0`` (9 bytes), version u64 = 1, dtype code u8,
sequence count S u64, document-index length C u64 (documents + 1), then int32 lengths[S],
int64 byte pointers[S], int64 document_indices[C]. ``.bin`` is the bare concatenation of the
sequences. See ``docs/megatron.md`` §1.

Writers in this module never build the arrays whole: ``IndexLayout`` gives every array's byte offset, so
each rank writes its own slice in place into a preallocated file.
"""

from __future__ import annotations

import itertools
import mmap
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import FormatError
from ..runtime import object_storage
from ..runtime.fsio import pread_into, pwrite_all, writing

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = 34  # 9 magic + 8 version + 1 dtype + 8 S + 8 C
#: index entries this close together are read by one pread (a page)
ENTRY_WINDOW = 4096

#: Megatron's DType enum: code -> numpy dtype
CODE_TO_DTYPE = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
DTYPE_TO_CODE = {v: k for k, v in CODE_TO_DTYPE.items()}

#: Megatron's vocabulary threshold for uint16 tokens (not 65536: see docs/megatron.md §1.3)
UINT16_VOCAB_LIMIT = 65500


def optimal_dtype(vocab_size: int | None) -> np.dtype:
    """Megatron's ``DType.optimal_dtype``: uint16 below a vocabulary of 65500, else int32."""
    if vocab_size is not None and vocab_size < UINT16_VOCAB_LIMIT:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def idx_path(prefix: str) -> str:
    return prefix + ".idx"


def bin_path(prefix: str) -> str:
    return prefix + ".bin"


@dataclass(frozen=True)
class IndexLayout:
    """Sizes and byte offsets of one ``.idx`` file."""

    dtype: np.dtype
    sequence_count: int  # S
    document_count: int  # C = documents + 1

    @property
    def lengths_offset(self) -> int:
        return HEADER_SIZE

    @property
    def pointers_offset(self) -> int:
        return HEADER_SIZE + 4 * self.sequence_count

    @property
    def documents_offset(self) -> int:
        return HEADER_SIZE + 12 * self.sequence_count

    @property
    def idx_size(self) -> int:
        return HEADER_SIZE + 12 * self.sequence_count + 8 * self.document_count

    def header_bytes(self) -> bytes:
        return (
            MAGIC
            + struct.pack("<Q", VERSION)
            + struct.pack("<B", DTYPE_TO_CODE[np.dtype(self.dtype)])
            + struct.pack("<Q", self.sequence_count)
            + struct.pack("<Q", self.document_count)
        )


def read_layout(path: str) -> IndexLayout:
    """Read and check an ``.idx`` header (an object's in a bucket: by one ranged read, and its
    size); errors name the file and the field."""
    if object_storage.is_object_storage(path):
        try:
            size = object_storage.size(path)
        except object_storage.ObjectMissing:
            raise FormatError(f"{object_storage.shown(path)}: index file not found") from None
        head = np.empty(min(size, HEADER_SIZE), dtype=np.uint8)
        object_storage.read_into(path, 0, head)
        return _layout_of(head.tobytes(), size, object_storage.shown(path))
    with _open_index(path) as f:
        return _layout_of(f.read(HEADER_SIZE), os.fstat(f.fileno()).st_size, path)


def _open_index(path: str):
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FormatError(f"{path}: index file not found") from None


def _layout_of(head: bytes, size: int, path: str) -> IndexLayout:
    """The layout of an ``.idx`` of ``size`` bytes that starts with ``head``; ``path`` as the
    errors name the file."""
    if len(head) < HEADER_SIZE:
        raise FormatError(f"{path}: truncated header ({len(head)} of {HEADER_SIZE} bytes)")
    if head[:9] != MAGIC:
        raise FormatError(f"{path}: bad magic {head[:9]!r}, expected {MAGIC!r}: not a Megatron .idx file")
    (version,) = struct.unpack("<Q", head[9:17])
    if version != VERSION:
        raise FormatError(f"{path}: unsupported version {version}, expected {VERSION}")
    code = head[17]
    if code not in CODE_TO_DTYPE:
        raise FormatError(f"{path}: unknown dtype code {code}, expected one of {sorted(CODE_TO_DTYPE)}")
    s, c = struct.unpack("<QQ", head[18:34])
    layout = IndexLayout(CODE_TO_DTYPE[code], s, c)
    if c < 1:
        raise FormatError(f"{path}: document count is 0; it must be at least 1 (the leading 0)")
    if size < layout.idx_size:
        raise FormatError(
            f"{path}: truncated: {size} bytes, but S={s} sequences and C={c} document "
            f"entries need {layout.idx_size}"
        )
    if size > layout.idx_size:  # a count in the header is wrong (every reader then misplaces the arrays)
        raise FormatError(f"{path}: {size} bytes, but S={s} sequences and C={c} document entries make exactly "
                          f"{layout.idx_size}: its header is damaged or the file was extended; re-create the dataset")
    return layout


def _spans(fd: int, lay: IndexLayout, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``IndexedDataset.span_bytes`` on an open ``.idx`` descriptor. The entries are read by
    neighbourhood, one pread for those within ``ENTRY_WINDOW`` bytes of each other: the ranges of
    a split meet, so a three-way split needs about five reads, not nine."""
    sizes = {}
    for lo, hi in ranges:
        sizes[lay.pointers_offset + 8 * lo] = sizes[lay.pointers_offset + 8 * (hi - 1)] = 8
        sizes[lay.lengths_offset + 4 * (hi - 1)] = 4
    entries = {}
    offsets = sorted(sizes)
    while offsets:
        first = offsets[0]
        # entries do not overlap, so sorted offsets end in order too: the near ones lead
        near = list(itertools.takewhile(lambda o: o + sizes[o] - first <= ENTRY_WINDOW, offsets))
        data = os.pread(fd, near[-1] + sizes[near[-1]] - first, first)
        for o in near:
            entries[o] = int.from_bytes(data[o - first : o - first + sizes[o]], "little", signed=True)
        offsets = offsets[len(near):]
    return [(entries[lay.pointers_offset + 8 * lo],
             entries[lay.pointers_offset + 8 * (hi - 1)] + entries[lay.lengths_offset + 4 * (hi - 1)] * lay.dtype.itemsize)
            for lo, hi in ranges]


class IndexedDataset:
    """Read-only view of a ``.bin/.idx`` pair through memory maps (nothing is loaded eagerly).

    Opening refuses a ``.bin`` too short for the index's last sequence (an O(1) check: Megatron
    would load it and read past its end in training); ``check_bin_size=False`` leaves that to a
    caller that checks every pointer itself (verify). A dataset in a bucket (``s3://``,
    ``msc://``) is read from ``index_copy``, a local copy of its ``.idx`` (errors name the
    object), and its ``.bin`` is asked for its size unless the caller knows it (``bin_size``);
    its tokens are read by ranged requests for the bytes asked only (``ObjectArray``).
    """

    def __init__(self, prefix: str, check_bin_size: bool = True, index_copy: str | None = None,
                 bin_size: int | None = None):
        self.prefix = prefix
        self.idx_file = index_copy or idx_path(prefix)
        # One open, mmap + frombuffer (not np.memmap): a blend opens thousands of datasets on every rank.
        with _open_index(self.idx_file) as f:
            self.layout = lay = _layout_of(f.read(HEADER_SIZE), os.fstat(f.fileno()).st_size,
                                           object_storage.shown(idx_path(prefix)))
            idx = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
            last = _spans(f.fileno(), lay, [(lay.sequence_count - 1, lay.sequence_count)]) if lay.sequence_count else []
        self.sequence_lengths = idx[lay.lengths_offset : lay.pointers_offset].view(np.int32)
        self.sequence_pointers = idx[lay.pointers_offset : lay.documents_offset].view(np.int64)
        self.document_indices = idx[lay.documents_offset : lay.idx_size].view(np.int64)
        binp = bin_path(prefix)
        try:
            self.bin_size = (bin_size if bin_size is not None else object_storage.size(binp)
                             if object_storage.is_object_storage(binp) else os.stat(binp).st_size)
        except (FileNotFoundError, object_storage.ObjectMissing):
            raise FormatError(f"{object_storage.shown(binp)}: token file not found (its index {idx_path(prefix)} "
                              f"exists)") from None
        if check_bin_size and last:
            end = last[0][1]
            if self.bin_size < end:
                raise FormatError(
                    f"{object_storage.shown(binp)}: truncated: {self.bin_size} bytes, but its index {idx_path(prefix)} "
                    f"puts the last sequence's tokens up to byte {end}; re-create the dataset (megacache verify "
                    f"{prefix} locates the damage)")

    def span_bytes(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """For each non-empty sequence range ``[lo, hi)``: the ``.bin`` bytes from its first
        sequence's start to its last one's end, from three index entries read with pread (which
        releases the GIL, so threads overlap the reads of many datasets; a memory map's page
        fault would hold it)."""
        for lo, hi in ranges:
            if not 0 <= lo < hi <= len(self):
                raise ValueError(f"{self.prefix}: sequences [{lo}, {hi}) are not a non-empty range of [0, {len(self)}]")
        fd = os.open(self.idx_file, os.O_RDONLY)
        try:
            return _spans(fd, self.layout, ranges)
        finally:
            os.close(fd)

    def read_lengths(self, lo: int, hi: int) -> np.ndarray:
        """Sequence lengths ``[lo, hi)`` read into a new array: memory that is freed with it,
        where a slice of ``sequence_lengths`` would keep its pages resident as long as the
        dataset is open (a build holds every dataset open and reads each length once)."""
        if not 0 <= lo <= hi <= len(self):
            raise ValueError(f"{self.prefix}: sequences [{lo}, {hi}) outside [0, {len(self)}]")
        out = np.empty(hi - lo, dtype=np.int32)
        fd = os.open(self.idx_file, os.O_RDONLY)
        try:
            return pread_into(fd, out, self.layout.lengths_offset + 4 * lo)
        finally:
            os.close(fd)

    @cached_property
    def tokens(self) -> np.ndarray | object_storage.ObjectArray:
        """The ``.bin``'s tokens, mapped on first use (index builds never read them); in a bucket,
        an ``ObjectArray``, whose slices are ranged reads."""
        binp = bin_path(self.prefix)
        if object_storage.is_object_storage(binp):
            return object_storage.ObjectArray(binp, self.layout.dtype, self.bin_size // self.layout.dtype.itemsize)
        # numpy cannot map an empty file; a dataset of only empty documents has one.
        return np.memmap(binp, mode="r", dtype=self.layout.dtype) if self.bin_size else np.zeros(0, self.layout.dtype)

    @property
    def dtype(self) -> np.dtype:
        return self.layout.dtype

    def __len__(self) -> int:
        return self.layout.sequence_count

    @property
    def num_documents(self) -> int:
        return self.layout.document_count - 1

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens of sequence ``i`` from element ``offset``, ``length`` of them (to its end if None)."""
        start = int(self.sequence_pointers[i]) // self.dtype.itemsize + offset
        if length is None:
            length = int(self.sequence_lengths[i]) - offset
        return self.tokens[start : start + length]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.get(i)

    def document(self, d: int) -> np.ndarray:
        """All tokens of document ``d`` (its sequences are contiguous in ``.bin``)."""
        s0, s1 = int(self.document_indices[d]), int(self.document_indices[d + 1])
        if s0 == s1:
            return self.tokens[:0]
        start = int(self.sequence_pointers[s0]) // self.dtype.itemsize
        stop = int(self.sequence_pointers[s1 - 1]) // self.dtype.itemsize + int(self.sequence_lengths[s1 - 1])
        return self.tokens[start:stop]


class IndexCopies:
    """Datasets opened to be read where they are: a local one in place; one in a bucket from a copy
    of its ``.idx`` downloaded whole, once, into a temporary directory (under TMPDIR) that closing
    removes, its ``.bin`` asked for its size once and its tokens read by ranged requests. A context."""

    def __init__(self):
        self._directory: str | None = None
        self._copies: dict[str, str] = {}
        self._bin_sizes: dict[str, int] = {}

    def open(self, prefix: str, check_bin_size: bool = True) -> IndexedDataset:
        """``IndexedDataset(prefix, check_bin_size)``, from the ``.idx``'s copy for a bucket's."""
        if not object_storage.is_object_storage(prefix):
            return IndexedDataset(prefix, check_bin_size)
        if prefix not in self._copies:
            if self._directory is None:
                self._directory = tempfile.mkdtemp(prefix="megacache-idx-")
            copy = object_storage.local_copy(idx_path(prefix), self._directory)
            try:
                object_storage.download(idx_path(prefix), copy)
            except object_storage.ObjectMissing:
                raise FormatError(f"{object_storage.shown(idx_path(prefix))}: index file not found") from None
            self._copies[prefix] = copy
        dataset = IndexedDataset(prefix, check_bin_size, self._copies[prefix], self._bin_sizes.get(prefix))
        self._bin_sizes[prefix] = dataset.bin_size
        return dataset

    def close(self) -> None:
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
        self._directory = None
        self._copies.clear()
        self._bin_sizes.clear()

    def __enter__(self) -> "IndexCopies":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class IndexWriter:
    """An ``.idx`` (and its ``.bin``) preallocated at full size; ranks fill slices in place.

    One rank calls ``create``; after a barrier every rank calls ``open`` and writes its slices.
    """

    def __init__(self, idx_file: str, bin_file: str, layout: IndexLayout, fds: tuple[int, int]):
        self.idx_file, self.bin_file, self.layout = idx_file, bin_file, layout
        self.idx_fd, self.bin_fd = fds

    @classmethod
    def create(cls, idx_file: str, bin_file: str | None, layout: IndexLayout, bin_size: int) -> None:
        """Both files at full size; ``bin_file`` None: the ``.idx`` alone (its ``.bin`` is written
        elsewhere)."""
        with writing(idx_file), open(idx_file, "wb") as f:
            f.write(layout.header_bytes())
            f.truncate(layout.idx_size)
        if bin_file is not None:
            with writing(bin_file), open(bin_file, "wb") as f:
                f.truncate(bin_size)

    @classmethod
    def open(cls, idx_file: str, bin_file: str | None, layout: IndexLayout) -> "IndexWriter":
        return cls(idx_file, bin_file, layout, (os.open(idx_file, os.O_WRONLY),
                                                None if bin_file is None else os.open(bin_file, os.O_WRONLY)))

    def write_sequences(self, first: int, lengths: np.ndarray, first_byte: int) -> None:
        """Lengths of sequences ``first…`` and their pointers, starting at ``.bin`` byte ``first_byte``."""
        lengths = np.asarray(lengths, dtype=np.int32)
        pointers = np.empty(len(lengths), dtype=np.int64)
        if len(lengths):
            pointers[0] = first_byte
            np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
            pointers[1:] *= self.layout.dtype.itemsize
            pointers[1:] += first_byte
        with writing(self.idx_file):
            pwrite_all(self.idx_fd, lengths, self.layout.lengths_offset + 4 * first)
            pwrite_all(self.idx_fd, pointers, self.layout.pointers_offset + 8 * first)

    def write_documents(self, first: int, document_indices: np.ndarray) -> None:
        """Entries ``first…`` of document_indices (entry 0 is the leading 0)."""
        arr = np.asarray(document_indices, dtype=np.int64)
        with writing(self.idx_file):
            pwrite_all(self.idx_fd, arr, self.layout.documents_offset + 8 * first)

    def write_tokens(self, byte_offset: int, tokens: np.ndarray) -> None:
        with writing(self.bin_file):
            pwrite_all(self.bin_fd, np.asarray(tokens, dtype=self.layout.dtype), byte_offset)

    def close(self) -> None:
        # a network filesystem may report a failed write (no space) only when the file is closed
        try:
            with writing(self.idx_file):
                os.close(self.idx_fd)
        finally:
            if self.bin_fd is not None:
                with writing(self.bin_file):
                    os.close(self.bin_fd)

    def __enter__(self) -> "IndexWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_dataset(prefix: str, documents: list[np.ndarray], dtype: np.dtype) -> None:
    """Write a small dataset in one go (one sequence per non-empty document, as Megatron's
    preprocess_data.py does). For tests and tools; the builders write in slices."""
    dtype = np.dtype(dtype)
    lengths = np.array([len(d) for d in documents if len(d)], dtype=np.int32)
    doc_idx = np.zeros(len(documents) + 1, dtype=np.int64)
    doc_idx[1:] = np.cumsum([1 if len(d) else 0 for d in documents])
    layout = IndexLayout(dtype, len(lengths), len(doc_idx))
    tokens = np.concatenate([np.asarray(d, dtype=dtype) for d in documents]) if documents else np.zeros(0, dtype)
    IndexWriter.create(idx_path(prefix), bin_path(prefix), layout, tokens.nbytes)
    with IndexWriter.open(idx_path(prefix), bin_path(prefix), layout) as w:
        w.write_sequences(0, lengths, 0)
        w.write_documents(0, doc_idx)
        w.write_tokens(0, tokens)
