"""Faults across nodes, on two emulated nodes of two ranks each sharing a GlusterFS volume: a node
lost, a node hung, SIGTERM to every rank (Slurm's preemption and ``scancel``), two jobs on two nodes
building one cache, a lock whose holder's node is gone, a node's filesystem client dying, a full
volume. After each: nothing partial is visible (every file under its final name equals an
uninterrupted run's), and a rerun on the cluster is byte-identical and leaves nothing behind.

Trials kill at random moments: a random phase, read from the ranks' own records, and a random
delay within it. The run's summary gets, per fault, the trials, where they landed and the seconds
each job took to end ("reports")."""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass

import numpy as np
import pytest

from support.systems.cluster import CACHING_S
from support.inputs.corpus import documents, run_megacache, write_jsonl
from support.systems.faults import current_phases, final_files, leftovers, lock_held, settled_files
from support.inputs.indexed import write_lengths
from support.sweeps import build_args

TRIALS = 5
#: a job that lost a node to a hang ends within the stale time and this margin
ENDS_WITHIN_MARGIN_S = 5
#: the one-prefix build's sizes: a few seconds on two nodes of two ranks
SEQ_LENGTH, SAMPLES = 32, 3_000_000


@dataclass
class Workload:
    name: str
    args: list[str]
    outputs: str                 # where a reader looks
    phases: list[str]            # where faults are aimed
    reference: dict[str, bytes]


def build_workload(shared: str, local: str) -> Workload:
    prefix = f"{shared}/big"
    write_lengths(prefix, np.random.default_rng(5).integers(1, 120, 1_000_000))
    args = build_args(f"{shared}/cache", [prefix], SEQ_LENGTH, SAMPLES)
    run_megacache(1, *build_args(f"{local}/cache", [prefix], SEQ_LENGTH, SAMPLES))
    return Workload("build", args, f"{shared}/cache", ["startup", "document index", "sample index", "publish"],
                    final_files(f"{local}/cache"))


def tokenize_workload(shared: str, local: str) -> Workload:
    os.makedirs(f"{shared}/corpus", exist_ok=True)
    docs = documents(12000, seed=11)
    for i in range(8):
        write_jsonl(f"{shared}/corpus/shard{i}.jsonl", docs[i::8])
    os.makedirs(f"{shared}/tokens", exist_ok=True)
    os.makedirs(f"{local}/tokens", exist_ok=True)
    flags = ["--tokenizer", "byte", "--append-eod", "--unit-bytes", "64K"]
    run_megacache(1, "tokenize", "--input", f"{shared}/corpus", "--output-prefix", f"{local}/tokens/out", *flags)
    return Workload("tokenize", ["tokenize", "--input", f"{shared}/corpus", "--output-prefix",
                                 f"{shared}/tokens/out", *flags], f"{shared}/tokens",
                    ["startup", "tokenizing", f"writing {shared}/tokens/out_text_document"],
                    final_files(f"{local}/tokens"))


@pytest.fixture
def workloads(cluster, tmp_path):
    return [build_workload(cluster.volume.path, str(tmp_path)), tokenize_workload(cluster.volume.path, str(tmp_path))]


def reset(workload: Workload) -> None:
    """The workload's outputs removed, its inputs kept."""
    import shutil

    shutil.rmtree(workload.outputs)
    os.makedirs(workload.outputs)


def start_and_wait_for(cluster, workload: Workload, rng, env: dict, phases: list[str]) -> tuple[subprocess.Popen, str | None]:
    """Start the workload on both nodes and return once it reaches a random one of ``phases`` (plus
    a random delay), with the phases its ranks were in; None if it finished first."""
    target = phases[int(rng.integers(0, len(phases)))]
    job = cluster.start(2, *workload.args, env=env)
    deadline = time.monotonic() + 120
    while job.poll() is None and time.monotonic() < deadline:
        phases = current_phases(workload.outputs)
        if target in phases or (target == "startup" and all(len(n.ranks()) == 2 for n in cluster.nodes)):
            time.sleep(float(rng.uniform(0, 0.05 if target != "startup" else 1.5)))
            return job, "/".join(sorted(current_phases(workload.outputs))) or "startup"
        time.sleep(0.005)
    return job, None


