"""Progress as a user sees it in a job's log (stderr a pipe, not a terminal): build, merge, convert
and verify, as one process and under mpiexec -n 2, show each phase with done/total, rate and ETA at
--progress-interval; the counts, summed over the ranks, reach the totals by the last line; stdout says
what it says without progress; and no progress file is left. At the default interval (30 s in a
log) short work prints no progress line, and a build that runs longer than that prints one."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from support.inputs.corpus import run_megacache
from support.systems.faults import leftovers
from support.inputs.indexed import write_lengths
from support.sweeps import TOKENIZER_FLAGS, build_args

#: one progress line: the command, each phase shown (separated by "; "), the time elapsed
LINE = re.compile(r"(build|merge|convert|verify): (.*) \| \d+(?:h\d\dm|m\d\ds|s) elapsed")
#: one phase of it: its name, percentage, done/total (counts and their unit, or sizes), rate and ETA
PART = re.compile(r"(?P<phase>[a-z ]+) (?P<percent>\d+\.\d)%: "
                  r"(?P<done>[\d.]+ ?[kMGT]?B?)/(?P<total>[\d.]+ ?[kMGT]?B?)(?: (?P<unit>[a-z]+))?, "
                  r"(?P<rate>[\d.]+ ?[kMGT]?B?(?: [a-z]+)?/s), ETA (?P<eta>\d+(?:h\d\dm|m\d\ds|s)|\?)")


def progress(stderr: str, command: str) -> list[dict[str, dict]]:
    """The progress lines of ``command`` in ``stderr``, each as its phases by name; every line whole."""
    lines = []
    for text in stderr.splitlines():
        m = LINE.fullmatch(text)
        if m and m.group(1) == command:
            parts = [PART.fullmatch(p) for p in m.group(2).split("; ")]
            assert all(parts), text
            lines.append({p["phase"]: p.groupdict() for p in parts})
    return lines


def finished(lines: list[dict[str, dict]], phases: list[str]) -> None:
    """The last line shows every phase, in order, done: its count at its total."""
    assert lines, "no progress line"
    last = lines[-1]
    assert list(last) == phases, last
    for name, p in last.items():
        assert p["percent"] == "100.0" and p["done"] == p["total"], (name, p)


def timeless(stdout: str) -> str:
    """``stdout`` less the seconds it reports."""
    return re.sub(r"\d+\.\d+ s\b", "T s", stdout)


def progress_files(directory: str) -> list[str]:
    return [os.path.join(d, n) for d, _, files in os.walk(directory) for n in files if "progress" in n]


def run(ranks: int, *args: str, **kw) -> subprocess.CompletedProcess:
    return run_megacache(ranks, *args, env={"MEGACACHE_KERNEL_DIR": "jit"}, **kw)


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_blend_build_shows_its_phases(tmp_path, ranks):
    rng = np.random.default_rng(7)
    for name in ("a", "b"):
        write_lengths(str(tmp_path / name), rng.integers(1, 120, 400_000))
    data = ["--data-path", "0.3", str(tmp_path / "a"), "0.7", str(tmp_path / "b")]

    def build(cache: str, *flags: str) -> subprocess.CompletedProcess:
        args = build_args(str(tmp_path / cache), [], 32, 12_000_000)
        return run(ranks, *args[:1], *data, *args[2:], *flags)

    shown = build("shown", "--progress-interval", "0.05")
    lines = progress(shown.stderr, "build")
    finished(lines, ["blend", "document index", "sample index", "shuffle index", "publish"])
    assert len(lines) > 1, shown.stderr
    assert not progress_files(str(tmp_path)) and not leftovers(str(tmp_path / "shown"))

    # --log-interval is the training command's own (iterations), not megacache's progress
    quiet = build("quiet", "--progress-interval", "0", "--log-interval", "1")
    assert not progress(quiet.stderr, "build") and "elapsed" not in quiet.stderr
    assert timeless(shown.stdout) == timeless(quiet.stdout).replace("/quiet", "/shown")
    assert "elapsed" not in shown.stdout

    verified = run(ranks, "verify", str(tmp_path / "shown"), "--progress-interval", "0.01")
    lines = progress(verified.stderr, "verify")
    finished(lines, ["cache entries", "blend draws"])
    assert "elapsed" not in verified.stdout and not progress_files(str(tmp_path))


@pytest.mark.parametrize("ranks", [1, 2])
def test_merge_convert_and_verify_show_their_phases(tmp_path, ranks):
    rng = np.random.default_rng(3)
    inputs = [str(tmp_path / f"part{i}") for i in range(4)]
    for prefix in inputs:
        write_lengths(prefix, rng.integers(1, 1000, 100_000))
    out = str(tmp_path / "out")

    merged = run(ranks, "merge", *inputs, "--output-prefix", out, "--chunk-bytes", "4M", "--progress-interval", "0.02")
    finished(progress(merged.stderr, "merge"), ["writing"])
    assert merged.stdout.startswith(f"megacache merge: 4 dataset(s) -> {out}.bin/.idx: 400,000 documents")

    converted = run(ranks, "convert", out, f"{out}.pbin", "--chunk-bytes", "4M", "--progress-interval", "0.02")
    lines = progress(converted.stderr, "convert")
    finished(lines, ["writing"])
    total = int(re.search(r"([\d,]+) tokens", merged.stdout).group(1).replace(",", ""))
    assert lines[-1]["writing"]["total"] == f"{total / 1e6:.2f}M", (lines[-1], total)

    checked = run(ranks, "verify", out, f"{out}.pbin", *inputs, "--progress-interval", "0.01")
    finished(progress(checked.stderr, "verify"), ["datasets"])
    assert progress(checked.stderr, "verify")[-1]["datasets"]["total"] == "6"
    assert checked.stdout.startswith(f"ok   {out}: 400,000 documents") and "elapsed" not in checked.stdout
    assert not progress_files(str(tmp_path)) and not leftovers(str(tmp_path))


def test_convert_per_file_counts_files(tmp_path):
    rng = np.random.default_rng(4)
    inputs = [str(tmp_path / f"shard{i}") for i in range(5)]
    for prefix in inputs:
        write_lengths(prefix, rng.integers(1, 1000, 50_000))
    os.makedirs(tmp_path / "out")
    done = run(2, "convert", *inputs, str(tmp_path / "out" / "*.pbin"), "--per-file", "--progress-interval", "0.01")
    finished(progress(done.stderr, "convert"), ["converting"])
    assert progress(done.stderr, "convert")[-1]["converting"]["done"] == "5"
    assert not progress_files(str(tmp_path)) and not leftovers(str(tmp_path / "out"))


def test_a_short_build_prints_no_progress_line_at_the_default_interval(tmp_path):
    write_lengths(str(tmp_path / "data"), np.random.default_rng(1).integers(1, 120, 20_000))
    done = run(1, *build_args(str(tmp_path / "cache"), [str(tmp_path / "data")], 32, 100_000))
    assert done.stderr == "", done.stderr


@pytest.mark.slow
def test_a_build_longer_than_the_default_interval_prints_progress(tmp_path):
    # A weighted blend of four datasets: 1.3e9 document-index positions of long samples in all,
    # shuffled, summed and walked by one process of a 2-core machine for longer than the default
    # interval. Their 5 GB of index files are made one dataset after another: one file that large,
    # shuffled in place beyond what the kernel lets stay dirty, would go at the disk's pace.
    data = []
    for i in range(4):
        write_lengths(str(tmp_path / f"d{i}"), np.random.default_rng(10 + i).integers(1, 120, 1_500_000))
        data += ["1", str(tmp_path / f"d{i}")]
    args = ["build", "--data-path", *data, "--split", "1,0,0", "--seq-length", "4096", "--train-samples", "18700000",
            "--global-batch-size", "8", "--eval-iters", "0", "--eval-interval", "1000", "--data-cache-path",
            str(tmp_path / "cache"), *TOKENIZER_FLAGS]
    try:
        job = subprocess.run([sys.executable, "-m", "megacache", *args], capture_output=True, text=True,
                             env=dict(os.environ, MEGACACHE_KERNEL_DIR="jit"), timeout=600)
    finally:
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)  # not kept for the session (on tmpfs: memory)
    assert job.returncode == 0, job.stderr
    seconds = float(re.search(r"in (\d+\.\d) s on 1 rank", job.stdout).group(1))
    assert seconds > 30, f"the build took {seconds} s: too short to test the default interval"
    lines = progress(job.stderr, "build")
    assert len(lines) >= 2, job.stderr  # one at the default interval, and the last
    finished(lines, ["blend", "document index", "sample index", "shuffle index", "publish"])
