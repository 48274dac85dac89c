"""Input files of ``megacache tokenize``: finding them, cutting them into work units, reading units.
An input may be a file or an object in a bucket (``s3://``, ``msc://``): an object is listed once,
its size taken from the listing, and read by ranged requests of the version listed, a unit's bytes
as a file's.

Work units are defined by the data alone, never by the rank count, so every rank count produces the
same documents in the same order:

* plain ``.jsonl``/``.json``/``.txt``: byte ranges of ``unit_bytes``. Unit ``k`` of a file holds the
  lines whose *first byte* lies in ``[k*unit_bytes, (k+1)*unit_bytes)``. A line starts at offset 0
  or right after a ``\\n``, so a reader finds its first line by reading from ``start - 1`` to the
  next ``\\n``; the last line of a unit may run past ``stop``. No pre-scan of the file is needed,
  and the units partition the lines exactly for every ``unit_bytes >= 1``.
* ``.parquet``: runs of consecutive row groups of about ``unit_bytes`` on disk.
* ``.gz``/``.zst`` of the line formats: one unit per file (a compressed stream cannot be entered in
  the middle).

Line formats follow Megatron's ``tools/preprocess_data.py``, which reads the file as UTF-8 text and
calls ``json.loads`` on every line; ``.json`` is JSON lines too. Lines end at ``\\n``; the last line
needs no newline. For ``.txt`` each line is one document without its ``\\n`` or ``\\r\\n``; a ``\\r``
not followed by ``\\n`` is text, and a blank line is an empty document. Line and row numbers in
messages are 1-based and count from the start of the file.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import gzip
import json
import json.decoder
import json.scanner
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import msgspec

from ..errors import InputError, MegacacheError
from ..formats.paths import objects_named
from ..runtime import object_storage

# suffix -> (format, compression); matched against the lower-cased file name.
_SUFFIXES = {
    f"{base}{ext}": (fmt, comp)
    for base, fmt in ((".jsonl", "jsonl"), (".json", "jsonl"), (".txt", "txt"))
    for ext, comp in (("", None), (".gz", "gz"), (".zst", "zst"))
}
_SUFFIXES[".parquet"] = ("parquet", None)
SUPPORTED = ".jsonl, .json, .txt (each optionally compressed as .gz or .zst), .parquet"

# json.loads = this scanner plus whitespace handling, a BOM check and Python-level calls per line.
_scan_json = json.scanner.make_scanner(json.decoder.JSONDecoder())
_FIELDS = tuple(f"f{i}" for i in range(64))


@functools.lru_cache(maxsize=None)
def _chunk_decoder(keys: tuple[str, ...]):
    """A msgspec decoder of JSON lines holding string values under ``keys`` (None when the keys
    repeat or are too many for one record type)."""
    if len(set(keys)) != len(keys) or len(keys) > len(_FIELDS):
        return None
    fields = _FIELDS[:len(keys)]
    record = msgspec.defstruct("Record", [(f, str) for f in fields], rename=dict(zip(fields, keys)))
    return msgspec.json.Decoder(record)


_TAIL_BLOCK = 1 << 16  # read size while finishing a line that runs past the unit's end
_MAX_LISTED_KEYS = 10


@dataclass(frozen=True)
class Source:
    """An input as listed: a file or an object, and its version, a file's modification time (ns) or
    an object's ETag and modification time."""

    path: str                 # absolute path, or the object's URL
    size: int
    stamp: int | dict

    @classmethod
    def of_file(cls, path: str) -> "Source":
        st = os.stat(path)
        return cls(path, st.st_size, st.st_mtime_ns)

    @classmethod
    def of_object(cls, listed: object_storage.Listed) -> "Source":
        return cls(listed.url, listed.size, {"etag": listed.etag, "modified": listed.modified})

    @property
    def in_bucket(self) -> bool:
        return object_storage.is_object_storage(self.path)

    def open(self, end: int = 0):
        """The input's bytes as an unbuffered binary file: an object's by ranged requests of the
        version listed, a read before ``end`` streaming on to ``end`` (``ObjectReader``)."""
        if self.in_bucket:
            return object_storage.ObjectReader(self.path, self.size, self.stamp["etag"] or None, end)
        return open(self.path, "rb", buffering=0)


