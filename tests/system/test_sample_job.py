"""The README's first command, ``pip install -e '.[mpich]' && bash tests/sample_job.sh``: the
install, the kernels compiled, the sample corpus, tokenize and build on 2 MPI ranks, verify. Under
this interpreter (the suite's own environment), and in a venv of every other Python the project
declares (3.10 to 3.13, as pyenv has them on this machine kind: support/systems/venvs.py), the kernels
compiled afresh every time, into the test's own directory."""

from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest

from support.systems.venvs import HERE, PYTHONS, REPO, interpreter, venv


def check_sample_job(done: subprocess.CompletedProcess, out, kernels: str) -> None:
    """The job passed, its first line ``kernels``'s, and it built and verified everything."""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith(kernels), done.stdout[:2000]
    assert "note: no kernels compiled" not in done.stderr
    assert "megacache build: 1 dataset(s), 3 GPTDataset and 0 BlendedDataset cache entries (3 built" in done.stdout
    assert done.stdout.count(" on 2 rank(s)") == 3, done.stdout  # tokenize, build and verify, on the ranks launched
    verified = [line for line in done.stdout.splitlines() if line.startswith("ok ")]
    assert len(verified) == 4, done.stdout  # the dataset and its three cache entries
    assert re.search(r"megacache verify: all 4 dataset\(s\) and cache entries passed in [0-9.]+ s on 2 rank\(s\)$",
                     done.stdout.rstrip()), done.stdout
    assert os.path.isfile(os.path.join(out, "cache", "sequences_per_dataset.json"))


def test_sample_job_runs_end_to_end(tmp_path, compiled_kernels):
    out = str(tmp_path / "sample_out")
    env = dict(os.environ, PYTHONWARNINGS="ignore", MEGACACHE_KERNEL_DIR=compiled_kernels)
    done = subprocess.run(["bash", os.path.join(REPO, "tests", "sample_job.sh"), out], capture_output=True, text=True,
                          env=env, timeout=600)
    check_sample_job(done, out, f"megacache kernels: already compiled for this CPU and this megacache: "
                                f"{compiled_kernels}/megacache_kernels_")


@pytest.mark.parametrize("version", [v for v in PYTHONS if v != HERE])
def test_the_readme_first_command_in_a_venv(tmp_path, version):
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} here (python{version} on PATH or pyenv's ~/.pyenv/versions/{version}.*)")
    env_dir = venv(python, version)
    out, kernels = tmp_path / "sample_out", tmp_path / "kernels"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{env_dir}/bin:{env['PATH']}", VIRTUAL_ENV=env_dir, PYTHONWARNINGS="ignore",
               PIP_DISABLE_PIP_VERSION_CHECK="1", MEGACACHE_KERNEL_DIR=str(kernels))
    done = subprocess.run(["bash", "-c", f"pip install -q -e '.[mpich]' && bash tests/sample_job.sh {out}"],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
    check_sample_job(done, out, "megacache kernels: compiled for this CPU in ")
    assert glob.glob(str(kernels / "megacache_kernels_*")), "no kernels compiled"
