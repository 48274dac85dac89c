"""docs/architecture.md's walk of ``--seq-length`` from the command line to the kernel names real
code: every dotted name in it resolves to something in the package."""

from __future__ import annotations

import importlib
import os
import re

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                   "architecture.md")


def walk_names() -> list[str]:
    text = open(DOC, encoding="utf-8").read()
    section = text.split("## One flag from the command line to the kernel", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"`(megacache(?:\.\w+)+)`", section)


def resolve(name: str):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise ModuleNotFoundError(name)


def test_every_name_of_the_walk_exists():
    names = walk_names()
    assert len(names) >= 15, names
    missing = []
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing, f"docs/architecture.md names what the code does not have: {missing}"


def test_a_name_that_is_not_there_is_found_missing():
    try:
        resolve("megacache.builders.config.BuildConfig.no_such_method")
    except AttributeError:
        return
    raise AssertionError("a missing name resolved")
