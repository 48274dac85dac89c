"""--split strings megatron-core would read otherwise than they are written. It keeps each run of
digits and dots and drops everything else without a word, so '-1,50,51' trains on 1, 50, 51 and
'a1,b' on 1, 0, 0. megacache builds what Megatron reads (the cache name hashes the string, and its
numbers must stay Megatron's) and warns, saying what Megatron reads; a string Megatron cannot use
(more than three weights, weights that sum to 0) is refused, saying how it reads it. A string read
as written though not as documented, by commas ('99/1/0', '90;10'), builds, with a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megacache.interfaces import cli
from support.inputs.indexed import write_lengths

BUILD = ["build", "--data-path", "d", "--seq-length", "8", "--train-samples", "40", "--global-batch-size", "1",
         "--eval-iters", "2", "--eval-interval", "10", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
         "--data-cache-path", "cache", "--megatron-version", "0.19"]
ADVICE = "Give megacache and training alike 1 to 3 non-negative numbers separated by commas, such as '969,30,1'"


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_lengths("d", [5, 9, 0, 30, 12] * 120)
    return tmp_path


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


REFUSED = [
    ("a,b", "0, 0, 0 (train, valid, test), weights that sum to 0, which it cannot normalise, ignoring 'a', 'b'"),
    ("1e2,1,0", "4 weights, 1, 2, 1, 0, which it refuses (at most 3), ignoring 'e'"),
]
MISREAD = [
    ("a1,b", "1, 0, 0 (train, valid, test), ignoring 'a', 'b'"),
    ("-1,50,51", "1, 50, 51 (train, valid, test), ignoring '-'"),
    ("1_000,1", "1, 0, 1 (train, valid, test), ignoring '_'"),
    ("90,,10", "90, 10, 0 (train, valid, test), an empty place being no weight, not 0"),
    (",90,10", "90, 10, 0 (train, valid, test), an empty place being no weight, not 0"),
]
WARNED = ("The caches are built for that, as training will read it; if you meant otherwise, give megacache and "
          "training alike numbers separated by commas, such as '969,30,1'")


@pytest.mark.parametrize("split, read", REFUSED, ids=[repr(split) for split, _ in REFUSED])
def test_a_split_megatron_cannot_use_is_refused_saying_how_it_reads_it(split, read, here, capsys):
    before = sorted(os.listdir())
    status, out, err = run([*BUILD, f"--split={split}"], capsys)
    assert (status, out) == (2, "")
    assert err == (f"megacache build: error: --split {split!r}: megatron-core reads only the runs of digits and dots "
                   f"in a split, so it would read this as {read}. {ADVICE}\n")
    assert sorted(os.listdir()) == before


@pytest.mark.parametrize("split, read", MISREAD, ids=[repr(split) for split, _ in MISREAD])
def test_a_split_megatron_misreads_is_built_as_it_reads_it_with_a_warning(split, read, here, capsys):
    status, out, err = run([*BUILD, f"--split={split}", "--dry-run", "--json", "--verbose"], capsys)
    assert status == 0, err
    assert err == (f"megacache build: warning: --split {split!r}: megatron-core reads only the runs of digits and "
                   f"dots in a split, so it reads this as {read}. {WARNED}\n")
    weights = [float(w) for w in read.split(" (")[0].split(", ")]
    matrix = [json.loads(e["description"])["split_matrix"] for e in json.loads(out)["entries"]]
    assert matrix and all(m[0][1] == pytest.approx(weights[0] / sum(weights)) for m in matrix)
    assert sorted(os.listdir()) == ["d.bin", "d.idx"]


def test_a_split_read_as_meant_through_other_separators_builds_with_a_warning(here, capsys):
    """The cache is named from the string as given, with the numbers of the same weights written with commas."""
    def dry_run(split: str) -> tuple[str, list[dict]]:
        status, out, err = run([*BUILD, "--split", split, "--dry-run", "--json", "--verbose"], capsys)
        assert status == 0, err
        return err, [json.loads(e["description"]) for e in json.loads(out)["entries"]]

    err, slashes = dry_run("99/1/0")
    assert err == ("megacache build: warning: --split '99/1/0': megatron-core reads the numbers only, whatever "
                   "is around them: 99, 1, 0 (train, valid, test); the cache name hashes the string as given, so give "
                   "training this same --split\n")
    err, commas = dry_run("99,1,0")
    assert err == ""
    assert [d["split"] for d in slashes] == ["99/1/0"] * 2 and [d["split"] for d in commas] == ["99,1,0"] * 2
    assert [d["split_matrix"] for d in slashes] == [d["split_matrix"] for d in commas] == \
        [[[0, 0.99], [0.99, 1.0], None]] * 2
    assert sorted(os.listdir()) == ["d.bin", "d.idx"]


def test_plain_splits_say_nothing_and_other_separators_warn(here, capsys):
    for split in ("969, 30, 1", "90,5,5", ".5,.5", " 99,1 "):
        status, _, err = run([*BUILD, "--split", split, "--dry-run"], capsys)
        assert (status, err) == (0, ""), split
    for split, read in (("90;10", "90, 10, 0"), ("90 5 5", "90, 5, 5"), ("[90, 5, 5]", "90, 5, 5"),
                        ("9,1,", "9, 1, 0")):
        status, _, err = run([*BUILD, "--split", split, "--dry-run"], capsys)
        assert status == 0 and err.startswith(f"megacache build: warning: --split {split!r}: megatron-core reads the "
                                              f"numbers only, whatever is around them: {read} (train, valid, "
                                              f"test);"), (split, err)


def test_a_misread_split_from_the_shell(here):
    done = subprocess.run([sys.executable, "-m", "megacache", *BUILD, "--split=-1,50,51", "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("megacache build: warning: --split '-1,50,51': megatron-core reads only the runs "
                                  "of digits and dots in a split, so it reads this as 1, 50, 51 (train, valid, "
                                  "test), ignoring '-'."), done.stderr
    assert sorted(os.listdir(here)) == ["d.bin", "d.idx"]
