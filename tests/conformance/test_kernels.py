"""The kernels' two ways of running (megacache/runtime/kernels.py): a call meets the export compiled for
exactly its argument types, the compiled library decodes and builds bit for bit as the JIT does, a
build with it never imports numba, and a library is never taken for another CPU's or another
source's. (The algorithm tests run every kernel both ways: the ``kernel_mode`` fixture.)"""

import os
import pickle
import subprocess
import sys
import threading

import numba
import numpy as np
import pytest

from megacache.runtime import kernels
from megacache.runtime.environment import kernel_dir
from megacache.errors import MegacacheError
from megacache.formats import pickled_pairs as pp
from support.inputs.indexed import write_lengths

VALUES = [
    np.zeros(5, np.int32), np.zeros(5, np.uint32), np.zeros(5, np.int64), np.zeros(5, np.float64),
    np.zeros(5, np.int16), np.zeros(5, np.uint8), np.zeros((3, 2), np.int64),
    np.zeros((3, 2), np.int32, order="F"), np.zeros((4, 6))[:, 1], np.zeros((4, 6))[1:3, 2:5], np.zeros(0, np.int32),
    np.frombuffer(b"abcd", np.uint8), np.zeros((2, 2), np.int64)[:, :1],
    0, -1, 2**63 - 1, -(2**63), 2**63, np.int64(3), np.uint64(3), np.int32(3), np.uint32(3), np.int16(-2),
    1.5, np.float64(2.0), np.float32(2.0), True, np.bool_(False),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{type(v).__name__}")
def test_call_types_are_numbas_types(value):
    assert kernels._value_type(value) == kernels.numba_type_key(numba.typeof(value))


def test_arrays_numba_tells_apart_or_refuses_are_told_apart():
    a = np.zeros(4, np.uint8)
    view = a.view()
    view.flags.writeable = False
    assert kernels._value_type(a) != kernels._value_type(view) == kernels._value_type(np.frombuffer(b"abcd", np.uint8))
    # numba refuses big-endian arrays; they must not meet a little-endian export
    assert kernels._value_type(np.zeros(5, ">i4")) != kernels._value_type(np.zeros(5, "<i4"))


@pytest.mark.parametrize("n", [0, 1, 1000, 7919])
def test_pbin_decoding(kernel_mode, n):
    rng = np.random.default_rng(n)
    pairs = rng.integers(0, 2**40, size=(n, 2), dtype=np.int64)
    data = pickle.dumps([(int(a), int(b)) for a, b in pairs], protocol=4)
    for buf in (data, np.frombuffer(data, np.uint8).copy()):  # read-only (a file's bytes) and writable
        offsets, lengths = pp.decode(buf, "x.pbin")
        assert np.array_equal(offsets, pairs[:, 0]) and np.array_equal(lengths, pairs[:, 1])
        total, rows = pp.checkpoints(buf, "x.pbin", 100)
        assert total == n
        if n > 200:
            offsets, lengths = pp.window(buf, "x.pbin", rows[1], 150, 500)
            assert np.array_equal(offsets, pairs[150:650, 0]) and np.array_equal(lengths, pairs[150:650, 1])
    with pytest.raises(Exception, match="x.pbin: index byte"):
        pp.decode(data[:-1], "x.pbin")


def test_kernels_release_the_gil(kernel_mode):
    """A build runs kernels on several threads at once: while one runs, Python runs elsewhere."""
    from megacache.algorithms.gpt_index import _tile_range

    out = np.empty(60_000_000, np.int64)
    running = []
    spins = 0

    def work():
        running.append(True)
        for _ in range(4):  # long enough that a busy machine still gives the main thread its share
            _tile_range(out, 0, len(out))
        running.append(False)

    thread = threading.Thread(target=work)
    thread.start()
    while running[-1:] != [False]:
        spins += running[-1:] == [True]
    thread.join()
    assert out[-1] == len(out) - 1
    # holding it, the main thread would run only until the kernel starts, far fewer times than this
    assert spins > 200_000, f"the main thread ran {spins} times while the kernel ran"


def test_library_names_the_source_the_cpu_and_the_interpreter(monkeypatch, tmp_path):
    here = kernels.library_path(str(tmp_path))
    assert os.path.dirname(here) == str(tmp_path) and here.endswith(".so")
    assert kernels.library_path(str(tmp_path)) == here
    cpu = kernels._cpu()
    assert "flags" in cpu or "Features" in cpu  # Linux on x86 or ARM: the CPU's features are in it
    monkeypatch.setattr(kernels, "_cpu", lambda: cpu.replace("avx", "sse"))
    assert kernels.library_path(str(tmp_path)) != here
    monkeypatch.undo()
    monkeypatch.setattr(kernels, "MODULES", kernels.MODULES[:-1])
    assert kernels.library_path(str(tmp_path)) != here


def test_compiling_without_numbas_ahead_of_time_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "numba.pycc", None)  # as a numba without it would answer
    with pytest.raises(MegacacheError, match=r"this numba cannot compile ahead of time \(numba.pycc: .*\); builds "
                                             "still run, through numba's JIT"):
        kernels.compile_library(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_jit_only(monkeypatch):
    monkeypatch.setenv("MEGACACHE_KERNEL_DIR", "jit")
    kernels.forget_library()
    try:
        assert kernel_dir() is None and kernels.native_library() is None
        with pytest.raises(MegacacheError, match="MEGACACHE_KERNEL_DIR=jit: there is no kernel directory"):
            kernels.compile_library()
    finally:
        kernels.forget_library()


BUILD = """
import sys
from megacache.interfaces import cli
status = cli.main(sys.argv[1:])
# one write per line: mpiexec merges the ranks' output, and print's separate writes could interleave
sys.stdout.write(f"numba imported: {'numba' in sys.modules}\\n")
sys.stdout.flush()
sys.exit(status)
"""


def test_builds_with_the_compiled_library_never_import_numba(tmp_path):
    """``megacache kernels`` (on 2 ranks: rank 0 compiles) into an empty directory (again: nothing
    to do), then the same
    blend built three ways: with that library, through the JIT, and with no library (a note says
    how to get one). The caches are identical."""
    directory = tmp_path / "kernels"
    env = {**os.environ, "MEGACACHE_KERNEL_DIR": str(directory)}
    made = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "megacache", "kernels"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    # one part per core, the first under the library's name
    parts = sorted(os.listdir(directory))
    library = parts[0]
    assert parts == [os.path.basename(kernels.library_path(str(directory), i)) for i in range(len(parts))]
    assert len(parts) == min(len(os.sched_getaffinity(0)), kernels._MAX_PARTS)
    assert made.stdout.startswith("megacache kernels: compiled for this CPU in ")
    assert made.stdout.rstrip().endswith(f": {directory / library}") and made.stdout.count("\n") == 1
    again = subprocess.run([sys.executable, "-m", "megacache", "kernels"], env=env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and again.stdout == ("megacache kernels: already compiled for this CPU and this "
                                                      f"megacache: {directory / library}\n"), again.stderr

    prefixes = []
    for i in range(3):
        prefixes.append(str(tmp_path / f"data{i}"))
        write_lengths(prefixes[-1], np.random.default_rng(i).integers(0, 300, 2000))
    data_path = " ".join(f"{w} {p}" for w, p in zip((0.5, 0.3, 0.2), prefixes))
    outputs = {}
    for mode, setting in (("native", str(directory)), ("jit", "jit"), ("missing", str(tmp_path / "none"))):
        cache = tmp_path / f"cache-{mode}"
        run = subprocess.run([sys.executable, "-c", BUILD, "build", "--data-path", *data_path.split(), "--split",
                              "90,8,2", "--seq-length", "64", "--train-samples", "3000", "--global-batch-size", "1",
                              "--eval-iters", "20", "--eval-interval", "100", "--tokenizer-type", "NullTokenizer",
                              "--vocab-size", "1000", "--data-cache-path", str(cache)],
                             env={**os.environ, "MEGACACHE_KERNEL_DIR": setting}, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.endswith(f"numba imported: {mode != 'native'}\n")
        note = (f"megacache build: note: no kernels compiled for this CPU in {tmp_path / 'none'}, so every rank loads "
                "numba's JIT (about 0.35 s of CPU each); `megacache kernels` compiles them once\n")
        assert run.stderr == (note if mode == "missing" else "")
        outputs[mode] = {p.name: p.read_bytes() for p in cache.iterdir() if p.is_file()}
    # per dataset and split 3 arrays and a description, per split a blend's 2 and one, the sequence counts
    assert len(outputs["native"]) == 3 * 3 * 4 + 3 * 3 + 1
    assert outputs["native"] == outputs["jit"] == outputs["missing"]

    # One prefix on 2 ranks: its train split is shared, so its walk reads the lengths memory-mapped
    # from the .idx (read-only and, 34 bytes into the file, off their alignment) and the shared
    # document index (read-only): those calls have exports too.
    run = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-c", BUILD, "build", "--data-path", prefixes[0],
                          "--seq-length", "64", "--train-samples", "3000", "--global-batch-size", "1", "--eval-iters",
                          "20", "--eval-interval", "100", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
                          "--data-cache-path", str(tmp_path / "cache-shared")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("numba imported: False\n") == 2, run.stdout[-3000:]
