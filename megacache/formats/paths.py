"""What a path given to a command names: a dataset of one of the formats, or a directory (a cache
directory to verify and inspect, a folder of datasets to merge and convert). A path may name a
file or an object in a bucket (``s3://``, ``msc://``: ``runtime.object_storage``), and a path or
glob in a bucket the objects it names as the same local path names files."""

from __future__ import annotations

import fnmatch
import glob
import os
from dataclasses import dataclass

from ..errors import MegacacheError
from ..runtime import object_storage
from .datatrove import is_ds
from .indexed import bin_path, idx_path
from .olmo import is_olmo
from .pbin import is_pbin
from .sft_packed import is_parquet

#: the dataset formats, by name: Megatron's .bin/.idx prefix, datatrove's .ds, Modalities' .pbin,
#: OLMo's token file (.npy), Megatron-Bridge's packed SFT file (.parquet/.pq, or a pickled .npy)
MEGATRON, DS, PBIN, OLMO, SFT_PACKED = "megatron", "ds", "pbin", "olmo", "sft-packed"
#: a directory that is not also a Megatron prefix
DIRECTORY = "directory"
#: a name with no format's suffix where no Megatron dataset and no directory is
MISSING = "missing"


def format_of(path: str) -> str:
    """The format a dataset's name gives, whether or not it exists (an output's too): a ``.ds``, a
    ``.pbin``, an OLMo ``.npy``, else a Megatron prefix."""
    return DS if is_ds(path) else PBIN if is_pbin(path) else OLMO if is_olmo(path) else MEGATRON


@dataclass(frozen=True)
class Named:
    """What a path names: ``kind`` one of the formats, ``DIRECTORY`` or ``MISSING``; ``path`` the
    dataset's prefix for a Megatron dataset (and for ``MISSING``, the prefix it would be), else the
    path as given."""

    kind: str
    path: str


def is_file(path: str) -> bool:
    """Whether a file is at ``path``, or, for an ``s3://`` or ``msc://`` path, an object (one
    request; a missing bucket is an error naming it)."""
    return object_storage.exists(path) if object_storage.is_object_storage(path) else os.path.isfile(path)


def read_in_place(found: Named) -> Named:
    """``found``, unless it is a file in a bucket of a format other than Megatron's: of the datasets
    in buckets, only Megatron's are read where they are (the ``.idx`` whole, the ``.bin`` by ranged
    reads)."""
    if object_storage.is_object_storage(found.path) and found.kind not in (MEGATRON, MISSING):
        raise MegacacheError(f"{object_storage.shown(found.path)}: a {found.kind} file is read from a local path "
                             f"only (of the datasets in buckets, Megatron .bin/.idx prefixes are read in place); "
                             f"copy it from the bucket first")
    return found


def _is_object_npy(path: str) -> bool:
    """Whether a local file at ``path`` starts as ``numpy.save`` of an object array does (Bridge's
    packed rows), which no headerless OLMo token file does."""
    if object_storage.is_object_storage(path) or not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        head = f.read(128)
    return head.startswith(b"\x93NUMPY") and b"'descr': '|O'" in head


def _has_dataset(prefix: str) -> bool:
    return is_file(idx_path(prefix)) or is_file(bin_path(prefix))


def named(path: str) -> Named:
    """A Megatron dataset where ``PREFIX.idx`` or ``PREFIX.bin`` is a file, PREFIX being the path or,
    when it ends in .idx or .bin and is no prefix itself, the path without that suffix; a prefix
    with its files is a dataset even when it is a directory too (Megatron's default cache directory
    lives under the prefix). Else a directory; else the format its suffix gives, the file there or
    not (its reader says what is wrong), a packed SFT file for a ``.parquet`` or ``.pq`` name or an
    ``.npy`` file of pickled objects; else ``MISSING``. The filesystem is asked when this is
    called: a path that changes after is read as it then is."""
    prefix = path[:-4] if path.endswith((".idx", ".bin")) and not _has_dataset(path) else path
    if _has_dataset(prefix):
        return Named(MEGATRON, prefix)
    if os.path.isdir(path):
        return Named(DIRECTORY, path)
    if is_parquet(path) or (is_olmo(path) and _is_object_npy(path)):
        return Named(SFT_PACKED, path)
    kind = format_of(path)
    return Named(kind, path) if kind != MEGATRON else Named(MISSING, prefix)


# ---------------------------------------------------------------------------------------------
# Objects named by a path or a glob


@dataclass(frozen=True)
class Found:
    """An object that a path or glob in a bucket names: ``within`` is its path below the prefix that
    names it as a directory does, empty where the path or glob names the object itself."""

    object: object_storage.Listed
    within: str


def objects_named(pattern: str) -> list[Found]:
    """The objects an ``s3://`` or ``msc://`` path or glob names, in key order, as the same local
    path names files: the object of that key, else those under it as under a directory, recursively;
    for a glob (``*``, ``?``, ``[...]``, ``**``), those it matches as ``glob.glob(pattern,
    recursive=True)`` matches files, and those under the prefixes it matches as directories, its
    wildcards matching no name that begins with a dot. One listing: of the path, or of the prefix
    before the glob's first component with a wildcard."""
    where = object_storage.ObjectPath.parse(pattern)
    parts = where.key.split("/")
    magic = next((i for i, part in enumerate(parts) if glob.has_magic(part)), None)
    if magic is None:
        base = pattern.rstrip("/")
        return [Found(o, "" if o.url == pattern else o.url[len(base) + 1:]) for o in object_storage.listing(pattern)]
    head = f"{where.scheme}{where.bucket}/" + "".join(f"{part}/" for part in parts[:magic])
    # A glob ending in a slash matches directories only.
    rest, folders_only = (parts[magic:-1], True) if parts[-1] == "" else (parts[magic:], False)
    found = []
    for o in object_storage.listing(head):
        names = o.url[len(head):].split("/")
        if not folders_only and _glob_matches(rest, names):
            found.append(Found(o, ""))
        else:
            directory = next((j for j in range(len(names)) if _glob_matches(rest, names[:j])), None)
            if directory is not None:
                found.append(Found(o, "/".join(names[directory:])))
    return found


def _glob_matches(parts: list[str], names: list[str]) -> bool:
    """Whether the path ``names`` (its components) matches the glob ``parts`` as ``glob.glob``
    matches with ``recursive=True``: ``**`` alone is any number of components, a wildcard matches
    no name beginning with a dot that its pattern does not begin with."""
    if not parts:
        return not names
    if parts[0] == "**":
        return _glob_matches(parts[1:], names) or (bool(names) and not names[0].startswith(".")
                                                   and _glob_matches(parts, names[1:]))
    return (bool(names) and (parts[0].startswith(".") or not names[0].startswith("."))
            and fnmatch.fnmatchcase(names[0], parts[0]) and _glob_matches(parts[1:], names[1:]))
