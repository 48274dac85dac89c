"""Every subcommand's command line, swept. From one valid command line per subcommand, generated
changes: each flag left out; each value-taking flag the subcommand's parser has given 0, -1, NaN, a
word, an empty string, or nothing where it takes a list (a text flag: a word and an empty string);
each input file missing; conflicting flags added. A change that makes the command line invalid must
exit 2 with a message naming the flag (or the file, or the bad value) and no traceback; a change the
tables declare valid must exit 0. Each case runs in process through ``cli.main``, in a directory of
its own (a relative path a case gives lands there), so the whole sweep takes seconds.

The tables are the specification: a flag whose absence is an error is ``required``; any other
change is an error unless ``valid`` says why the command still means something. A flag added to the
parser is swept at once, so it needs an entry in these tables only where it accepts such a value.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

import pytest

from megacache.interfaces import cli
from support import run_cli
from support.inputs.indexed import write_lengths

#: stand for the sweep's input directory and for the case's own output path
T, O = "{t}", "{o}"
#: a word that is no number, no choice and no file
WORD = "nosuch"


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]                      # a valid command line
    required: frozenset = frozenset()          # flags whose absence is an error
    #: why a change leaves the command valid: keyed by (flag, value), or by flag for every value
    valid: dict = field(default_factory=dict)
    #: (words given, what the message names, flags dropped first); a flag given replaces the base's
    conflicts: tuple = ()


_IGNORED = "NullTokenizer reads no file and has no special tokens: Megatron ignores it, so does build"
_NO_PROGRESS = "no progress lines"
COMMANDS = {
    "build": Command(
        ("build", "--data-path", f"{T}/a", "--split", "90,8,2", "--seq-length", "8", "--train-samples", "40",
         "--global-batch-size", "1", "--eval-iters", "2", "--eval-interval", "10", "--tokenizer-type",
         "NullTokenizer", "--vocab-size", "100", "--data-cache-path", O, "--megatron-version", "0.19"),
        required=frozenset({"--data-path", "--seq-length", "--train-samples", "--global-batch-size",
                            "--eval-interval", "--tokenizer-type", "--vocab-size"}),
        valid={
            ("--split", "-1"): "Megatron reads the digits of --split only: '-1' is '1' (a warning says so)",
            ("--seed", "0"): "a seed",
            ("--data-cache-path", WORD): "a directory relative to the current one",
            ("--mid-level-dataset-surplus", "0"): "no surplus",
            ("--train-samples", "0"): "Megatron-LM trains on no samples",
            ("--eval-iters", "0"): "no validation or test samples",
            ("--eval-global-batch-size", "0"): "read as not given: --global-batch-size",
            ("--start-eval-at-iter", "0"): "evaluations from the start",
            ("--per-dataset-sequences-path", ""): "no sequences file (documented)",
            "--object-storage-cache-path": "read only for datasets in buckets; the local ones here need none, as "
                                           "Megatron ignores it for them",
            ("--per-dataset-sequences-path", WORD): "a file relative to the current directory",
            ("--padded-vocab-size", "0"): "the embedding's size only: never hashed",
            ("--vocab-extra-ids", "0"): "its default",
            ("--tiktoken-num-special-tokens", "0"): _IGNORED,
            ("--null-tokenizer-eod-id", "0"): "an id",
            ("--null-tokenizer-eod-id", "-1"): "Megatron takes it as given (hashed)",
            ("--null-tokenizer-pad-id", "0"): "an id",
            ("--null-tokenizer-pad-id", "-1"): "its default",
            ("--progress-interval", "0"): _NO_PROGRESS,
            **dict.fromkeys(("--tokenizer-model", "--tokenizer-metadata", "--vocab-file", "--merge-file",
                             "--tokenizer-special-tokens", "--chat-template"), _IGNORED),
        },
        conflicts=(
            (("--data-args-path", f"{T}/words"), "--data-args-path"),
            (("--train-data-path", f"{T}/a"), "--train-data-path"),
            (("--per-split-data-args-path", f"{T}/split.json"), "--per-split-data-args-path"),
            (("--train-data-path", f"{T}/a"), "--split", ("--data-path",)),
            (("--dataloader-fast-cache-load",), "--dataloader-fast-cache-load"),
            (("--bridge-config", f"{T}/bridge.yaml"), "--bridge-config"),
            (("--tokenizer-identifiers", f"{T}/ids.json", "--tokenizer-from-description", f"{T}/description.txt"),
             "--tokenizer-from-description"),
            (("--tokenizer-identifiers", f"{T}/ids.json", "--megatron-python", "python"), "--megatron-python"),
            (("--train-iters", "5"), "--train-iters"),
            (("--json",), "--json"),
            (("--data-cache-path", f"{T}/a.bin"), "--data-cache-path"),
            (("--per-dataset-sequences-path", T), "--per-dataset-sequences-path"),
        )),
    "tokenize": Command(
        ("tokenize", "--input", f"{T}/ids.jsonl", "--output-prefix", O, "--tokenizer-type", "NullTokenizer",
         "--vocab-size", "100"),
        required=frozenset({"--input", "--output-prefix", "--tokenizer-type", "--vocab-size"}),
        valid={
            ("--output-prefix", WORD): "a prefix relative to the current directory",
            "--tokenizer": _IGNORED,
            **dict.fromkeys(("--tokenizer-model", "--vocab-file", "--merge-file", "--tokenizer-special-tokens"),
                            _IGNORED),
            ("--tiktoken-num-special-tokens", "0"): _IGNORED,
            ("--eod-id", "0"): "an id",
            ("--verify-fraction", "0"): "no document checked",
            ("--progress-interval", "0"): _NO_PROGRESS,
        },
        conflicts=(
            (("--eod-id", "101"), "--eod-id"),  # NullTokenizer's ids are 0..100, EOD 100
        )),
    "merge": Command(
        ("merge", f"{T}/a", f"{T}/b", "--output-prefix", O),
        required=frozenset({"--output-prefix"}),
        valid={("--output-prefix", WORD): "a prefix relative to the current directory",
               ("--progress-interval", "0"): _NO_PROGRESS},
        conflicts=(
            ((f"{T}/a",), f"{T}/a"),
            (("--output-prefix", f"{T}/b"), f"{T}/b"),
        )),
    "convert": Command(("convert", f"{T}/a", f"{O}.pbin", "--vocab-size", "100"),
                       valid={("--progress-interval", "0"): _NO_PROGRESS}),
    "verify": Command(("verify", f"{T}/a", "--vocab-size", "100"), valid={("--progress-interval", "0"): _NO_PROGRESS}),
    "inspect": Command(("inspect", f"{T}/a")),
    "sample-corpus": Command(
        ("sample-corpus", "--output-dir", O, "--files", "1", "--documents", "5"),
        required=frozenset({"--output-dir"}),
        valid={("--output-dir", WORD): "a directory relative to the current one", ("--seed", "0"): "a seed"}),
}


def _options(command: str) -> list[argparse.Action]:
    """The subcommand's flags that take values, from the parser itself."""
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices[command]._actions if a.option_strings and a.nargs != 0]


