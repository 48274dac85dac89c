import os

import numpy as np
import pytest

from megacache.fsio import DIRECT_ALIGN, DIRECT_MIN, DIRECT_STAGE, open_direct, pwrite_mostly_direct, pwritev_all


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
