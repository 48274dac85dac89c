"""Nothing damaged passes as complete: a cache file cut short, extended, or with a byte of its
header or description flipped makes its entry "damaged" in ``build --dry-run``; ``build`` rebuilds
exactly the damaged entries (and says which), or with ``--no-rebuild`` refuses them and changes
nothing; ``open_cache`` and ``prepare_cache`` refuse them. A dataset ``.idx`` whose header counts or
size are wrong is refused by every command that opens it. Each case runs the command as a user
would (in this process) and checks the exit status, the message and the files left."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from megacache.errors import CacheDamaged
from megacache.interfaces import cli
from megacache.interfaces.api import BuildConfig, open_cache
from megacache.megatron.blends import parse_blend
from megacache.megatron.tokenizer import tokenizer_identifiers
from megacache.runtime.comm import get_comm
from support import run_cli, shared_directory
from support.inputs.indexed import write_lengths

COMMAND = ["build", "--data-path", "0.5", "a", "0.5", "b", "--seq-length", "8", "--train-iters", "40",
           "--global-batch-size", "4", "--eval-iters", "2", "--eval-interval", "10", "--split", "90,8,2",
           "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--data-cache-path", "cache",
           "--megatron-version", "0.19"]
FILES = ("description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy", "dataset_index.npy",
         "dataset_sample_index.npy")


def damage_truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) - 3)


def damage_extend(path: str) -> None:
    with open(path, "ab") as f:
        f.write(b"\0" * 8)


def damage_flip(path: str) -> None:
    """A byte flipped where a reuse check can see it: the description's text, or an array's header
    (the first dimension's last digit: another shape)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if path.endswith(".txt"):
        where = len(data) // 2
    else:
        header = data[:data.index(b"\n") + 1]
        where = header.index(b"'shape': (") + len(b"'shape': (")
        while chr(header[where + 1]).isdigit():
            where += 1
    data[where] ^= 0x01
    with open(path, "r+b") as f:
        f.write(data)


DAMAGES = {"truncated": damage_truncate, "extended": damage_extend, "flipped": damage_flip}


@pytest.fixture
def built(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_lengths("a", [5, 9, 0, 30, 12] * 40)
    write_lengths("b", [7, 3, 22, 11] * 50)
    assert cli.main(COMMAND) == 0
    capsys.readouterr()
    return tmp_path


def snapshot() -> dict:
    out = {}
    for name in sorted(os.listdir("cache")):
        path = os.path.join("cache", name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out[name] = (os.stat(path).st_mtime_ns, hashlib.sha256(f.read()).hexdigest())
    return out


def cases():
    return [(what, how) for what in FILES for how in DAMAGES]


@pytest.mark.parametrize("what, how", cases(), ids=[f"{w} {h}" for w, h in cases()])
def test_a_damaged_entry_is_reported_rebuilt_or_refused(what, how, built, capsys):
    before = snapshot()
    victim = sorted(n for n in before if n.endswith(f"-train-{what}"))[0]
    stem = victim[:-len(what) - 1]
    DAMAGES[how](os.path.join("cache", victim))
    damaged = snapshot()

    assert cli.main([*COMMAND, "--dry-run", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    states = {e["md5"]: e["state"] for e in entries}
    victim_md5 = stem.split("-")[0]
    assert states.pop(victim_md5) == "damaged" and set(states.values()) == {"complete"}
    [record] = [e for e in entries if e["md5"] == victim_md5]
    assert len(record["damage"]) == 1 and record["damage"][0].startswith(f"{what}: ")

    status, err = run_cli(["inspect", "cache", "--megatron-version", "0.19"], capsys)  # as verify would
    assert status == 2 and re.fullmatch(r"megacache inspect: error: [12] problem\(s\) found\n", err)

    status, err = run_cli([*COMMAND, "--no-rebuild"], capsys)
    assert status == 2 and snapshot() == damaged
    assert err.startswith("megacache build: error: 1 existing cache entry is damaged (training would fail on it):\n"
                          f"  cache/{stem}-description.txt: {what}: ")
    assert err.endswith("`megacache build` without --no-rebuild (BuildConfig.rebuild_damaged) rebuilds it\n")

    cfg = BuildConfig(blend=parse_blend(["0.5", "a", "0.5", "b"]), split="90,8,2", seq_length=8,
                      sizes=(160, 40, 8), tokenizer=tokenizer_identifiers("NullTokenizer", vocab_size=100,
                                                                         megatron_version="0.19"),
                      cache_dir="cache", megatron_version="0.19")
    with pytest.raises(CacheDamaged, match=f"cache/{stem}-description.txt: {what}: "):
        open_cache(cfg)

    status, err = run_cli(COMMAND, capsys)
    assert status == 0
    assert err.startswith(f"megacache: warning: rebuilding 1 damaged cache entry:\n  cache/{stem}-description.txt: ")
    after = snapshot()
    # the damaged entry's files rewritten as they were; every other file untouched
    assert {n: h for n, (_, h) in after.items()} == {n: h for n, (_, h) in before.items()}
    assert {n for n in after if after[n][0] != damaged[n][0]} <= {n for n in after if n.startswith(stem)}
    assert after[victim][0] != damaged[victim][0]


def test_the_damage_is_named(built, capsys):
    gpt = sorted(n for n in os.listdir("cache") if n.endswith("-train-shuffle_index.npy"))[0]
    os.truncate(os.path.join("cache", gpt), 1000)
    blend = sorted(n for n in os.listdir("cache") if n.endswith("-train-dataset_index.npy"))[0]
    damage_flip(os.path.join("cache", blend))
    assert cli.main([*COMMAND, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(2 damaged, 7 complete)" in out.splitlines()[0]
    assert "         shuffle_index.npy: 1,000 bytes, its header says " in out
    assert "         dataset_index.npy: holds <i2 (161,), the entry's array is <i2 (160,)\n" in out


@pytest.mark.parametrize("how", ["extended", "count"])
def test_an_index_whose_header_or_size_is_wrong_is_refused(how, built, capsys):
    if how == "extended":
        damage_extend("a.idx")
    else:  # the sequence count's low byte, one less: every array after it misplaced
        with open("a.idx", "r+b") as f:
            f.seek(18)
            count = f.read(1)[0]
            f.seek(18)
            f.write(bytes([count - 1]))
    before = snapshot()
    status, err = run_cli(COMMAND, capsys)
    assert status == 2 and snapshot() == before
    assert err.startswith("megacache build: error: ") and err.endswith(
        "  rank 0: a.idx: " + ("4050 bytes, but S=200 sequences and C=201 document entries make exactly 4042" if
                               how == "extended" else "4042 bytes, but S=199 sequences and C=201 document entries "
                                                      "make exactly 4030")
        + ": its header is damaged or the file was extended; re-create the dataset\n")


def test_a_build_that_reuses_every_entry_reports_its_checks_as_phases(built, capsys):
    status, out = cli.main(COMMAND), capsys.readouterr().out
    assert status == 0 and "(0 built, 9 already there)" in out, out
    phases = re.search(r"^  phases: (.*)$", out, re.MULTILINE).group(1)
    assert re.fullmatch(r"plan [0-9.]+ s, drift_check [0-9.]+ s, damage_check [0-9.]+ s", phases), phases


@pytest.mark.mpi(min_size=2)
def test_the_damage_check_dealt_over_ranks_finds_each_damaged_entry(monkeypatch, capsys):
    comm = get_comm()
    said = []  # rank 0's outputs, checked once every rank is past its collectives
    with shared_directory(comm, "megacache-damage-") as root:
        monkeypatch.chdir(root)
        if comm.rank == 0:
            write_lengths("a", [5, 9, 0, 30, 12] * 40)
            write_lengths("b", [7, 3, 22, 11] * 50)
        comm.barrier()
        assert cli.main(COMMAND) == 0
        if comm.rank == 0:  # one file of every entry but one
            victims = sorted(n for n in os.listdir("cache") if n.endswith(("-sample_index.npy", "-dataset_index.npy")))
            for n in victims[1:]:
                damage_truncate(os.path.join("cache", n))
        comm.barrier()
        capsys.readouterr()
        said.append(cli.main(COMMAND))
        said.append(capsys.readouterr().err)
        said.append(cli.main([*COMMAND, "--dry-run"]))
        said.append(capsys.readouterr().out)
    assert said[0] == 0 and said[2] == 0
    if comm.rank == 0:
        assert said[1].startswith("megacache: warning: rebuilding 8 damaged cache entries:\n")
        assert "(9 complete)" in said[3].splitlines()[0]
