import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from megacache.errors import MegacacheError
from megacache.formats.npy import BackgroundWrites, write_npy
from megacache.runtime.fsio import DIRECT_MIN


def test_every_array_lands_as_numpy_save_writes_it(tmp_path):
    rng = np.random.default_rng(3)
    arrays = [rng.integers(0, 2**31 - 1, n, dtype=np.int32) for n in (0, 1, 5, DIRECT_MIN // 4 + 7, 40_000, 3)]
    arrays.append(rng.integers(0, 2**40, (DIRECT_MIN // 8, 2), dtype=np.int64))
    limit = 2 * DIRECT_MIN
    with ThreadPoolExecutor(2) as pool:
        writes = BackgroundWrites(pool, limit)
        for i, a in enumerate(arrays):
            writes.put(a.nbytes, write_npy, str(tmp_path / f"{i}.npy"), a)
            assert writes.waiting <= limit
        writes.wait()
        assert not writes.pending and writes.waiting == 0
    for i, a in enumerate(arrays):
        np.save(tmp_path / "ref.npy", a)
        assert (tmp_path / f"{i}.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()


def test_put_waits_for_older_writes_beyond_the_limit(tmp_path):
    gate = threading.Event()
    array = np.arange(1000, dtype=np.int64)  # 8000 bytes
    with ThreadPoolExecutor(1) as pool:
        pool.submit(gate.wait)  # the pool's one thread is busy until the gate opens
        try:
            writes = BackgroundWrites(pool, 20_000)
            writes.put(array.nbytes, write_npy, str(tmp_path / "a.npy"), array)
            writes.put(array.nbytes, write_npy, str(tmp_path / "b.npy"), array)  # 16000 bytes waiting: returns at once
            third = threading.Thread(target=writes.put, args=(array.nbytes, write_npy, str(tmp_path / "c.npy"), array))
            third.start()
            third.join(0.3)
            assert third.is_alive(), "24000 bytes would wait, over the limit: put must block"
            assert not (tmp_path / "a.npy").exists()
        finally:
            gate.set()
        third.join(10)
        assert not third.is_alive()
        writes.wait()
    for name in "abc":
        assert np.array_equal(np.load(tmp_path / f"{name}.npy"), array)


def test_a_failed_write_is_raised_naming_the_file(tmp_path):
    with ThreadPoolExecutor(1) as pool:
        writes = BackgroundWrites(pool, 1 << 20)
        writes.put(12, write_npy, str(tmp_path / "ok.npy"), np.zeros(3, np.int32))
        missing = str(tmp_path / "no-such-dir" / "x.npy")
        writes.put(12, write_npy, missing, np.zeros(3, np.int32))
        with pytest.raises(MegacacheError, match=f"{missing}: cannot write"):
            writes.wait()
