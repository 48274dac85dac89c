"""Megatron-Bridge 0.6.2's packed SFT files, written byte for byte as Bridge writes them
(``prepare_gpt_sft_packed_data``; docs/sft-packing.md §7), each published whole (temp name, fsync,
rename):

* Parquet (``write_packed_parquet``): columns ``input_ids`` (list of int64), ``loss_mask`` (list of
  int8), ``seq_start_id`` (list of int64), one row per packed sequence, row groups of 500, pyarrow's
  defaults otherwise;
* ``.npy``: ``numpy.save`` of the rows as dicts in an object array (a pickle). Bridge's rows hold
  Python lists whose loss-mask values are bools or ints, and the pickle records which: the caller
  says which values are ints. megacache writes this form and never unpickles it;
* the metadata file: a JSON list, the new record appended (the list read before anything is written).

Reading (``read_packed``) takes either file apart into flat arrays without unpickling: the Parquet
file through pyarrow, its schema checked; the ``.npy`` file's pickle walked opcode by opcode by a
kernel (``_walk``) whose values are kinds and numbers: it builds lists, dicts, tuples, ints, bools
and strings as entries of arrays and records, never makes, the calls numpy's own reconstruction asks
for, so a crafted file is refused with its byte offset and runs nothing; numpy then checks what it
built and gathers the rows. ``problems`` checks the rows as Bridge's loader needs them.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
from typing import NamedTuple

import numpy as np

from ..errors import FormatError, MegacacheError
from .npy import read_npy_layout
from .pickled_pairs import refusal
from ..runtime.fsio import publish, remove_quietly, tmp_path, write_atomic, writing
from ..runtime.kernels import kernel

#: Bridge's ``write_packed_parquet`` row group size
ROW_GROUP_SIZE = 500


def is_parquet(path: str) -> bool:
    """Bridge writes Parquet to a path ending in .parquet or .pq (any case), ``.npy`` otherwise."""
    return path.lower().endswith((".parquet", ".pq"))


def default_file_name(split: str, pack_size: int) -> str:
    """The name Bridge's builder gives a split's packed file in its default directory."""
    return f"{split}_{pack_size}.idx.parquet"


def default_metadata_name(pack_size: int) -> str:
    """The name of the metadata file beside them."""
    return f"{pack_size}_metadata.jsonl"


def npy_path(path: str) -> str:
    """Where ``numpy.save`` puts ``path``: ``.npy`` appended unless it ends so."""
    return path if path.endswith(".npy") else path + ".npy"


def _published(path: str, write) -> None:
    tmp = tmp_path(path, str(os.getpid()))
    try:
        with writing(path):
            write(tmp)
            publish(tmp, path)
    finally:
        remove_quietly(tmp)


def write_parquet(path: str, tokens: int, chunks) -> None:
    """Bridge's Parquet file of ``tokens`` packed tokens from ``chunks``, runs of consecutive packed
    sequences, each a whole number of row groups but the last (pyarrow then writes the bytes it
    writes for the whole table): (``token_offsets``, ``input_ids``, ``loss_mask``,
    ``place_offsets``, ``seq_start_id``), packed sequence b's ``input_ids`` and ``loss_mask`` over
    ``token_offsets[b]:token_offsets[b + 1]``, its ``seq_start_id`` over ``place_offsets``'s."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if tokens >= 2**31:
        raise MegacacheError(f"{path}: {tokens} packed tokens do not fit Bridge's Parquet lists (32-bit "
                             "offsets); pack fewer examples into this file")

    def column(offsets, values, dtype):
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values.astype(dtype, copy=False)))

    def write(tmp):
        writer = None
        try:
            for token_offsets, input_ids, loss_mask, place_offsets, seq_start_id in chunks:
                table = pa.table({"input_ids": column(token_offsets, input_ids, np.int64),
                                  "loss_mask": column(token_offsets, loss_mask, np.int8),
                                  "seq_start_id": column(place_offsets, seq_start_id, np.int64)})
                writer = writer or pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table, row_group_size=ROW_GROUP_SIZE)
        finally:
            if writer is not None:
                writer.close()

    _published(path, write)


def write_npy(path: str, token_offsets: np.ndarray, input_ids: np.ndarray, loss_mask: np.ndarray,
              mask_ints: np.ndarray, place_offsets: np.ndarray, seq_start_id: np.ndarray) -> str:
    """As ``write_parquet``, as Bridge's ``numpy.save`` of its rows; ``mask_ints`` (bool, per packed
    token) marks the loss-mask values that are Python ints in Bridge's rows, the rest being bools.
    Returns the path written (``npy_path``)."""
    mask = np.empty(loss_mask.size, dtype=object)
    mask[:] = loss_mask.astype(bool)
    mask[mask_ints] = loss_mask[mask_ints].astype(np.int64)
    ids = input_ids.tolist()
    starts = seq_start_id.tolist()
    # The pickle is of Python objects: one dict of lists per packed sequence, as Bridge builds them.
    rows = [{"input_ids": ids[a:b], "loss_mask": mask[a:b].tolist(), "seq_start_id": starts[c:d]}
            for a, b, c, d in zip(token_offsets[:-1].tolist(), token_offsets[1:].tolist(),
                                  place_offsets[:-1].tolist(), place_offsets[1:].tolist())]
    path = npy_path(path)

    def write(tmp):
        with open(tmp, "wb") as f:
            np.save(f, np.asanyarray(rows), allow_pickle=True)

    _published(path, write)
    return path


