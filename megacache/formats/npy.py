"""``.npy`` files that several ranks fill in place, byte-identical to ``numpy.save``.

Megatron writes its cache arrays with ``numpy.save`` (format 1.0, C order). In this module the header is
written once and the file preallocated, so every rank can write its rows at a computed offset and
no rank ever holds the whole array.
"""

from __future__ import annotations

import io
import math
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import NamedTuple
from concurrent.futures import Executor, Future

import numpy as np

from ..errors import FormatError
from ..runtime.fsio import DIRECT_MIN, aligned_empty, open_direct, pwrite_all, pwrite_mostly_direct, write_new_file, writing


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The exact header ``numpy.save`` writes for a C-ordered array of this dtype and shape.

    numpy's writer builds every header in Python, and a blend writes thousands of arrays per rank. The
    header of a shape whose first dimension has as many digits differs only in those digits (the
    padding depends on the header's length), so numpy's header for one such shape serves as a
    template for all of them."""
    shape = tuple(int(n) for n in shape)
    if not shape or shape[0] < 0:
        return _numpy_header(dtype, shape)
    digits = str(shape[0])
    key = (np.dtype(dtype).str, len(digits), shape[1:])
    template = _TEMPLATES.get(key)
    if template is None:
        example = "1" + "0" * (len(digits) - 1)
        text = _numpy_header(dtype, (int(example), *shape[1:]))
        marker = b"'shape': (" + example.encode() + b","
        if text.count(marker) != 1:  # not the layout this relies on: numpy writes every header
            return _numpy_header(dtype, shape)
        template = _TEMPLATES[key] = text.split(marker)
    return template[0] + b"'shape': (" + digits.encode() + b"," + template[1]


#: ``npy_header``'s templates: the header's text before and after the first dimension's digits
_TEMPLATES: dict[tuple, list[bytes]] = {}


def _numpy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    try:
        np.lib.format.write_array_header_1_0(buf, header)
    except ValueError:  # header too long for format 1.0, as numpy.save would fall back to 2.0
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, header)
    return buf.getvalue()


def npy_buffers(array: np.ndarray) -> list:
    """``numpy.save``'s bytes for an array (no pickle), as buffers to write end to end."""
    array = np.ascontiguousarray(array)
    return [npy_header(array.dtype, array.shape), array]


def npy_image(dtype, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A new array inside the bytes of its ``.npy`` file: ``(file, array)``, the file's bytes
    (header, then the array's) starting at an aligned address, so that writing them directly
    needs no staging copy."""
    dtype = np.dtype(dtype)
    header = npy_header(dtype, shape)
    image = aligned_empty(len(header) + dtype.itemsize * math.prod(shape))
    image[: len(header)] = np.frombuffer(header, dtype=np.uint8)
    return image, image[len(header) :].view(dtype).reshape(shape)


def write_npy(path: str, array: np.ndarray) -> None:
    """``numpy.save``'s bytes for an array, as one new file."""
    with writing(path):
        write_new_file(path, npy_buffers(array))


class BackgroundWrites:
    """Jobs that write arrays, run on a pool's threads while the caller computes the next arrays (a
    direct write holds its thread until the device has the data), with at most ``limit`` bytes of
    arrays held by jobs not yet done: ``put`` blocks until older jobs are done when more would."""

    def __init__(self, pool: Executor, limit: int):
        self.pool, self.limit = pool, limit
        self.pending: deque[tuple[Future, int]] = deque()
        self.waiting = 0

    def put(self, nbytes: int, job: Callable[..., None], *args) -> None:
        """Run ``job(*args)``, which holds ``nbytes`` of arrays (not to be changed until ``wait``)."""
        self.pending.append((self.pool.submit(job, *args), nbytes))
        self.waiting += nbytes
        while self.waiting > self.limit:
            self._oldest()

    def wait(self) -> None:
        """Until every job is done; a failed one raises its error."""
        while self.pending:
            self._oldest()

    def _oldest(self) -> None:
        future, size = self.pending.popleft()
        self.waiting -= size
        future.result()


class NpyWriter:
    """A preallocated ``.npy`` file; ``write_rows`` places rows ``first…`` at their offset."""

    def __init__(self, path: str, dtype: np.dtype, shape: tuple[int, ...]):
        self.path, self.dtype, self.shape = path, np.dtype(dtype), tuple(shape)
        self.header_size = len(npy_header(self.dtype, self.shape))
        self.row_bytes = self.dtype.itemsize * math.prod(self.shape[1:])
        self.fd = os.open(path, os.O_WRONLY)
        self._direct_fd: int | None = None  # O_DIRECT, opened by the first large write
        self._direct_tried = False

    @staticmethod
    def create(path: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        header = npy_header(dtype, shape)
        with writing(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                pwrite_all(fd, header, 0)
                os.ftruncate(fd, len(header) + np.dtype(dtype).itemsize * math.prod(shape))
            finally:
                os.close(fd)

    def write_rows(self, first: int, rows: np.ndarray) -> None:
        rows = np.asarray(rows)
        if rows.dtype != self.dtype or rows.shape[1:] != self.shape[1:]:
            raise ValueError(f"{self.path}: rows of {rows.dtype}{rows.shape} do not fit {self.dtype}{self.shape}")
        if first < 0 or first + len(rows) > self.shape[0]:
            raise ValueError(f"{self.path}: rows {first}..{first + len(rows)} outside {self.shape[0]}")
        with writing(self.path):
            if not self._direct_tried and rows.nbytes >= DIRECT_MIN:
                self._direct_fd, self._direct_tried = open_direct(self.path), True
            pwrite_mostly_direct(self.fd, self._direct_fd, [rows], self.header_size + first * self.row_bytes)

    def close(self) -> None:
        with writing(self.path):  # a network filesystem may report a failed write only now
            os.close(self.fd)
            if self._direct_fd is not None:
                os.close(self._direct_fd)

    def __enter__(self) -> "NpyWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NpyLayout(NamedTuple):
    """An ``.npy`` file as its header describes it, and its size on disk."""

    dtype: np.dtype
    shape: tuple[int, ...]
    data_offset: int                    # where the array's bytes start
    file_size: int

    @property
    def problem(self) -> str | None:
        """How the file's size disagrees with its header (None: it holds exactly the array)."""
        expected = self.data_offset + self.dtype.itemsize * math.prod(self.shape)
        if self.file_size == expected:
            return None
        return f"{self.file_size:,} bytes, its header says {expected:,}"


#: numpy parses a header with ``ast.literal_eval``, and CPython 3.11's parser keeps its recursion
#: depth in state the interpreter's threads share: two threads parsing at once can fail with
#: "SystemError: AST constructor recursion depth mismatch". A build opens arrays on several
#: threads (the index pool, the blend), so every header is parsed under this lock.
_PARSING = threading.Lock()


def read_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` from the ``.npy`` header at ``f``'s position (numpy's
    readers, under ``_PARSING``); a ValueError where there is none."""
    with _PARSING:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        return read(f)


def open_memmap(path: str) -> np.memmap:
    """An existing ``.npy`` file memory-mapped for writing (``numpy.lib.format.open_memmap``, under
    ``_PARSING``)."""
    with _PARSING:
        return np.lib.format.open_memmap(path, mode="r+")


def read_npy_layout(path: str) -> NpyLayout:
    """An ``.npy`` file's header, without reading its array."""
    try:
        with open(path, "rb") as f:
            shape, _, dtype = read_header(f)
            offset = f.tell()
            size = os.fstat(f.fileno()).st_size
    except (ValueError, OSError) as exc:
        raise FormatError(f"{path}: not a readable .npy header ({exc})") from None
    return NpyLayout(np.dtype(dtype), tuple(shape), offset, size)


def load_npy(path: str, mmap: bool = True) -> np.ndarray:
    """Open a cache array without ever unpickling (``allow_pickle=False``)."""
    try:
        with _PARSING:
            return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise FormatError(f"{path}: not a readable .npy array ({exc})") from None
