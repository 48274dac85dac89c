"""Cache entries into place: Megatron's files published atomically, then megacache's manifest, its
record of what each entry was built from beyond what Megatron's hash covers. A dataset that
``tokenize`` published has a record of its own beside it (``write_record``): one job at a time
writes a dataset prefix, while jobs writing other prefixes of its directory run at once."""

from __future__ import annotations

import json
import os

from ..errors import FormatError
from ..runtime import object_storage
from ..runtime.fsio import STATE_DIR, Staging, make_directories, read_json, write_atomic, write_json_atomic

#: a dataset's record in the state directory beside it: ``{dataset's file name}{RECORD_SUFFIX}``
RECORD_SUFFIX = ".made-from.json"


def write_description(entry, staging: Staging) -> None:
    """An entry's description, held by ``staging`` with its arrays (the sync before publishing
    covers it too)."""
    staging.write(entry.path("description.txt"), [entry.description.encode("utf-8")])


def publish_entries(entries, staging: Staging) -> None:
    """Cache entries into place from ``staging`` (every file written, ``write_description``
    included): every array first, then every description, so Megatron's cache hit (all files
    present) never sees a part."""
    entries = list(entries)
    staging.publish([e.path(w) for e in entries for w in e.names if w != "description.txt"])
    staging.publish([e.path("description.txt") for e in entries])


def manifest_path(directory: str) -> str:
    return os.path.join(directory, STATE_DIR, "manifest.json")


def read_manifest(directory: str) -> dict[str, dict]:
    """``{entry stem: record}`` for ``directory``; empty when megacache never built there."""
    path = manifest_path(directory)
    manifest = _read_state(path, "delete it (megacache then checks the entries' shapes only) or rebuild the cache")
    if manifest is None:
        return {}
    entries = manifest.get("entries") if isinstance(manifest, dict) else None
    if not isinstance(entries, dict):
        raise FormatError(f"{path}: no 'entries' object; delete it or rebuild the cache")
    return entries


def _read_state(path: str, remedy: str):
    """A JSON file of the state directory, or None where there is none; unreadable, an error naming
    it and ``remedy``."""
    try:
        return read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: unreadable ({exc}); {remedy}") from None


def write_manifest(directory: str, data: bytes) -> None:
    # The state directory is removed only when empty, and the caller's lock file is in it.
    make_directories(os.path.dirname(manifest_path(directory)))
    write_atomic(manifest_path(directory), data)


def manifest_bytes(entries: dict[str, dict]) -> bytes:
    """The manifest as JSON, one entry per line in stem order: readable and diffable, and each line
    encoded by ``json``'s C encoder (an indented dump goes through its Python one: several times
    slower, on rank 0 while the others wait, at thousands of entries)."""
    lines = ",\n".join(f"{json.dumps(stem)}: {json.dumps(entries[stem], sort_keys=True)}" for stem in sorted(entries))
    return f'{{"format": 1, "entries": {{\n{lines}\n}}}}\n'.encode()


def size_and_time(path: str) -> list:
    """What a record keeps of a published file: its size and modification time, to tell by one stat
    whether it is still the file published; of an object, its size and ETag (one listing). A
    missing one raises FileNotFoundError."""
    if object_storage.is_object_storage(path):
        found = [o for o in object_storage.listing(path) if o.url == path]
        if not found:
            raise FileNotFoundError(path)
        return [found[0].size, found[0].etag]
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def record_path(output: str) -> str:
    """Where the record of the dataset ``output`` (a prefix, or a file such as a ``.pbin``) is: in
    the state directory beside it, for an object too (``s3://B/dir/.megacache/NAME.made-from.json``)."""
    if object_storage.is_object_storage(output):
        directory, _, name = output.rpartition("/")
        return f"{directory}/{STATE_DIR}/{name}{RECORD_SUFFIX}"
    directory, name = os.path.split(os.path.abspath(output))
    return os.path.join(directory, STATE_DIR, name + RECORD_SUFFIX)


def read_record(output: str) -> dict | None:
    """The record of the dataset ``output``; None when there is none (another tool wrote it)."""
    path = record_path(output)
    remedy = "delete it, or pass --overwrite to replace the dataset and its record"
    if object_storage.is_object_storage(path):
        try:
            record = json.loads(object_storage.read(path))
        except object_storage.ObjectMissing:
            return None
        except ValueError as exc:
            raise FormatError(f"{object_storage.shown(path)}: unreadable ({exc}); {remedy}") from None
    else:
        record = _read_state(path, remedy)
    if record is None:
        return None
    if not isinstance(record, dict):
        raise FormatError(f"{path}: not a record (a JSON object); delete it, or pass --overwrite")
    return record


def write_record(output: str, record: dict) -> None:
    """The record of the dataset ``output``, written atomically once it is published."""
    if object_storage.is_object_storage(output):
        object_storage.upload_bytes(json.dumps(record).encode(), record_path(output))
        return
    make_directories(os.path.dirname(record_path(output)))
    write_json_atomic(record_path(output), record)