def metadata_records(path: str) -> list:
    """The records of the metadata file at ``path`` (a JSON list; none when there is no file yet),
    read before anything is written, so that a file Bridge could not append to stops the run first."""
    if not os.path.exists(path):
        return []
    try:
        with open(path, "rb") as f:
            records = json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise MegacacheError(f"{path}: the packing metadata file is not readable JSON ({exc}); Bridge "
                             "0.6.2 appends to a JSON list there: remove the file or give another "
                             "metadata path") from None
    if not isinstance(records, list):
        raise MegacacheError(f"{path}: the packing metadata file holds a JSON {type(records).__name__}, not a "
                             "list of records; remove it or give another metadata path")
    return records


def write_metadata(path: str, records: list) -> None:
    """The metadata file as Bridge's ``json.dump`` writes the list."""
    with writing(path):
        write_atomic(path, json.dumps(records).encode())


# ------------------------------------------------------------------------------------------------
# reading

#: the columns of Bridge's packed Parquet and their list element types
COLUMNS = {"input_ids": "int64", "loss_mask": "int8", "seq_start_id": "int64"}


class PackedRows(NamedTuple):
    """A packed file's rows as flat arrays: pack b's ``input_ids`` over
    ``token_offsets[b]:token_offsets[b + 1]``, its ``loss_mask`` over ``mask_offsets``'s, its
    ``seq_start_id`` over ``place_offsets``'s."""

    token_offsets: np.ndarray
    input_ids: np.ndarray
    mask_offsets: np.ndarray
    loss_mask: np.ndarray
    place_offsets: np.ndarray
    seq_start_id: np.ndarray

    @property
    def packs(self) -> int:
        return len(self.token_offsets) - 1

    @property
    def examples(self) -> int:
        return len(self.seq_start_id)

    @property
    def tokens(self) -> int:
        return len(self.input_ids)

    @property
    def longest(self) -> int:
        """The most tokens in one pack."""
        return int(np.diff(self.token_offsets).max()) if self.packs else 0


def read_packed(path: str) -> PackedRows:
    """A packed SFT file's rows, Parquet or ``.npy`` as its name says; a FormatError naming the file
    (and for a pickle the byte) for anything else."""
    return read_parquet(path) if is_parquet(path) else read_npy(path)


def read_parquet(path: str) -> PackedRows:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise FormatError(f"{path}: not a readable Parquet file ({exc})") from None
    types = {f.name: f.type for f in table.schema}
    if (set(types) != set(COLUMNS) or any(not pa.types.is_list(types[name]) or str(types[name].value_type) != t
                                          for name, t in COLUMNS.items())):
        found = ", ".join(f"{name} {t}" for name, t in types.items())
        want = ", ".join(f"{name} list<{t}>" for name, t in COLUMNS.items())
        raise FormatError(f"{path}: columns {found}; Bridge's packed Parquet has {want}")

    def column(name: str) -> tuple[np.ndarray, np.ndarray]:
        lists = table.column(name).combine_chunks()
        values = lists.flatten()
        if lists.null_count or values.null_count:
            raise FormatError(f"{path}: column {name} holds nulls; Bridge's packed rows have none")
        offsets = lists.offsets.to_numpy().astype(np.int64)
        return offsets - offsets[0], values.to_numpy(zero_copy_only=False).astype(np.int64)

    return PackedRows(*column("input_ids"), *column("loss_mask"), *column("seq_start_id"))


# The walk of a ``.npy`` file's pickle (``_walk``): a stack machine over the opcodes numpy's pickle
# of an object array of dicts of lists uses, in which every value is a (kind, a, b) triple and the
# containers are numbers. What it builds is logged in arrays: each list's elements (runs of
# consecutive elements of one list), each dict's items, each tuple's items, each call with its
# state; ``read_npy`` then checks the result in numpy. Nothing is ever called.

# the opcodes the walk takes, as the pickle module names them
(_PROTO, _FRAME, _STOP, _MARK, _BININT, _BININT1, _BININT2, _LONG1, _NONE, _NEWTRUE, _NEWFALSE,
 _SHORT_BINUNICODE, _BINUNICODE, _SHORT_BINBYTES, _BINBYTES, _EMPTY_TUPLE, _TUPLE, _TUPLE1, _TUPLE2, _TUPLE3,
 _EMPTY_LIST, _APPEND, _APPENDS, _EMPTY_DICT, _SETITEM, _SETITEMS, _MEMOIZE, _BINPUT, _LONG_BINPUT, _BINGET,
 _LONG_BINGET, _GLOBAL, _STACK_GLOBAL, _REDUCE, _BUILD) = (
    getattr(pickle, name)[0] for name in (
    "PROTO", "FRAME", "STOP", "MARK", "BININT", "BININT1", "BININT2", "LONG1", "NONE", "NEWTRUE",
    "NEWFALSE", "SHORT_BINUNICODE", "BINUNICODE", "SHORT_BINBYTES", "BINBYTES", "EMPTY_TUPLE",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_LIST", "APPEND", "APPENDS", "EMPTY_DICT",
    "SETITEM", "SETITEMS", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "GLOBAL",
    "STACK_GLOBAL", "REDUCE", "BUILD"))