@dataclass(frozen=True)
class WorkUnit:
    index: int                # global position in input order (0..)
    source: Source
    fmt: str                  # "jsonl" | "txt" | "parquet"
    compression: str | None   # None | "gz" | "zst"
    start: int                # plain files: first byte offset; parquet: first row group; compressed: 0
    stop: int                 # plain: end byte offset (exclusive); parquet: end row group; compressed: file size
    size: int                 # on-disk bytes this unit covers (used for load balance and progress)

    @property
    def path(self) -> str:
        return self.source.path

    def describe(self) -> str:
        """Where the unit lies, for messages."""
        if self.fmt == "parquet":
            return f"{self.path}, row groups {self.start}-{self.stop - 1} (work unit {self.index})"
        if self.compression is not None:
            return f"{self.path} (work unit {self.index})"
        return f"{self.path}, bytes {self.start}-{self.stop} (work unit {self.index})"


@dataclass
class Batch:
    texts: dict[str, list[str]]   # per json key, the documents of this batch in order (same length per key)
    bytes_done: int               # on-disk bytes of the unit consumed so far (compressed: compressed bytes)


@dataclass
class BadRecords:
    """Records skipped under ``--skip-bad``: how many, and where the first few were."""

    max_locations: int = 10
    count: int = 0
    first: list[str] = field(default_factory=list)  # "path:line N: reason", in reading order

    def add(self, path: str, where: str, reason: str) -> None:
        self.count += 1
        if len(self.first) < self.max_locations:
            self.first.append(f"{path}:{where}: {reason}")

    def merge(self, count: int, first: list[str]) -> None:
        """Add another reader's tally (e.g. another unit's), keeping the first locations in order."""
        self.count += count
        self.first.extend(first[: self.max_locations - len(self.first)])


def input_format(path: str) -> tuple[str, str | None] | None:
    """``(fmt, compression)`` from the file name, or None when the suffix is not supported."""
    name = os.path.basename(path).lower()
    for suffix, kind in _SUFFIXES.items():
        if name.endswith(suffix):
            return kind
    return None


def _natural_key(path: str) -> tuple:
    # Digit runs compare as numbers (shard_2 < shard_10); text and numbers alternate in the split,
    # so positions never compare a str with an int. The raw path breaks ties such as 01 vs 1.
    parts = re.split(r"(\d+)", path)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), path


def _walk(directory: str) -> list[str]:
    """Supported files under ``directory``, recursively; hidden files and directories are skipped
    (megacache's own temporary files are hidden)."""
    found = []
    for root, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(root, f) for f in files if not f.startswith(".") and input_format(f)]
    return found


def _check_file(path: str, pattern: str) -> str:
    if input_format(path) is None:
        via = "" if path == pattern else f" (matched by {pattern!r})"
        raise MegacacheError(f"{path}{via}: unsupported input file type; supported: {SUPPORTED}")
    return path


def expand_inputs(patterns: list[str]) -> list[Source]:
    """Files named by ``patterns`` (files, directories searched recursively, globs with ``**``; the
    same in buckets: ``_objects``): their union by absolute path or URL, de-duplicated and sorted
    naturally (shard_2 before shard_10).

    Inside a directory, files of other types are ignored; a file named or matched directly must be
    of a supported type."""
    if not patterns:
        raise MegacacheError("--input: give at least one file, directory or glob")
    found: dict[str, Source] = {}
    # Inputs are only read while a job runs: judging a path before opening it is safe, and one
    # that vanishes after is reported when its unit opens it.
    for pattern in patterns:
        if object_storage.is_object_storage(pattern):
            found.update((s.path, s) for s in _objects(pattern))
            continue
        if os.path.isdir(pattern):
            files = _walk(pattern)
            if not files:
                raise MegacacheError(f"{pattern}: directory has no input files; supported: {SUPPORTED}")
        elif os.path.exists(pattern):
            files = [_check_file(pattern, pattern)]
        elif glob.has_magic(pattern):
            matches = glob.glob(pattern, recursive=True)
            if not matches:
                raise MegacacheError(f"{pattern}: the pattern matches nothing")
            files = []
            for m in matches:
                files += _walk(m) if os.path.isdir(m) else [_check_file(m, pattern)]
            if not files:
                raise MegacacheError(f"{pattern}: the pattern matches no input files; supported: {SUPPORTED}")
        else:
            raise MegacacheError(f"{pattern}: no such file or directory")
        found.update((path, Source.of_file(path)) for path in map(os.path.abspath, files))
    return [found[path] for path in sorted(found, key=_natural_key)]


