"""Modalities' packed data file, ``.pbin`` (docs/modalities.md §1).

Layout: a 12-byte header, the data length in bytes (u64 LE) and the token size in bytes (u32 LE);
the data, every token little-endian unsigned in that size; then the index, a pickled list of
``(offset, length)`` pairs in bytes, offsets counted from the start of the data. The index is
written and read by ``pickled_pairs`` (never by pickle's loader).

The token size follows the vocabulary: the bytes ``log2(vocab_size)`` bits take, 3 rounded up to 4.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import FormatError
from ..runtime.fsio import pwrite_all, writing
from .pickled_pairs import checkpoints, window

SUFFIX = ".pbin"
HEADER_SIZE = 12
#: token size in bytes -> the dtype of the data segment
TOKEN_DTYPES = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def is_pbin(path: str) -> bool:
    """A path ending in ``.pbin`` is Modalities' format; anything else names a Megatron prefix."""
    return path.endswith(SUFFIX)


def token_size(vocab_size: int) -> int:
    """Modalities' token size for a vocabulary: ceil(log2(vocab_size) / 8) bytes, 3 taken as 4."""
    if vocab_size < 2:
        raise FormatError(f"a .pbin needs a vocabulary of at least 2 tokens, got {vocab_size}")
    size = math.ceil(math.log2(vocab_size) / 8)
    if size > 4:
        raise FormatError(f"a vocabulary of {vocab_size} tokens needs {size}-byte tokens; .pbin has at most 4")
    return 4 if size == 3 else size


def expected_offsets(lengths: np.ndarray, start: int) -> np.ndarray:
    """Where documents of these lengths start when each follows the one before it, the first at ``start``."""
    offsets = np.full(len(lengths), start, dtype=np.int64)
    if len(lengths) > 1:
        offsets[1:] += np.cumsum(lengths[:-1])
    return offsets


def merge_bug_hint(short_bytes: int) -> str:
    """Why a document may start ``short_bytes`` before the end of the one before it."""
    if short_bytes > 0 and short_bytes % 12 == 0:
        return (" (as Modalities' merge_packed_data writes them: it puts each file's offsets 12 bytes per "
                "earlier file too low; merge the original files with megacache merge)")
    return ""


def header_bytes(data_bytes: int, size: int) -> bytes:
    return struct.pack("<QI", data_bytes, size)


@dataclass(frozen=True)
class PbinLayout:
    data_bytes: int
    token_size: int
    file_size: int

    @property
    def dtype(self) -> np.dtype:
        return TOKEN_DTYPES[self.token_size]

    @property
    def index_offset(self) -> int:
        return HEADER_SIZE + self.data_bytes


def _layout(f, path: str) -> PbinLayout:
    head = f.read(HEADER_SIZE)
    size = os.fstat(f.fileno()).st_size
    if len(head) < HEADER_SIZE:
        raise FormatError(f"{path}: truncated header ({len(head)} of {HEADER_SIZE} bytes): not a .pbin file")
    data_bytes, tsize = struct.unpack("<QI", head)
    if tsize not in TOKEN_DTYPES:
        raise FormatError(f"{path}: header byte 8: token size {tsize}; a .pbin has 1, 2 or 4 "
                          "(an 8-byte header from an older Modalities is not supported)")
    if data_bytes % tsize:
        raise FormatError(f"{path}: header byte 0: data length {data_bytes} is not a multiple of the "
                          f"token size {tsize}")
    if HEADER_SIZE + data_bytes > size:
        raise FormatError(f"{path}: truncated: the header gives {data_bytes} data bytes but the file has "
                          f"{size - HEADER_SIZE} after the header")
    if HEADER_SIZE + data_bytes == size:
        raise FormatError(f"{path}: no index after the {data_bytes} data bytes (truncated file?)")
    return PbinLayout(data_bytes, tsize, size)


def read_layout(path: str) -> PbinLayout:
    try:
        with open(path, "rb") as f:
            return _layout(f, path)
    except FileNotFoundError:
        raise FormatError(f"{path}: no such .pbin file") from None


#: items between two decoder checkpoints: a window's decoding starts at most this many items early
CHECKPOINT_ITEMS = 1 << 16