# kinds of value (int64, the type of what holds them)
(_K_INT, _K_BOOL, _K_NONE, _K_STR, _K_BYTES, _K_LIST, _K_DICT, _K_TUPLE, _K_GLOBAL, _K_CALL,
 _K_BIG) = map(np.int64, range(1, 12))
# the globals accepted (a global's ``a``): numpy's reconstruction of an array, and nothing else
_RECONSTRUCT, _NDARRAY, _DTYPE = map(np.int64, range(3))
_NUMPY_GLOBALS = ((b"numpy._core.multiarray", b"_reconstruct", _RECONSTRUCT),
                  (b"numpy.core.multiarray", b"_reconstruct", _RECONSTRUCT),
                  (b"numpy", b"ndarray", _NDARRAY), (b"numpy", b"dtype", _DTYPE))
_GLOBAL_MODULES = tuple(np.frombuffer(m, np.uint8) for m, _, _ in _NUMPY_GLOBALS)
_GLOBAL_NAMES = tuple(np.frombuffer(n, np.uint8) for _, n, _ in _NUMPY_GLOBALS)
_GLOBAL_IDS = np.array([g for _, _, g in _NUMPY_GLOBALS], dtype=np.int64)

# statuses: the walk's refusals, and ``_ROOM`` (an array is full: ``detail`` says which, the caller
# grows it and walks again)
(_OK, _INCOMPLETE, _NOT_PROTO, _PROTO_LATER, _ACROSS_FRAME, _FRAME_PAST, _TRAILING, _OPCODE, _TOO_FEW,
 _NEEDS, _NEEDS_MARK, _FOREIGN_GLOBAL, _NOTHING_TO_REMEMBER, _NEVER_STORED, _MEMO_TOO_BIG, _KEY, _BAD_REDUCE,
 _SECOND_BUILD, _LEFT_ON_STACK, _ROOM) = range(20)
# the arrays ``_walk`` fills, in the order of its arguments: (name, columns or 0 for one dimension, dtype)
_ARRAYS = (("stack", 3, np.int64), ("marks", 0, np.int64), ("memo", 3, np.int64), ("kinds", 0, np.int8),
           ("values", 0, np.int64), ("runs", 3, np.int64), ("tuple_items", 3, np.int64), ("tuples", 2, np.int64),
           ("dict_items", 5, np.int64), ("calls", 5, np.int64))
#: what ``_walk`` counts (``counts``): its arrays' rows in use, then the result's (kind, a, b), then
#: a refused global's module and name (start, length) in the data
_COUNTS = 8 + 3 + 4


@kernel(inline=True)
def _same_bytes(data, at, length, expected):
    if length != expected.shape[0]:
        return False
    for k in range(length):
        if data[at + k] != expected[k]:
            return False
    return True


@kernel()
def _global_id(data, module, module_length, name, name_length):
    """Which accepted global the module and name at those bytes are (its id), or -1."""
    for g in range(_GLOBAL_IDS.shape[0]):
        if (_same_bytes(data, module, module_length, _GLOBAL_MODULES[g])
                and _same_bytes(data, name, name_length, _GLOBAL_NAMES[g])):
            return _GLOBAL_IDS[g]
    return np.int64(-1)


@kernel(inline=True)
def _items(single, count, kind, stack, depth, floor, marks, nmarks):
    """Where the items an APPEND or SETITEM (``single``: its ``count`` values on top) or an APPENDS
    or SETITEMS (the values above the last mark) adds start, the container of ``kind`` just below
    them: (status, first item, marks left)."""
    if single:
        if depth - floor < count:
            return _TOO_FEW, 0, nmarks
        first = depth - count
        bottom = floor
    else:
        if nmarks == 0:
            return _NEEDS_MARK, 0, nmarks
        nmarks -= 1
        first = marks[nmarks]
        bottom = marks[nmarks - 1] if nmarks else 0
    if first <= bottom or stack[first - 1, 0] != kind:
        return _NEEDS, 0, nmarks
    return _OK, first, nmarks


@kernel(*(f"{b}, int64, int64[:, ::1], int64[::1], int64[:, ::1], int8[::1], int64[::1], int64[:, ::1], "
          f"int64[:, ::1], int64[:, ::1], int64[:, ::1], int64[:, ::1], int64[::1]"
          for b in ("uint8[::1]", "readonly(uint8[::1])")))
