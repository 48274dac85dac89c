import numpy as np
import pytest

from megacache.errors import FormatError
from megacache.formats.indexed import IndexedDataset, optimal_dtype, read_layout, write_dataset


def megatron_write(megatron, prefix, documents, dtype):
    builder = megatron.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in documents:
        builder.add_document(list(map(int, doc)), [len(doc)] if len(doc) else [])
    builder.finalize(prefix + ".idx")


def read_bytes(prefix):
    return open(prefix + ".bin", "rb").read(), open(prefix + ".idx", "rb").read()


def test_three_documents_match_the_worked_example(tmp_path):
    # docs/megatron.md §7 fact 1
    write_dataset(str(tmp_path / "d"), [np.arange(3), np.arange(5), np.arange(2)], np.uint16)
    binb, idxb = read_bytes(str(tmp_path / "d"))
    assert len(binb) == 20 and len(idxb) == 102
    assert idxb[:17].hex() == "4d4d49444944580000" + "0100000000000000"
    assert idxb[17] == 8
    assert np.frombuffer(idxb[34:46], np.int32).tolist() == [3, 5, 2]
    assert np.frombuffer(idxb[46:70], np.int64).tolist() == [0, 6, 16]
    assert np.frombuffer(idxb[70:102], np.int64).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_random_datasets_equal_megatron_bytes(tmp_path, megatron, dtype):
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 30000, rng.integers(0, 40)) for _ in range(200)]  # includes empty docs
    write_dataset(str(tmp_path / "ours"), docs, dtype)
    megatron_write(megatron, str(tmp_path / "theirs"), docs, dtype)
    assert read_bytes(str(tmp_path / "ours")) == read_bytes(str(tmp_path / "theirs"))
    ours = IndexedDataset(str(tmp_path / "ours"))
    theirs = megatron.IndexedDataset(str(tmp_path / "theirs"))
    assert len(ours) == len(theirs)
    for i in range(len(ours)):
        assert np.array_equal(ours[i], theirs[i])
    for d, doc in enumerate(docs):
        assert np.array_equal(ours.document(d), doc)
    # read_lengths: megatron-core's sequence lengths, read rather than mapped, any range
    assert np.array_equal(ours.read_lengths(0, len(ours)), theirs.sequence_lengths)
    assert np.array_equal(ours.read_lengths(17, 101), theirs.sequence_lengths[17:101])
    assert ours.read_lengths(5, 5).shape == (0,)
    with pytest.raises(ValueError, match=r"sequences \[3, %d\) outside" % (len(ours) + 1)):
        ours.read_lengths(3, len(ours) + 1)


def test_span_bytes_match_megatrons_pointers(tmp_path, megatron):
    # each range's bytes from its first sequence's pointer to its last one's end, whatever the
    # ranges: neighbouring bounds (one read), far ones (pointers beyond a page apart), one sequence
    rng = np.random.default_rng(11)
    docs = [rng.integers(0, 30000, rng.integers(1, 40)) for _ in range(3000)]
    write_dataset(str(tmp_path / "d"), docs, np.int32)
    ours, theirs = IndexedDataset(str(tmp_path / "d")), megatron.IndexedDataset(str(tmp_path / "d"))
    pointers, lengths = theirs.index.sequence_pointers, theirs.sequence_lengths
    cuts = [[0, 1500, 2990, 3000], [0, 1, 2, 3000], [0, 2999, 3000], [0, 3000]]
    cuts += [[0, *sorted(rng.choice(np.arange(1, 3000), k, replace=False).tolist()), 3000] for k in (3, 20)]
    for bounds in cuts:
        ranges = list(zip(bounds[:-1], bounds[1:]))
        assert ours.span_bytes(ranges) == [(int(pointers[lo]), int(pointers[hi - 1] + 4 * lengths[hi - 1]))
                                           for lo, hi in ranges], bounds
    assert ours.span_bytes([(7, 2500), (100, 101)]) == [(int(pointers[7]), int(pointers[2499] + 4 * lengths[2499])),
                                                       (int(pointers[100]), int(pointers[100] + 4 * lengths[100]))]


def test_optimal_dtype_is_megatrons(megatron):
    for cardinality in (None, 0, 1, 255, 256, 65_499, 65_500, 65_535, 65_536, 128_256, 2**31):
        assert optimal_dtype(cardinality) == megatron.DType.optimal_dtype(cardinality), cardinality


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda b: b"XXIDIDX\x00\x00" + b[9:], "bad magic"),
        (lambda b: b[:9] + (2).to_bytes(8, "little") + b[17:], "unsupported version 2"),
        (lambda b: b[:17] + bytes([9]) + b[18:], "unknown dtype code 9"),
        (lambda b: b[:60], "truncated: 60 bytes"),
        (lambda b: b[:20], "truncated header"),
    ],
)
def test_corrupt_headers_are_named(tmp_path, corrupt, message):
    prefix = str(tmp_path / "d")
    write_dataset(prefix, [np.arange(3), np.arange(5)], np.uint16)
    data = open(prefix + ".idx", "rb").read()
    open(prefix + ".idx", "wb").write(corrupt(data))
    with pytest.raises(FormatError, match=message) as exc:
        read_layout(prefix + ".idx")
    assert prefix + ".idx" in str(exc.value)
