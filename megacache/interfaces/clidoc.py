"""The command reference, docs/cli.md, generated from the parser: ``python -m megacache.interfaces.clidoc >
docs/cli.md``. tests/unit/test_cli_reference.py fails when the file differs from what this prints.

The output depends on nothing but the parser (no terminal width, no argparse version's layout, no
path or core count of this machine), so that every machine prints the same file.
"""

from __future__ import annotations

import argparse
import re

from .cli import build_parser

COMMAND = "python -m megacache.interfaces.clidoc > docs/cli.md"


def _escape(text: str) -> str:
    """Plain text as Markdown: what would start markup (an HTML tag, emphasis, code) escaped."""
    return re.sub(r"([\\`*<])", r"\\\1", " ".join(text.split()))


def _documented(actions) -> list[argparse.Action]:
    """The flags and positionals --help shows, less --help itself and the subcommands."""
    return [a for a in actions if a.help != argparse.SUPPRESS
            and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar
    return "{" + ",".join(action.choices) + "}" if action.choices else action.dest.upper()


def _words(action: argparse.Action) -> str:
    """The flag (or positional) as typed: its spellings and its value's metavar."""
    name = " / ".join(action.option_strings)
    m = _metavar(action)
    if isinstance(m, tuple):  # a metavar for each of a fixed number of values
        value = " ".join(m)
    else:
        value = {None: m, "?": f"[{m}]", "*": f"[{m} ...]", "+": f"{m} [{m} ...]", 0: ""}[action.nargs]
    return " ".join(filter(None, (name, value)))


def _usage(prog: str, parser: argparse.ArgumentParser) -> str:
    """The required flags and the positionals; the rest as [options] (argparse's own wrapped usage
    differs between Python versions)."""
    actions = _documented(parser._actions)
    needed = [_words(a) for a in actions if a.required and a.option_strings]
    optional = any(not a.required for a in actions if a.option_strings)
    positional = [_words(a) for a in actions if not a.option_strings]
    return " ".join([prog, *needed, *(["[options]"] if optional else []), *positional])


def _default(action: argparse.Action) -> str | None:
    """The default worth showing: none for a switch, for a flag absent unless given, or for None."""
    d = action.default
    if action.nargs == 0 or d is None or d == argparse.SUPPRESS:
        return None
    return " ".join(map(str, d)) if isinstance(d, list) else str(d)


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    """Each group of flags under its title: every flag's words, whether required, its default, its help."""
    lines = []
    for group in parser._action_groups:
        actions = _documented(group._group_actions)
        if not actions:
            continue
        lines += ["", f"### {_escape(group.title)}", ""]
        if group.description:
            lines += [_escape(group.description), ""]
        for a in actions:
            notes = [n for n in ("required" if a.required and a.option_strings else None,
                                 f"default `{_default(a)}`" if _default(a) is not None else None) if n]
            line = f"- `{_words(a)}`" + (f" ({', '.join(notes)})" if notes else "")
            lines.append(line + (f": {_escape(a.help)}" if a.help else ""))
    return lines


def reference() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    lines = ["# megacache command reference", "",
             f"Generated from the command line's parser by `{COMMAND}`; do not edit it by hand.", "",
             "```text", parser.description.strip(), "```", "", "## megacache", "", "```text",
             "megacache [options] COMMAND ...", "```", "", "### commands", ""]
    lines += [f"- [`{name}`](#megacache-{name}): {_escape(helps[name])}" for name in sub.choices]
    lines += _flags(parser)
    for name, p in sub.choices.items():
        lines += ["", f"## megacache {name}", "", _escape(helps[name]), "",
                  *([_escape(p.description), ""] if p.description else []), "```text",
                  _usage(f"megacache {name}", p), "```", *_flags(p)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