def _walk(data, start, stack, marks, memo, kinds, values, runs, tuple_items, tuples, dict_items, calls,
          counts):  # pragma: no cover - compiled
    """Walk the pickle at ``data[start:]``; returns (status, byte, detail): the byte and, for some
    refusals, a detail (the opcode, the memo key, the kind needed; for ``_ROOM`` the full array)."""
    n = data.shape[0]
    if start + 2 > n:
        return _INCOMPLETE, start, 0
    if data[start] != _PROTO or data[start + 1] < 2 or data[start + 1] > 5:
        return _NOT_PROTO, start, np.int64(data[start])
    pos = start + 2
    frame_end = -1
    depth = 0  # values on the stack
    nmarks = 0
    stored = 0  # distinct memo keys stored
    nvalues = nruns = ntuple_items = ntuples = ndict_items = ncalls = nlists = ndicts = 0
    memo[:, 0] = 0
    while pos < n:
        at = pos
        op = np.int64(data[at])
        if frame_end >= 0 and at >= frame_end:
            frame_end = -1
        # the opcode's length, its argument's bytes checked to be there
        size = np.int64(1)
        if op == _FRAME:
            size = 9
        elif (op == _BININT or op == _LONG_BINPUT or op == _LONG_BINGET or op == _BINUNICODE
              or op == _BINBYTES):
            size = 5
        elif (op == _BININT1 or op == _BINPUT or op == _BINGET or op == _SHORT_BINUNICODE or op == _SHORT_BINBYTES
              or op == _LONG1 or op == _PROTO):
            size = 2
        elif op == _BININT2:
            size = 3
        elif op == _GLOBAL:  # module\nname\n
            lines = 0
            k = at + 1
            while k < n and lines < 2:
                if data[k] == 10:
                    lines += 1
                k += 1
            if lines < 2:
                return _INCOMPLETE, at, 0
            size = k - at
        elif not (op == _NEWTRUE or op == _NEWFALSE or op == _NONE or op == _EMPTY_TUPLE or op == _MEMOIZE
                  or op == _MARK or op == _EMPTY_LIST or op == _EMPTY_DICT or op == _TUPLE or op == _TUPLE1
                  or op == _TUPLE2 or op == _TUPLE3 or op == _APPEND or op == _APPENDS or op == _SETITEM
                  or op == _SETITEMS or op == _STACK_GLOBAL or op == _REDUCE or op == _BUILD or op == _STOP):
            return _OPCODE, at, op
        if at + size > n:
            return _INCOMPLETE, at, 0
        length = np.int64(0)  # a string's or a long's bytes after its length
        if op == _SHORT_BINUNICODE or op == _SHORT_BINBYTES or op == _LONG1:
            length = np.int64(data[at + 1])
        elif op == _BINUNICODE or op == _BINBYTES:
            length = (np.int64(data[at + 1]) | np.int64(data[at + 2]) << 8 | np.int64(data[at + 3]) << 16
                      | np.int64(data[at + 4]) << 24)
        if at + size + length > n:
            return _INCOMPLETE, at, 0
        end = at + size + length
        if frame_end >= 0 and end > frame_end:
            return _ACROSS_FRAME, at, op
        pos = end
        floor = marks[nmarks - 1] if nmarks else 0
        if op == _PROTO:
            return _PROTO_LATER, at, op
        if op == _FRAME:
            flen = np.int64(0)
            for k in range(8):
                flen |= np.int64(data[at + 1 + k]) << (8 * k)
            if flen < 0 or pos + flen > n:
                return _FRAME_PAST, at, op
            frame_end = pos + flen
            continue
        # opcodes that push a value: (kind, a, b)
        push = True
        kind = np.int64(0)
        a = b = np.int64(0)
        if op == _BININT1:
            kind, a = _K_INT, np.int64(data[at + 1])
        elif op == _BININT2:
            kind, a = _K_INT, np.int64(data[at + 1]) | np.int64(data[at + 2]) << 8
        elif op == _BININT:
            a = (np.int64(data[at + 1]) | np.int64(data[at + 2]) << 8 | np.int64(data[at + 3]) << 16
                 | np.int64(data[at + 4]) << 24)
            kind, a = _K_INT, a - (np.int64(1) << 32) if a >= np.int64(1) << 31 else a
        elif op == _LONG1:
            if length > 8:
                kind = _K_BIG
            else:
                kind = _K_INT
                for k in range(length):
                    a |= np.int64(data[at + 2 + k]) << (8 * k)
                if 0 < length < 8 and data[at + 1 + length] >= _PROTO:
                    a -= np.int64(1) << (8 * length)
        elif op == _NEWTRUE or op == _NEWFALSE:
            kind, a = _K_BOOL, np.int64(op == _NEWTRUE)
        elif op == _NONE:
            kind = _K_NONE
        elif op == _SHORT_BINUNICODE or op == _BINUNICODE:
            kind, a, b = _K_STR, end - length, length
        elif op == _SHORT_BINBYTES or op == _BINBYTES:
            kind, a, b = _K_BYTES, end - length, length
        elif op == _EMPTY_LIST:
            kind, a = _K_LIST, nlists
            nlists += 1
        elif op == _EMPTY_DICT:
            kind, a = _K_DICT, ndicts
            ndicts += 1
        elif op == _BINGET or op == _LONG_BINGET:
            key = np.int64(data[at + 1])
            if op == _LONG_BINGET:
                for k in range(1, 4):
                    key |= np.int64(data[at + 1 + k]) << (8 * k)
            if key >= memo.shape[0] or memo[key, 0] == 0:
                return _NEVER_STORED, at, key
            kind, a, b = memo[key, 0], memo[key, 1], memo[key, 2]
        elif op == _GLOBAL:
            module = at + 1
            k = module
            while data[k] != 10:
                k += 1
            name = k + 1
            k = name
            while data[k] != 10:
                k += 1
            g = _global_id(data, module, name - 1 - module, name, k - name)
            if g < 0:
                counts[11], counts[12], counts[13], counts[14] = module, name - 1 - module, name, k - name
                return _FOREIGN_GLOBAL, at, 0
            kind, a = _K_GLOBAL, g
        elif op == _EMPTY_TUPLE or op == _TUPLE or op == _TUPLE1 or op == _TUPLE2 or op == _TUPLE3:  # tuples
            if op == _TUPLE:
                if nmarks == 0:
                    return _NEEDS_MARK, at, op
                nmarks -= 1
                first = marks[nmarks]
            else:
                count = 0 if op == _EMPTY_TUPLE else op - _TUPLE1 + 1
                if depth - floor < count:
                    return _TOO_FEW, at, op
                first = depth - count
            if ntuples == tuples.shape[0]:
                return _ROOM, at, 7
            if ntuple_items + depth - first > tuple_items.shape[0]:
                return _ROOM, at, 6
            tuples[ntuples, 0], tuples[ntuples, 1] = ntuple_items, depth - first
            for k in range(first, depth):
                tuple_items[ntuple_items, 0] = stack[k, 0]
                tuple_items[ntuple_items, 1] = stack[k, 1]
                tuple_items[ntuple_items, 2] = stack[k, 2]
                ntuple_items += 1
            depth = first
            kind, a = _K_TUPLE, ntuples
            ntuples += 1
        elif op == _STACK_GLOBAL:
            if depth - floor < 2:
                return _TOO_FEW, at, op
            depth -= 2
            g = -1
            if stack[depth, 0] == _K_STR and stack[depth + 1, 0] == _K_STR:
                g = _global_id(data, stack[depth, 1], stack[depth, 2], stack[depth + 1, 1], stack[depth + 1, 2])
            if g < 0:
                for k in range(2):
                    counts[11 + 2 * k], counts[12 + 2 * k] = -1, 0  # not a string
                    if stack[depth + k, 0] == _K_STR:
                        counts[11 + 2 * k], counts[12 + 2 * k] = stack[depth + k, 1], stack[depth + k, 2]
                return _FOREIGN_GLOBAL, at, 0
            kind, a = _K_GLOBAL, g
        elif op == _REDUCE:
            if depth - floor < 2:
                return _TOO_FEW, at, op
            depth -= 2
            if stack[depth, 0] != _K_GLOBAL or stack[depth + 1, 0] != _K_TUPLE:
                return _BAD_REDUCE, at, op
            if ncalls == calls.shape[0]:
                return _ROOM, at, 9
            calls[ncalls, 0], calls[ncalls, 1] = stack[depth, 1], stack[depth + 1, 1]
            calls[ncalls, 2] = calls[ncalls, 3] = calls[ncalls, 4] = 0  # no state yet
            kind, a = _K_CALL, ncalls
            ncalls += 1
        else:
            push = False
        if push:
            if depth == stack.shape[0]:
                return _ROOM, at, 0
            stack[depth, 0], stack[depth, 1], stack[depth, 2] = kind, a, b
            depth += 1
            continue
        if op == _MEMOIZE or op == _BINPUT or op == _LONG_BINPUT:
            key = stored
            if op != _MEMOIZE:
                key = np.int64(data[at + 1])
                if op == _LONG_BINPUT:
                    for k in range(1, 4):
                        key |= np.int64(data[at + 1 + k]) << (8 * k)
            if depth == 0:
                return _NOTHING_TO_REMEMBER, at, op
            if key >= n:
                return _MEMO_TOO_BIG, at, key
            if key >= memo.shape[0]:
                return _ROOM, at, 2
            if memo[key, 0] == 0:
                stored += 1
            memo[key, 0], memo[key, 1], memo[key, 2] = stack[depth - 1, 0], stack[depth - 1, 1], stack[depth - 1, 2]
        elif op == _MARK:
            if nmarks == marks.shape[0]:
                return _ROOM, at, 1
            marks[nmarks] = depth
            nmarks += 1
        elif op == _APPEND or op == _APPENDS:
            status, first, nmarks = _items(op == _APPEND, 1, _K_LIST, stack, depth, floor, marks, nmarks)
            if status != _OK:
                return status, at, _K_LIST if status == _NEEDS else op
            target = first - 1
            if nvalues + depth - first > values.shape[0]:
                return _ROOM, at, 4
            listed = stack[target, 1]
            if depth > first and not (nruns and runs[nruns - 1, 0] == listed
                                      and runs[nruns - 1, 1] + runs[nruns - 1, 2] == nvalues):
                if nruns == runs.shape[0]:
                    return _ROOM, at, 5
                runs[nruns, 0], runs[nruns, 1], runs[nruns, 2] = listed, nvalues, 0
                nruns += 1
            for k in range(first, depth):
                kinds[nvalues], values[nvalues] = stack[k, 0], stack[k, 1]
                nvalues += 1
            if depth > first:
                runs[nruns - 1, 2] += depth - first
            depth = first
        elif op == _SETITEM or op == _SETITEMS:
            status, first, nmarks = _items(op == _SETITEM, 2, _K_DICT, stack, depth, floor, marks, nmarks)
            if status != _OK:
                return status, at, _K_DICT if status == _NEEDS else op
            if (depth - first) % 2:
                return _KEY, at, op
            for k in range(first, depth, 2):
                if stack[k, 0] != _K_STR:
                    return _KEY, at, op
            if ndict_items + (depth - first) // 2 > dict_items.shape[0]:
                return _ROOM, at, 8
            for k in range(first, depth, 2):
                dict_items[ndict_items, 0] = stack[first - 1, 1]
                dict_items[ndict_items, 1], dict_items[ndict_items, 2] = stack[k, 1], stack[k, 2]
                dict_items[ndict_items, 3], dict_items[ndict_items, 4] = stack[k + 1, 0], stack[k + 1, 1]
                ndict_items += 1
            depth = first
        elif op == _BUILD:
            if depth - floor < 1:
                return _TOO_FEW, at, op
            depth -= 1
            if depth <= floor or stack[depth - 1, 0] != _K_CALL:
                return _NEEDS, at, _K_CALL
            call = stack[depth - 1, 1]
            if calls[call, 2] != 0 and calls[call, 2] != _K_NONE:
                return _SECOND_BUILD, at, op
            calls[call, 2], calls[call, 3], calls[call, 4] = stack[depth, 0], stack[depth, 1], stack[depth, 2]
        else:  # STOP
            if depth - floor < 1:
                return _TOO_FEW, at, op
            depth -= 1
            if depth or nmarks:
                return _LEFT_ON_STACK, at, op
            if pos != n:
                return _TRAILING, pos, 0
            counts[0], counts[1], counts[2], counts[3] = nvalues, nruns, ntuple_items, ntuples
            counts[4], counts[5], counts[6], counts[7] = ndict_items, ncalls, nlists, ndicts
            counts[8], counts[9], counts[10] = stack[0, 0], stack[0, 1], stack[0, 2]
            return _OK, at, 0
    return _INCOMPLETE, n, 0