class PackedFile:
    """Read-only view of a ``.pbin`` through one memory map. The first use of the index checks all
    of it once, keeping a decoder checkpoint every ``CHECKPOINT_ITEMS`` documents; windows of
    documents are then decoded from the nearest checkpoint, so memory follows the window."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                self.layout = _layout(f, path)
                self._map = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
        except FileNotFoundError:
            raise FormatError(f"{path}: no such .pbin file") from None
        self._name = f"{path} (index at byte {self.layout.index_offset})"

    @property
    def token_size(self) -> int:
        return self.layout.token_size

    @property
    def dtype(self) -> np.dtype:
        return self.layout.dtype

    @cached_property
    def tokens(self) -> np.ndarray:
        lay = self.layout
        return self._map[HEADER_SIZE : lay.index_offset].view(lay.dtype)

    @property
    def index_bytes(self) -> np.ndarray:
        return self._map[self.layout.index_offset :]

    @cached_property
    def _checkpoints(self) -> tuple[int, np.ndarray]:
        return checkpoints(self.index_bytes, self._name, CHECKPOINT_ITEMS)

    @property
    def document_count(self) -> int:
        return self._checkpoints[0]

    def document_window(self, first: int = 0, count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Documents [first, first+count) (to the end if None) as token offsets and token lengths,
        checked: aligned to the token size, in order without overlap, inside the data."""
        total, rows = self._checkpoints
        count = total - first if count is None else count
        if first < 0 or count < 0 or first + count > total:
            raise FormatError(f"{self.path}: documents {first}..{first + count} asked for, the file holds {total}")
        if count == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        offsets, lengths = window(self.index_bytes, self._name, rows[first // CHECKPOINT_ITEMS], first, count)
        return self._checked(offsets, lengths, first)

    def windows(self, size: int):
        """``(first, token offsets, token lengths)`` of every document, ``size`` documents at a time."""
        for first in range(0, self.document_count, size):
            yield (first, *self.document_window(first, min(size, self.document_count - first)))

    def _checked(self, offsets: np.ndarray, lengths: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
        size, data = self.token_size, self.layout.data_bytes
        bad = np.flatnonzero((offsets % size != 0) | (lengths % size != 0))
        if len(bad):
            d = int(bad[0])
            raise FormatError(f"{self.path}: document {first + d}: offset {offsets[d]} or length {lengths[d]} "
                              f"is not a multiple of the token size {size}")
        ends = offsets + lengths
        bad = np.flatnonzero(ends > data)
        if len(bad):
            d = int(bad[0])
            raise FormatError(f"{self.path}: document {first + d} ends at data byte {ends[d]}, past the data's "
                              f"{data} bytes")
        bad = np.flatnonzero(offsets[1:] < ends[:-1]) + 1
        if len(bad):
            d = int(bad[0])
            hint = merge_bug_hint(int(ends[d - 1] - offsets[d]))
            raise FormatError(f"{self.path}: document {first + d} starts at data byte {offsets[d]}, before the end "
                              f"of document {first + d - 1} ({ends[d - 1]}): offsets out of order{hint}")
        return offsets // size, lengths // size


class PbinWriter:
    """A ``.pbin`` preallocated at full size; ranks fill data and index slices in place.
    One rank calls ``create``; after a barrier every rank ``open``s it and writes its slices."""

    def __init__(self, path: str, data_bytes: int, fd: int):
        self.path, self.data_bytes, self.fd = path, data_bytes, fd

    @staticmethod
    def create(path: str, data_bytes: int, size: int, index_bytes: int) -> None:
        with writing(path), open(path, "wb") as f:
            f.write(header_bytes(data_bytes, size))
            f.truncate(HEADER_SIZE + data_bytes + index_bytes)

    @classmethod
    def open(cls, path: str, data_bytes: int) -> "PbinWriter":
        return cls(path, data_bytes, os.open(path, os.O_WRONLY))

    def data_offset(self, token_byte: int) -> int:
        return HEADER_SIZE + token_byte

    def write_index(self, index_byte: int, data: np.ndarray) -> None:
        with writing(self.path):
            pwrite_all(self.fd, data, HEADER_SIZE + self.data_bytes + index_byte)

    def close(self) -> None:
        with writing(self.path):  # a network filesystem may report a failed write only now
            os.close(self.fd)

    def __enter__(self) -> "PbinWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