def check_and_rerun(cluster, workload: Workload, what: str) -> subprocess.CompletedProcess:
    visible = final_files(workload.outputs)
    wrong = [n for n, data in visible.items() if workload.reference.get(n) != data]
    assert not wrong, f"{what}: partial or wrong files visible: {wrong}"
    rerun = cluster.run(2, *workload.args, env=cluster.fast)
    assert final_files(workload.outputs) == workload.reference, f"{what}: the rerun differs"
    assert not leftovers(workload.outputs), f"{what}: left behind: {leftovers(workload.outputs)}"
    reset(workload)
    return rerun


def ended(job: subprocess.Popen, since: float, timeout: float = 120, kill: bool = True) -> tuple[float, str]:
    """Seconds from ``since`` to the job's end, and its stderr; past ``timeout``, it fails (or,
    ``kill=False``, raises ``TimeoutExpired`` with the job still running)."""
    try:
        _, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if not kill:
            raise
        job.kill()
        raise AssertionError(f"the job did not end within {timeout} s of the fault")
    return time.monotonic() - since, err


def summary(cluster, name: str, landed: list[str], seconds: list[float]) -> str:
    where: dict[str, int] = {}
    for phase in landed:
        where[phase] = where.get(phase, 0) + 1
    return (f"{name}, clients caching {cluster.volume.caching}: {len(landed)} trials, {sum(p != 'finished first' for p in landed)} mid-job; ended in "
            f"{min(seconds):.2f}-{max(seconds):.2f} s (median {statistics.median(seconds):.2f}); landed in "
            + ", ".join(f"{k} x{v}" for k, v in sorted(where.items())) + "; all clean, reruns identical")


def run_fault_trials(cluster, workloads, seed: int, fault, check_end, startup: bool = True,
                     resume=None) -> tuple[list[str], list[float], list]:
    """TRIALS faults landing mid-job (alternating workloads), in any phase or (``startup=False``)
    once the job holds its lock: ``fault(job, rng)`` injects it and returns its time;
    ``check_end(workload, job, stderr, seconds, phases)`` judges how the job ended. A fault that
    lets the job run on (a hang) gives ``resume``: when the job has not ended within the stale time
    and ENDS_WITHIN_MARGIN_S but had published everything, it is resumed and, if it then ends cleanly,
    counts as finished first.
    Where the faults landed, the seconds each job took to end, and (workload, rerun) of each."""
    rng = np.random.default_rng(seed)
    ends_within = cluster.stale_s + ENDS_WITHIN_MARGIN_S
    landed, seconds, reruns = [], [], []
    trial = 0
    while sum(p != "finished first" for p in landed) < TRIALS and trial < 3 * TRIALS:
        workload = workloads[trial % len(workloads)]
        trial += 1
        phases = workload.phases if startup else [p for p in workload.phases if p != "startup"]
        job, where = start_and_wait_for(cluster, workload, rng, cluster.fast, phases)
        if where is None or job.poll() is not None:
            _, err = ended(job, time.monotonic())
            assert job.returncode == 0, err
            landed.append("finished first")
        else:
            since = fault(job, rng)
            resumed = False
            try:
                took, err = ended(job, since, timeout=ends_within if resume else 120, kill=resume is None)
            except subprocess.TimeoutExpired:
                assert final_files(workload.outputs) == workload.reference, \
                    f"{workload.name}: the job did not end within {ends_within} s of the fault, and had not finished"
                resume()
                resumed = True
                took, err = ended(job, since)
            if resumed and job.returncode == 0:
                landed.append("finished first")
            else:  # a resumed job may already have been stopping for the hung node: judged as any other
                check_end(workload, job, err, took, where)
                landed.append(f"{workload.name}: {where}")
                seconds.append(took)
        reruns.append((workload, check_and_rerun(cluster, workload, f"{workload.name} trial {trial}")))
    assert sum(p != "finished first" for p in landed) >= TRIALS, landed
    return landed, seconds, reruns