def _walked(data: np.ndarray, start: int, path: str):
    """``_walk``'s arrays, trimmed to what it filled, and its counts; a FormatError for a refusal."""
    n = data.shape[0]
    rows = {"stack": 4096, "marks": 64, "memo": min(n, 4096), "kinds": n - start + 16, "values": n - start + 16,
            "runs": 1024, "tuple_items": 256, "tuples": 64, "dict_items": 1024,
            "calls": 16}
    while True:
        arrays = [np.empty((rows[name], columns) if columns else rows[name], dtype=dtype)
                  for name, columns, dtype in _ARRAYS]
        counts = np.zeros(_COUNTS, dtype=np.int64)
        status, at, detail = _walk(data, np.int64(start), *arrays, counts)
        if status != _ROOM:
            break
        names = ("kinds", "values") if _ARRAYS[detail][0] in ("kinds", "values") else (_ARRAYS[detail][0],)
        for name in names:
            rows[name] = min(4 * rows[name], n) if name == "memo" else 4 * rows[name]
    if status != _OK:
        raise refusal(path, "byte", int(at), _refused(int(status), int(detail), data, int(at), counts))
    stack, marks, memo, kinds, values, runs, tuple_items, tuples, dict_items, calls = arrays
    used = counts[:8]
    return (kinds[:used[0]], values[:used[0]], runs[:used[1]], tuple_items[:used[2]], tuples[:used[3]],
            dict_items[:used[4]], calls[:used[5]], int(used[7]), tuple(int(v) for v in counts[8:11]))


