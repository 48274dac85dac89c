"""The README's first command: tests/sample_job.sh runs the main job end to end (kernels compiled,
here already, sample corpus, tokenize and build on 2 MPI ranks, verify) and leaves a verified
dataset and cache."""

from __future__ import annotations

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_sample_job_runs_end_to_end(tmp_path, compiled_kernels):
    out = str(tmp_path / "sample_out")
    env = dict(os.environ, PYTHONWARNINGS="ignore", MEGACACHE_KERNEL_DIR=compiled_kernels)
    done = subprocess.run(["bash", os.path.join(REPO, "tests", "sample_job.sh"), out], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith(f"megacache kernels: already compiled for this CPU and this megacache: "
                                  f"{compiled_kernels}/megacache_kernels_")
    assert "note: no kernels compiled" not in done.stderr
    assert "megacache build: 1 dataset(s), 3 GPTDataset and 0 BlendedDataset cache entries (3 built" in done.stdout
    verified = [line for line in done.stdout.splitlines() if line.startswith("ok ")]
    assert len(verified) == 4, done.stdout  # the dataset and its three cache entries
    assert os.path.isfile(os.path.join(out, "cache", "sequences_per_dataset.json"))
