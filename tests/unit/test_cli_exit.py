"""The ``megacache`` process leaves by ``os._exit`` once its command is done (``cli.run``): what a
normal exit would do must still happen."""

import os
import subprocess
import sys

RUN = """
import atexit, sys
from megacache import cli
atexit.register(print, "exit handler ran")
sys.argv = ["megacache", *sys.argv[1:]]
print("buffered output", end=" ")
cli.run()
"""


def run(*args):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # output a pipe buffers
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=120, env=env)


def test_exit_status_output_and_exit_handlers_survive_the_fast_exit(tmp_path):
    bad = run("inspect", str(tmp_path / "missing"))
    assert bad.returncode == 2
    assert bad.stdout == "buffered output exit handler ran\n"
    assert bad.stderr == f"megacache inspect: error: {tmp_path / 'missing'}: not a dataset prefix (no " \
                         f"{tmp_path / 'missing'}.idx) nor a cache directory\n"
    good = run("sample-corpus", "--output-dir", str(tmp_path / "corpus"), "--documents", "50")
    assert good.returncode == 0, good.stderr
    assert good.stdout == (f"buffered output megacache sample-corpus: wrote 4 file(s) to {tmp_path / 'corpus'}\n"
                           "exit handler ran\n")
    assert sorted(p.name for p in (tmp_path / "corpus").iterdir() if p.stat().st_size) == \
        [f"shard_{i}.jsonl" for i in range(4)]


def test_finalize_mpi_ends_an_initialised_mpi_and_imports_nothing():
    code = ("import sys; from megacache.comm import finalize_mpi; finalize_mpi(); "
            "print('mpi4py.MPI' in sys.modules); from mpi4py import MPI; finalize_mpi(); print(MPI.Is_finalized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "True"]