def _objects(pattern: str) -> list[Source]:
    """The input objects an ``s3://`` or ``msc://`` path or glob names (``formats.paths``), as a
    local one names files: under a prefix, hidden ones and those of other types left out."""
    where = object_storage.ObjectPath.parse(pattern)
    is_glob = glob.has_magic(where.key)
    found = objects_named(pattern)
    if not found:
        raise MegacacheError(f"{where}: the pattern matches nothing" if is_glob else
                             f"{where}: bucket {where.bucket!r} has no object {where.key!r} and none under it")
    sources = []
    for f in found:
        if f.within and (not input_format(f.within) or any(name.startswith(".") for name in f.within.split("/"))):
            continue
        _check_file(f.object.url, pattern)
        sources.append(Source.of_object(f.object))
    if not sources:
        raise MegacacheError(f"{where}: the pattern matches no input objects; supported: {SUPPORTED}" if is_glob else
                             f"{where}: no input objects under it; supported: {SUPPORTED}")
    return sources


def plan_units(sources: list[Source], unit_bytes: int) -> list[WorkUnit]:
    """Cut ``sources`` (in this order) into work units of about ``unit_bytes`` on-disk bytes each.
    Every file gets at least one unit, so that an empty file is reported by its reader."""
    if unit_bytes < 1:
        raise MegacacheError(f"unit size must be at least 1 byte, got {unit_bytes}")
    units: list[WorkUnit] = []

    def add(source, fmt, comp, start, stop, size):
        units.append(WorkUnit(len(units), source, fmt, comp, start, stop, size))

    for source in sources:
        kind = input_format(source.path)
        if kind is None:
            _check_file(source.path, source.path)
        fmt, comp = kind
        size = source.size
        if fmt == "parquet":
            sizes = _row_group_sizes(source)
            first, acc = 0, 0
            for g, s in enumerate(sizes):
                acc += s
                if acc >= unit_bytes or g == len(sizes) - 1:
                    add(source, fmt, comp, first, g + 1, acc)
                    first, acc = g + 1, 0
            if not sizes:
                add(source, fmt, comp, 0, 0, 0)
        elif comp is not None:
            add(source, fmt, comp, 0, size, size)
        else:
            for start in range(0, max(size, 1), unit_bytes):
                stop = min(start + unit_bytes, size)
                add(source, fmt, comp, start, stop, stop - start)
    return units


def _row_group_sizes(source: Source) -> list[int]:
    import pyarrow.parquet as pq

    with _parquet(source) as f:
        meta = pq.read_metadata(f)
    return [sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
            for rg in (meta.row_group(g) for g in range(meta.num_row_groups))]


def read_unit(unit: WorkUnit, keys: list[str], skip_bad: bool, bad: BadRecords,
              batch_bytes: int = 1 << 20) -> Iterator[Batch]:
    """The documents of ``unit`` as batches of about ``batch_bytes`` of input.

    A bad record raises ``InputError`` naming its file and line (row for parquet), or, with
    ``skip_bad``, is left out (for every key) and counted in ``bad``. The last batch has
    ``bytes_done == unit.size``; it is empty when nothing was left to deliver with it. For txt,
    every key maps to the same list. Memory is bounded by ``batch_bytes`` plus one line (plus
    pyarrow's read buffer for parquet)."""
    if not keys:
        raise MegacacheError("give at least one JSON key")
    if unit.fmt == "parquet":
        yield from _read_parquet(unit, keys, skip_bad, bad, batch_bytes)
    else:
        yield from _read_lines(unit, keys, skip_bad, bad, max(1, batch_bytes))


# ---------------------------------------------------------------------------------------------
# Line formats