def test_a_node_lost_mid_job(cluster, workloads, report):
    def fault(job, rng):
        node = cluster.nodes[int(rng.integers(0, 2))]
        node.kill()
        return time.monotonic()

    def check_end(workload, job, err, took, where):
        assert job.returncode != 0, err

    landed, seconds, _ = run_fault_trials(cluster, workloads, 1, fault, check_end)
    report(summary(cluster, "node lost (its 2 ranks killed)", landed, seconds))


def test_a_node_hung_mid_job(cluster, workloads, report):
    stopped: list[int] = []

    def fault(job, rng):
        node = cluster.nodes[int(rng.integers(0, 2))]
        stopped[:] = node.hang()
        return time.monotonic()

    def resume():
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def check_end(workload, job, err, took, where):
        resume()  # the hung node comes back after the job ended: what of it still runs must not publish
        assert job.returncode != 0, err
        assert re.search(r"rank \d+ \(pid \d+ on node\d\) died during phase '[^']+' \(no heartbeat", err), \
            f"status {job.returncode} after {took:.2f} s, fault in {where}: {err}"
        time.sleep(1)

    # Before a job holds its lock (MPI's start, planning) no rank records a heartbeat: a node hung
    # then is left to the launcher's and the scheduler's limits (docs/operations.md).
    landed, seconds, _ = run_fault_trials(cluster, workloads, 2, fault, check_end, startup=False, resume=resume)
    report(summary(cluster, f"node hung (ranks and filesystem client stopped; MEGACACHE_STALE_S={cluster.stale_s:.0f})",
                   landed, seconds))


def test_sigterm_to_every_rank(cluster, workloads, report):
    def fault(job, rng):
        since = time.monotonic()
        for node in cluster.nodes:
            node.signal(signal.SIGTERM, node.ranks())
        return since

    def check_end(workload, job, err, took, where):
        assert took < 10, f"{took:.1f} s"
        # The job may end as the signal is sent: what it published is then read once this client's
        # cache of the outputs, from before the other nodes renamed them, has expired.
        if job.returncode == 0:  # every rank had ended before the signal reached it
            assert settled_files(workload.outputs, CACHING_S[cluster.volume.caching]) == workload.reference, err
            return
        # every rank ended by SIGTERM after its cleanup (mpiexec reports the signal); before MPI
        # started, or once its command is done, a rank has nothing to clean up and dies of it at once
        assert job.returncode == signal.SIGTERM, (job.returncode, err)
        if where == "startup":
            return
        visible = settled_files(workload.outputs, CACHING_S[cluster.volume.caching])
        if visible == workload.reference:
            return
        assert re.search(r"stopped by SIGTERM: (.* was in phase '|while it held no lock)", err), \
            (err, sorted(set(workload.reference) - set(visible)))
        assert "rerun the same command to resume" in err and "Traceback" not in err, err
        assert not lock_held(workload.outputs), "the lock was not released"

    landed, seconds, reruns = run_fault_trials(cluster, workloads, 3, fault, check_end)
    resumed = [re.search(r"resuming: (\d+) of (\d+) units already done", rerun.stderr)
               for workload, rerun in reruns if workload.name == "tokenize"]
    report(summary(cluster, "SIGTERM to every rank (mpiexec exits 15, lock released)", landed, seconds)
           + "; tokenize reruns resumed " + ", ".join(f"{m.group(1)}/{m.group(2)}" if m else "0" for m in resumed)
           + " units")
