import os

import numpy as np
import pytest

from megacache.fsio import DIRECT_ALIGN, DIRECT_MIN, DIRECT_STAGE, open_direct, pwrite_mostly_direct


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
