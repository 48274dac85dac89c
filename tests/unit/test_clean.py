"""What a failed job leaves, said with its error, and ``megacache clean``: it removes what jobs that
ended left, and nothing while a job runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from megacache.runtime.coordination import Lock
from support.corpus import run_megacache


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
