"""datatrove's tokenized files, ``X.ds`` and its companions (docs/datatrove.md §1).

- ``X.ds``: the token ids, nothing else, each little-endian unsigned of 2 or 4 bytes (the width).
- ``X.ds.index``: uint64 little-endian, one per document: where it ends, in tokens, counted from the
  start of ``X.ds`` (exclusive; no leading 0, no count). Equal ends are empty documents.
- ``X.ds.loss`` (optional): one byte per token, 1 where the loss counts, 0 where it is masked.
- ``X.ds.metadata`` (optional): text lines ``<tokenizer>|<width>``, the token count, the count for
  people. Nothing else records the width: without it, the width is the data's bytes over the last
  end, which the index gives exactly.

``DsFile`` reads a file through memory maps and checks what its size alone can say when opened;
the document ends are checked a window at a time (``ends``), so memory follows the window.
"""

from __future__ import annotations

import os
from functools import cached_property

import numpy as np

from ..errors import FormatError
from ..runtime.fsio import pwrite_all, writing

SUFFIX = ".ds"
#: width in bytes -> the dtype of the token ids
TOKEN_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
#: datatrove widens to 4 bytes above this vocabulary (its tokenizer step's token_size)
UINT16_VOCAB = 1 << 16


def is_ds(path: str) -> bool:
    return path.endswith(SUFFIX)


def index_path(path: str) -> str:
    return path + ".index"


def loss_path(path: str) -> str:
    return path + ".loss"


def metadata_path(path: str) -> str:
    return path + ".metadata"


def token_size(vocab_size: int) -> int:
    """datatrove's width for a vocabulary: 2 bytes up to 65,536 ids, else 4."""
    return 4 if vocab_size > UINT16_VOCAB else 2


def metadata_text(width: int, tokens: int, tokenizer: str = "unknown") -> str:
    """The ``.metadata`` datatrove writes; its third line is for people and read by no one."""
    scaled, unit = float(tokens), ""
    for unit in ("", "k", "M", "G", "T", "P"):
        if scaled < 1000:
            break
        scaled /= 1000
    return f"{tokenizer}|{width}\n{tokens}\n{scaled:.3g} {unit}T"


def _map(path: str, size: int, dtype: np.dtype) -> np.ndarray:
    # np.memmap refuses an empty file; an empty array reads the same
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


