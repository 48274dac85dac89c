"""Crash safety with real signals: a rank of a real ``mpiexec -n 2`` job is killed with SIGKILL at a
random moment (a random phase, read from the ranks' own records), then (a) every file a reader
would load (megacache's reader or megatron-core's: the final names) is either absent or equal to an
uninterrupted run's, and (b) a rerun completes with identical bytes, leaving no temporaries, locks
or rank records behind. Per workload: tokenize, one-prefix build, blend build.

The trial counts and where each kill landed are printed in the run's summary ("reports")."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from support.inputs.corpus import children, documents, processes, write_jsonl
from support.systems.faults import current_phases, final_files, leftovers
from megacache.megatron.blends import parse_blend
from megacache.builders.build import BuildConfig, build
from megacache.builders.tokenize import TokenizeConfig, tokenize
from megacache.runtime.comm import SingleComm
from megacache.runtime.fsio import STATE_DIR
from support.inputs.indexed import write_lengths
from support.sweeps import build_args, build_sizes
from support.sweeps import NULL_TOKENIZER

TRIALS = int(os.environ.get("MEGACACHE_FAULT_TRIALS", "20"))


@dataclass
class Workload:
    name: str
    args: list[str]                     # megacache's command line
    outputs: str                        # the directory whose final files a reader loads
    rerun: Callable[[], None]           # the same job in this process (one rank)
    phases: list[str]                   # where kills are aimed (records' phase names)


def rank_processes(launcher: int) -> list[int]:
    """The python ranks below an ``mpiexec`` (its proxies' children)."""
    table = processes()
    return [rank for proxy in children(table, launcher) for rank in children(table, proxy)]


def kill_one_rank(workload: Workload, rng: np.random.Generator) -> str:
    """Start the job, kill one rank in a random phase (or the first later one seen: a short phase is
    often over between two looks), wait for the job to end; where it landed."""
    target = int(rng.integers(0, len(workload.phases)))
    env = dict(os.environ, PYTHONWARNINGS="ignore", MEGACACHE_HEARTBEAT_S="0.2")
    launcher = subprocess.Popen(["mpiexec", "-n", "2", sys.executable, "-m", "megacache", *workload.args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    landed = None
    deadline = time.monotonic() + 60
    while launcher.poll() is None and time.monotonic() < deadline:
        ranks = rank_processes(launcher.pid)
        phases = current_phases(workload.outputs)
        reached = max((workload.phases.index(p) for p in phases if p in workload.phases), default=0)
        ready = reached >= target if target else len(ranks) == 2
        if ready and len(ranks) == 2:
            time.sleep(float(rng.uniform(0, 0.03 if target else 1.0)))
            victim = ranks[int(rng.integers(0, 2))]
            landed = "/".join(sorted(current_phases(workload.outputs))) or "startup"
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                landed = None
            break
        time.sleep(0.002)
    try:
        _, stderr = launcher.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        launcher.kill()
        raise AssertionError(f"{workload.name}: the job did not end within 60 s after a rank was killed")
    if landed is None:
        assert launcher.returncode == 0, stderr
        return "finished first"
    return landed


def run_trials(workload: Workload, reference: dict[str, bytes], seed: int, report: Callable[[str], None]) -> str:
    rng = np.random.default_rng(seed)
    outcomes: dict[str, int] = {}
    kills = 0
    # A job can finish before its kill lands (a small job on a busy machine): such a trial still
    # checks the outputs, but trials go on until TRIALS kills have landed mid-job (or twice TRIALS).
    trial = 0
    while kills < TRIALS and trial < 2 * TRIALS:
        trial += 1
        landed = kill_one_rank(workload, rng)
        kills += landed != "finished first"
        visible = final_files(workload.outputs)
        wrong = [n for n, data in visible.items() if reference.get(n) != data]
        assert not wrong, f"{workload.name} trial {trial} (killed in {landed}): partial or wrong files visible: {wrong}"
        workload.rerun()
        assert final_files(workload.outputs) == reference, f"{workload.name} trial {trial}: rerun differs"
        left = leftovers(workload.outputs)
        assert not left, f"{workload.name} trial {trial}: left behind after the rerun: {left}"
        outcomes[landed] = outcomes.get(landed, 0) + 1
        reset(workload)
    summary = (f"{workload.name}: {trial} trials, {kills} ranks killed mid-job, every visible file equal to an "
               f"uninterrupted run's, every rerun byte-identical; kills landed in: "
               + ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items())))
    report(summary)
    assert kills >= TRIALS, summary
    return summary


def reset(workload: Workload) -> None:
    """Back to the state before the job: its outputs removed (inputs kept)."""
    for e in os.scandir(workload.outputs):
        if e.is_dir() and e.name == STATE_DIR:
            shutil.rmtree(e.path)
        elif e.is_file() and (e.name.endswith((".bin", ".idx", ".npy", ".txt")) and "out_" in e.name
                              or "Dataset" in e.name):
            os.unlink(e.path)


# ---------------------------------------------------------------------------------------------
# Workloads


def tokenize_workload(tmp) -> tuple[Workload, dict[str, bytes]]:
    data = tmp / "corpus"
    data.mkdir()
    docs = documents(6000, seed=11)
    for i in range(8):
        write_jsonl(str(data / f"shard{i}.jsonl"), docs[i::8])
    out = tmp / "out"
    out.mkdir()
    prefix = str(out / "out")
    args = ["tokenize", "--input", str(data), "--output-prefix", prefix, "--tokenizer", "byte", "--unit-bytes", "64K"]
    cfg = TokenizeConfig(inputs=[str(data)], output_prefix=prefix, tokenizer="byte", unit_bytes=64 << 10, threads=1)
    tokenize(cfg, SingleComm())
    reference = final_files(str(out))
    wl = Workload("tokenize", args, str(out), lambda: tokenize(cfg, SingleComm()),
                  ["startup", "tokenizing", "writing " + cfg.output_path("text")])
    reset(wl)
    return wl, reference


def gpt_workload(tmp) -> tuple[Workload, dict[str, bytes]]:
    rng = np.random.default_rng(5)
    prefix = str(tmp / "big")
    write_lengths(prefix, rng.integers(1, 120, 600_000))
    cache = tmp / "cache"
    cache.mkdir()
    cfg = BuildConfig.for_prefix(prefix, seq_length=32, sizes=build_sizes(1_500_000), tokenizer=NULL_TOKENIZER,
                                 cache_dir=str(cache))
    build(cfg, SingleComm())
    reference = final_files(str(cache))
    wl = Workload("build", build_args(str(cache), [prefix], 32, 1_500_000), str(cache),
                  lambda: build(cfg, SingleComm()),
                  ["startup", "document index", "sample index", "shuffle index", "publish"])
    reset(wl)
    return wl, reference


def blend_workload(tmp) -> tuple[Workload, dict[str, bytes]]:
    rng = np.random.default_rng(6)
    words = []
    for i in range(60):
        prefix = str(tmp / f"d{i:03d}")
        write_lengths(prefix, rng.integers(1, 200, int(rng.integers(2000, 20000))))
        words += [f"{rng.uniform(0.1, 3):.3f}", prefix]
    cache = tmp / "cache"
    cache.mkdir()
    cfg = BuildConfig(blend=parse_blend(words), seq_length=64, sizes=build_sizes(400_000),
                      tokenizer=NULL_TOKENIZER, cache_dir=str(cache))
    build(cfg, SingleComm())
    reference = final_files(str(cache))
    wl = Workload("blend", build_args(str(cache), words, 64, 400_000), str(cache), lambda: build(cfg, SingleComm()),
                  ["startup", "blend (start)", "document index", "sample index", "blend (finish)", "publish"])
    reset(wl)
    return wl, reference


@pytest.mark.parametrize("make,seed", [(tokenize_workload, 1), (gpt_workload, 2), (blend_workload, 3)],
                         ids=["tokenize", "build", "blend"])
def test_kill_one_rank_at_a_random_moment(tmp_path, make, seed, report):
    workload, reference = make(tmp_path)
    assert reference, "the reference run wrote nothing"
    run_trials(workload, reference, seed, report)
