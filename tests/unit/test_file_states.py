"""The reuse check's stats (megacache/runtime/file_states.py): the kernel's sizes and modification
times are os.stat's, file by file, both ways the kernels run."""

import os

import numpy as np

from megacache.runtime.file_states import file_states, file_states_reference


def test_sizes_and_times_are_os_stats(kernel_mode, tmp_path):
    rng = np.random.default_rng(5)
    names = []
    for i in range(300):
        name = f"{i:032x}-GPTDataset-train-{'é' if i % 7 == 0 else ''}document_index.npy"
        (tmp_path / name).write_bytes(b"x" * int(rng.integers(0, 5000)))
        os.utime(tmp_path / name, ns=(0, int(rng.integers(0, 2**62))))
        names.append(name)
    os.symlink(names[3], tmp_path / "link")  # followed, as os.stat does
    os.mkdir(tmp_path / "sub")
    (tmp_path / "sub" / "deeper").write_bytes(b"abc")
    names += ["link", "gone", "sub/deeper", "sub", names[0] + "/not-a-directory"]
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sizes, mtimes = file_states(fd, names)
        want_sizes, want_mtimes = file_states_reference(fd, names)
        empty = file_states(fd, [])
    finally:
        os.close(fd)
    assert np.array_equal(sizes, want_sizes) and np.array_equal(mtimes, want_mtimes)
    assert sizes[300] == sizes[3] and sizes[302] == 3
    assert sizes[301] == mtimes[301] == sizes[-1] == mtimes[-1] == -1
    assert sizes.dtype == mtimes.dtype == np.int64 and len(empty[0]) == len(empty[1]) == 0
    assert want_mtimes[0] == os.stat(tmp_path / names[0]).st_mtime_ns > 2**40
