"""Paths on the shared filesystem that another node removes or creates between two of this node's
steps: each place that looks at such a path and then acts on it, run with the change landing in
between (the other node stood in for by this process, at the moment between the steps)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time

import pytest

from megacache.builders.build import _is_other_than_directory
from megacache.builders.tokenize import _finished_units, _start_work_dir
from megacache.runtime.coordination import Lock, post_mortem, state_dir
from megacache.runtime.fsio import gone, make_directories, remove_quietly


def between(monkeypatch, module_function: str, path: str, change) -> list[str]:
    """``os.<module_function>`` runs ``change()`` once, right after its first call on ``path``
    returns: another node acting between this step and the next. The calls' paths are returned."""
    real = getattr(os, module_function)
    seen: list[str] = []

    def step(target, *args, **kwargs):
        out = real(target, *args, **kwargs)
        if os.fspath(target) == path and path not in seen:
            seen.append(path)
            change()
        return out

    monkeypatch.setattr(os, module_function, step)
    return seen


def test_gone_is_enoent_and_estale_only():
    assert gone(FileNotFoundError(errno.ENOENT, "x"))
    assert gone(OSError(errno.ESTALE, "Stale file handle"))
    assert not gone(OSError(errno.ENOTCONN, "Transport endpoint is not connected"))
    assert not gone(PermissionError(errno.EACCES, "x"))


def test_a_lock_is_taken_when_the_state_directory_is_removed_right_after_it_was_made(tmp_path, monkeypatch):
    # the last job's _remove_state_dir_if_empty, on another node, between mkdir and the create
    lock = Lock(str(tmp_path), "cache", "job", "test")
    seen = between(monkeypatch, "mkdir", state_dir(str(tmp_path)), lambda: os.rmdir(state_dir(str(tmp_path))))
    assert lock.acquire(wait=False)
    assert seen and json.load(open(lock.path))["token"] == lock.record["token"]
    lock.release()