def _line_chunks(read: Callable[[int], bytes], head: bytes, pos: int, stop: int | None,
                 block: int) -> Iterator[tuple[bytes, int]]:
    """Whole lines of a byte stream, in chunks of about ``block`` bytes.

    ``head`` holds bytes already read, beginning at the line start ``pos``. Yields ``(chunk, end)``:
    each chunk ends right after a ``\\n`` (or at the end of the stream) and ``end`` is the stream
    offset after it. Only lines that start before ``stop`` are delivered (all when None).
    """
    pieces: list = []   # read bytes after pos that hold no newline yet
    pending = 0
    data = head
    if stop is not None and pos >= stop:
        return
    while True:
        if data:
            nl = data.rfind(b"\n")
            if nl < 0:
                pieces.append(data)
                pending += len(data)
            else:
                pieces.append(memoryview(data)[: nl + 1])
                chunk = b"".join(pieces)
                end = pos + len(chunk)
                if stop is not None and end > stop:
                    # Cut before the first line that starts at or after stop.
                    cut = chunk.find(b"\n", stop - 1 - pos) + 1
                    yield chunk[:cut], pos + cut
                    return
                yield chunk, end
                pos = end
                if stop is not None and pos >= stop:
                    return
                rest = data[nl + 1:]
                pieces, pending = ([rest], len(rest)) if rest else ([], 0)
        read_pos = pos + pending
        if stop is None:
            n = block
        elif read_pos < stop:
            n = min(block, stop - read_pos)
        else:
            n = _TAIL_BLOCK
        data = read(n)
        if not data:
            if pending:
                yield b"".join(pieces), pos + pending
            return


def _first_line(f, start: int) -> tuple[int, bytes]:
    """Offset of the first line starting at or after ``start``, and bytes read from there on."""
    if start == 0:
        return 0, b""
    pos = start - 1
    f.seek(pos)
    while True:
        data = f.read(_TAIL_BLOCK)
        if not data:
            return pos, b""
        nl = data.find(b"\n")
        if nl >= 0:
            return pos + nl + 1, data[nl + 1:]
        pos += len(data)


def _count_newlines(source: Source, stop: int) -> int:
    """Newlines in the first ``stop`` bytes of ``source``: only needed to number a bad line."""
    n = 0
    with source.open(end=stop) as f:
        while stop > 0:
            data = f.read(min(stop, 1 << 22))
            if not data:
                break
            n += data.count(b"\n")
            stop -= len(data)
    return n


def _report(path: str, where: str, reason: str, skip_bad: bool, bad: BadRecords) -> None:
    if not skip_bad:
        raise InputError(path, where, reason)
    bad.add(path, where, reason)


def _listing(names) -> str:
    names = list(names)
    shown = ", ".join(names[:_MAX_LISTED_KEYS]) or "none"
    return shown + (", ..." if len(names) > _MAX_LISTED_KEYS else "")


def _utf8_problem(e: UnicodeDecodeError) -> str:
    return f"invalid UTF-8 at byte {e.start + 1} of the line"


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


