"""OLMo's numpy token files (allenai OLMo-core's ``NumpyFSLDataset`` and friends; docs/olmo.md §1).

A file holds token ids and nothing else: no numpy header although it is usually named ``*.npy``,
each id a little-endian unsigned integer of 2 or 4 bytes. Nothing in the file records the width
(OLMo's config gives it, or derives it from the vocabulary size); documents are not recorded
either: each ends with the EOS id, which stays with its document. megacache reads ids after the
last EOS as one more document, without EOS.

``OlmoFile`` maps a file and finds its documents a block at a time (``document_ends``), so memory
follows the block, not the file.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import FormatError
from ..runtime.fsio import writing
from .npy import read_header

SUFFIX = ".npy"
#: the widths megacache reads and writes, by name (the CLI's --dtype)
TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
#: what ``numpy.save`` writes first; OLMo's files have no such header
_NUMPY_MAGIC = b"\x93NUMPY"
#: tokens compared with the EOS per vectorized step: the scan's memory
SCAN_TOKENS = 1 << 22


def is_olmo(path: str) -> bool:
    return path.endswith(SUFFIX)


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """OLMo-core's width for a vocabulary when its config names none: the narrowest that holds the
    largest id (``vocab_size - 1``)."""
    return TOKEN_DTYPES["uint16"] if vocab_size - 1 <= np.iinfo(np.uint16).max else TOKEN_DTYPES["uint32"]


def given_width(path: str, dtype: str | None, vocab_size: int | None) -> np.dtype:
    """An OLMo file's width from what the user gave: ``dtype`` (uint16 or uint32), else the
    vocabulary's by OLMo's rule; the file itself does not say."""
    if dtype is not None:
        return TOKEN_DTYPES[dtype]
    if vocab_size is None:
        raise FormatError(f"{path} records no token width; give --dtype uint16|uint32 (as OLMo-core's dtype) or "
                          "--vocab-size (OLMo's rule: uint16 up to 65,536 ids)")
    return dtype_for_vocab(vocab_size)


def given_eos(eos_id: int | None, verb: str) -> int:
    if eos_id is None:
        raise FormatError(f"{verb}: an OLMo token file's documents are delimited by the EOS id alone: give "
                          "--eos-id (the tokenizer's EOS, as OLMo-core's eos_token_id)")
    return eos_id


def check_eos(eos_id: int, dtype: np.dtype, path: str) -> None:
    if not 0 <= eos_id <= np.iinfo(dtype).max:
        raise FormatError(f"{path}: --eos-id {eos_id} does not fit its {dtype.itemsize}-byte tokens "
                          f"(0..{np.iinfo(dtype).max}); give the EOS id of the tokenizer that wrote it, or the "
                          "right --dtype")


def _has_numpy_header(path: str) -> bool:
    """Whether ``path`` starts with a readable ``numpy.save`` header: raw ids that happen to spell
    the magic (three uint16 ids) are still tokens unless a whole header follows."""
    with open(path, "rb") as f:
        if f.read(len(_NUMPY_MAGIC)) != _NUMPY_MAGIC:
            return False
        f.seek(0)
        try:
            read_header(f)
        except ValueError:
            return False
    return True


class OlmoFile:
    """Read-only view of one token file of ``dtype`` ids whose documents end with ``eos_id``."""

    def __init__(self, path: str, dtype: np.dtype, eos_id: int):
        self.path, self.dtype, self.eos_id = path, np.dtype(dtype), eos_id
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            raise FormatError(f"{path}: no such OLMo token file") from None
        if _has_numpy_header(path):
            raise FormatError(f"{path}: a numpy array with a header (numpy.save's .npy), not an OLMo token file "
                              "(raw ids, no header); give the token file OLMo trains from")
        check_eos(eos_id, self.dtype, path)
        if size % self.dtype.itemsize:
            raise FormatError(f"{path}: {size} bytes, not a multiple of the {self.dtype.itemsize}-byte tokens of "
                              f"--dtype {self.dtype.name}: truncated at byte {size - size % self.dtype.itemsize}, or "
                              "the width is another")
        if size == 0:
            raise FormatError(f"{path}: empty, no documents; a tokenizer task that failed may have left it: "
                              "tokenize it again or leave it out")
        self.token_count = size // self.dtype.itemsize
        self.tokens = np.memmap(path, dtype=self.dtype, mode="r")

    @property
    def terminated(self) -> bool:
        """Whether the last document ends with the EOS (else it is kept without)."""
        return int(self.tokens[-1]) == self.eos_id

    def document_ends(self, start: int, stop: int):
        """The ends (exclusive, in tokens from the file's start) of the documents whose EOS lies in
        tokens ``[start, stop)``, as arrays, one per block of ``SCAN_TOKENS`` tokens."""
        for b0 in range(start, stop, SCAN_TOKENS):
            b1 = min(stop, b0 + SCAN_TOKENS)
            yield b0 + 1 + np.flatnonzero(np.asarray(self.tokens[b0:b1]) == self.eos_id)

    def document_lengths(self):
        """Every document's length in tokens (EOS included), an array per block of tokens scanned;
        the last document without EOS, if there is one, last."""
        last = 0
        for ends in self.document_ends(0, self.token_count):
            if len(ends):
                yield np.diff(ends, prepend=last)
                last = int(ends[-1])
        if last < self.token_count:
            yield np.array([self.token_count - last])


class OlmoWriter:
    """A token file preallocated at full size under a temporary name; ranks fill their slices in
    place. One rank calls ``create``; after a barrier every rank opens it."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY)

    @staticmethod
    def create(path: str, data_bytes: int) -> None:
        with writing(path), open(path, "wb") as f:
            f.truncate(data_bytes)

    def sync(self) -> None:
        with writing(self.path):  # a network filesystem may report a failed write only now
            os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "OlmoWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
