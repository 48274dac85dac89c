"""Several jobs on one cache: two builds started together, the lock's stale detection, and a rank
that dies where no launcher stops the job (the ring monitor does, naming the rank and phase)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from support.inputs.corpus import free_port
from megacache.builders.build import BuildConfig, build
from megacache.runtime.comm import SingleComm
from megacache.errors import MegacacheError
from megacache.runtime.coordination import Lock, Monitor, guarded, post_mortem, this_process
from megacache.runtime.environment import stale_s
from support.inputs.indexed import write_lengths
from support.sweeps import NULL_TOKENIZER, cache_files
from support.sweeps import build_args, build_sizes

ENV = dict(os.environ, PYTHONWARNINGS="ignore", MEGACACHE_HEARTBEAT_S="0.2")


def a_dead_process() -> dict:
    """The identity of a process that has exited (this machine)."""
    proc = subprocess.Popen([sys.executable, "-c", "import os; print(open(f'/proc/{os.getpid()}/stat').read())"],
                            stdout=subprocess.PIPE, text=True)
    stat = proc.communicate()[0]
    record = this_process()
    record.update(pid=proc.pid, start=int(stat.rsplit(")", 1)[1].split()[19]))
    return record


def test_two_builds_started_together_end_with_one_correct_cache(tmp_path):
    rng = np.random.default_rng(1)
    prefix = str(tmp_path / "d")
    write_lengths(prefix, rng.integers(1, 100, 300_000))
    reference = tmp_path / "reference"
    build(BuildConfig.for_prefix(prefix, seq_length=32, sizes=build_sizes(600_000), tokenizer=NULL_TOKENIZER,
                                 cache_dir=str(reference)), SingleComm())
    cache = str(tmp_path / "cache")
    args = build_args(cache, [prefix], 32, 600_000)
    jobs = [subprocess.Popen(["mpiexec", "-n", str(n), sys.executable, "-m", "megacache", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for n in (2, 1)]
    outputs = [job.communicate(timeout=300) for job in jobs]
    for job, (out, err) in zip(jobs, outputs):
        assert job.returncode == 0, out + err
    assert cache_files(cache) == cache_files(str(reference))
    # Exactly one job built the entries: the other waited for the lock and then reused them all,
    # or found them built when it planned.
    built = [int(re.search(r"\((\d+) built", out).group(1)) for out, _ in outputs]
    assert sorted(built) == [0, 3], outputs
    assert not [n for n in os.listdir(cache) if ".megacache-tmp" in n]
    assert os.listdir(os.path.join(cache, ".megacache")) == ["manifest.json"]


def test_two_tokenizes_of_one_prefix_started_together(tmp_path):
    from support.inputs.corpus import documents, write_jsonl

    write_jsonl(str(tmp_path / "in.jsonl"), documents(3000, seed=4))
    prefix = str(tmp_path / "out")
    cmd = [sys.executable, "-m", "megacache", "tokenize", "--input", str(tmp_path / "in.jsonl"),
           "--output-prefix", prefix, "--tokenizer", "byte", "--unit-bytes", "32K"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=ENV, check=True)
    reference = {n: open(tmp_path / n, "rb").read() for n in ("out_text_document.bin", "out_text_document.idx")}
    for n in reference:
        os.unlink(tmp_path / n)
    jobs = [subprocess.Popen(["mpiexec", "-n", "2", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=ENV) for _ in range(2)]
    for job in jobs:
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, out + err
    assert {n: open(tmp_path / n, "rb").read() for n in reference} == reference, first.stdout
    assert sorted(os.listdir(tmp_path)) == [".megacache", "in.jsonl", *sorted(reference)]
    assert os.listdir(tmp_path / ".megacache") == ["out_text_document.made-from.json"]  # what made it


def test_a_lock_held_by_a_live_job_waits_and_a_dead_holders_lock_is_broken(tmp_path):
    holder = Lock(str(tmp_path), "cache", "job1", "a test holder")
    assert holder.acquire()
    other = Lock(str(tmp_path), "cache", "job2", "another")
    assert not other.acquire(wait=False)            # this process is alive: no breaking
    holder.release()
    assert other.acquire(wait=False)
    other.release()

    # A holder on this machine whose process has exited: broken at once, whatever its heartbeat.
    with open(holder.path, "w") as f:
        json.dump({**a_dead_process(), "token": "t-dead", "job": "dead"}, f)
    said = []
    taker = Lock(str(tmp_path), "cache", "job3", "taker")
    assert taker.acquire(said.append, wait=False)
    assert "breaking the stale lock" in said[0] and "job dead" in said[0]
    taker.release()


def test_a_holder_elsewhere_is_judged_by_its_heartbeat(tmp_path, monkeypatch):
    lock = Lock(str(tmp_path), "cache", "job", "test")
    os.makedirs(os.path.dirname(lock.path))
    with open(lock.path, "w") as f:
        json.dump({"host": "another-node", "boot": "x", "pid": 1, "start": 1, "token": "far", "job": "far"}, f)
    monkeypatch.setenv("MEGACACHE_STALE_S", "30")
    assert not lock.acquire(wait=False)             # fresh heartbeat: alive
    past = time.time() - 31
    os.utime(lock.path, (past, past))
    assert lock.acquire(wait=False)                 # 31 s without a heartbeat: dead
    lock.release()
    monkeypatch.setenv("MEGACACHE_STALE_S", "soon")
    with pytest.raises(MegacacheError, match=r"\$MEGACACHE_STALE_S='soon': expected a number of seconds"):
        stale_s()


def test_a_holder_whose_lock_was_taken_refuses_to_publish(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGACACHE_HEARTBEAT_S", "0.05")
    lock = Lock(str(tmp_path), "cache", "job", "test")
    lock.acquire()
    with open(lock.path, "w") as f:   # another job judged this one dead and took the lock
        json.dump({**this_process(), "token": "someone-else"}, f)
    time.sleep(0.3)
    with pytest.raises(MegacacheError, match="lost its lock"):
        lock.check_held()
    lock.release()
    assert os.path.exists(lock.path), "a lost lock is the new holder's: never removed"


def test_post_mortem_names_each_rank_and_phase_and_removes_temporaries(tmp_path):
    with guarded(SingleComm(), [str(tmp_path)], "cache", ("",), "test") as guard:
        guard.enter("sample index")
        job = guard.job
        open(tmp_path / ".x.npy.megacache-tmp-abc", "w").close()
        # as if killed at this point: the records stay
        records = os.path.join(tmp_path, ".megacache", f"cache.job-{job}")
        saved = {n: open(os.path.join(records, n)).read() for n in os.listdir(records)}
    os.makedirs(records)
    for n, text in saved.items():
        with open(os.path.join(records, n), "w") as f:
            f.write(text)
    left = post_mortem(str(tmp_path), "cache", "new", ("",))
    assert left.temporaries == 1 and not os.path.exists(tmp_path / ".x.npy.megacache-tmp-abc")
    assert len(left.reports) == 1
    assert f"an earlier job ({job}) did not finish: rank 0 (pid {os.getpid()}" in left.reports[0]
    assert "was in phase 'sample index'" in left.reports[0]


# Two ranks over a torch.distributed gloo group started by hand (no launcher that would kill the
# survivor): rank 1 is killed in the middle of the build, rank 0 is then blocked in a collective.
RANK = textwrap.dedent("""
    import os, sys, datetime
    import torch.distributed as dist
    from megacache.builders.build import BuildConfig, build
    from megacache.runtime.comm import TorchComm
    from megacache.errors import MegacacheError
    from megacache.megatron.tokenizer import tokenizer_identifiers
    rank, port, prefix, cache = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank,
                            timeout=datetime.timedelta(seconds=600))
    cfg = BuildConfig.for_prefix(prefix, seq_length=16, sizes=(3_000_000, 1000, 10),
                                 tokenizer=tokenizer_identifiers("NullTokenizer", vocab_size=1000), cache_dir=cache)
    try:
        build(cfg, TorchComm())
    except MegacacheError as exc:  # as the command line reports it
        sys.exit(f"megacache build: error: {exc}")
    print("finished", flush=True)