class _Lines:
    """Turns chunks of whole lines into documents and reports bad lines with absolute numbers."""

    def __init__(self, unit: WorkUnit, keys: list[str], skip_bad: bool, bad: BadRecords,
                 lines_before: Callable[[], int]):
        self.unit, self.keys, self.skip_bad, self.bad = unit, keys, skip_bad, bad
        self._lines_before_fn = lines_before
        self._lines_before: int | None = None
        self.lines = 0  # lines of this unit seen so far
        self.json_hint = (unit.path.lower().endswith((".json", ".json.gz", ".json.zst")))

    def where(self, i: int) -> str:
        if self._lines_before is None:
            self._lines_before = self._lines_before_fn()
        return f"line {self._lines_before + self.lines + i + 1}"

    def report(self, where: str, reason: str) -> None:
        _report(self.unit.path, where, reason, self.skip_bad, self.bad)

    def parse(self, chunk: bytes) -> dict[str, list[str]]:
        if self.unit.fmt == "jsonl":
            texts = self._json_chunk(chunk)
            if texts is not None:
                return texts
        if self.unit.fmt == "txt" and b"\r\n" in chunk:
            # A txt line ends at "\n" or "\r\n"; any other "\r" is text.
            chunk = chunk.replace(b"\r\n", b"\n")
        # Split bytes, then decode line by line: several times faster than decoding the chunk and
        # splitting the str (which widens every line to the chunk's widest character).
        lines = chunk.split(b"\n")
        if chunk.endswith(b"\n"):
            lines.pop()  # the empty piece after the final newline is not a line
        texts = self._txt(lines) if self.unit.fmt == "txt" else self._json(lines)
        self.lines += len(lines)
        return texts

    def _txt(self, lines: list[bytes]) -> dict[str, list[str]]:
        try:
            docs = [line.decode() for line in lines]
        except UnicodeDecodeError:
            docs = []
            for i, line in enumerate(lines):
                try:
                    docs.append(line.decode())
                except UnicodeDecodeError as e:
                    self.report(self.where(i), _utf8_problem(e))
        return dict.fromkeys(self.keys, docs)

    def _json_chunk(self, chunk: bytes) -> dict[str, list[str]] | None:
        """The whole chunk decoded by msgspec (several times faster than line by line), or None.

        msgspec accepts a subset of what json.loads accepts and gives the same values there (the
        last of duplicate keys included); it refuses the rest (NaN, lone surrogates, a BOM, raw
        control characters, a value that is not a string), and skips blank lines where json.loads
        fails on them. A chunk it refuses or shortens goes to the line-by-line path, which reports
        bad lines."""
        decoder = _chunk_decoder(tuple(self.keys))
        if decoder is None:
            return None
        try:
            records = decoder.decode_lines(chunk)
        except (msgspec.MsgspecError, UnicodeDecodeError):
            return None
        lines = chunk.count(b"\n") + (not chunk.endswith(b"\n"))
        if len(records) != lines:
            return None
        self.lines += lines
        return {key: [getattr(r, field) for r in records] for key, field in zip(self.keys, _FIELDS)}

    def _json(self, lines: list[bytes]) -> dict[str, list[str]]:
        # Fast path: the C scanner behind json.loads, called directly, without json.loads' own
        # checks and dispatch, which weigh on short lines.
        # It accepts a subset of what json.loads accepts; any other line goes to _slow, which
        # applies json.loads itself, so the result is json.loads' in every case.
        scan, keys = _scan_json, self.keys
        if len(keys) == 1:
            key = keys[0]
            docs: list[str] = []
            append = docs.append
            for i, line in enumerate(lines):
                try:
                    s = line.decode()
                    obj, end = scan(s, 0)
                    value = obj[key]
                    if value.__class__ is str and (end == len(s) or not s[end:].strip(" \t\r")):
                        append(value)
                        continue
                except Exception:
                    pass
                values = self._slow(i, line)
                if values is not None:
                    append(values[0])
            return {key: docs}
        out: list[list[str]] = [[] for _ in keys]
        for i, line in enumerate(lines):
            values = None
            try:
                s = line.decode()
                obj, end = scan(s, 0)
                values = [obj[k] for k in keys]
                if not (all(v.__class__ is str for v in values)
                        and (end == len(s) or not s[end:].strip(" \t\r"))):
                    values = None
            except Exception:
                pass
            if values is None:
                values = self._slow(i, line)
            if values is not None:
                for docs, v in zip(out, values):
                    docs.append(v)
        return dict(zip(keys, out))

    def _slow(self, i: int, raw: bytes) -> list[str] | None:
        """The values of a line by json.loads, or None after reporting why the line is bad."""
        try:
            line = raw.decode()
        except UnicodeDecodeError as e:
            return self.report(self.where(i), _utf8_problem(e))
        if not line.strip(" \t\r"):
            return self.report(self.where(i), "blank line (every line must hold one JSON object)")
        hint = (" (a .json input is read as JSON lines, one object per line, as Megatron does)"
                if self.json_hint else "")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            # json phrases one message as "Invalid control character at"; the column completes it.
            msg = e.msg.removesuffix(" at")
            return self.report(self.where(i), f"invalid JSON: {msg} at column {e.colno}{hint}")
        except RecursionError:
            return self.report(self.where(i), f"invalid JSON: nested too deeply{hint}")
        if not isinstance(obj, dict):
            return self.report(self.where(i), f"expected a JSON object, got {_type_name(obj)}{hint}")
        for k in self.keys:
            if k not in obj:
                return self.report(self.where(i), f"missing key {k!r} (keys present: {_listing(obj)})")
            if not isinstance(obj[k], str):
                return self.report(self.where(i), f"value of {k!r} is {_type_name(obj[k])}, expected a string")
        return [obj[k] for k in self.keys]


def _open_decompressed(raw, comp: str):
    if comp == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(raw, read_size=1 << 20, read_across_frames=True)


