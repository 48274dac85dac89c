"""The ``.pbin`` index: a pickled Python list of ``(offset, length)`` integer pairs, written and read
without Python's pickle machinery.

Writing gives the bytes CPython's C pickler gives for such a list at protocol 4 (the default of
the Pythons Modalities runs on; docs/modalities.md §2), built with numpy a slice at a time:

* ``\\x80\\x04`` (PROTO 4), then the payload cut into frames, each ``\\x95`` + its length (u64 LE).
* Payload: EMPTY_LIST, MEMOIZE; items in batches of 1000, each batch ``MARK items APPENDS``; a list
  of exactly one item is ``item APPEND`` instead; STOP last.
* An item: both integers, TUPLE2, MEMOIZE. An integer n >= 0 is BININT1 (n < 2^8), BININT2
  (n < 2^16), BININT (n < 2^31), else LONG1 with the fewest two's-complement bytes.
* Framing: the pickler may close a frame only where it starts saving an object (before an item,
  and between an item's two integers), and does so at the first such point where the open frame
  holds at least 64 KiB. A frame is written with its header only if it holds at least 4 bytes (so
  the empty list's 3 payload bytes go unframed).

Where frames close depends on every byte before, so a distributed writer encodes its slice of items
unframed (``encode``), finds its cuts once it knows where the open frame started (``frame_cuts``,
a few operations per 64 KiB), and then places bytes and headers (``frame_starts``,
``assemble_frames``, ``output_position``).

Reading accepts only the opcodes such a list needs, in the order a list of pairs puts them, inside
well-formed frames; anything else (a global, a reduce, a string, a negative number) is refused with
its offset, so a crafted file runs nothing. ``checkpoints`` checks a whole index once and keeps the
parser's state every so many items; ``window`` decodes a range of items from such a state;
``decode`` reads all. ``decode_reference`` is the same decoder written over ``opcodes``, a walk of
``pickletools.genops`` (which parses without executing) with the checks any pickle reader needs
(PROTO, frames, trailing bytes): the serial reference for the kernel.
"""

from __future__ import annotations

import io
import pickletools

import numpy as np

from ..errors import FormatError
from ..runtime.kernels import kernel

PROTOCOL = 4
PREFIX = bytes([0x80, PROTOCOL])
FRAME_TARGET = 64 * 1024
FRAME_HEADER = 9
FRAME_MIN = 4
BATCH = 1000

_EMPTY_LIST, _MEMOIZE, _MARK, _APPENDS, _APPEND, _STOP = 0x5D, 0x94, 0x28, 0x65, 0x61, 0x2E
_TUPLE2, _FRAME, _PROTO = 0x86, 0x95, 0x80
_BININT1, _BININT2, _BININT, _LONG1 = 0x4B, 0x4D, 0x4A, 0x8A
_BINPUT, _LONG_BINPUT = 0x71, 0x72


# ------------------------------------------------------------------------------------------------
# writing


def _int_sizes(values: np.ndarray) -> np.ndarray:
    """Encoded size in bytes (opcode included) of each integer in [0, 2^63)."""
    v = values.astype(np.uint64, copy=False)
    sizes = np.full(len(v), 2, dtype=np.int64)
    sizes[v >= 1 << 8] = 3
    sizes[v >= 1 << 16] = 5
    # LONG1: opcode, count, and the fewest bytes n whose two's complement holds v: v < 2^(8n - 1)
    big = v >= 1 << 31
    sizes[big] = 7 + sum((v[big] >= np.uint64(1 << (8 * n - 1))).astype(np.int64) for n in (5, 6, 7))
    return sizes


