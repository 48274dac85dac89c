"""The .pbin index codec: bytes equal to CPython's pickler, decoding equal to its serial reference
(over pickletools, which parses without executing) and to pickle itself, and refusal of anything
but a list of integer pairs."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from megacache.errors import FormatError
from megacache.formats import pickled_pairs as pp

EDGES = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**39 - 1, 2**39, 2**47 - 1, 2**47, 2**55 - 1, 2**55,
         2**63 - 1]


def random_pairs(rng, n):
    scale = rng.choice([300, 70_000, 2**32, 2**45, 2**63 - 1])
    pairs = rng.integers(0, scale, size=(n, 2), dtype=np.int64)
    if n:
        k = min(n, len(EDGES))
        pairs[rng.choice(n, k, replace=False), rng.integers(0, 2)] = rng.choice(EDGES, k)
    return pairs


def as_list(pairs):
    return [(int(a), int(b)) for a, b in pairs]


@pytest.mark.parametrize("n", [0, 1, 2, 999, 1000, 1001, 2001, 7919, 30000])
def test_dumps_equals_the_c_pickler(n):
    rng = np.random.default_rng(n)
    for _ in range(3):
        pairs = random_pairs(rng, n)
        assert pp.dumps(pairs[:, 0], pairs[:, 1]) == pickle.dumps(as_list(pairs), protocol=4)


def test_slices_encoded_apart_frame_as_one():
    """What ranks do: each encodes its slice unframed, frame cuts found slice after slice, bytes
    placed at their output positions."""
    rng = np.random.default_rng(7)
    for trial in range(30):
        n = int(rng.integers(0, 40_000))
        pairs = random_pairs(rng, n)
        want = pickle.dumps(as_list(pairs), protocol=4)
        bounds = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, size=int(rng.integers(0, 8)))]))
        if len(bounds) == 1:
            bounds = np.array([0, 0])
        slices = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        encoded = [pp.encode(pairs[a:b, 0], pairs[a:b, 1], a, n, opens=i == 0, closes=i == len(slices) - 1)
                   for i, (a, b) in enumerate(slices)]
        at = np.concatenate([[0], np.cumsum([len(p) for p, _ in encoded])])
        frame_start, cuts = 0, []
        for (_, boundaries), start in zip(encoded, at):
            found, frame_start = pp.frame_cuts(boundaries + start, frame_start)
            cuts.append(found)
        starts = pp.frame_starts(np.concatenate(cuts), int(at[-1]))
        out = bytearray(pp.pickle_size(int(at[-1]), len(starts)))
        for (payload, _), start in zip(encoded, at):
            before = int(np.count_nonzero(starts < start))
            chunk = pp.assemble_frames(payload, int(start), starts, int(at[-1]), before)
            pos = pp.output_position(int(start), before)
            out[pos : pos + len(chunk)] = chunk.tobytes()
        assert bytes(out) == want, (trial, slices)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_decode_reads_what_pickle_writes(protocol):
    rng = np.random.default_rng(protocol)
    for n in (0, 1, 2, 1000, 1001, 12345):
        pairs = random_pairs(rng, n)
        data = pickle.dumps(as_list(pairs), protocol=protocol)
        for decode in (pp.decode, pp.decode_reference):
            offsets, lengths = decode(data, "x.pbin")
            assert np.array_equal(offsets, pairs[:, 0]) and np.array_equal(lengths, pairs[:, 1])


@pytest.mark.parametrize("protocol", [2, 4])
def test_windows_from_checkpoints_equal_the_whole(protocol):
    """A window decoded from the nearest checkpoint (the state of the parse where an item starts:
    inside a batch, inside a frame) equals that slice of the whole."""
    rng = np.random.default_rng(protocol + 10)
    for n, every in ((1, 1), (2, 1), (1000, 7), (1001, 1000), (25_000, 333), (25_000, 4096)):
        pairs = random_pairs(rng, n)
        data = pickle.dumps(as_list(pairs), protocol=protocol)
        total, rows = pp.checkpoints(data, "x.pbin", every)
        assert total == n and np.array_equal(rows[:, 1], np.arange(0, n, every))
        assert np.array_equal(rows[:, 6], pairs[::every, 0])
        for _ in range(20):
            first = int(rng.integers(0, n))
            count = int(rng.integers(0, n - first + 1))
            offsets, lengths = pp.window(data, "x.pbin", rows[first // every], first, count)
            assert np.array_equal(offsets, pairs[first : first + count, 0])
            assert np.array_equal(lengths, pairs[first : first + count, 1])


def _outcome(decode, data):
    try:
        offsets, lengths = decode(data, "f.pbin")
    except FormatError as exc:
        return "refused", str(exc).split(":")[1].strip()  # the byte offset
    return "read", (offsets.tolist(), lengths.tolist())


def test_kernel_agrees_with_its_reference_on_damaged_pickles():
    """Random byte flips, cuts and insertions in valid pickles: the kernel and the reference accept
    the same inputs with the same pairs, and refuse the same ones at the same byte."""
    rng = np.random.default_rng(11)
    tried = refused = 0
    for _ in range(3000):
        pairs = random_pairs(rng, int(rng.choice([0, 1, 2, 3, 1001])))
        data = bytearray(pickle.dumps(as_list(pairs), protocol=int(rng.integers(2, 6))))
        for _ in range(int(rng.integers(1, 3))):
            if not data:
                break
            kind, at = rng.integers(0, 3), int(rng.integers(0, len(data)))
            if kind == 0:
                data[at] = int(rng.integers(0, 256))
            elif kind == 1:
                del data[at:]
            else:
                data[at:at] = bytes([int(rng.choice([0x28, 0x65, 0x61, 0x86, 0x94, 0x4B, 0x2E, 0x5D]))])
        kernel, reference = _outcome(pp.decode, bytes(data)), _outcome(pp.decode_reference, bytes(data))
        assert kernel == reference, (bytes(data), kernel, reference)
        if kernel[0] == "read":
            assert kernel[1] == tuple(map(list, zip(*pickle.loads(bytes(data))))) or not pickle.loads(bytes(data))
        tried += 1
        refused += kernel[0] == "refused"
    assert refused > tried // 2  # most damage is caught


class Exploit:
    def __reduce__(self):
        return (eval, ("1 + 1",))


@pytest.mark.parametrize("payload", [
    [(0, 1), Exploit()],
    [eval],
    [("a", 1)],
    [(0, -1)],
    [(0, 1, 2)],
    [((0, 1), 2)],
    [(0, 2**64)],
    {0: 1},
], ids=["reduce", "global", "string", "negative", "triple", "nested", "huge", "dict"])
def test_anything_but_pairs_is_refused_with_its_offset(payload):
    data = pickle.dumps(payload, protocol=4)
    for decode in (pp.decode, pp.decode_reference):
        with pytest.raises(FormatError, match=r"^f\.pbin: index byte \d+: "):
            decode(data, "f.pbin")


def test_truncated_and_trailing_bytes():
    data = pickle.dumps([(0, 5), (5, 7)], protocol=4)
    with pytest.raises(FormatError, match="frame runs past the end of the index"):
        pp.decode(data[:-1], "f.pbin")
    with pytest.raises(FormatError, match="bytes after the pickle's STOP opcode"):
        pp.decode(data + b"\0", "f.pbin")
    with pytest.raises(FormatError, match="ends before the pickle does"):
        pp.decode(b"", "f.pbin")
