"""The Slurm prebuild job for real, on a running Slurm (a single node, started by
slurm/start_single_node.sh): the README's example, run as written, tokenizes the sample corpus and
builds the caches its training command asks for with 2 MPI ranks under ``srun --mpi=pmi2``, equal
byte for byte to a plain one-rank build; and scancel stops a job that a resubmission resumes."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import without_mpi

REPO = Path(__file__).resolve().parents[2]
START = "run slurm/start_single_node.sh (as root) to install and start a one-node Slurm"
# The sample job's build flags (tests/sample_job.sh, the README's first command), and a split whose
# spaces check that TRAIN_ARGS keeps a quoted argument whole on its way through the batch script.
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


def megacache(*args: str, env: dict, cwd=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "megacache", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def read_dir(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}  # not megacache's state directory


def readme_example() -> str:
    """The README's Slurm example: the shell block of its "Under Slurm" section."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Under Slurm"):]
    return section[section.index("```bash\n") + 8:section.index("\n```\n")]


def wait_for_job(job_id: str, timeout_s: int = 240) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], timeout=30)
            pytest.fail(f"Slurm job {job_id} did not finish in {timeout_s} s: is the node busy, or slurmd down? {START}")
        time.sleep(0.5)


def test_the_readme_example_runs_as_written_and_equals_a_single_rank_build(tmp_path, compiled_kernels):
    require_slurm()
    # The job runs this checkout's megacache as a plain Slurm job, not inside any launcher this test
    # may run under; the example runs from a folder holding the repository's slurm/ (as its own does).
    env = without_mpi(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PATH"] = os.pathsep.join((os.path.dirname(sys.executable), env["PATH"]))
    env["MEGACACHE_KERNEL_DIR"] = compiled_kernels
    (tmp_path / "slurm").symlink_to(REPO / "slurm")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_example()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.fullmatch(r"Submitted batch job (\d+)\n", done.stdout.splitlines(keepends=True)[-1]).group(1)
    wait_for_job(job_id)
    output = (tmp_path / f"megacache-prebuild-{job_id}.out").read_text()

    assert "megacache kernels: already compiled for this CPU" in output, output
    # The three srun steps (tokenize, build, verify) each ran as one 2-rank MPI job (two singletons
    # would each report 1 rank).
    assert output.count("on 2 rank(s)") == 3, output
    assert "on 1 rank(s)" not in output, output
    data_path = "tok/corpus_text_document"
    assert f"ok   {data_path}: " in output, output
    built = read_dir(tmp_path / "cache")
    for split in ("train", "valid", "test"):
        names = sorted(n for n in built if f"-GPTDataset-{split}-" in n)
        assert [n.split("-", 3)[3] for n in names] == ["description.txt", "document_index.npy",
                                                         "sample_index.npy", "shuffle_index.npy"], names
    assert len(built) == 13 and "sequences_per_dataset.json" in built, sorted(built)  # 12 entry files

    # the same command on one rank, given as the training command is: the same bytes
    megacache("build", "@train.args", "--data-cache-path", "single", env=env, cwd=tmp_path)
    single = read_dir(tmp_path / "single")
    assert sorted(single) == sorted(built)
    assert [n for n in built if built[n] != single[n]] == []


def test_scancel_stops_the_prebuild_job_and_a_resubmitted_job_resumes(tmp_path, compiled_kernels):
    """``scancel`` (what preemption and the time limit do too: SIGTERM to every task) during the
    tokenize step: every rank stops at once, rank 0 says where the job was, the lock is released;
    the same job submitted again resumes from the finished work units and its dataset equals a
    one-rank tokenize."""
    import time

    from support.systems.faults import current_phases, lock_held

    require_slurm()
    env = without_mpi(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    corpus, prefix, cache = tmp_path / "corpus", tmp_path / "tok", tmp_path / "cache"
    megacache("sample-corpus", "--output-dir", str(corpus), "--files", "8", "--documents", "6000", env=env)
    env.update(INPUT=str(corpus), OUTPUT_PREFIX=str(prefix), TOKENIZER="--tokenizer byte",
               TOKENIZE_ARGS="--append-eod --unit-bytes 32K",
               TRAIN_ARGS=shlex.join(["--data-path", f"{prefix}_text_document", "--data-cache-path", str(cache),
                                      "--split", SPLIT, *BUILD_FLAGS]),
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
    megacache("tokenize", "--input", str(corpus), "--output-prefix", str(tmp_path / "single"), "--tokenizer", "byte",
              "--append-eod", env=env)
    for suffix in (".bin", ".idx"):
        assert Path(f"{prefix}_text_document{suffix}").read_bytes() == \
            (tmp_path / f"single_text_document{suffix}").read_bytes()