def _put_ints(out: np.ndarray, at: np.ndarray, values: np.ndarray, sizes: np.ndarray) -> None:
    """Write each integer's opcode and little-endian bytes at ``out[at]``."""
    le = values.astype("<u8", copy=False).view(np.uint8).reshape(-1, 8)
    for size in np.unique(sizes):
        sel = sizes == size
        where = at[sel]
        if size <= 5:
            out[where] = {2: _BININT1, 3: _BININT2, 5: _BININT}[int(size)]
            first, nbytes = 1, int(size) - 1
        else:
            out[where] = _LONG1
            out[where + 1] = int(size) - 2
            first, nbytes = 2, int(size) - 2
        for k in range(nbytes):
            out[where + first + k] = le[sel, k]


def encode(offsets: np.ndarray, lengths: np.ndarray, first: int, total: int, opens: bool | None = None,
           closes: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Unframed payload bytes of items ``first … first+len(offsets)`` of a ``total``-item list, with
    the list's opening if ``opens`` (default: the slice starts at 0) and its STOP if ``closes``
    (default: the slice ends the list); and the payload positions (relative to the slice) where a
    frame may close."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(offsets)
    if len(lengths) != n or first < 0 or first + n > total:
        raise ValueError(f"items {first}..{first + n} of {total}, {len(lengths)} lengths")
    if n and (offsets.min() < 0 or lengths.min() < 0):
        raise ValueError("offsets and lengths must be non-negative")
    opens = first == 0 if opens is None else opens
    closes = first + n == total if closes is None else closes
    head = 2 if opens else 0
    index = np.arange(first, first + n, dtype=np.int64)
    single = total == 1
    mark = np.zeros(n, dtype=np.int64) if single else (index % BATCH == 0).astype(np.int64)
    close = (((index % BATCH) == BATCH - 1) | (index == total - 1)).astype(np.int64)
    a_size, b_size = _int_sizes(offsets), _int_sizes(lengths)
    item = mark + a_size + b_size + 2 + close
    ends = head + np.cumsum(item)
    starts = ends - item
    size = head + int(item.sum()) + (1 if closes else 0)
    out = np.zeros(size, dtype=np.uint8)
    if head:
        out[0], out[1] = _EMPTY_LIST, _MEMOIZE
    out[starts[mark == 1]] = _MARK
    a_at = starts + mark
    _put_ints(out, a_at, offsets, a_size)
    b_at = a_at + a_size
    _put_ints(out, b_at, lengths, b_size)
    out[b_at + b_size] = _TUPLE2
    out[b_at + b_size + 1] = _MEMOIZE
    out[ends[close == 1] - 1] = _APPEND if single else _APPENDS
    if closes:
        out[-1] = _STOP
    boundaries = np.empty(2 * n, dtype=np.int64)
    boundaries[0::2] = a_at
    boundaries[1::2] = b_at
    return out, boundaries


def frame_cuts(boundaries: np.ndarray, frame_start: int) -> tuple[np.ndarray, int]:
    """Where frames close among ``boundaries`` (sorted payload positions), the open frame having
    started at payload position ``frame_start``; and where the frame open after them started."""
    cuts = []
    while True:
        i = int(np.searchsorted(boundaries, frame_start + FRAME_TARGET))
        if i == len(boundaries):
            return np.array(cuts, dtype=np.int64), frame_start
        frame_start = int(boundaries[i])
        cuts.append(frame_start)


def frame_starts(cuts: np.ndarray, payload_total: int) -> np.ndarray:
    """Every frame's first payload position: 0 and the cuts, or none when the payload is too small
    to be framed."""
    if payload_total < FRAME_MIN:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.zeros(1, dtype=np.int64), np.asarray(cuts, dtype=np.int64)])