""")


def test_a_rank_that_dies_unnoticed_by_the_launcher_stops_the_job_naming_rank_and_phase(tmp_path):
    prefix = str(tmp_path / "d")
    write_lengths(prefix, np.random.default_rng(2).integers(1, 60, 2_000_000))
    cache = str(tmp_path / "cache")
    port = str(free_port())
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r), port, prefix, cache], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ENV) for r in range(2)]
    record = os.path.join(cache, ".megacache")

    def rank_1_phase() -> str | None:
        for name in os.listdir(record) if os.path.isdir(record) else []:
            try:
                with open(os.path.join(record, name, "rank-1")) as f:
                    return json.load(f)["phase"]
            except (OSError, ValueError):
                continue
        return None

    deadline = time.monotonic() + 120
    while rank_1_phase() in (None, "starting") and time.monotonic() < deadline:
        time.sleep(0.005)
    seen = rank_1_phase()
    assert seen not in (None, "starting"), "rank 1 never reached a build phase"
    ranks[1].kill()
    killed_at = time.monotonic()
    ranks[1].wait()
    # The phase its record shows once it is dead: it may have moved on between the look and the kill.
    phase = rank_1_phase() or seen
    out, err = ranks[0].communicate(timeout=120)
    waited = time.monotonic() - killed_at
    ranks[1].communicate()
    assert ranks[0].returncode != 0 and "finished" not in out
    # Whichever sees it first: rank 0's ring monitor, or rank 0's failed collective read with the records.
    monitor = r"rank 1 \(pid \d+ on \S+\) died during phase '{0}' \(its process is gone\); stopping the whole job"
    collective = r"rank\(s\) failed during {0}:\n  rank 1: died during phase '{0}' \(pid \d+ on \S+: its process is gone\)"
    assert re.search(monitor.format(phase), err) or re.search(collective.format(phase), err), err
    assert waited < 30, f"the survivor took {waited:.0f} s to stop"


def test_the_ring_monitor_stops_the_job_when_its_neighbour_is_gone(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGACACHE_HEARTBEAT_S", "0.05")
    aborted = []
    watcher = Monitor(str(tmp_path), "cache", "job", 0, 2, lambda: aborted.append(time.monotonic()))
    neighbour = os.path.join(watcher.dir, "rank-1")
    with open(neighbour, "w") as f:
        json.dump({**this_process(), "rank": 1, "phase": "sample index"}, f)
    time.sleep(0.3)
    assert not aborted, "a live neighbour must not stop the job"
    with open(neighbour, "w") as f:
        json.dump({**a_dead_process(), "rank": 1, "phase": "sample index"}, f)
    deadline = time.monotonic() + 5
    while not aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    watcher.close()
    assert aborted, "the monitor did not notice its neighbour's death"
    assert watcher.dead_ranks()[0][:2] == (1, "sample index")
