"""The megatron-core versions megacache reproduces, and which one a run follows.

Patch releases within a minor version share their dataset and tokenizer code (0.17.0 = 0.17.1,
0.18.0 = 0.18.2, 0.19.0 = 0.19.2 in ``megatron/core/datasets`` and ``megatron/core/tokenizers``), so a
version is its ``MAJOR.MINOR``. 0.20 is Megatron-LM main (package 0.20.0, not yet released), as of the
commit docs/megatron-versions.md names: main may still change before it ships.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re

from ..errors import MegacacheError

#: oldest first
SUPPORTED = ("0.16", "0.17", "0.18", "0.19", "0.20")
#: Megatron-LM main's package version, reproduced from source: chosen by asking for it (or by
#: running from a main checkout), never by default
UNRELEASED = ("0.20",)
#: the default when no megatron-core is installed: the newest release, not main, whose caches only
#: those training from main look for
NEWEST = [v for v in SUPPORTED if v not in UNRELEASED][-1]


def listing() -> str:
    """The supported versions as messages name them."""
    return ", ".join(f"{v} (Megatron-LM main, package {v}.0, not yet released)" if v in UNRELEASED else v
                     for v in SUPPORTED)


def minor_of(version: str) -> tuple[int, int] | None:
    # a local label (``+d98e8a64dd``) is what a megatron-core built from a git checkout reports
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.\d+)?(?:[.\-+]?(?:rc|a|b|dev|post)?\d*)*(?:\+[A-Za-z0-9.]+)?\s*$", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def normalize(version: str, source: str = "--megatron-version") -> str:
    """``0.19``, ``0.19.2`` or ``0.19.0rc1`` -> ``0.19``; anything megacache does not know is an error
    listing the versions it does."""
    minor = minor_of(str(version))
    name = f"{minor[0]}.{minor[1]}" if minor else None
    if name not in SUPPORTED:
        raise MegacacheError(f"{source} {version}: megacache reproduces megatron-core "
                             f"{listing()}; patch versions accepted, e.g. {NEWEST}.2")
    return name


def installed() -> str | None:
    """The version of the megatron-core this interpreter would import, or None: read from the
    ``megatron/core/package_info.py`` found on the path (a wheel or a Megatron-LM checkout on
    PYTHONPATH alike) without importing it, else from the installed distribution's metadata."""
    try:
        spec = importlib.util.find_spec("megatron")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        info = os.path.join(location, "core", "package_info.py")
        if os.path.isfile(info):
            return _package_info_version(info)
    from importlib import metadata  # not up front: every rank's start would pay for it

    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def _package_info_version(path: str) -> str | None:
    """``MAJOR.MINOR.PATCH`` (+ ``PRE_RELEASE``) as megatron-core's package_info.py assigns them."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    parts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Constant):
                parts[node.targets[0].id] = node.value.value
    if not all(isinstance(parts.get(k), int) for k in ("MAJOR", "MINOR", "PATCH")):
        return None
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE') or ''}"


def resolve(requested: str | None) -> str:
    """The version a run follows: the one asked for; else the installed megatron-core's; else
    ``NEWEST``. An installed version megacache does not know needs an explicit choice."""
    if requested is not None:
        return normalize(requested)
    found = installed()
    if found is None:
        return NEWEST
    minor = minor_of(found)
    if minor is None or f"{minor[0]}.{minor[1]}" not in SUPPORTED:
        newer = minor is not None and minor > minor_of(SUPPORTED[-1])
        raise MegacacheError(
            f"megatron-core {found} is installed, {'newer than' if newer else 'not one of'} the versions "
            f"megacache reproduces ({listing()}): its cache names may differ. Pass "
            f"--megatron-version with the version your training runs (BuildConfig.megatron_version)")
    return f"{minor[0]}.{minor[1]}"


def at_least(version: str, oldest: str) -> bool:
    """Whether ``version`` (supported, normalized) is ``oldest`` or later."""
    return SUPPORTED.index(version) >= SUPPORTED.index(oldest)
