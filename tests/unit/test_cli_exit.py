"""The ``megacache`` process (``cli.run``) exits with every object frozen out of the garbage
collector: its status, output and exit handlers are a normal exit's."""

import subprocess
import sys

RUN = """
import atexit, gc, sys
from megacache import cli
atexit.register(lambda: print("exit handler ran; frozen:", gc.get_freeze_count() > 0))
sys.argv = ["megacache", *sys.argv[1:]]
cli.run()
"""


def run(*args):
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=120)


def test_run_exits_with_the_commands_status_and_output(tmp_path):
    bad = run("inspect", str(tmp_path / "missing"))
    assert bad.returncode == 2
    assert bad.stdout == "exit handler ran; frozen: True\n"
    assert bad.stderr == f"megacache inspect: error: {tmp_path / 'missing'}: not a dataset prefix (no " \
                         f"{tmp_path / 'missing'}.idx) nor a cache directory\n"
    good = run("sample-corpus", "--output-dir", str(tmp_path / "corpus"), "--documents", "50")
    assert good.returncode == 0, good.stderr
    assert good.stdout == (f"megacache sample-corpus: wrote 4 file(s) to {tmp_path / 'corpus'}\n"
                           "exit handler ran; frozen: True\n")
    assert sorted(p.name for p in (tmp_path / "corpus").iterdir() if p.stat().st_size) == \
        [f"shard_{i}.jsonl" for i in range(4)]
