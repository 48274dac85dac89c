"""megacache merge equals megatron-core's IndexedDatasetBuilder.add_index over the same prefixes."""

import numpy as np
import pytest

from support.inputs.corpus import file_bytes, run_megacache
from megacache.builders.merge import merge
from megacache.errors import MegacacheError
from megacache.formats.indexed import write_dataset


def make_inputs(tmp_path, dtype=np.uint16, seed=0):
    rng = np.random.default_rng(seed)
    prefixes = []
    for j, n in enumerate([0, 1, 37, 5, 200]):  # includes a dataset with no documents
        docs = [rng.integers(0, 5000, rng.integers(0, 30)) for _ in range(n)]
        prefix = str(tmp_path / f"in_{j}")
        write_dataset(prefix, docs, dtype)
        prefixes.append(prefix)
    return prefixes


def megatron_merge(megatron, prefixes, out, dtype):
    builder = megatron.IndexedDatasetBuilder(out + ".bin", dtype=dtype)
    for p in prefixes:
        builder.add_index(p)
    builder.finalize(out + ".idx")


@pytest.mark.parametrize("chunk_bytes", [1, 64, 1 << 30])
def test_merge_equals_megatron_add_index(tmp_path, megatron, chunk_bytes):
    prefixes = make_inputs(tmp_path)
    order = prefixes[::-1]  # the order given, not sorted
    merge(order, str(tmp_path / "ours"), chunk_bytes=chunk_bytes)
    megatron_merge(megatron, order, str(tmp_path / "theirs"), np.uint16)
    assert file_bytes(str(tmp_path / "ours")) == file_bytes(str(tmp_path / "theirs"))


@pytest.mark.parametrize("ranks", [2, 3])
def test_merge_under_mpi(tmp_path, megatron, ranks):
    prefixes = make_inputs(tmp_path, np.int32, seed=ranks)
    run_megacache(ranks, "merge", *prefixes, "--output-prefix", str(tmp_path / "ours"), "--chunk-bytes", "100")
    megatron_merge(megatron, prefixes, str(tmp_path / "theirs"), np.int32)
    assert file_bytes(str(tmp_path / "ours")) == file_bytes(str(tmp_path / "theirs"))


def test_mixed_dtypes_merge_only_into_a_dtype_given(tmp_path, megatron):
    """Inputs of several widths need --dtype; with it, each input is as if written in that dtype."""
    docs = {"a": [np.arange(3), np.arange(60000, 60005)], "b": [np.arange(70000, 70004)]}
    write_dataset(str(tmp_path / "a"), docs["a"], np.uint16)
    write_dataset(str(tmp_path / "b"), docs["b"], np.int32)
    with pytest.raises(MegacacheError, match="holds int32 tokens but .* holds uint16; give --dtype"):
        merge([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "o"))
    merge([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "ours"), dtype="int32")
    for name in docs:
        write_dataset(str(tmp_path / f"{name}32"), docs[name], np.int32)
    megatron_merge(megatron, [str(tmp_path / "a32"), str(tmp_path / "b32")], str(tmp_path / "theirs"), np.int32)
    assert file_bytes(str(tmp_path / "ours")) == file_bytes(str(tmp_path / "theirs"))


def test_merge_refuses_truncated_bin(tmp_path):
    write_dataset(str(tmp_path / "a"), [np.arange(30)], np.uint16)
    with open(tmp_path / "a.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(MegacacheError, match="truncated"):
        merge([str(tmp_path / "a")], str(tmp_path / "o"))


def test_merge_refuses_pointers_that_disagree_with_lengths(tmp_path):
    from megacache.formats.indexed import read_layout

    write_dataset(str(tmp_path / "a"), [np.arange(5), np.arange(7), np.arange(3)], np.uint16)
    lay = read_layout(str(tmp_path / "a.idx"))
    with open(tmp_path / "a.idx", "r+b") as f:  # the last pointer, inside the file, 2 tokens early
        f.seek(lay.pointers_offset + 8 * 2)
        f.write(np.int64(2 * 10).tobytes())
    with pytest.raises(MegacacheError, match=r"pointers of sequences 0\.\.3 disagree"):
        merge([str(tmp_path / "a")], str(tmp_path / "o"))
    assert not (tmp_path / "o.bin").exists() and not (tmp_path / "o.idx").exists()
