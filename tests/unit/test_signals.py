"""The stop on SIGTERM, in one process: the same signal arriving again while the process stops
(Slurm repeats it; a rank's monitor relays a peer's stop as the signal) lets the stop finish."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from megacache.runtime.coordination import Lock, Monitor, held_by, lock_path

PROGRAM = textwrap.dedent("""
    import os, signal, sys, time
    from megacache.runtime import preemption

    # The main thread, busy in Python, runs the handler before the watcher thread gets the interpreter.
    sys.setswitchinterval(1.0)
    released = sys.argv[1]

    def leaves():
        os.kill(os.getpid(), signal.SIGTERM)  # the signal again, in the middle of the stop
        time.sleep(0.2)
        return "it leaves nothing"

    def halt(name):
        with open(released, "w") as f:
            f.write(name)

    with preemption.stoppable("test", 0):
        preemption.register((lambda: "the test was busy", leaves, halt))
        os.kill(os.getpid(), signal.SIGTERM)
        while True:
            pass
""")


def test_a_signal_again_while_stopping_lets_the_stop_finish(tmp_path):
    released = tmp_path / "released"
    job = subprocess.run([sys.executable, "-c", PROGRAM, str(released)], capture_output=True, text=True, timeout=20,
                         env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert job.returncode == -signal.SIGTERM, (job.returncode, job.stderr)
    assert "megacache test: stopped by SIGTERM: the test was busy. Nothing partial is published" in job.stderr
    assert "megacache test: it leaves nothing" in job.stderr
    assert released.read_text() == "SIGTERM"


def test_a_stopping_rank_waits_for_rank_0_whose_job_has_just_finished(tmp_path):
    """A signal between a finished job's removal of its records and rank 0's release of the lock:
    another rank, stopping, finds rank 0's record gone and waits for the lock too (mpiexec kills
    rank 0 once that rank ends); it returns when the lock goes, and at once when rank 0 says it
    stopped."""
    lock = Lock(str(tmp_path), "build", "job1", "a test")
    assert lock.acquire(wait=False)
    monitor = Monitor(str(tmp_path), "build", "job1", 1, 2, abort=None)
    monitor.close()
    path = lock_path(str(tmp_path), "build")
    releasing = threading.Timer(0.5, lock.release)
    releasing.start()
    started = time.monotonic()
    monitor.await_stopped(0, 5.0, lambda: not held_by(path, "job1"))
    waited = time.monotonic() - started
    releasing.join()
    assert 0.5 <= waited < 4 and not os.path.exists(path), waited

    with open(os.path.join(monitor.dir, "rank-0"), "w") as f:
        f.write('{"stopped": "SIGTERM"}')
    started = time.monotonic()
    monitor.await_stopped(0, 5.0, lambda: False)
    assert time.monotonic() - started < 1
