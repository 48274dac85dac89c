"""A mistyped or abbreviated flag is refused by the subcommand it was given to: that subcommand's
usage, the flag it most likely meant, exit 2, and nothing written. Flags are never abbreviated, as
in Megatron-LM, whose parser has allow_abbrev=False: a flag training would refuse builds
nothing in megacache.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from megacache.interfaces import cli
from support import run_cli
from support.inputs.indexed import write_lengths


CASES = [
    (["build", "--megatron-version", "0.19", "--data-path", "d", "--seq-lenght", "8"], "megacache build",
     "--seq-lenght is not a flag of Megatron-LM 0.19's training; did you mean --seq-length, --encoder-seq-length or "
     "--decoder-seq-length?"),
    (["build", "--megatron-version", "0.19", "--data-path", "d", "--dry_run"], "megacache build",
     "--dry_run is not a flag of Megatron-LM 0.19's training; did you mean --dry-run?"),
    (["inspect", "d", "--eos_id=3"], "megacache inspect", "unrecognized arguments: --eos_id=3; did you mean --eos-id?"),
    (["tokenize", "--input", "d", "--output-prefix", "o", "--json-key", "text"], "megacache tokenize",
     "unrecognized arguments: --json-key text; flags are not abbreviated (as in Megatron-LM): did you mean "
     "--json-keys?"),
    (["sample-corpus", "--output-dir", "out", "--file", "1"], "megacache sample-corpus",
     "unrecognized arguments: --file 1; flags are not abbreviated (as in Megatron-LM): did you mean --files?"),
    (["--verison", "inspect", "d"], "megacache [-h]", "unrecognized arguments: --verison; did you mean --version?"),
]


@pytest.mark.parametrize("argv, usage, hint", CASES, ids=[" ".join(argv) for argv, _, _ in CASES])
def test_a_mistyped_flag_names_the_flag_meant_in_its_subcommands_usage(argv, usage, hint, capsys, tmp_path,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_lengths("d", [5, 9, 30] * 20)
    before = sorted(os.listdir())
    status, err = run_cli(argv, capsys)
    assert status == 2
    assert err.startswith(f"usage: {usage}"), err
    prog = usage.split(" [")[0]
    assert err.endswith(f"\n{prog}: error: {hint}\n"), err
    assert sorted(os.listdir()) == before


def test_no_parser_takes_an_abbreviation():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert [name for name, p in {"megacache": parser, **sub.choices}.items() if p.allow_abbrev] == []


def test_a_mistyped_flag_from_the_shell(tmp_path):
    done = subprocess.run([sys.executable, "-m", "megacache", "build", "--megatron-version", "0.19", "--seq-lenght",
                           "4096", "--data-path",
                           str(tmp_path / "d"), "--data-cache-path", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: megacache build --data-path ... --seq-length N SAMPLES TOKENIZER [...]\n")
    assert done.stderr.endswith("megacache build: error: --seq-lenght is not a flag of Megatron-LM 0.19's training; "
                                "did you mean --seq-length, --encoder-seq-length or --decoder-seq-length?\n")
    assert os.listdir(tmp_path) == []


COMMANDS = ["", "tokenize", "build", "merge", "convert", "verify", "inspect", "sample-corpus", "kernels"]


@pytest.mark.parametrize("columns", [80, 120])
def test_help_fits_the_terminal(columns):
    for command in COMMANDS:
        done = subprocess.run([sys.executable, "-m", "megacache", *command.split(), "--help"], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "COLUMNS": str(columns)})
        assert done.returncode == 0 and done.stderr == ""
        wide = [line for line in done.stdout.splitlines() if len(line) > columns]
        assert wide == [], (command, wide)


def test_build_help_starts_with_the_data_and_marks_what_is_required():
    done = subprocess.run([sys.executable, "-m", "megacache", "build", "--help"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "100"})
    groups = [line[:-1] for line in done.stdout.splitlines() if line and not line[0].isspace() and line.endswith(":")]
    assert groups == ["data (required: one of these forms, as in Megatron-LM)", "sequences (hashed into the cache name)",
                      "samples per split (required)", "tokenizer (required)", "Megatron version",
                      "the command from a file, instead of the flags above", "the cache", "Megatron-LM's loading flags"]
    version = done.stdout.split("\nMegatron version:\n")[1].split("\n\n")[0]
    assert [line.split()[0] for line in version.splitlines() if line.startswith("  --")] == \
        ["--megatron-version", "--megatron-python"]
    assert "  --seq-length N        (required, or --encoder-seq-length)" in done.stdout
    # a flag of two spellings under its first, the other named in its help
    assert "  --no-pad-vocab-size   (embedding size only; not hashed) (Megatron-LM 0.18 to 0.20 only) (also\n" \
           "                        --disable-pad-vocab-size)" in done.stdout