def test_a_lock_is_taken_when_a_cached_entry_answers_eexist_for_a_removed_state_directory(tmp_path, monkeypatch):
    # This node's client still holds the entry of the state directory another node removed: mkdir
    # answers EEXIST, a stat would answer ENOENT, and the create inside it ENOENT.
    lock = Lock(str(tmp_path), "cache", "job", "test")
    state = state_dir(str(tmp_path))
    real = os.mkdir
    cached = []

    def mkdir(path, *args, **kwargs):
        if path == state and not cached:
            cached.append(path)
            raise FileExistsError(errno.EEXIST, "File exists", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert lock.acquire(wait=False)
    assert cached and json.load(open(lock.path))["token"] == lock.record["token"]
    lock.release()


def test_directories_are_made_with_their_parents_and_eexist_is_taken_as_there(tmp_path, monkeypatch):
    make_directories(str(tmp_path / "a" / "b" / "c"))
    assert os.path.isdir(tmp_path / "a" / "b" / "c")
    make_directories(str(tmp_path / "a" / "b"))      # there already
    real = os.mkdir

    def mkdir(path, *args, **kwargs):   # made by another node; this client's stat says it is not
        if path.endswith("other"):
            raise FileExistsError(errno.EEXIST, "File exists", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os.path, "isdir", lambda path: False)
    make_directories(str(tmp_path / "other"))
    with pytest.raises(PermissionError):
        monkeypatch.setattr(os, "mkdir", lambda p, *a: (_ for _ in ()).throw(PermissionError(errno.EACCES, "no", p)))
        make_directories(str(tmp_path / "refused"))


@pytest.mark.parametrize("error", [errno.ESTALE, errno.ENOENT])
def test_a_directory_under_one_another_node_replaced_is_made_once_the_client_sees_it(tmp_path, monkeypatch, error):
    # a client that still resolves the replaced parent, for a few tries, answers ESTALE, or ENOENT
    # inside the parent whose mkdir answers EEXIST; then the directory is made
    parent = str(tmp_path / "state")
    target = os.path.join(parent, "job")
    real = os.mkdir
    tries = []

    def mkdir(path, *args, **kwargs):
        if len(tries) < 3 and path in (parent, target):
            if path == parent:
                raise FileExistsError(errno.EEXIST, "File exists", path)
            tries.append(path)
            raise OSError(error, os.strerror(error), path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    make_directories(target)
    assert len(tries) == 3 and os.path.isdir(target)


def test_a_directory_that_stays_stale_past_the_stale_time_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGACACHE_STALE_S", "0.2")
    monkeypatch.setattr(os, "mkdir", lambda p, *a: (_ for _ in ()).throw(OSError(errno.ESTALE, "Stale file handle", p)))
    with pytest.raises(OSError, match="Stale file handle"):
        make_directories(str(tmp_path / "never"))


def test_a_directory_under_a_link_to_nothing_fails_at_once(tmp_path, monkeypatch):
    os.symlink(str(tmp_path / "nowhere"), str(tmp_path / "link"))
    monkeypatch.setenv("MEGACACHE_STALE_S", "60")
    started = time.monotonic()
    with pytest.raises(FileNotFoundError):
        make_directories(str(tmp_path / "link" / "cache"))
    assert time.monotonic() - started < 5


def test_a_lock_is_taken_when_its_create_answers_estale_once(tmp_path, monkeypatch):
    # a client whose cached entry of the state directory names what the server no longer has
    lock = Lock(str(tmp_path), "cache", "job", "test")
    real = os.open
    stale = []

    def create(path, flags, *args):
        if path == lock.path and not stale:
            stale.append(path)
            raise OSError(errno.ESTALE, "Stale file handle", path)
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", create)
    assert lock.acquire(wait=False)
    assert stale and json.load(open(lock.path))["token"] == lock.record["token"]
    lock.release()


def test_a_lock_whose_create_fails_otherwise_is_an_error(tmp_path, monkeypatch):
    lock = Lock(str(tmp_path), "cache", "job", "test")
    real = os.open

    def create(path, flags, *args):
        if path == lock.path:
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected", path)
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", create)
    with pytest.raises(OSError, match="Transport endpoint"):
        lock.acquire(wait=False)


def test_breaking_a_lock_that_another_breaker_removed_first_does_nothing(tmp_path):
    lock = Lock(str(tmp_path), "cache", "job", "test")
    os.makedirs(os.path.dirname(lock.path))
    lock._break({"token": "dead"})   # judged stale, then renamed aside by another node first
    assert os.listdir(os.path.dirname(lock.path)) == []


def test_post_mortem_skips_a_job_whose_records_go_between_listing_and_reading(tmp_path, monkeypatch):
    # A job judged dead that was alive (a hung node come back) finishes and removes its records
    # while the next lock holder looks at them.
    state = state_dir(str(tmp_path))
    for job in ("gone", "dead"):
        os.makedirs(os.path.join(state, f"cache.job-{job}"))
        with open(os.path.join(state, f"cache.job-{job}", "rank-0"), "w") as f:
            json.dump({"rank": 0, "host": "node9", "pid": 7, "phase": "sample index"}, f)
    between(monkeypatch, "listdir", state, lambda: shutil.rmtree(os.path.join(state, "cache.job-gone")))
    left = post_mortem(str(tmp_path), "cache", "own", ("",))
    assert left.reports == ["an earlier job (dead) did not finish: rank 0 (pid 7 on node9) was in phase 'sample index'"]
    assert os.listdir(state) == []


def test_post_mortem_of_a_state_directory_removed_meanwhile_finds_nothing(tmp_path):
    assert post_mortem(str(tmp_path), "cache", "own", ("",)).reports == []


def test_a_work_directory_removed_between_its_fingerprint_and_its_listing_is_started_afresh(tmp_path, monkeypatch):
    work = str(tmp_path / "out.megacache-work")
    assert _finished_units(work, "f1") is None      # none
    _start_work_dir(work, "f1")
    with open(os.path.join(work, "unit_0000003.done"), "w") as f:
        f.write("{}")
    assert _finished_units(work, "f1") == [3]       # an identical earlier run's units reused
    # another node removes it (its remove_tree) after the fingerprint was read, before the listing
    real = os.listdir

    def listdir(path):
        if path == work and os.path.isdir(work):
            shutil.rmtree(work)
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    assert _finished_units(work, "f1") is None
    _start_work_dir(work, "f1")
    assert real(work) == ["fingerprint.json"]


def test_a_work_directory_of_other_inputs_or_torn_is_started_afresh(tmp_path):
    work = str(tmp_path / "out.megacache-work")
    _start_work_dir(work, "f1")
    open(os.path.join(work, "unit_0000001.done"), "w").close()
    assert _finished_units(work, "f2") is None      # another run's
    _start_work_dir(work, "f2")
    assert os.listdir(work) == ["fingerprint.json"]
    with open(os.path.join(work, "fingerprint.json"), "w") as f:
        f.write('["torn')
    assert _finished_units(work, "f2") is None      # torn
    _start_work_dir(work, "f2")
    assert json.load(open(os.path.join(work, "fingerprint.json"))) == {"fingerprint": "f2"}


def test_the_cache_directory_is_judged_by_one_look(tmp_path, monkeypatch):
    path = str(tmp_path / "cache")
    assert not _is_other_than_directory(path)       # not there: made later
    open(path, "w").close()
    assert _is_other_than_directory(path)           # a file: refused
    os.unlink(path)
    os.mkdir(path)
    assert not _is_other_than_directory(path)
    assert not _is_other_than_directory(str(tmp_path / "cache" / "x" / "y"))


def test_removing_what_is_gone_already_is_quiet_and_anything_else_is_an_error(tmp_path, monkeypatch):
    remove_quietly(str(tmp_path / "never"))

    def unlink(path):
        raise OSError(errno.ESTALE if path.endswith("stale") else errno.EACCES, "refused", path)

    monkeypatch.setattr(os, "unlink", unlink)
    remove_quietly(str(tmp_path / "stale"))
    with pytest.raises(PermissionError):
        remove_quietly(str(tmp_path / "x"))