def dumps(offsets, lengths) -> bytes:
    """The whole pickle of one list, in one process (tools, tests and small files)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    payload, boundaries = encode(offsets, lengths, 0, len(offsets))
    cuts, _ = frame_cuts(boundaries, 0)
    return bytes(assemble_frames(payload, 0, frame_starts(cuts, len(payload)), len(payload), 0))


def assemble_frames(payload: np.ndarray, payload_start: int, starts: np.ndarray, payload_total: int,
                    frames_before: int) -> np.ndarray:
    """A slice's bytes in the pickle, frame headers included: ``payload`` is the unframed payload
    from ``payload_start``; ``starts`` the frame starts (``frame_starts``) within the slice and the
    first one after it, if any; ``frames_before`` the number of frames starting before the slice.
    The result goes at ``output_position(payload_start, frames_before)``, less PROTO for the slice
    at 0, which begins with it."""
    starts = np.asarray(starts, dtype=np.int64)
    mine = starts[(starts >= payload_start) & (starts < payload_start + len(payload))]
    ends = np.empty(len(mine), dtype=np.int64)
    if len(mine):
        later = starts[starts > mine[-1]]
        ends[:-1] = mine[1:]
        ends[-1] = later[0] if len(later) else payload_total
    head = PREFIX if payload_start == 0 else b""
    out = np.empty(len(head) + len(payload) + FRAME_HEADER * len(mine), dtype=np.uint8)
    out[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    pos, src = len(head), 0
    for start, end in zip(mine.tolist(), ends.tolist()):
        k = start - payload_start
        out[pos : pos + k - src] = payload[src:k]
        pos += k - src
        out[pos] = _FRAME
        out[pos + 1 : pos + FRAME_HEADER] = np.frombuffer(np.uint64(end - start).astype("<u8").tobytes(), np.uint8)
        pos += FRAME_HEADER
        src = k
    out[pos:] = payload[src:]
    return out


def pickle_size(payload_total: int, frames: int) -> int:
    """Bytes of the whole pickle: PROTO, the payload and its frames' headers."""
    return len(PREFIX) + payload_total + FRAME_HEADER * frames


def output_position(payload_start: int, frames_before: int) -> int:
    """Where payload position ``payload_start`` (not a frame start) lands in the pickle, after PROTO
    and ``frames_before`` frame headers; a slice starting at 0 starts at 0 (with PROTO)."""
    return 0 if payload_start == 0 else len(PREFIX) + payload_start + FRAME_HEADER * frames_before


# ------------------------------------------------------------------------------------------------
# reading

#: decoder statuses
OK, BAD_OPCODE, TRUNCATED, NEGATIVE, STRUCTURE, TRAILING, TOO_BIG, FRAME_PAST_END = range(8)
_STATUS_TEXT = {
    BAD_OPCODE: "opcode {op} is not one a list of integer pairs needs (a crafted index could run code "
                "under pickle.load; megacache never loads it)",
    TRUNCATED: "the index ends before the pickle does (truncated file?)",
    NEGATIVE: "a negative integer (offsets and lengths are never negative)",
    STRUCTURE: "opcode {op} where a list of (offset, length) pairs cannot have it",
    TRAILING: "bytes after the pickle's STOP opcode",
    TOO_BIG: "an integer too large for 63 bits",
    FRAME_PAST_END: "a frame runs past the end of the index (truncated file?)",
}


#: a checkpoint: the decoder's state where an item's first integer starts (its byte position, the
#: item's number, whether a MARK is open, items since it, memo entries so far, the open frame's
#: end or -1) and that integer (the item's offset)
CHECKPOINT = ("position", "item", "marked", "pending", "memos", "frame_end", "offset")


@kernel(*(f"{b}, int64[::1], int64, int64, int64[::1], int64[::1], int64, int64[:, ::1]"
         for b in ("uint8[::1]", "readonly(uint8[::1])")))
