"""docs/cli.md is what ``python -m megacache.interfaces.clidoc`` prints from the parser, and that print is the
same on every machine."""

import os
import sys
from pathlib import Path

from megacache.interfaces import clidoc

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_the_generated_reference():
    assert DOC.read_text() == clidoc.reference(), \
        f"docs/cli.md differs from the parser's command reference: regenerate it with `{clidoc.COMMAND}`"


def test_the_reference_depends_on_no_terminal_and_no_machine(monkeypatch):
    wide = clidoc.reference()
    monkeypatch.setenv("COLUMNS", "30")
    assert clidoc.reference() == wide
    for local in (os.path.expanduser("~"), os.getcwd(), str(DOC.parents[1]), sys.prefix):
        assert len(local) < 2 or local not in wide, local  # "/" is in any text
