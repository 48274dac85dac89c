"""The venvs in which tests/system/test_sample_job.py runs the README's first command, one for every
other Python the project declares (3.10 to 3.13, as pyenv has them on this machine kind).

Each is made the first time from nothing but the interpreter (its own venv module, as a user makes
one: pip, and nothing else) and kept, keyed by the Python and pyproject.toml; the project's declared
dependencies are installed into it then, so that the test's ``pip install -e '.[mpich]'`` installs
the project and finds the rest. ``python -m support.systems.venvs`` (tests/run_all.sh, in the background
while other tests run: mostly downloads) makes them ahead of the test, which waits for a venv still
being made (a lock beside it). Uses the standard library only: it runs before the project is
installed."""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys

try:
    import tomllib
except ImportError:  # Python 3.10: the test's own pip install then installs everything
    tomllib = None

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
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


def requirements() -> list[str]:
    """What ``pip install '.[mpich]'`` installs besides the project."""
    if tomllib is None:
        return []
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["mpich"]]


def venv(python: str, version: str) -> str:
    """The kept venv of Python ``version`` (made now if it is not there, or waited for while
    another process makes it)."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:12]
    path = os.path.join(VENVS, f"py{version}-{key}")
    os.makedirs(VENVS, exist_ok=True)
    with open(os.path.join(VENVS, f"py{version}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(path, "ready")):
            for stale in glob.glob(os.path.join(VENVS, f"py{version}-*")):  # made for another pyproject.toml
                shutil.rmtree(stale, ignore_errors=True)
            subprocess.run([python, "-m", "venv", path], check=True, timeout=300)
            needed = requirements()
            if needed:
                subprocess.run([os.path.join(path, "bin", "python"), "-m", "pip", "install", "-q",
                                "--disable-pip-version-check", *needed], check=True, timeout=1200)
            open(os.path.join(path, "ready"), "w").close()
    return path


def main() -> None:
    for version in PYTHONS:
        python = interpreter(version)
        if version != HERE and python is not None:
            print(venv(python, version), flush=True)


if __name__ == "__main__":
    main()