class DsFile:
    """Read-only view of ``X.ds`` with its index (required), its loss mask and metadata (if there)."""

    def __init__(self, path: str):
        self.path = path
        self.index_file = index_path(path)
        try:
            data_bytes = os.path.getsize(path)
        except FileNotFoundError:
            raise FormatError(f"{path}: no such datatrove .ds file") from None
        try:
            index_bytes = os.path.getsize(self.index_file)
        except FileNotFoundError:
            raise FormatError(f"{self.index_file}: not found; megacache needs the document ends (datatrove's "
                              "DocumentTokenizer writes them unless save_index=False)") from None
        if index_bytes % 8:
            raise FormatError(f"{self.index_file}: {index_bytes} bytes, not a multiple of 8 (uint64 document "
                              f"ends): the file is truncated at byte {index_bytes - index_bytes % 8}; tokenize "
                              "again or restore it")
        self.document_count = index_bytes // 8
        self.document_ends = _map(self.index_file, index_bytes, np.dtype("<u8"))
        last = int(self.document_ends[-1]) if self.document_count else 0
        self.tokenizer, self.token_size = self._width(data_bytes, last)
        self.token_count = data_bytes // self.token_size
        if last > self.token_count:
            raise FormatError(f"{self.index_file}: document {self.document_count - 1} ends at token {last}, past "
                              f"the {self.token_count} tokens of {path} (truncated data?)")
        if last < self.token_count:
            raise FormatError(f"{self.index_file}: the documents cover {last} of the {self.token_count} tokens of "
                              f"{path}; the index is truncated or belongs to another file")
        self.tokens = _map(path, data_bytes, self.dtype)
        # A dataset's companion files are only read while a job runs: looking first is safe.
        self.loss_file = loss_path(path) if os.path.exists(loss_path(path)) else None
        if self.loss_file and os.path.getsize(self.loss_file) != self.token_count:
            raise FormatError(f"{self.loss_file}: {os.path.getsize(self.loss_file)} bytes, but {path} holds "
                              f"{self.token_count} tokens (one loss byte each); the file is truncated or stale")

    def _width(self, data_bytes: int, last: int) -> tuple[str | None, int]:
        """The tokenizer named by ``.metadata`` (if any) and the width, checked against the data."""
        meta = metadata_path(self.path)
        tokenizer, width = None, None
        if os.path.exists(meta):
            with open(meta, encoding="utf-8", errors="replace") as f:
                first = f.readline().rstrip("\n")
            tokenizer, _, given = first.rpartition("|")
            if given not in ("2", "4"):
                raise FormatError(f"{meta}: line 1 is {first!r}; datatrove writes '<tokenizer>|2' or '<tokenizer>|4'")
            width = int(given)
        if width is not None and data_bytes != last * width and data_bytes == last * (6 - width):
            raise FormatError(f"{meta}: says {width}-byte tokens, but {self.path} holds {data_bytes} bytes for the "
                              f"{last} tokens its index covers: {6 - width}-byte tokens; fix or remove the .metadata")
        if data_bytes % (width or 2):
            raise FormatError(f"{self.path}: {data_bytes} bytes, not a multiple of the token width "
                              f"{width or 2}: the file is truncated at byte {data_bytes - data_bytes % (width or 2)}")
        if width is not None:
            return tokenizer, width
        if last and data_bytes == 4 * last:
            return None, 4
        return None, 2  # then any disagreement with the index is reported in tokens of 2 bytes

    @property
    def dtype(self) -> np.dtype:
        return TOKEN_DTYPES[self.token_size]

    def ends(self, first: int, stop: int) -> np.ndarray:
        """The ends of documents [first, stop) as int64, with the end before them (0 for the first
        document) in front: checked to be non-decreasing and inside the data."""
        block = np.empty(stop - first + 1, dtype=np.uint64)
        block[0] = self.document_ends[first - 1] if first else 0
        block[1:] = self.document_ends[first:stop]
        past = np.flatnonzero(block > self.token_count)
        if len(past):
            d = first - 1 + int(past[0])
            raise FormatError(f"{self.index_file}: document {d} ends at token {int(block[past[0]])}, past the "
                              f"{self.token_count} tokens of {self.path}; the index belongs to another file or is "
                              "damaged")
        ends = block.astype(np.int64)
        down = np.flatnonzero(np.diff(ends) < 0)
        if len(down):
            d = first + int(down[0])
            raise FormatError(f"{self.index_file}: document {d} ends at token {int(ends[down[0] + 1])}, before "
                              f"the end of document {d - 1} ({int(ends[down[0]])}): the ends must not decrease; "
                              "the index is damaged")
        return ends

    @cached_property
    def loss(self) -> np.ndarray | None:
        return _map(self.loss_file, self.token_count, np.dtype(np.uint8)) if self.loss_file else None


class DsWriter:
    """A ``.ds`` and its ``.index`` preallocated at full size; ranks fill slices in place.
    One rank calls ``create``; after a barrier every rank ``open``s them and writes its slices."""

    def __init__(self, data_file: str, index_file: str):
        self.data_file, self.index_file = data_file, index_file
        self.data_fd = os.open(data_file, os.O_WRONLY)
        self.index_fd = os.open(index_file, os.O_WRONLY)

    @staticmethod
    def create(data_file: str, index_file: str, data_bytes: int, documents: int) -> None:
        for path, size in ((data_file, data_bytes), (index_file, 8 * documents)):
            with writing(path), open(path, "wb") as f:
                f.truncate(size)

    def write_ends(self, first: int, ends: np.ndarray) -> None:
        """Documents ``first``... end at ``ends`` (tokens from the start of the file)."""
        with writing(self.index_file):
            pwrite_all(self.index_fd, np.asarray(ends, dtype="<u8"), 8 * first)

    def sync(self) -> None:
        for path, fd in ((self.data_file, self.data_fd), (self.index_file, self.index_fd)):
            with writing(path):  # a network filesystem may report a failed write only now
                os.fsync(fd)

    def close(self) -> None:
        os.close(self.data_fd)
        os.close(self.index_fd)

    def __enter__(self) -> "DsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
