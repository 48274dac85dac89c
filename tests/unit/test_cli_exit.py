"""The ``megacache`` process and the garbage collector: ``cli.run`` exits with every object frozen
out of it (its status, output and exit handlers are a normal exit's), and a build runs without it."""

import gc
import os
import subprocess
import sys

from megacache.interfaces import cli
from support.inputs.indexed import write_lengths

RUN = """
import atexit, gc, sys
from megacache.interfaces import cli
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


def test_build_runs_without_the_collector_and_leaves_it_as_found(tmp_path):
    prefix = str(tmp_path / "data")
    write_lengths(prefix, [5, 9, 0, 30, 12] * 20)
    cache = tmp_path / "cache"
    args = ["build", "--data-path", prefix, "--split", "90,10,0", "--seq-length", "8", "--train-samples", "40",
            "--global-batch-size", "1", "--eval-iters", "2", "--eval-interval", "10", "--tokenizer-type",
            "NullTokenizer", "--vocab-size", "100", "--data-cache-path", str(cache)]
    during = []  # collections that start once the build has made its cache directory, before its manifest

    def collection(phase, info):
        if phase == "start" and cache.is_dir() and not (cache / ".megacache" / "manifest.json").exists():
            during.append(info["generation"])

    gc.callbacks.append(collection)
    try:
        status = cli.main(args)
    finally:
        gc.callbacks.remove(collection)  # first: anything allocated after the build may collect
    assert status == 0 and during == []
    assert gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            assert cli.main(args) == 0
            assert gc.isenabled() is enabled
            # an error raised inside the command restores it too
            assert cli.main([a for a in args if a not in ("--global-batch-size", "1")]) == 2
            assert gc.isenabled() is enabled
    finally:
        gc.enable()


def test_version_and_the_whole_description():
    from importlib import metadata

    for flag in ("--version", "-V"):
        done = run(flag)
        assert (done.returncode, done.stdout.splitlines()[0], done.stderr) == \
            (0, f"megacache {metadata.version('megacache')}", "")
    described = run("--help").stdout
    for variable in ("MEGACACHE_COMM", "MEGACACHE_KERNEL_DIR", "MEGACACHE_HEARTBEAT_S", "MEGACACHE_STALE_S"):
        assert f"\n  {variable} " in described
    assert "Exit status: 0 success; 2 bad input" in described and "``" not in described


def test_the_parser_leaves_the_version_lookup_to_version():
    # every rank builds the parser: the lookup (importlib.metadata, a search of sys.path) waits for -V
    code = ("import sys\nfrom megacache.interfaces import cli\ncli.build_parser()\n"
            "print('importlib.metadata' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


BUGGY = """
import os, sys
from megacache.interfaces import cli
from megacache.builders import gpt

def publish(self):
    if os.environ.get("PMI_RANK", "0") == "1":
        1 / 0
gpt.GPTBuild.publish = publish
sys.argv = ["megacache", *sys.argv[1:]]
cli.run()
"""


def test_a_bug_inside_an_agreed_phase_exits_1_with_its_traceback(tmp_path):
    write_lengths(str(tmp_path / "d"), [30] * 200)
    done = subprocess.run(
        ["mpiexec", "-n", "2", sys.executable, "-c", BUGGY, "build", "--data-path", str(tmp_path / "d"),
         "--seq-length", "8", "--train-samples", "100", "--global-batch-size", "4", "--eval-iters", "1",
         "--eval-interval", "10", "--split", "90,5,5", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
         "--data-cache-path", str(tmp_path / "cache")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "megacache build: unexpected failure, a bug in megacache" in done.stderr
    assert "during publishing the GPTDataset caches:\n  rank 1: Traceback" in done.stderr
    assert "ZeroDivisionError: division by zero" in done.stderr
    assert not [n for n in os.listdir(tmp_path / "cache") if n.endswith("description.txt")]


def run_into_closed_pipe(*args, python=("-m", "megacache")):
    """The command with its stdout a pipe whose reader has gone, as in ``megacache ... | head -1``
    once head has its line."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, *python, *args], stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    finally:
        os.close(write)


def test_a_closed_stdout_ends_the_command_quietly_with_status_141(tmp_path):
    prefix = str(tmp_path / "d")
    write_lengths(prefix, [5, 9, 30] * 20)
    before = sorted(os.listdir(tmp_path))
    for args in (["verify", prefix, prefix], ["inspect", prefix]):
        done = run_into_closed_pipe(*args)
        assert (done.returncode, done.stderr) == (141, ""), args
    for args in (["--help"], ["-V"]):  # no command ran: argparse's own printing, quiet too
        done = run_into_closed_pipe(*args)
        assert (done.returncode, done.stderr) == (0, ""), args
    # what the process writes after, such as an exit handler's line, goes nowhere rather than failing
    done = run_into_closed_pipe("inspect", prefix, python=("-c", RUN))
    assert (done.returncode, done.stderr) == (141, "")
    assert sorted(os.listdir(tmp_path)) == before


OWN_PIPE = """
import os, sys
from megacache.interfaces import cli

def broken(args, comm):
    read, write = os.pipe()  # a pipe of megacache's own, as to a worker process
    os.close(read)
    os.write(write, b"x")
cli._cmd_inspect = broken
sys.argv = ["megacache", *sys.argv[1:]]
cli.run()
"""


def test_a_broken_pipe_other_than_stdout_is_still_an_error(tmp_path):
    done = subprocess.run([sys.executable, "-c", OWN_PIPE, "inspect", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stderr) == (2, "megacache inspect: error: [Errno 32] Broken pipe\n")
