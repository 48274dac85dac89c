import os

import numpy as np
import pytest

from megacache.formats.npy import npy_image
from megacache.runtime.fsio import (DIRECT_ALIGN, DIRECT_MIN, DIRECT_STAGE, TMP_MARK, Staging, _can_link_unnamed,
                                    aligned_empty, open_direct, pwrite_mostly_direct, pwritev_all, write_atomic,
                                    write_new_file)


@pytest.mark.parametrize("offset", [0, 1, DIRECT_ALIGN - 1, DIRECT_ALIGN, 3 * DIRECT_ALIGN + 17])
@pytest.mark.parametrize("sizes", [[10], [128, DIRECT_MIN + 5], [DIRECT_ALIGN - 3, 7, 2 * DIRECT_MIN, 1, 0, 4099],
                                   [5, DIRECT_STAGE + 3, DIRECT_STAGE // 2]])
def test_pieces_written_mostly_direct_land_end_to_end_at_their_offset(tmp_path, offset, sizes):
    # Pieces whose boundaries fall inside the direct blocks (each block staged from several) and
    # inside a staging buffer's worth.
    rng = np.random.default_rng(len(sizes) + offset)
    pieces = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    path = str(tmp_path / "f")
    before = rng.integers(0, 256, offset + sum(sizes) + 100, dtype=np.uint8)
    before.tofile(path)
    fd = os.open(path, os.O_WRONLY)
    direct = open_direct(path)
    try:
        pwrite_mostly_direct(fd, direct, [pieces[0].tobytes(), *pieces[1:]], offset)
    finally:
        os.close(fd)
        if direct is not None:
            os.close(direct)
    expected = before.copy()
    expected[offset : offset + sum(sizes)] = np.concatenate(pieces)
    assert np.fromfile(path, dtype=np.uint8).tobytes() == expected.tobytes()


@pytest.mark.parametrize("offset", [0, 5, DIRECT_ALIGN, 2 * DIRECT_ALIGN + 3])
@pytest.mark.parametrize("size", [DIRECT_MIN - 1, DIRECT_MIN + DIRECT_ALIGN + 9, DIRECT_STAGE + 4 * DIRECT_ALIGN])
def test_aligned_buffers_are_written_from_where_they_lie(tmp_path, offset, size):
    # An aligned buffer at an aligned offset goes to the device without staging; at any other
    # offset it is staged as before: the same bytes either way.
    data = aligned_empty(size)
    data[:] = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    path = str(tmp_path / "f")
    before = np.full(offset + size + 10, 7, dtype=np.uint8)
    before.tofile(path)
    fd, direct = os.open(path, os.O_WRONLY), open_direct(path)
    try:
        pwrite_mostly_direct(fd, direct, [data[:3].tobytes(), data[3:]] if offset % 2 else [data], offset)
    finally:
        os.close(fd)
        if direct is not None:
            os.close(direct)
    expected = before.copy()
    expected[offset : offset + size] = data
    assert np.fromfile(path, dtype=np.uint8).tobytes() == expected.tobytes()


@pytest.mark.parametrize("shape", [(0,), (5,), (300_000,), (70_001, 2)])
def test_an_npy_image_is_the_file_numpy_saves(tmp_path, shape):
    file, array = npy_image(np.int64 if len(shape) == 2 else np.int32, shape)
    assert file.ctypes.data % DIRECT_ALIGN == 0 and array.base is not None
    array[...] = np.arange(array.size).reshape(shape)
    write_new_file(str(tmp_path / "image.npy"), [file])
    np.save(tmp_path / "saved.npy", array)
    assert (tmp_path / "image.npy").read_bytes() == (tmp_path / "saved.npy").read_bytes()


@pytest.mark.parametrize("most", [1, 3, 7, 1 << 20])
def test_short_vector_writes_are_resumed_where_they_stopped(tmp_path, monkeypatch, most):
    """pwritev may write less than asked; the rest follows, across and inside the views."""
    real = os.pwritev
    calls = []

    def short(fd, views, offset):  # the kernel taking at most ``most`` bytes per call
        calls.append(len(views))
        taken, left = [], most
        for v in views:
            if left <= 0:
                break
            taken.append(v[:left])
            left -= len(taken[-1])
        return real(fd, taken, offset)

    monkeypatch.setattr(os, "pwritev", short)
    pieces = [b"abc", b"", b"defgh", bytes(range(256)) * 3, b"z"]
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"." * 5)
    fd = os.open(path, os.O_WRONLY)
    try:
        pwritev_all(fd, [memoryview(p) for p in pieces], 5)
    finally:
        os.close(fd)
    assert open(path, "rb").read() == b"." * 5 + b"".join(pieces)
    assert len(calls) == -(-sum(map(len, pieces)) // most)


def _contents(rng) -> dict[str, list]:
    """Files as pieces: small, one straddling the direct-write threshold, one of several pieces."""
    return {"a.npy": [b"header", rng.integers(0, 9, 5, dtype=np.int32)],
            "b.npy": [rng.integers(0, 256, DIRECT_MIN + DIRECT_ALIGN + 3, dtype=np.uint8)],
            "c.txt": [b"x" * 10, b"", b"y" * 4099]}


def _joined(pieces) -> bytes:
    return b"".join(p.tobytes() if isinstance(p, np.ndarray) else p for p in pieces)


@pytest.mark.parametrize("unnamed_limit", [None, 1, 0])
def test_staged_files_appear_only_when_published_and_hold_their_bytes(tmp_path, unnamed_limit):
    """Unnamed where the filesystem can link them in (none visible, not even a temporary name),
    under temporary names once the descriptor budget is spent: the published bytes are the same."""
    if unnamed_limit != 0 and not _can_link_unnamed(str(tmp_path), "test"):
        pytest.skip("this filesystem cannot link unnamed (O_TMPFILE) files in")
    files = _contents(np.random.default_rng(1))
    staging = Staging("test", unnamed_limit)
    for name, pieces in files.items():
        staging.write(str(tmp_path / name), pieces)
    waiting = sorted(os.listdir(tmp_path))
    assert all(TMP_MARK in n for n in waiting)
    assert len(waiting) == {None: 0, 1: 2, 0: 3}[unnamed_limit]
    staging.publish(str(tmp_path / name) for name in files)
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == {n: _joined(p) for n, p in files.items()}


@pytest.mark.parametrize("unnamed_limit", [None, 0])
def test_publishing_replaces_an_existing_file(tmp_path, unnamed_limit):
    (tmp_path / "a").write_bytes(b"stale")
    staging = Staging("test", unnamed_limit)
    staging.write(str(tmp_path / "a"), [b"fresh"])
    assert (tmp_path / "a").read_bytes() == b"stale"
    staging.publish([str(tmp_path / "a")])
    assert os.listdir(tmp_path) == ["a"] and (tmp_path / "a").read_bytes() == b"fresh"


@pytest.mark.parametrize("durable", [True, False])
def test_an_atomic_write_replaces_the_whole_file_and_leaves_no_temporary(tmp_path, durable):
    path = tmp_path / "record.json"
    write_atomic(str(path), b"first, and longer", durable)
    write_atomic(str(path), b"second", durable)
    assert os.listdir(tmp_path) == ["record.json"] and path.read_bytes() == b"second"


@pytest.mark.parametrize("unnamed_limit", [None, 0])
def test_discarded_files_leave_nothing(tmp_path, unnamed_limit):
    files = _contents(np.random.default_rng(2))
    staging = Staging("test", unnamed_limit)
    for name, pieces in files.items():
        staging.write(str(tmp_path / name), pieces)
    staging.path(str(tmp_path / "shared.npy"))  # named, written by others: never created
    staging.discard()
    assert os.listdir(tmp_path) == []