def _opcode_name(op: int) -> str:
    found = pickletools.code2op.get(chr(op)) if 0 <= op < 256 else None
    return found.name if found is not None else f"0x{op:02x}"


def _refused(status: int, detail: int, data: np.ndarray, at: int, counts: np.ndarray) -> str:
    """What ``_walk``'s refusal says."""
    crafted = "(a crafted file could run code under pickle.load; megacache never loads it)"
    op = _opcode_name(int(data[at])) if at < data.shape[0] else ""
    if status == _FOREIGN_GLOBAL:
        module, name = ("?" if counts[k] < 0 else bytes(data[counts[k]:counts[k] + counts[k + 1]]).decode(
            "utf-8", "replace") for k in (11, 13))
        return f"a global {module}.{name}: only numpy's own reconstruction of an array is accepted {crafted}"
    if status == _OPCODE and chr(detail) not in pickletools.code2op:
        status = _INCOMPLETE  # no opcode at all
    return {
        _INCOMPLETE: "not a complete pickle",
        _NOT_PROTO: f"{op}: not a pickle of protocol 2 to 5",
        _PROTO_LATER: "PROTO after the start",
        _ACROSS_FRAME: f"{op} across a frame's end",
        _FRAME_PAST: "a frame runs past the end",
        _TRAILING: "bytes after the pickle's STOP opcode",
        _OPCODE: f"opcode {op} is not one numpy's pickle of Bridge's packed rows uses {crafted}",
        _TOO_FEW: "an opcode with too few values before it",
        _NEEDS: f"an opcode that needs a {({_K_LIST: 'list', _K_DICT: 'dict', _K_CALL: 'call'}).get(detail)} before it",
        _NEEDS_MARK: "an opcode that needs a MARK before it",
        _NOTHING_TO_REMEMBER: f"{op} with nothing to remember",
        _NEVER_STORED: f"{op} of memo entry {detail}, which was never stored",
        _MEMO_TOO_BIG: f"{op} of memo entry {detail}, more than the pickle could store",
        _KEY: f"{op} with a key that is not a string",
        _BAD_REDUCE: "REDUCE of something other than a numpy global and its arguments",
        _SECOND_BUILD: "a second BUILD of one object",
        _LEFT_ON_STACK: "STOP with values left on the stack",
    }[status]


