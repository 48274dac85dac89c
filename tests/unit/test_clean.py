"""What a failed job leaves, said with its error, and ``megacache clean``: it removes what jobs that
ended left, and nothing while a job runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

from megacache.runtime.coordination import Lock
from megacache.runtime.fsio import PROGRESS_MARK, STATE_DIR, names
from support.inputs.corpus import run_megacache
from support.inputs.indexed import write_lengths


def megacache(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megacache", *args], capture_output=True, text=True, timeout=300)


def test_a_failed_tokenize_says_what_it_leaves_and_clean_removes_it(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("".join(f'{{"text": "document {i} " }}\n' for i in range(2000)))
    (corpus / "b.jsonl").write_text('{"text": broken\n')
    out = tmp_path / "out"
    done = megacache("tokenize", "--input", str(corpus / "a.jsonl"), str(corpus / "b.jsonl"), "--output-prefix",
                     f"{out}/tok", "--tokenizer", "byte", "--threads", "1")
    assert done.returncode == 2
    work = out / ".tok.megacache-work"
    size = sum(f.stat().st_size for f in work.rglob("*") if f.is_file())
    assert done.stderr.endswith(
        f"\nIt leaves 1 work directory(ies) of finished units ({size / 1e3:.1f} kB) in {out}: a rerun of the same "
        f"command resumes from them, and `megacache clean {out}` removes it all\n"), done.stderr
    assert os.listdir(out) == [work.name]  # no job folder: its ranks removed their records

    cleaned = megacache("clean", str(out))
    assert (cleaned.returncode, cleaned.stderr) == (0, "")
    assert cleaned.stdout == f"megacache clean: {out}: removed 1 work directory(ies) of finished units " \
                             f"({size / 1e3:.1f} kB)\n"
    assert os.listdir(out) == []


def test_clean_removes_nothing_while_a_job_runs(tmp_path):
    lock = Lock(str(tmp_path), "cache", "live0job", "megacache build of 3 entries")
    assert lock.acquire()
    temporary = tmp_path / ".x-train-sample_index.npy.megacache-tmp-live0job"
    temporary.write_bytes(b"x" * 1000)
    try:
        done = megacache("clean", str(tmp_path))
    finally:
        lock.release()
    assert done.returncode == 2 and done.stdout == ""
    assert re.fullmatch(rf"megacache clean: error: {tmp_path}: megacache build of 3 entries by pid {os.getpid()} on "
                        rf"\S+ \(job live0job, since [\d :-]+\) is running there; nothing was removed\. Clean once "
                        rf"it has ended\n", done.stderr), done.stderr
    assert temporary.exists()
    done = megacache("clean", str(tmp_path))  # once it has ended
    assert done.stdout == f"megacache clean: {tmp_path}: removed 1 temporary file(s) (1.0 kB)\n"
    assert os.listdir(tmp_path) == []


def test_clean_of_what_is_not_a_directory_removes_nothing(tmp_path):
    (tmp_path / ".y.megacache-tmp-0").write_text("")
    done = megacache("clean", str(tmp_path), str(tmp_path / "data"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"megacache clean: error: {tmp_path / 'data'}: not a directory: give the directory a job "
                           f"wrote to (a cache directory, or the directory of an output prefix); nothing was removed\n")
    assert os.listdir(tmp_path) == [".y.megacache-tmp-0"]


def test_clean_under_mpi_cleans_once(tmp_path):
    (tmp_path / ".y.megacache-tmp-0").write_text("abc")
    done = run_megacache(2, "clean", str(tmp_path))
    assert done.stdout == f"megacache clean: {tmp_path}: removed 1 temporary file(s) (3 B)\n"
    assert os.listdir(tmp_path) == []


def test_a_killed_verify_leaves_its_progress_which_clean_removes_once_stale(tmp_path):
    rng = np.random.default_rng(4)
    prefixes = [str(tmp_path / f"d{i}") for i in range(8)]
    for prefix in prefixes:
        write_lengths(prefix, rng.integers(1, 1000, 1_000_000))
    state = tmp_path / STATE_DIR
    job = subprocess.Popen(["mpiexec", "-n", "2", sys.executable, "-m", "megacache", "verify", *prefixes,
                            "--progress-interval", "0.05"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
    deadline = time.monotonic() + 120
    while not any(n.startswith(PROGRESS_MARK) for n in names(str(state))):
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, "verify made no progress directory"
        time.sleep(0.002)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    [left] = os.listdir(state)
    assert left.startswith(PROGRESS_MARK)

    kept = megacache("clean", str(tmp_path))  # it may be a live job's: kept, and said so
    assert kept.returncode == 0, kept.stderr
    assert re.fullmatch(rf"megacache clean: {tmp_path}: kept {STATE_DIR}/{left}: a verify or convert that may still "
                        rf"be running updated it \d+ s ago; clean removes it once it is 120 s old\n"
                        rf"megacache clean: {tmp_path}: nothing left by megacache jobs\n", kept.stdout), kept.stdout
    cleaned = subprocess.run([sys.executable, "-m", "megacache", "clean", str(tmp_path)], capture_output=True,
                             text=True, timeout=300, env={**os.environ, "MEGACACHE_STALE_S": "0.001"})
    assert (cleaned.returncode, cleaned.stderr) == (0, "")
    assert cleaned.stdout == f"megacache clean: {tmp_path}: removed 1 record(s) of jobs that did not finish\n"
    assert not state.exists()
