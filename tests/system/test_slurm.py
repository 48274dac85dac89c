"""The Slurm prebuild job for real: ``sbatch --wait slurm/prebuild.sbatch`` on a running Slurm (one
node here, started by slurm/start_single_node.sh) tokenizes a corpus and builds its cache with 2
MPI ranks under ``srun --mpi=pmi2``, and the cache equals a plain one-rank build byte for byte."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import without_mpi

REPO = Path(__file__).resolve().parents[2]
START = "run slurm/start_single_node.sh (as root) to install and start a one-node Slurm"
# The sample job's build flags (tests/sample_job.sh, the README's first command), with a split that
# leaves every split non-empty for 400 documents; its spaces check that BUILD_ARGS keeps a quoted
# argument whole on its way through the batch script.
SPLIT = "90, 5, 5"
BUILD_FLAGS = ["--seq-length", "256", "--train-iters", "500", "--global-batch-size", "8", "--eval-iters", "5",
               "--eval-interval", "100", "--tokenizer-type", "NullTokenizer", "--vocab-size", "257"]


def require_slurm() -> None:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        pytest.skip(f"Slurm is not installed here (no sinfo/sbatch on PATH): {START}")
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.skip(f"Slurm is not running here (sinfo timed out): {START}")
    states = proc.stdout.split()
    if proc.returncode != 0 or not {"idle", "mixed"} & set(states):
        reason = proc.stderr.strip() or f"node states {states}"
        pytest.skip(f"Slurm is not running here or has no idle node ({reason}): {START}")


def sbatch_wait(args: list[str], env: dict, timeout_s: int = 180) -> subprocess.CompletedProcess:
    """``sbatch --wait``; a job still queued or running at the timeout is cancelled, not left behind."""
    try:
        return subprocess.run(["sbatch", "--wait", "--parsable", *args], env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        job_id = (exc.stdout or b"").decode().split(";")[0].strip()
        if job_id:
            subprocess.run(["scancel", job_id], timeout=30)
        pytest.fail(f"Slurm job {job_id or '(not submitted)'} did not finish in {timeout_s} s: "
                    f"is the node busy, or slurmd down? {START}")


def megacache(*args: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "megacache", *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def read_dir(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}  # not megacache's state directory


def test_prebuild_job_under_sbatch_equals_a_single_rank_build(tmp_path, compiled_kernels):
    require_slurm()
    # The job imports this checkout's megacache, and runs as a plain Slurm job, not inside any
    # launcher this test might run under.
    env = without_mpi(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    corpus, prefix, cache, log = tmp_path / "corpus", tmp_path / "tok", tmp_path / "cache", tmp_path / "job.out"
    megacache("sample-corpus", "--output-dir", str(corpus), "--files", "2", "--documents", "200", env=env)

    # Knobs go through the environment and --export=ALL: values with commas would not survive
    # sbatch's own --export=NAME=value list.
    env.update(INPUT=str(corpus), OUTPUT_PREFIX=str(prefix), DATA_CACHE_PATH=str(cache),
               BUILD_ARGS=f"--split '{SPLIT}' " + " ".join(BUILD_FLAGS), VERIFY_ARGS="--vocab-size 257",
               MEGACACHE=f"{sys.executable} -m megacache", MEGACACHE_KERNEL_DIR=compiled_kernels)
    job = sbatch_wait(["--export=ALL", f"--chdir={tmp_path}", f"--output={log}", "--time=00:02:00",
                       str(REPO / "slurm" / "prebuild.sbatch")], env=env)
    output = log.read_text() if log.exists() else "(no job output file)"
    assert job.returncode == 0, job.stdout + job.stderr + output

    assert "megacache kernels: already compiled for this CPU" in output, output
    # The three srun steps (tokenize, build, verify) each ran as one 2-rank MPI job (two singletons
    # would each report 1 rank).
    assert output.count("on 2 rank(s)") == 3, output
    assert "on 1 rank(s)" not in output, output
    data_path = f"{prefix}_text_document"
    assert f"ok   {data_path}: 400 documents" in output, output
    assert Path(data_path + ".bin").stat().st_size > 0 and Path(data_path + ".idx").stat().st_size > 0
    megacache("verify", data_path, "--vocab-size", "257", env=env)

    built = read_dir(cache)
    for split in ("train", "valid", "test"):
        names = sorted(n for n in built if f"-GPTDataset-{split}-" in n)
        assert [n.split("-", 3)[3] for n in names] == ["description.txt", "document_index.npy",
                                                         "sample_index.npy", "shuffle_index.npy"], names
    assert len(built) == 13 and "sequences_per_dataset.json" in built, sorted(built)  # 12 entry files

    single_cache = tmp_path / "cache_single_rank"
    megacache("build", "--data-path", data_path, "--split", SPLIT, *BUILD_FLAGS,
              "--data-cache-path", str(single_cache), env=env)
    single = read_dir(single_cache)
    assert sorted(single) == sorted(built)
    assert [n for n in built if built[n] != single[n]] == []


def test_scancel_stops_the_prebuild_job_and_a_resubmitted_job_resumes(tmp_path, compiled_kernels):
    """``scancel`` (what preemption and the time limit do too: SIGTERM to every task) during the
    tokenize step: every rank stops at once, rank 0 says where the job was, the lock is released;
    the same job submitted again resumes from the finished work units and its dataset equals a
    one-rank tokenize."""
    import time

    from support.faults import current_phases, lock_held

    require_slurm()
    env = without_mpi(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    corpus, prefix, cache = tmp_path / "corpus", tmp_path / "tok", tmp_path / "cache"
    megacache("sample-corpus", "--output-dir", str(corpus), "--files", "8", "--documents", "6000", env=env)
    env.update(INPUT=str(corpus), OUTPUT_PREFIX=str(prefix), DATA_CACHE_PATH=str(cache),
               TOKENIZE_ARGS="--append-eod --unit-bytes 32K", BUILD_ARGS=" ".join(BUILD_FLAGS),
               VERIFY_ARGS="--vocab-size 257", MEGACACHE=f"{sys.executable} -m megacache",
               MEGACACHE_KERNEL_DIR=compiled_kernels)
    batch = ["--export=ALL", f"--chdir={tmp_path}", "--time=00:02:00", str(REPO / "slurm" / "prebuild.sbatch")]
    first = tmp_path / "first.out"
    job_id = subprocess.run(["sbatch", "--parsable", f"--output={first}", *batch], env=env, capture_output=True,
                            text=True, timeout=30, check=True).stdout.strip().split(";")[0]
    deadline = time.monotonic() + 90
    while "tokenizing" not in current_phases(str(tmp_path)):
        assert time.monotonic() < deadline, f"job {job_id} did not start tokenizing in 90 s"
        time.sleep(0.02)
    cancelled = time.monotonic()
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() - cancelled < 30, f"job {job_id} still listed 30 s after scancel"
        time.sleep(0.1)
    output = first.read_text()
    assert "megacache tokenize: stopped by SIGTERM: " in output and "was in phase 'tokenizing'" in output, output
    assert not lock_held(str(tmp_path)), "lock not released"
    assert not Path(f"{prefix}_text_document.idx").exists()

    second = tmp_path / "second.out"
    job = sbatch_wait([f"--output={second}", *batch], env=env)
    output = second.read_text()
    assert job.returncode == 0, output
    assert "an earlier job" in output and "(stopped by SIGTERM)" in output, output
    resumed = re.search(r"resuming: (\d+) of (\d+) units already done", output)
    assert resumed and int(resumed.group(1)) > 0, output
    megacache("tokenize", "--input", str(corpus), "--output-prefix", str(tmp_path / "single"), "--append-eod",
              env=env)
    for suffix in (".bin", ".idx"):
        assert Path(f"{prefix}_text_document{suffix}").read_bytes() == \
            (tmp_path / f"single_text_document{suffix}").read_bytes()