def _elements(runs: np.ndarray, lists: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The elements of each of ``lists`` (list numbers) in the walk's logs: (int64[len(lists) + 1],
    list k's elements are its slice of the second; int64, each element's place in the logs)."""
    order = np.argsort(runs[:, 0], kind="stable")
    owner, first, count = runs[order, 0], runs[order, 1], runs[order, 2]
    lo, hi = np.searchsorted(owner, lists, "left"), np.searchsorted(owner, lists, "right")
    before = np.concatenate(([0], np.cumsum(count)))
    offsets = np.concatenate(([0], np.cumsum(before[hi] - before[lo])))
    spans = hi - lo  # runs of each list
    run = np.repeat(lo - np.cumsum(spans) + spans, spans) + np.arange(int(spans.sum()))
    placed = np.concatenate(([0], np.cumsum(count[run])))[:-1]
    index = np.repeat(first[run] - placed, count[run]) + np.arange(int(count[run].sum()))
    return offsets, index


def read_npy(path: str) -> PackedRows:
    layout = read_npy_layout(path)
    if layout.dtype != np.dtype(object) or len(layout.shape) != 1:
        raise FormatError(f"{path}: a {layout.dtype} array of shape {layout.shape}; Bridge's packed .npy is a "
                          "one-dimensional object array of rows")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    kinds, values, runs, tuple_items, tuples, dict_items, calls, dicts, result = _walked(data, layout.data_offset, path)
    count = layout.shape[0]

    def items(entry) -> np.ndarray:
        """A tuple's items, rows of (kind, a, b); none for anything else."""
        return tuple_items[tuples[entry[1], 0]:tuples[entry[1], 0] + tuples[entry[1], 1]] if entry[0] == _K_TUPLE \
            else np.zeros((0, 3), np.int64)

    def text(entry) -> bytes | None:
        return bytes(data[entry[1]:entry[1] + entry[2]]) if entry[0] == _K_STR else None

    # numpy's pickle: _reconstruct(ndarray, ...) built with (1, (count,), dtype("O8", ...), False, rows)
    call = calls[result[1]] if result[0] == _K_CALL else None
    args = items((_K_TUPLE, call[1])) if call is not None else None
    state = items(call[2:5]) if call is not None else None
    dtype = calls[state[2][1]] if call is not None and len(state) == 5 and state[2][0] == _K_CALL else None
    shape = items(state[1]) if dtype is not None else None
    array = (dtype is not None and call[0] == _RECONSTRUCT and len(args) == 3
             and tuple(args[0][:2]) == (_K_GLOBAL, _NDARRAY) and len(shape) == 1 and shape[0][0] in (_K_INT, _K_BOOL)
             and shape[0][1] == count and dtype[0] == _DTYPE
             and len(items((_K_TUPLE, dtype[1]))) and text(items((_K_TUPLE, dtype[1]))[0]) == b"O8"
             and state[4][0] == _K_LIST)
    offsets, index = _elements(runs, np.array([state[4][1]])) if array else (None, None)
    if not array or index.size != count:
        raise FormatError(f"{path}: byte {layout.data_offset}: the pickle is not numpy's pickle of a "
                          "one-dimensional object array")
    # each row a dict of exactly the three lists (a key set twice keeps its last value)
    row_kinds, row_dicts = kinds[index], values[index]
    codes = np.full(len(dict_items), -1, dtype=np.int64)
    for c, name in enumerate(COLUMNS):
        key = np.frombuffer(name.encode(), np.uint8)
        same = np.flatnonzero(dict_items[:, 2] == key.size)
        equal = (data[dict_items[same, 1][:, None] + np.arange(key.size)] == key).all(axis=1)
        codes[same[equal]] = c
    codes[codes < 0] = len(COLUMNS)  # any other key
    _, last = np.unique((dict_items[:, 0] * (len(COLUMNS) + 1) + codes)[::-1], return_index=True)
    last = len(codes) - 1 - last  # each dict's last item of each key, as a dict keeps it
    final = np.zeros((dicts + 1, len(COLUMNS) + 1, 2), dtype=np.int64)  # per dict and key: (kind, value)
    final[dict_items[last, 0], codes[last]] = dict_items[last, 3:5]
    row_dicts = np.where(row_kinds == _K_DICT, row_dicts, dicts)  # a row that is not a dict: the empty entry
    fits = (row_kinds == _K_DICT) & (final[row_dicts, len(COLUMNS), 0] == 0) & \
        (final[row_dicts, :len(COLUMNS), 0] == _K_LIST).all(axis=1)
    if not fits.all():
        raise FormatError(f"{path}: row {int(np.argmin(fits))}: not a dict of the lists {', '.join(COLUMNS)}")

    def flat(c: int, name: str) -> tuple[np.ndarray, np.ndarray]:
        offsets, index = _elements(runs, final[row_dicts, c, 1])
        kind = kinds[index]
        if not np.isin(kind, (_K_INT, _K_BOOL, _K_BIG)).all():
            raise FormatError(f"{path}: {name} holds values other than integers")
        if (kind == _K_BIG).any():
            raise FormatError(f"{path}: {name} holds an integer beyond 64 bits")
        return offsets, values[index]

    return PackedRows(*(part for c, name in enumerate(COLUMNS) for part in flat(c, name)))


