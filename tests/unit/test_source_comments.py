"""Comments and docstrings keep the reason, never a number measured on one machine: every timing,
rate, speed-up and date lives in docs/benchmarks.md or benchmarks/results/ with its record. Nor do
they point at a place with a bare adverb: they name it (this function, this test, this machine).
This scans every comment and docstring of megacache/ and tests/ (Python, and the comments of the
tests' shell scripts) and names each file:line that states one."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: a number, or a range of two ("0.3-0.6", "1 to 1.5"), as a measurement states it
_NUMBER = r"(?<![\w.])~?\d[\d,]*(?:\.\d+)?(?:\s*(?:-|–|to)\s*~?\d[\d,]*(?:\.\d+)?)?"
_TIME_UNITS = r"ns|µs|us|ms|s|secs?|seconds?|mins?|minutes?|h|hours?"
_TIMING = rf"{_NUMBER}\s?(?:{_TIME_UNITS})\b"
_RATE = r"(?:[KMGT]i?B|tokens?|bytes?|samples?|steps?|documents?)/s"

PATTERNS = {
    "a date": re.compile(r"\b(?:19|20)\d\d-\d\d-\d\d\b"),
    "a timing": re.compile(rf"{_TIMING}(?:/\w+)?"),
    "a timing in words": re.compile(r"\b(?:an?|one)\s+(?:milli|micro|nano)second\b|\bof a second\b"),
    "a rate": re.compile(rf"{_NUMBER}\s?{_RATE}"),
    "a speed-up": re.compile(rf"{_NUMBER}[x×](?![\w])"),
    "a measured share": re.compile(rf"{_NUMBER}%"),
    "a measurement's wording (measured, here)": re.compile(
        r"\b(?:measured|per (?:process|rank|call|byte|token|step)|times|took|takes|costs?|slower|faster)"
        r"\s+(?:here|on this machine)\b|\(measured\b|\bmeasured\s*[:,)]", re.IGNORECASE),
    "'here' (name the place: this function, this machine, this test ...)": re.compile(
        r"\bhere\b", re.IGNORECASE),
}

#: phrasings that match a pattern but state a design value, not a measurement
ALLOWED = [
    # an interval the code keeps ("a heartbeat every 5 s"): chosen, not measured
    re.compile(rf"\bevery\s+{_TIMING}"),
    # a default, the code's own or another program's, named as one in the same sentence
    re.compile(rf"\bdefaults?\b[^.;]{{0,80}}?{_TIMING}|{_TIMING}\s*\(default\)", re.IGNORECASE),
    # a test's own clock: the heartbeat's age it sets, against MEGACACHE_STALE_S=30
    re.compile(r"\b31 s without a heartbeat"),
]


#: a line break and the comment marker after it, which a run of comment lines drops when it joins them
_MARKERS = re.compile(r"[ \t]*\n[ \t]*#[#:]*[ \t]*")


def comment_runs(comments: list[tuple[int, str, bool]]) -> list[tuple[int, str]]:
    """(first line, text) of each run of whole-line comments on consecutive lines, and of each
    comment after code, from ``comments``' (line, text, whole line)."""
    out: list[tuple[int, str]] = []
    previous = None
    for line, text, whole in comments:
        if whole and previous == line - 1:
            out[-1] = (out[-1][0], out[-1][1] + "\n" + text)
        else:
            out.append((line, text))
        previous = line if whole else None
    return out


def python_texts(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each comment run and of each docstring."""
    source = path.read_text()
    # A comment run or docstring matches a pattern only where the file's text does once its comment
    # markers are dropped as the runs drop them: most files need no tokenizing or parsing.
    if not any(pattern.search(_MARKERS.sub("\n", source)) for pattern in PATTERNS.values()):
        return []
    out = comment_runs([(tok.start[0], tok.string.lstrip("#:").strip(), tok.line.lstrip().startswith("#"))
                        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                        if tok.type == tokenize.COMMENT])
    lines = source.splitlines()
    statements: list[ast.AST] = [ast.parse(source)]
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.append((first.lineno, "\n".join(lines[first.lineno - 1:first.end_lineno])))
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                statements.extend(children)
    return out


def shell_texts(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each comment run of a shell script (``#!`` aside)."""
    comments = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        whole = stripped.startswith("#")
        text = stripped.lstrip("#").strip() if whole else line.partition(" # ")[2].strip()
        if text and not line.startswith("#!"):
            comments.append((number, text, whole))
    return comment_runs(comments)


def findings(text: str) -> list[tuple[int, str, str]]:
    """(line offset, kind, words) of each measurement ``text`` states."""
    allowed = [m.span() for pattern in ALLOWED for m in pattern.finditer(text)]
    out = []
    for kind, pattern in PATTERNS.items():
        for m in pattern.finditer(text):
            if not any(a <= m.start() < b for a, b in allowed):
                out.append((text.count("\n", 0, m.start()), kind, " ".join(m.group().split())))
    return out


def measurements(root: Path) -> list[str]:
    out = []
    for folder in ("megacache", "tests"):
        for path in sorted((root / folder).rglob("*")):
            texts = python_texts(path) if path.suffix == ".py" else shell_texts(path) if path.suffix == ".sh" else []
            found = [(line + offset, kind, words) for line, text in texts for offset, kind, words in findings(text)]
            out += [f"{path.relative_to(root)}:{line}: {kind}: {words!r}" for line, kind, words in sorted(found)]
    return out


def test_the_patterns_tell_measurements_from_design_values():
    measured = [
        "importing it took 0.2 s per process here", "(0.3-0.6 s", "1-1.5 s", "cost 60 ms", "9 us a header",
        "0.7-2.9 ns per byte", "run on 2026-11-28", "3x slower", "4.7x (natural English)", "(about 1.5 min)",
        "5-10% of the encode time", "~5 ns/token", "0.41 GB/s", "12,955,882 tokens/s", "measured here",
        "(measured)", "Measured, of 200:", "about 25,000 times here", "under a millisecond",
        "a third of a second", "files trained here", "refused here too", "Here the header is",
    ]
    design = [
        "heartbeat every few seconds", "MEGACACHE_STALE_S seconds", "(default 5)", "64 KiB", "16 MiB buffer",
        "2.5 MB of buffers", "on a second thread", "0x80000000", "20 datasets x 3 splits", "4096 x 4096",
        "3 splits", "(>= 5 % of the sequences", "measured when the entry is found", "names a process on this "
        "machine", "every rank's start", "31 s without a heartbeat: dead", "factor-10", "costs microseconds",
        "a heartbeat every 5 s", "every 30 s", "(default 30 s)", "waits 10 s (default)", "there", "where",
        "a sphere", "adhere to it", "hereafter", "whereas",
        "GlusterFS's defaults (an entry's attributes and a name's lookup for 1 s each)", "Default: 60 s",
    ]
    assert [t for t in measured if not findings(t)] == []
    assert [(t, findings(t)) for t in design if findings(t)] == []


def test_comments_and_docstrings_state_no_measurement():
    found = measurements(ROOT)
    assert found == [], "comments and docstrings keep the reason and name the place; a number goes to " \
        "docs/benchmarks.md:\n" + "\n".join(found)