def _decode(buf, resume, first, count, offsets, lengths, every, checkpoints):  # pragma: no cover - compiled
    """Parse ``buf`` from its start (``resume[0] == 0``) or from a checkpoint row ``resume``; keep
    items [first, first+count) into ``offsets``/``lengths``; from a checkpoint, stop once they are
    read. With ``every`` > 0, record a checkpoint row at every ``every``-th item.
    Returns (status, byte offset of the problem, opcode there, items seen, checkpoints recorded)."""
    n = len(buf)
    kept = 0
    if resume[0] == 0:
        if n < 2:
            return TRUNCATED, 0, np.int64(-1), 0, kept
        if buf[0] != _PROTO or buf[1] < 2 or buf[1] > 5:
            return STRUCTURE, 0, np.int64(buf[0]), 0, kept
        pos = 2
        items = 0
        started = False
        marked = False     # a MARK is open
        pending = 0        # items parsed but not yet appended
        memos = 0          # memo entries so far: a BINPUT must name the next one
        frame_end = -1
        stop_at = -1
    else:
        pos, items, started = resume[0], resume[1], True
        marked, pending, memos, frame_end = resume[2] != 0, resume[3], resume[4], resume[5]
        stop_at = first + count
    stopped = False
    ints = 0           # integers on the stack since the last tuple
    a = np.int64(0)
    b = np.int64(0)
    memo_ok = False    # a memo opcode may follow (after the list or a tuple)
    while pos < n:
        start = pos
        op = np.int64(buf[pos])
        if stopped:
            return TRAILING, start, op, items, kept
        if frame_end >= 0 and start >= frame_end:
            frame_end = -1
        if op == _FRAME:
            size = 9
        elif op == _BINPUT or op == _BININT1:
            size = 2
        elif op == _BININT2:
            size = 3
        elif op == _LONG_BINPUT or op == _BININT:
            size = 5
        elif op == _LONG1:
            if start + 2 > n:
                return TRUNCATED, start, op, items, kept
            if buf[start + 1] > 8:
                return TOO_BIG, start, op, items, kept
            size = 2 + np.int64(buf[start + 1])
        elif (op == _MEMOIZE or op == _EMPTY_LIST or op == _MARK or op == _APPENDS or op == _APPEND
              or op == _STOP or op == _TUPLE2):
            size = 1
        else:
            return BAD_OPCODE, start, op, items, kept
        if start + size > n:
            return TRUNCATED, start, op, items, kept
        if frame_end >= 0 and start + size > frame_end:
            return STRUCTURE, start, op, items, kept  # an opcode across a frame's end, or a frame in a frame
        pos = start + size
        if op == _FRAME:
            flen = np.int64(0)
            for k in range(8):
                flen |= np.int64(buf[start + 1 + k]) << (8 * k)
            if flen < 0 or pos + flen > n:
                return FRAME_PAST_END, start, op, items, kept
            frame_end = pos + flen
            continue
        if op == _MEMOIZE or op == _BINPUT or op == _LONG_BINPUT:
            if not memo_ok:
                return STRUCTURE, start, op, items, kept
            if op != _MEMOIZE:
                key = np.int64(buf[start + 1])
                if op == _LONG_BINPUT:
                    for k in range(1, 4):
                        key |= np.int64(buf[start + 1 + k]) << (8 * k)
                if key != memos:
                    return STRUCTURE, start, op, items, kept
            memos += 1
            memo_ok = False
            continue
        memo_ok = False
        if not started:
            if op != _EMPTY_LIST:
                return STRUCTURE, start, op, items, kept
            started = True
            memo_ok = True
            continue
        if op == _BININT1 or op == _BININT2 or op == _BININT or op == _LONG1:
            if ints == 2:
                return STRUCTURE, start, op, items, kept
            if ints == 0 and items == stop_at:
                return OK, start, np.int64(-1), items, kept
            width = size - 1 if op != _LONG1 else size - 2
            at = start + 1 if op != _LONG1 else start + 2
            v = np.int64(0)
            for k in range(width):
                v |= np.int64(buf[at + k]) << (8 * k)
            if (op == _BININT and v >= np.int64(1) << 31) or (op == _LONG1 and width > 0 and buf[at + width - 1] >= 0x80):
                return NEGATIVE, start, op, items, kept
            if ints == 0:
                a = v
                if every > 0 and items % every == 0:
                    if kept == len(checkpoints):
                        return STRUCTURE, start, op, items, kept  # more items than the bytes allow
                    row = checkpoints[kept]
                    row[0], row[1], row[2], row[3], row[4], row[5], row[6] = (
                        start, items, np.int64(marked), pending, memos, frame_end, v)
                    kept += 1
            else:
                b = v
            ints += 1
        elif op == _TUPLE2:
            if ints != 2:
                return STRUCTURE, start, op, items, kept
            if items >= first and items - first < count:
                offsets[items - first] = a
                lengths[items - first] = b
            items += 1
            pending += 1
            ints = 0
            memo_ok = True
        elif op == _MARK:
            if ints != 0 or marked or pending != 0:
                return STRUCTURE, start, op, items, kept
            marked = True
        elif op == _APPENDS:
            if not marked or ints != 0:
                return STRUCTURE, start, op, items, kept
            marked = False
            pending = 0
        elif op == _APPEND:
            if marked or ints != 0 or pending != 1:
                return STRUCTURE, start, op, items, kept
            pending = 0
        elif op == _STOP:
            if marked or ints != 0 or pending != 0:
                return STRUCTURE, start, op, items, kept
            stopped = True
        else:
            return STRUCTURE, start, op, items, kept  # a second EMPTY_LIST
    if not stopped:
        return TRUNCATED, n, np.int64(-1), items, kept
    return OK, n, np.int64(-1), items, kept


