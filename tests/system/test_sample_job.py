"""The README's first command, ``pip install -e '.[mpich]' && bash tests/sample_job.sh``: the
install, the kernels compiled, the sample corpus, tokenize and build on 2 MPI ranks, verify. Under
this interpreter (the suite's own environment), and in a venv of every other Python the project
declares (3.10 to 3.13, as pyenv has them on this machine kind).

Each venv is made the first time from nothing but the interpreter and kept, keyed by the Python
and the project's declared requirements, so later runs install into it again (quickly) instead of
downloading everything; the kernels compile afresh every time, into the test's own directory."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
VENVS = os.path.join(os.path.expanduser("~"), ".cache", "megacache", "venvs")


def interpreter(version: str) -> str | None:
    """pyenv's Python ``version``, else one on PATH (pyenv's shims there fail unless it is selected)."""
    pyenv = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    if pyenv:
        return pyenv[-1]
    found = shutil.which(f"python{version}")
    works = found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0
    return found if works else None


def fresh_or_kept_venv(python: str, version: str) -> str:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:12]
    path = os.path.join(VENVS, f"py{version}-{key}")
    if not os.path.exists(os.path.join(path, "ready")):
        for stale in glob.glob(os.path.join(VENVS, f"py{version}-*")):  # made for another pyproject.toml
            shutil.rmtree(stale, ignore_errors=True)
        # the interpreter's own venv module, as a user makes one: pip, and nothing else
        subprocess.run([python, "-m", "venv", path], check=True, timeout=300)
        open(os.path.join(path, "ready"), "w").close()
    return path


def check_sample_job(done: subprocess.CompletedProcess, out, kernels: str) -> None:
    """The job passed, its first line ``kernels``'s, and it built and verified everything."""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith(kernels), done.stdout[:2000]
    assert "note: no kernels compiled" not in done.stderr
    assert "megacache build: 1 dataset(s), 3 GPTDataset and 0 BlendedDataset cache entries (3 built" in done.stdout
    verified = [line for line in done.stdout.splitlines() if line.startswith("ok ")]
    assert len(verified) == 4, done.stdout  # the dataset and its three cache entries
    assert done.stdout.rstrip().endswith("megacache verify: all 4 dataset(s) and cache entries passed"), done.stdout
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
    env_dir = fresh_or_kept_venv(python, version)
    out, kernels = tmp_path / "sample_out", tmp_path / "kernels"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{env_dir}/bin:{env['PATH']}", VIRTUAL_ENV=env_dir, PYTHONWARNINGS="ignore",
               PIP_DISABLE_PIP_VERSION_CHECK="1", MEGACACHE_KERNEL_DIR=str(kernels))
    done = subprocess.run(["bash", "-c", f"pip install -q -e '.[mpich]' && bash tests/sample_job.sh {out}"],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
    check_sample_job(done, out, "megacache kernels: compiled for this CPU in ")
    assert glob.glob(str(kernels / "megacache_kernels_*")), "no kernels compiled"
