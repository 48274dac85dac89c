"""What two nodes share besides the data: the lock, the filesystem itself. Two jobs on two nodes
building one cache; a lock whose holder's node is gone; a node's filesystem client dying under a
job; a full volume. Each ends clearly, publishes nothing partial, and a rerun is byte-identical."""

from __future__ import annotations

import os
import re
import signal
import time

import numpy as np

from support.inputs.corpus import run_megacache
from support.systems.faults import final_files, leftovers, wait_for_phase
from support.inputs.indexed import write_lengths
from support.sweeps import build_args

def dataset(shared: str, name: str, documents: int) -> str:
    """A new dataset under a name of its test's own: a name that an earlier test's dataset had can
    still resolve to that one on a node whose client cached it (the ``cached`` run)."""
    prefix = f"{shared}/{name}"
    write_lengths(prefix, np.random.default_rng(7).integers(1, 120, documents))
    return prefix


def reference(tmp_path, args_for) -> dict[str, bytes]:
    """The cache of one local process (the same dataset path, a local cache directory)."""
    run_megacache(1, *args_for(str(tmp_path / "reference")))
    return final_files(str(tmp_path / "reference"))


def interrupted_build(cluster, tmp_path, name: str, nodes=None):
    """A build of a million documents (a dataset ``name``) started on ``nodes`` (default: both) and
    now in its sample index phase: the job, its arguments for a cache directory, and the reference
    cache."""
    prefix = dataset(cluster.volume.path, name, 1_000_000)
    args_for = lambda cache: build_args(cache, [prefix], 32, 3_000_000)  # noqa: E731
    expected = reference(tmp_path, args_for)
    job = cluster.start(2, *args_for(f"{cluster.volume.path}/cache"), nodes=nodes, env=cluster.fast)
    # read on the brick: the host's client, caching entries, can show a phase later than it lasts
    wait_for_phase(cluster.volume.on_brick(f"{cluster.volume.path}/cache"), "sample index", job)
    return job, args_for, expected


def test_two_jobs_on_two_nodes_build_one_cache(cluster, tmp_path):
    shared = cluster.volume.path
    prefix = dataset(shared, "two-jobs", 400_000)
    args_for = lambda cache: build_args(cache, [prefix], 32, 1_000_000)  # noqa: E731
    expected = reference(tmp_path, args_for)
    jobs = [cluster.start(2, *args_for(f"{shared}/cache"), nodes=[node]) for node in cluster.nodes]
    outputs = [job.communicate(timeout=120) for job in jobs]
    assert all(job.returncode == 0 for job in jobs), outputs
    built = [int(re.search(r"\((\d+) built, (\d+) already there\)", out).group(1)) for out, _ in outputs]
    assert sorted(built) == [0, 3], outputs  # one built everything, the other reused it
    assert final_files(f"{shared}/cache") == expected
    assert not leftovers(f"{shared}/cache")


def test_a_lock_whose_holder_node_is_gone_is_broken_from_another_node(cluster, tmp_path):
    shared = cluster.volume.path
    first, second = cluster.nodes
    job, args_for, expected = interrupted_build(cluster, tmp_path, "lock", nodes=[first])
    first.kill()
    job.communicate(timeout=60)
    lost = time.monotonic()
    rerun = cluster.run(2, *args_for(f"{shared}/cache"), nodes=[second], env=cluster.fast)
    took = time.monotonic() - lost
    broken = re.search(r"breaking the stale lock \S+ \(held by pid \d+ on node1, job \w+, last heartbeat (\d+) s ago\)",
                       rerun.stderr)
    assert broken, rerun.stderr
    assert int(broken.group(1)) >= cluster.stale_s and took < cluster.stale_s + 10, (took, rerun.stderr)
    assert re.search(r"an earlier job \(\w+\) did not finish: rank 0 \(pid \d+ on node1\) was in phase "
                     r"'sample index'", rerun.stderr), rerun.stderr
    assert final_files(f"{shared}/cache") == expected
    assert not leftovers(f"{shared}/cache")


def test_a_node_filesystem_client_dying_is_a_clear_error(cluster, tmp_path):
    shared = cluster.volume.path
    node = cluster.nodes[1]
    job, args_for, expected = interrupted_build(cluster, tmp_path, "client")
    os.kill(node.client(), signal.SIGKILL)
    try:
        out, err = job.communicate(timeout=60)
    finally:
        node.remount(cluster.volume)
    assert job.returncode != 0
    assert "Transport endpoint is not connected" in err and shared in err, err
    assert "Traceback" not in err, err
    assert all(expected.get(n) == data for n, data in final_files(f"{shared}/cache").items())
    cluster.run(2, *args_for(f"{shared}/cache"), env=cluster.fast)
    assert final_files(f"{shared}/cache") == expected
    assert not leftovers(f"{shared}/cache")


def test_a_full_volume_is_a_clear_error_and_the_rerun_after_freeing_space_succeeds(cluster, small_volume, tmp_path):
    shared, small = cluster.volume.path, small_volume.path
    prefix = dataset(shared, "full", 200_000)
    args_for = lambda cache: build_args(cache, [prefix], 32, 600_000)  # noqa: E731
    expected = reference(tmp_path, args_for)
    needed = sum(len(data) for data in expected.values())
    free = os.statvfs(small).f_bavail * os.statvfs(small).f_frsize
    with open(f"{small}/filler", "wb") as f:
        f.write(b"\0" * (free - needed // 2))
    failed = cluster.run(2, *args_for(f"{small}/cache"), check=False)
    assert failed.returncode == 2, failed.stderr
    assert "No space left on device" in failed.stderr and small in failed.stderr, failed.stderr
    assert "Traceback" not in failed.stderr, failed.stderr
    assert all(expected.get(n) == data for n, data in final_files(f"{small}/cache").items())
    os.unlink(f"{small}/filler")
    # The bricks may free a deleted file's space after the unlink returns: rerun once it shows.
    deadline = time.monotonic() + 60
    while os.statvfs(small).f_bavail * os.statvfs(small).f_frsize < free - needed and time.monotonic() < deadline:
        time.sleep(0.2)
    cluster.run(2, *args_for(f"{small}/cache"))
    assert final_files(f"{small}/cache") == expected
    assert not leftovers(f"{small}/cache")
