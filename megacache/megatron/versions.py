"""The megatron-core versions megacache reproduces, and which one a run follows.

Patch releases within a minor version share their dataset and tokenizer code (0.17.0 = 0.17.1,
0.18.0 = 0.18.2, 0.19.0 = 0.19.2 in ``megatron/core/datasets`` and ``megatron/core/tokenizers``), so a
version is its ``MAJOR.MINOR``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re

from ..errors import MegacacheError

#: oldest first; the last is the default when no megatron-core is installed
SUPPORTED = ("0.16", "0.17", "0.18", "0.19")
NEWEST = SUPPORTED[-1]


def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.\d+)?(?:[.\-+]?(?:rc|a|b|dev|post)?\d*)*\s*$", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def normalize(version: str, source: str = "--megatron-version") -> str:
    """``0.19``, ``0.19.2`` or ``0.19.0rc1`` -> ``0.19``; anything megacache does not know is an error
    listing the versions it does."""
    minor = _minor(str(version))
    name = f"{minor[0]}.{minor[1]}" if minor else None
    if name not in SUPPORTED:
        raise MegacacheError(f"{source} {version}: megacache reproduces megatron-core "
                             f"{', '.join(SUPPORTED)} (patch versions accepted, e.g. {NEWEST}.2)")
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
    from importlib import metadata  # here: 13 ms of every rank's start when imported up front

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
    """The version a run follows: the one asked for; else the installed megatron-core's; else the
    newest supported. An installed version megacache does not know needs an explicit choice."""
    if requested is not None:
        return normalize(requested)
    found = installed()
    if found is None:
        return NEWEST
    minor = _minor(found)
    if minor is None or f"{minor[0]}.{minor[1]}" not in SUPPORTED:
        newer = minor is not None and minor > _minor(NEWEST)
        raise MegacacheError(
            f"megatron-core {found} is installed, {'newer than' if newer else 'not one of'} the versions "
            f"megacache reproduces ({', '.join(SUPPORTED)}): its cache names may differ. Pass "
            f"--megatron-version with the version your training runs (BuildConfig.megatron_version)")
    return f"{minor[0]}.{minor[1]}"


def at_least(version: str, oldest: str) -> bool:
    """Whether ``version`` (supported, normalized) is ``oldest`` or later."""
    return SUPPORTED.index(version) >= SUPPORTED.index(oldest)