def _bad_values(action: argparse.Action) -> list[str | None]:
    """A text flag: a word and ''; a number: 0, -1, NaN, a word and ''; None: the flag alone."""
    text = action.type in (None, str, cli.nonempty) or action.choices
    values = [WORD, ""] if text else ["0", "-1", "nan", WORD, ""]
    return values + ([None] if action.nargs == "+" else [])


def _set(argv: list[str], flag: str, words: list[str] | None) -> list[str]:
    """``argv`` without ``flag`` and its words, then with ``flag`` and ``words`` (None: without)."""
    out, skipping = [], False
    for w in argv:
        if w.startswith("--"):
            skipping = w == flag
        if not skipping:
            out.append(w)
    return out + ([flag, *words] if words is not None else [])


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    status: int                  # 2, or 0 for a change declared valid
    named: tuple[str, ...] = ()  # an error message names one of these


def cases() -> list:
    found = []
    for name, c in COMMANDS.items():
        base = list(c.argv)

        def case(label: str, argv: list[str], status: int, *named: str):
            found.append(pytest.param(Case(tuple(argv), status, named), id=f"{name} {label}"))

        for flag in (w for w in base if w.startswith("--")):
            case(f"without {flag}", _set(base, flag, None), 2 if flag in c.required else 0, flag)
        for action in _options(name):
            flag = action.option_strings[0]
            for value in _bad_values(action):
                why = c.valid.get((flag, value), None if value is None else c.valid.get(flag))
                case(f"{flag} {value!r}", _set(base, flag, [] if value is None else [value]), 0 if why else 2,
                     flag, *([value] if value == WORD else []))
        for i, word in enumerate(base):
            if word.startswith(f"{T}/"):  # an input file or dataset prefix
                case(f"missing {word}", base[:i] + [f"{T}/missing"] + base[i + 1:], 2, f"{T}/missing")
        for words, named, *dropped in c.conflicts:
            dropped = dropped[0] if dropped else ()
            argv = base
            for flag in [*dropped, *(w for w in words if w.startswith("--"))]:
                argv = _set(argv, flag, None)
            # first, so that a positional word joins the others
            case(f"with {' '.join(words)}" + "".join(f" without {d}" for d in dropped),
                 argv[:1] + list(words) + argv[1:], 2, named)
    return found