def _read_lines(unit: WorkUnit, keys: list[str], skip_bad: bool, bad: BadRecords,
                block: int) -> Iterator[Batch]:
    # A unit's last line mostly ends within _TAIL_BLOCK past its end: one request reads both.
    with unit.source.open(end=unit.stop + _TAIL_BLOCK) as raw:
        if unit.compression is None:
            first, head = _first_line(raw, unit.start)
            parser = _Lines(unit, keys, skip_bad, bad, lambda: _count_newlines(unit.source, first))
            chunks = _line_chunks(raw.read, head, first, unit.stop, block)
            progress = lambda end: min(end, unit.stop) - unit.start  # noqa: E731
        else:
            stream = _open_decompressed(raw, unit.compression)
            parser = _Lines(unit, keys, skip_bad, bad, lambda: 0)
            chunks = _line_chunks(_checked_read(stream, parser), b"", 0, None, block)
            progress = lambda end: min(raw.tell(), unit.size)  # noqa: E731
        done, any_lines = None, False
        for chunk, end in chunks:
            any_lines = True
            texts = parser.parse(chunk)
            if texts[keys[0]]:
                done = progress(end)
                yield Batch(texts, done)
        # Only a unit at offset 0 sees the whole file's first line.
        if not any_lines and unit.start == 0:
            parser.report("line 1", "empty file")
        if done != unit.size:
            yield Batch({k: [] for k in keys}, unit.size)


def _checked_read(stream, parser: _Lines) -> Callable[[int], bytes]:
    """``stream.read`` that reports corrupt compressed data as an InputError (never skippable:
    nothing after the damage can be trusted)."""
    import zstandard

    def read(n: int) -> bytes:
        try:
            return stream.read(n)
        except (gzip.BadGzipFile, EOFError, zlib.error, zstandard.ZstdError) as e:
            raise InputError(parser.unit.path, f"line {parser.lines + 1}",
                             f"corrupt or truncated {parser.unit.compression} data: {e}") from None

    return read


# ---------------------------------------------------------------------------------------------
# Parquet


def _read_parquet(unit: WorkUnit, keys: list[str], skip_bad: bool, bad: BadRecords,
                  batch_bytes: int) -> Iterator[Batch]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    with _parquet(unit.source) as f, pq.ParquetFile(f, buffer_size=1 << 20, pre_buffer=False) as pf:
        names = pf.schema_arrow.names
        for k in keys:
            if k not in names:
                raise MegacacheError(f"{unit.path}: no column {k!r} (columns present: {_listing(names)})")
            t = pf.schema_arrow.field(k).type
            value_type = t.value_type if pa.types.is_dictionary(t) else t
            if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)
                    or str(value_type) == "string_view"):
                raise MegacacheError(f"{unit.path}: column {k!r} has type {t}, expected a string column")

        meta = pf.metadata
        groups = range(unit.start, unit.stop)
        rows = sum(meta.row_group(g).num_rows for g in groups)
        if meta.num_rows == 0 and unit.start == 0:
            _report(unit.path, "row 1", "empty file", skip_bad, bad)
        if rows == 0:
            yield Batch({k: [] for k in keys}, unit.size)
            return
        row_bytes = sum(meta.row_group(g).total_byte_size for g in groups) / rows
        rows_before = sum(meta.row_group(g).num_rows for g in range(unit.start))
        done_rows = 0
        for batch in pf.iter_batches(batch_size=max(1, int(batch_bytes / max(row_bytes, 1))),
                                     row_groups=list(groups), columns=keys):
            cols = [batch.column(k) for k in keys]
            if any(c.null_count for c in cols):
                valid = np.logical_and.reduce([np.asarray(c.is_valid()) for c in cols])
                for i in np.flatnonzero(~valid).tolist():
                    null_key = next(k for k, c in zip(keys, cols) if not c[i].is_valid)
                    _report(unit.path, f"row {rows_before + done_rows + i + 1}",
                            f"value of {null_key!r} is null, expected a string", skip_bad, bad)
                mask = pa.array(valid)
                cols = [c.filter(mask) for c in cols]
            done_rows += batch.num_rows
            yield Batch({k: c.to_pylist() for k, c in zip(keys, cols)}, unit.size * done_rows // rows)


def _parquet(source: Source):
    """What pyarrow opens a parquet input from: its own file for a local one (read without Python
    calls), else ``source.open()``, each read of its one ranged request."""
    return source.open() if source.in_bucket else contextlib.nullcontext(source.path)
