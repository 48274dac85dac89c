"""Reading a packed SFT ``.npy`` file (numpy's pickle of Bridge's rows) without unpickling it
(``sft_packed.read_npy``, the ``_walk`` kernel): the rows numpy's own loader gives, for every
pickle protocol numpy's files use, batches of a thousand and values of every integer opcode; the
damage and the crafted pickles it refuses, each naming the file and the byte."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from megacache.errors import FormatError
from megacache.formats import sft_packed
from megacache.formats.sft_packed import COLUMNS, read_npy


def random_rows(rng, packs: int) -> np.ndarray:
    """Rows as Bridge builds them: lists of ints (any size, negative ones too), a mask of bools or
    ints, some empty, some longer than a pickle batch."""
    rows = []
    for _ in range(packs):
        n = int(rng.choice([0, 1, 3, 200, 1001, 2500]))
        scale = int(rng.choice([2**7, 2**15, 2**30, 2**62]))
        mask = rng.integers(0, 2, n)
        rows.append({"input_ids": [int(v) for v in rng.integers(-scale, scale, n)],
                     "loss_mask": [bool(v) for v in mask] if rng.random() < 0.5 else [int(v) for v in mask],
                     "seq_start_id": [int(v) for v in np.sort(rng.integers(0, 10**6, int(rng.integers(0, 4))))]})
    out = np.empty(len(rows), dtype=object)
    out[:] = rows
    return out


def npy_bytes(rows: np.ndarray, protocol: int) -> bytes:
    """numpy.save's bytes for ``rows`` with its pickle written at ``protocol``."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|O", "fortran_order": False, "shape": rows.shape})
    return buf.getvalue() + pickle.dumps(rows, protocol=protocol)


def flat(rows) -> list:
    out = []
    for name in COLUMNS:
        lists = [row[name] for row in rows]
        out += [np.concatenate(([0], np.cumsum([len(v) for v in lists]))).tolist(),
                [int(v) for v in lists for v in v]]
    return out


def as_lists(read: sft_packed.PackedRows) -> list:
    return [part.tolist() for part in read]


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_the_rows_numpys_loader_gives(protocol, kernel_mode, tmp_path):
    rng = np.random.default_rng(protocol)
    for packs in (0, 1, 7, 1200):
        rows = random_rows(rng, packs)
        path = tmp_path / f"{packs}.npy"
        path.write_bytes(npy_bytes(rows, protocol))
        assert as_lists(read_npy(str(path))) == flat(np.load(path, allow_pickle=True)), (protocol, packs)
    # numpy.save's own file, as Bridge writes it
    np.save(tmp_path / "saved.npy", rows, allow_pickle=True)
    assert as_lists(read_npy(str(tmp_path / "saved.npy"))) == flat(rows)