#: the fields of Bridge's packing metadata record (``algorithms.packing.metadata``)
METADATA_FIELDS = ("dataset_max_seqlen", "max_samples_per_bin", "packing_factor", "packing_efficiency",
                   "pack_size", "min_packed_seqlen")


def metadata_problems(path: str, rows: PackedRows) -> list[str]:
    """How the metadata file beside a packed file under Bridge's default name disagrees with it:
    not a list of records with Bridge's fields, or, where the file's record is known (the list
    holds one record per split file present, training's first), another pack count (through its
    packing factor) or max_samples_per_bin. None for a file under another name."""
    directory, name = os.path.split(path)
    pack_size = name.split("_", 1)[-1].split(".", 1)[0]
    splits = ("training", "validation")
    if not pack_size.isdigit() or name not in {default_file_name(s, int(pack_size)) for s in splits}:
        return []
    meta = os.path.join(directory, default_metadata_name(int(pack_size)))
    if not os.path.isfile(meta):
        return []
    try:
        records = metadata_records(meta)
    except MegacacheError as exc:
        return [str(exc)]
    bad = [i for i, r in enumerate(records) if not isinstance(r, dict) or set(r) != set(METADATA_FIELDS)]
    if bad:
        return [f"{meta}: record {bad[0]} does not hold Bridge's fields {', '.join(METADATA_FIELDS)}"]
    present = [s for s in splits if os.path.isfile(os.path.join(directory, default_file_name(s, int(pack_size))))]
    if len(records) != len(present):
        return []  # which record is whose is not known
    record = records[present.index(name.split("_", 1)[0])]
    found = []
    factor = round(rows.examples / rows.packs, 2) if rows.packs else None
    if record["packing_factor"] != factor:
        found.append(f"{path}: {rows.packs:,} packs of {rows.examples:,} examples (packing factor {factor}); its "
                     f"record in {meta} says packing_factor {record['packing_factor']}")
    most = int(np.diff(rows.place_offsets).max()) if rows.packs else 0
    if record["max_samples_per_bin"] != most:
        found.append(f"{path}: at most {most:,} examples in a pack; its record in {meta} says max_samples_per_bin "
                     f"{record['max_samples_per_bin']}")
    return found


def problems(path: str, rows: PackedRows) -> list[str]:
    """What Bridge's packed-sequence loader would trip on: a loss mask not as long as its pack, a
    mask value other than 0 or 1, a pack without seq_start_id, one not starting at 0, not rising or
    reaching past its pack's tokens; and ``metadata_problems``."""
    found = []

    def report(bad: np.ndarray, what: str):
        where = np.flatnonzero(bad)
        if len(where):
            found.append(f"{path}: {len(where):,} pack(s) {what}, the first pack {int(where[0])}")

    tokens = np.diff(rows.token_offsets)
    places = np.diff(rows.place_offsets)
    report(np.diff(rows.mask_offsets) != tokens, "with a loss_mask not as long as their input_ids")
    masked = np.repeat(np.arange(len(tokens)), np.diff(rows.mask_offsets))
    report(np.bincount(masked[(rows.loss_mask != 0) & (rows.loss_mask != 1)], minlength=len(tokens)) > 0,
           "with loss_mask values other than 0 and 1")
    report(places == 0, "without seq_start_id")
    pack = np.repeat(np.arange(len(places)), places)
    first = rows.place_offsets[:-1][places > 0]
    report(np.isin(np.arange(len(places)), pack[first[rows.seq_start_id[first] != 0]]),
           "whose seq_start_id does not start at 0")
    later = np.ones(len(pack), dtype=bool)
    later[first] = False
    falling = later.copy()
    falling[1:] &= np.diff(rows.seq_start_id) <= 0
    report(np.isin(np.arange(len(places)), pack[falling & later]), "whose seq_start_id does not rise")
    report(np.isin(np.arange(len(places)), pack[rows.seq_start_id >= np.repeat(tokens, places)]),
           "with a seq_start_id past their input_ids")
    return found + metadata_problems(path, rows)
