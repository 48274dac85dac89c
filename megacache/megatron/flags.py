"""Megatron-LM's command-line flags as data: which versions have each one and what it defaults to, so
that a user pastes the flags of the Megatron they train with, and a flag their version lacks is an
error naming the versions that have it."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import MegacacheError
from .versions import SUPPORTED, at_least


@dataclass(frozen=True)
class Flag:
    """One of Megatron-LM's tokenizer flags: its spellings, the versions that have it, its value."""

    names: tuple[str, ...]
    kind: str                           # "str", "int", "float", "list" (nargs='+'), "true"/"false" (switches)
    since: str = SUPPORTED[0]
    until: str | None = None            # last version that has it
    default: object = None
    help: str = ""
    #: the least value a number may take (None: any), and the values a string may take (None: any),
    #: where no value outside them works in Megatron-LM either; checked when the flag is parsed
    minimum: int | None = None
    choices: tuple[str, ...] | None = None
    #: a "list" flag's names for its values, where it takes exactly so many (None: one or more values)
    values: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        """The keyword of ``tokenizer_identifiers``: the flag's name in snake case (a switch that
        turns a setting off is named for the setting)."""
        name = self.names[0][2:]
        return name[3:].replace("-", "_") if self.kind == "false" else name.replace("-", "_")

    def exists_in(self, version: str) -> bool:
        return at_least(version, self.since) and (self.until is None or at_least(self.until, version))

    @property
    def versions(self) -> str:
        return versions_named([v for v in SUPPORTED if self.exists_in(v)])


def versions_named(versions: Sequence[str]) -> str:
    """Versions as messages name them: a run of consecutive supported versions by its ends."""
    first, last = SUPPORTED.index(versions[0]), SUPPORTED.index(versions[-1])
    if len(versions) > 2 and tuple(versions) == SUPPORTED[first:last + 1]:
        return f"{versions[0]} to {versions[-1]}"
    return " and ".join(versions) if len(versions) <= 2 else f"{', '.join(versions[:-1])} and {versions[-1]}"


def absent_from(version: str, flag: str, versions: Sequence[str]) -> str:
    """The error for ``flag`` given for ``version``, which lacks it, though ``versions`` have it."""
    return (f"{flag} does not exist in Megatron-LM {version} (it exists in {versions_named(versions)}): pass "
            f"the flags of the Megatron you train with, and --megatron-version to match it")


def number_at_least(kind: type, minimum: float):
    """An argparse type: a finite ``kind`` (int or float) of at least ``minimum``, so that a value
    that means nothing (a negative count, NaN) is an error naming its flag."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (math.isfinite(value) and value >= minimum):
            raise argparse.ArgumentTypeError(f"{text!r}: give a number of at least {minimum}")
        return value

    parse.kind = kind  # for the help's name of the value (N for a count)
    return parse


def add_flags(group, flags: Sequence[Flag], defaults: bool = False) -> None:
    """``flags`` on an argparse group; a flag not given stays absent from the namespace
    (``given_flags`` collects the rest) so that the chosen version's defaults apply, unless
    ``defaults`` asks for each flag's own default there."""
    for f in flags:
        note = "" if f.versions == f"{SUPPORTED[0]} to {SUPPORTED[-1]}" else f"(Megatron-LM {f.versions} only)"
        default = f"(default {f.default})" if f.default is not None and f.kind not in ("true", "false") else ""
        kw: dict = dict(dest=f.dest, default=f.default if defaults else argparse.SUPPRESS,
                        help=" ".join(filter(None, (f.help, default, note))) or None)
        if f.kind in ("true", "false"):
            kw["action"] = "store_true" if f.kind == "true" else "store_false"
        else:
            kind = {"int": int, "float": float}.get(f.kind, str)
            kw["type"] = kind if f.minimum is None else number_at_least(kind, f.minimum)
            if f.choices:
                kw["choices"] = f.choices
            if f.kind == "list":
                kw["nargs"] = len(f.values) if f.values else "+"
                if f.values:
                    kw["metavar"] = f.values
        group.add_argument(*f.names, **kw)


def flag_words(flags: Sequence[Flag], values: Mapping) -> list[str]:
    """``values`` (destinations and values) as the command-line words that give them, leaving out
    each value that is its flag's default."""
    words = []
    for f in flags:
        if f.dest not in values or values[f.dest] == f.default:
            continue
        value = values[f.dest]
        words.append(f.names[0])
        if f.kind == "list":
            words += [str(v) for v in value]
        elif f.kind not in ("true", "false"):
            words.append(str(value))
    return words


def given_flags(args: argparse.Namespace, flags: Sequence[Flag]) -> dict:
    return {f.dest: getattr(args, f.dest) for f in flags if hasattr(args, f.dest)}


def resolve_flags(flags: Sequence[Flag], version: str, given: Mapping) -> dict:
    """Every flag's value in ``version``: those given, the version's defaults for the rest. A flag
    the version does not have is an error naming the versions that do."""
    by_dest = {f.dest: f for f in flags}
    for dest in given:
        f = by_dest.get(dest)
        if f is None:
            raise MegacacheError(f"{dest!r} is not one of the Megatron-LM flags megacache reads here "
                                 f"({', '.join(sorted(by_dest))})")
        if not f.exists_in(version):
            raise MegacacheError(absent_from(version, f.names[0], [v for v in SUPPORTED if f.exists_in(v)]))
    return {f.dest: given.get(f.dest, f.default) for f in flags if f.exists_in(version)}


def without_defaults(flags: Sequence[Flag], values: Mapping) -> dict:
    """Keyword arguments of a Python caller, who passes every keyword it knows: None, or a value
    equal to the flag's default, is a flag not given."""
    by_dest = {f.dest: f for f in flags}
    return {k: v for k, v in values.items() if v is not None and (k not in by_dest or v != by_dest[k].default)}