class NumpyOnly(pickle.Unpickler):
    """pickle's own loader, given nothing but numpy's reconstruction of an array."""

    def find_class(self, module, name):
        if (module, name) not in {("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
                                  ("numpy", "dtype")}:
            raise pickle.UnpicklingError(f"{module}.{name}")
        return super().find_class(module, name)


def test_damaged_pickles_are_refused_or_read_as_pickle_reads_them(tmp_path):
    """Random byte flips, cuts and insertions: the reader refuses with a FormatError naming the byte,
    or gives the rows pickle's own loader gives; most damage is caught."""
    rng = np.random.default_rng(9)
    path = tmp_path / "damaged.npy"
    refused = read = 0
    for trial in range(600):
        data = bytearray(npy_bytes(random_rows(rng, int(rng.integers(1, 4))), int(rng.integers(3, 6))))
        header = data.index(b"\n") + 1
        for _ in range(int(rng.integers(1, 3))):
            kind, at = rng.integers(0, 3), int(rng.integers(header, len(data)))
            if kind == 0:
                data[at] = int(rng.integers(0, 256))
            elif kind == 1:
                del data[max(at, header + 1):]
            else:
                data[at:at] = bytes([int(rng.choice([0x28, 0x65, 0x61, 0x75, 0x94, 0x4B, 0x2E, 0x5D, 0x7D, 0x68]))])
        path.write_bytes(bytes(data))
        try:
            ours = as_lists(read_npy(str(path)))
        except FormatError as exc:
            assert str(exc).startswith(f"{path}: "), str(exc)
            refused += 1
            continue
        read += 1
        try:
            theirs = NumpyOnly(io.BytesIO(bytes(data[header:]))).load()
        except Exception:  # what the reader does not look at (the dtype's state) numpy may refuse
            continue
        assert ours == flat(theirs), trial
    assert refused > 3 * read


def crafted(tmp_path, rows, protocol: int = 4, change=lambda data: data):
    path = tmp_path / "crafted.npy"
    data = npy_bytes(rows, protocol)
    header = data.index(b"\n") + 1
    path.write_bytes(data[:header] + change(data[header:]))
    return path, header


def one_row(**row) -> np.ndarray:
    out = np.empty(1, dtype=object)
    out[0] = {"input_ids": [1, 2], "loss_mask": [True, False], "seq_start_id": [0], **row}
    return out


@pytest.mark.parametrize("row, message", [
    ({"loss_mask": [True, "x"]}, "loss_mask holds values other than integers"),
    ({"input_ids": [2**64]}, "input_ids holds an integer beyond 64 bits"),
    ({"extra": []}, "row 0: not a dict of the lists input_ids, loss_mask, seq_start_id"),
    ({"seq_start_id": (0,)}, "row 0: not a dict of the lists input_ids, loss_mask, seq_start_id"),
])
def test_rows_other_than_bridges_are_refused(row, message, tmp_path):
    path, _ = crafted(tmp_path, one_row(**row))
    with pytest.raises(FormatError) as refused:
        read_npy(str(path))
    assert str(refused.value) == f"{path}: {message}"


def test_a_row_that_is_not_a_dict_and_a_missing_key_are_refused(tmp_path):
    rows = np.empty(2, dtype=object)
    rows[0], rows[1] = one_row()[0], [1, 2]
    path, _ = crafted(tmp_path, rows)
    with pytest.raises(FormatError, match=f"^{path}: row 1: not a dict of the lists"):
        read_npy(str(path))
    rows[1] = {"input_ids": [], "loss_mask": []}
    path, _ = crafted(tmp_path, rows)
    with pytest.raises(FormatError, match=f"^{path}: row 1: not a dict of the lists"):
        read_npy(str(path))


def test_damage_is_named_with_its_byte(tmp_path):
    rows = one_row()
    data = npy_bytes(rows, 3)  # unframed: bytes can be cut and added anywhere
    header = data.index(b"\n") + 1
    pickled = data[header:]
    cases = {
        "trailing": (pickled + b".", len(pickled), "bytes after the pickle's STOP opcode"),
        "cut": (pickled[:-3], len(pickled) - 4, "not a complete pickle"),  # its last opcode lacks its argument
        "never stored": (pickled[:2] + b"h\x63" + pickled[2:], 2, "BINGET of memo entry 99, which was never stored"),
        "no mark": (pickled[:2] + b"e" + pickled[2:], 2, "an opcode that needs a MARK before it"),
        "too few": (pickled[:2] + b"R" + pickled[2:], 2, "an opcode with too few values before it"),
        "append to nothing": (pickled[:2] + b"a" + pickled[2:], 2, "an opcode with too few values before it"),
        "append to no list": (pickled[:2] + b"NNa" + pickled[2:], 4, "an opcode that needs a list before it"),
        "appends at the bottom": (pickled[:2] + b"(Ne" + pickled[2:], 4, "an opcode that needs a list before it"),
        "setitem to no dict": (pickled[:2] + b"NNNs" + pickled[2:], 5, "an opcode that needs a dict before it"),
        "setitems to no dict": (pickled[:2] + b"N(NNu" + pickled[2:], 6, "an opcode that needs a dict before it"),
        "a key not a string": (pickled[:2] + b"}NNs" + pickled[2:], 5, "SETITEM with a key that is not a string"),
        "not a pickle": (b"\x80\x01" + pickled[2:], 0, "PROTO: not a pickle of protocol 2 to 5"),
    }
    for name, (changed, at, message) in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.npy"
        path.write_bytes(data[:header] + changed)
        with pytest.raises(FormatError) as refused:
            read_npy(str(path))
        assert str(refused.value) == f"{path}: byte {header + at}: {message}", name


def test_a_pickle_of_another_shape_is_refused(tmp_path):
    path, header = crafted(tmp_path, one_row())
    data = bytearray(path.read_bytes())
    data[:header] = npy_bytes(np.empty(2, dtype=object), 4)[:header]  # the header says 2 rows
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=f"^{path}: byte {header}: the pickle is not numpy's pickle of a "
                                          "one-dimensional object array"):
        read_npy(str(path))
