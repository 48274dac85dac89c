"""SIGTERM and SIGINT on one machine (the cluster tier does it across nodes, as root): a real
``mpiexec -n 2`` build signalled on every rank mid-phase stops at once, rank 0 says where it was,
the lock is free, every rank ends by the signal, and the rerun reports the stopped job and is
byte-identical; Ctrl-C on a one-process tokenize does the same and the rerun resumes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

from support.inputs.corpus import children, documents, processes, run_megacache, write_jsonl
from megacache.runtime.fsio import TMP_MARK
from support.systems.faults import final_files, leftovers, lock_held, wait_for_phase
from support.inputs.indexed import write_lengths
from support.sweeps import build_args

ENV = dict(os.environ, PYTHONWARNINGS="ignore", MEGACACHE_HEARTBEAT_S="0.2")


def test_sigterm_to_every_rank_of_a_build(tmp_path):
    prefix = str(tmp_path / "data")
    write_lengths(prefix, np.random.default_rng(5).integers(1, 120, 1_500_000))
    cache = str(tmp_path / "cache")
    args = build_args(cache, [prefix], 32, 4_000_000)
    run_megacache(1, *build_args(str(tmp_path / "reference"), [prefix], 32, 4_000_000))
    reference = final_files(str(tmp_path / "reference"))

    job = subprocess.Popen(["mpiexec", "-n", "2", sys.executable, "-m", "megacache", *args], env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_phase(cache, "sample index", job)
    ranks = [rank for proxy in children(processes(), job.pid) for rank in children(processes(), proxy)]
    signalled = time.monotonic()
    for rank in ranks:
        os.kill(rank, signal.SIGTERM)
    _, err = job.communicate(timeout=30)
    assert time.monotonic() - signalled < 10
    assert job.returncode == signal.SIGTERM, (job.returncode, err)  # mpiexec reports the signal
    assert re.search(r"megacache build: stopped by SIGTERM: megacache build of 3 entries was in phase "
                     r"'sample index' on rank 0\. Nothing partial is published", err), err
    assert not lock_held(cache)
    assert all(reference.get(n) == data for n, data in final_files(cache).items())

    rerun = run_megacache(2, *args)
    assert re.search(r"rank 0 \(pid \d+ on \S+\) was in phase 'sample index' \(stopped by SIGTERM\)", rerun.stderr)
    assert final_files(cache) == reference and not leftovers(cache)


def test_ctrl_c_on_a_tokenize_then_the_rerun_resumes(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = documents(24000, seed=11)
    for i in range(8):
        write_jsonl(str(corpus / f"shard{i}.jsonl"), docs[i::8])
    out = str(tmp_path / "out")
    os.makedirs(out)
    args = ["tokenize", "--input", str(corpus), "--output-prefix", f"{out}/tok", "--tokenizer", "byte", "--unit-bytes",
            "32K", "--threads", "1"]
    job = subprocess.Popen([sys.executable, "-m", "megacache", *args], env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    wait_for_phase(out, "tokenizing", job)
    work = os.path.join(out, ".tok.megacache-work")
    while not any(n.endswith(".done") for n in (os.listdir(work) if os.path.isdir(work) else [])):
        assert job.poll() is None, job.communicate()
        time.sleep(0.002)
    job.send_signal(signal.SIGINT)  # once a work unit is finished, so that the rerun has one to keep
    _, err = job.communicate(timeout=30)
    assert job.returncode == -signal.SIGINT, (job.returncode, err)  # ended by the signal: a shell says 130
    assert "megacache tokenize: stopped by SIGINT: " in err and "was in phase 'tokenizing'" in err, err
    assert "Traceback" not in err and not lock_held(out) and not final_files(out)

    rerun = run_megacache(1, *args)
    resumed = re.search(r"resuming: (\d+) of (\d+) units already done", rerun.stderr)
    assert resumed and int(resumed.group(1)) > 0, rerun.stderr
    run_megacache(1, "tokenize", "--input", str(corpus), "--output-prefix", str(tmp_path / "whole"), "--tokenizer",
                  "byte")
    assert final_files(out) == {n.replace("whole", "tok"): d for n, d in final_files(str(tmp_path)).items()
                                if n.startswith("whole")}


def test_ctrl_c_on_a_build_says_what_it_leaves_and_clean_removes_it(tmp_path):
    prefix = str(tmp_path / "data")
    write_lengths(prefix, np.random.default_rng(6).integers(1, 120, 1_500_000))
    cache = str(tmp_path / "cache")
    args = build_args(cache, [prefix], 16, 60_000_000)
    job = subprocess.Popen([sys.executable, "-m", "megacache", *args], env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    wait_for_phase(cache, "sample index", job)
    while not [n for n in os.listdir(cache) if TMP_MARK in n]:  # once it has begun writing
        assert job.poll() is None, job.communicate()
        time.sleep(0.002)
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=30)
    assert job.returncode == -signal.SIGINT, (job.returncode, err)
    said = re.search(r"on rank 0\. Nothing partial is published and the lock is released: rerun the same command to "
                     r"resume\.\nmegacache build: it leaves (\d+) temporary file\(s\) \(\d+\.\d [kMG]B\) in (\S+): a "
                     r"rerun removes them, and `megacache clean (\S+)` removes it all\n", err)
    assert said and said.group(2) == said.group(3) == cache, err
    temporaries = [n for n in os.listdir(cache) if TMP_MARK in n]
    assert int(said.group(1)) == len(temporaries) > 0

    cleaned = run_megacache(1, "clean", cache)
    assert re.fullmatch(rf"megacache clean: {cache}: an earlier job \(\w+\) did not finish: rank 0 \(pid {job.pid} "
                        rf"on \S+\) was in phase 'sample index' \(stopped by SIGINT\)\n"
                        rf"megacache clean: {cache}: removed {len(temporaries)} temporary file\(s\) \(\d+\.\d [kMG]B\), "
                        rf"1 record\(s\) of jobs that did not finish\n", cleaned.stdout), cleaned.stdout
    assert os.listdir(cache) == []
    again = run_megacache(1, "clean", cache)
    assert again.stdout == f"megacache clean: {cache}: nothing left by megacache jobs\n"