def _raise(status: int, where: int, op: int, name: str) -> None:
    label = pickletools.code2op.get(chr(op)).name if 0 <= op < 256 and chr(op) in pickletools.code2op else f"0x{op:02x}"
    text = _STATUS_TEXT[status].format(op=f"{label} (0x{op:02x})" if op >= 0 else "")
    raise FormatError(f"{name}: index byte {where}: {text}")


#: the fewest bytes an item takes (two BININT1, TUPLE2), bounding the items a buffer can hold
_MIN_ITEM = 5
_NO_RESUME = np.zeros(len(CHECKPOINT), dtype=np.int64)
_NO_ROWS = np.zeros((0, len(CHECKPOINT)), dtype=np.int64)
_NONE = np.zeros(0, dtype=np.int64)


def _as_bytes(buf) -> np.ndarray:
    return buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)


def decode(buf, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Every item of a pickled list of pairs in ``buf`` (the whole index) as int64 offsets and
    lengths; a FormatError naming ``name`` and the byte offset for anything but such a list."""
    buf = _as_bytes(buf)
    total, _ = checkpoints(buf, name, 0)
    return window(buf, name, None, 0, total)


def checkpoints(buf, name: str, every: int) -> tuple[int, np.ndarray]:
    """Check every byte of the index; its item count and a checkpoint row (``CHECKPOINT``) at every
    ``every``-th item (none if 0): memory in items / ``every``."""
    buf = _as_bytes(buf)
    rows = np.zeros((len(buf) // (_MIN_ITEM * every) + 1 if every else 0, len(CHECKPOINT)), dtype=np.int64)
    status, where, op, total, kept = _decode(buf, _NO_RESUME, 0, 0, _NONE, _NONE, every, rows)
    if status != OK:
        _raise(status, where, op, name)
    return total, rows[:kept]


def window(buf, name: str, resume: np.ndarray | None, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Items [first, first+count), parsed from the checkpoint row ``resume`` (at or before ``first``;
    None: from the start, every byte checked) up to the last of them."""
    buf = _as_bytes(buf)
    offsets = np.zeros(count, dtype=np.int64)
    lengths = np.zeros(count, dtype=np.int64)
    status, where, op, total, _ = _decode(buf, _NO_RESUME if resume is None else resume, first, count,
                                                 offsets, lengths, 0, _NO_ROWS)
    if status != OK:
        _raise(status, where, op, name)
    if first + count > total:
        raise FormatError(f"{name}: the index holds {total} documents, not {first + count}")
    return offsets, lengths


def refusal(name: str, label: str, at: int, why: str) -> FormatError:
    """The error refusing a pickle in file ``name`` at byte ``at`` (``label`` says of what)."""
    return FormatError(f"{name}: {label} {at}: {why}")


def opcodes(data: bytes, name: str):
    """The opcodes of the pickle ``data`` as ``pickletools.genops`` parses them (nothing
    is executed): (name, argument, byte position), PROTO and FRAME checked and left out. Refused
    (``refusal``): anything but a protocol 2 to 5 pickle, an unknown opcode, one across a frame's
    end, a frame past the end, bytes after STOP."""
    stream = io.BytesIO(data)
    ops = pickletools.genops(stream)
    frame_end = -1
    while True:
        where = stream.tell()
        try:
            opcode, arg, pos = next(ops)
        except StopIteration:
            return
        except ValueError:  # unknown opcode, or the data ends inside one or before STOP
            raise refusal(name, "index byte", where, "not a complete pickle") from None
        op, end = opcode.name, stream.tell()
        if pos == 0:
            if op != "PROTO" or not 2 <= arg <= 5:
                raise refusal(name, "index byte", pos, f"{op}: not a pickle of protocol 2 to 5")
            continue
        if op == "PROTO":
            raise refusal(name, "index byte", pos, "PROTO after the start")
        if frame_end >= 0 and pos >= frame_end:
            frame_end = -1
        if frame_end >= 0 and end > frame_end:
            raise refusal(name, "index byte", pos, f"{op} across a frame's end")
        if op == "FRAME":
            if end + arg > len(data):
                raise refusal(name, "index byte", pos, "a frame runs past the end")
            frame_end = end + arg
            continue
        yield op, arg, pos
        if op == "STOP" and pos != len(data) - 1:  # after the caller has judged the STOP itself
            raise refusal(name, "index byte", pos + 1, "bytes after the pickle's STOP opcode")


def decode_reference(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``decode`` written over ``opcodes``: the same pairs, or a refusal at the same byte (tests
    hold the kernel to it)."""
    pairs, stack = [], []
    started = marked = memo_ok = False
    pending = memos = 0

    def refuse(at: int, why: str):
        raise refusal(name, "index byte", at, why)

    for op, arg, pos in opcodes(data, name):
        if op == "LONG1" and data[pos + 1] > 8:
            refuse(pos, "an integer too large for 63 bits")
        if op in ("MEMOIZE", "BINPUT", "LONG_BINPUT"):
            if not memo_ok or (op != "MEMOIZE" and arg != memos):
                refuse(pos, f"{op} out of place")
            memos += 1
            memo_ok = False
            continue
        memo_ok = False
        if not started:
            if op != "EMPTY_LIST":
                refuse(pos, f"{op} before the list")
            started = memo_ok = True
        elif op in ("BININT1", "BININT2", "BININT", "LONG1"):
            if len(stack) == 2:
                refuse(pos, "a third integer")
            if arg < 0:
                refuse(pos, "a negative integer")
            stack.append(arg)
        elif op == "TUPLE2":
            if len(stack) != 2:
                refuse(pos, "TUPLE2 without two integers")
            pairs.append(tuple(stack))
            stack.clear()
            pending += 1
            memo_ok = True
        elif op == "MARK":
            if stack or marked or pending:
                refuse(pos, "MARK out of place")
            marked = True
        elif op == "APPENDS":
            if not marked or stack:
                refuse(pos, "APPENDS out of place")
            marked, pending = False, 0
        elif op == "APPEND":
            if marked or stack or pending != 1:
                refuse(pos, "APPEND out of place")
            pending = 0
        elif op == "STOP":
            if marked or stack or pending:
                refuse(pos, "STOP inside the list")
        else:
            refuse(pos, f"opcode {op} is not one a list of integer pairs needs")
    return np.array([a for a, _ in pairs], dtype=np.int64), np.array([b for _, b in pairs], dtype=np.int64)