CASES = cases()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> str:
    t = tmp_path_factory.mktemp("sweep")
    write_lengths(f"{t}/a", [5, 9, 0, 30, 12] * 120)
    write_lengths(f"{t}/b", [7, 3, 11] * 20)
    (t / "ids.jsonl").write_text("".join(json.dumps({"text": f"{i} {i + 1} 7"}) + "\n" for i in range(50)))
    (t / "words").write_text(f"{t}/a\n")
    (t / "split.json").write_text(json.dumps({"train": [f"{t}/a"], "valid": [f"{t}/b"], "test": None}))
    (t / "ids.json").write_text(json.dumps({"class": "NullTokenizer", "vocab_size": "100"}))
    (t / "bridge.yaml").write_text("dataset: {}\n")
    (t / "description.txt").write_text("{}\n")
    return str(t)


def test_the_sweep_is_hundreds_of_command_lines():
    assert len(CASES) > 250
    assert len({p.id for p in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES)
def test_command_line(case: Case, inputs, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [w.replace(T, inputs).replace(O, f"{tmp_path}/o") for w in case.argv]
    status, err = run_cli(argv, capsys)
    assert "Traceback" not in err, err
    assert status == case.status, err
    if status:
        assert any(n.replace(T, inputs) in err for n in case.named), err


def test_a_bug_inside_an_agreed_phase_exits_1_with_its_traceback(inputs, capsys, tmp_path, monkeypatch):
    """What the sweep tells from a bad command line: a bug, in this test a TypeError inside the agreed
    phase that opens the datasets, is exit 1 with its traceback, not an error of the user's."""
    from megacache.builders import gpt

    def broken(*args):
        raise TypeError("injected")

    monkeypatch.setattr(gpt, "split_tokens", broken)
    argv = [w.replace(T, inputs).replace(O, f"{tmp_path}/o") for w in COMMANDS["build"].argv]
    status, err = run_cli(argv, capsys)
    assert status == 1, err
    assert "megacache build: unexpected failure, a bug in megacache" in err
    assert "during opening the datasets:\n  rank 0: Traceback" in err and "TypeError: injected" in err


def test_an_os_error_no_check_caught_is_exit_2_without_a_traceback(capsys, tmp_path, monkeypatch):
    """The system's fault or the input's, not a bug (errors.is_bug), wherever it surfaces."""
    from megacache.text import sample_corpus

    def refused(directory, **kw):
        raise PermissionError(13, "Permission denied", directory)

    monkeypatch.setattr(sample_corpus, "write_sample_corpus", refused)
    status, err = run_cli(["sample-corpus", "--output-dir", f"{tmp_path}/ro"], capsys)
    assert (status, err) == (2, f"megacache sample-corpus: error: [Errno 13] Permission denied: '{tmp_path}/ro'\n")
