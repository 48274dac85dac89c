import json
import random

import numpy as np
import pytest

from megacache.megatron.cache import CacheEntry, blend_entry, blend_identifiers, describe, existing, gpt_identifiers
from megacache.formats.npy import NpyWriter, _numpy_header, load_npy, npy_header, write_npy
from megacache.runtime.fsio import DIRECT_MIN, DIRECT_STAGE


@pytest.mark.parametrize("dtype, shape", [(np.int32, (7, 2)), (np.int64, (0, 2)), (np.uint32, (13,)),
                                          (np.int16, (100000,)), (np.int64, (3,)),
                                          # slices large enough for O_DIRECT between unaligned ends
                                          (np.int16, (3_000_001,)), (np.int32, (1_000_003, 2))])
def test_npy_written_in_slices_equals_numpy_save(tmp_path, dtype, shape):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 1000, shape).astype(dtype)
    np.save(tmp_path / "ref.npy", arr, allow_pickle=True)
    NpyWriter.create(str(tmp_path / "ours.npy"), dtype, shape)
    with NpyWriter(str(tmp_path / "ours.npy"), dtype, shape) as w:
        cuts = sorted(set([0, len(arr)] + rng.integers(0, len(arr) + 1, 3).tolist()))
        for a, b in zip(cuts[::-1][1:], cuts[::-1][:-1]):  # out of order, like ranks finishing
            w.write_rows(a, arr[a:b])
    assert (tmp_path / "ours.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
    assert np.array_equal(load_npy(str(tmp_path / "ours.npy")), arr)


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64, np.uint32, np.float64])
def test_npy_header_from_a_template_equals_numpys(tmp_path, dtype):
    """Headers made from another shape's (same digits in the first dimension) are numpy's bytes:
    against numpy.save for real arrays, against numpy's header writer for shapes too large to hold."""
    for shape in [(0,), (1,), (7,), (10,), (99,), (100,), (12345,), (54321,), (999_999,), (0, 2), (1, 2), (77, 2),
                  (123_456, 2), (3, 4, 5)]:
        np.save(tmp_path / "ref.npy", np.zeros(shape, dtype))
        reference = (tmp_path / "ref.npy").read_bytes()
        header = npy_header(np.dtype(dtype), shape)
        assert reference[: len(header)] == header and len(reference) == len(header) + np.zeros(shape, dtype).nbytes
    rng = np.random.default_rng(5)
    for n in [*rng.integers(0, 2**62, 200).tolist(), 10**15, 10**15 - 1, 2**63 - 1]:
        for shape in ((n,), (n, 2)):
            assert npy_header(np.dtype(dtype), shape) == _numpy_header(np.dtype(dtype), shape)


def test_gpt_cache_name_of_the_worked_example(tmp_path):
    # The configuration of docs/megatron.md §7 fact 10: megatron-core 0.16.1, run on it, names the
    # files 3177734e….
    tokenizer = {"class": "megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText",
                 "tokenizer_path": None, "vocab_size": "1000"}
    entry = CacheEntry(str(tmp_path), gpt_identifiers(
        "data/tiny", 50, "train", 1234, 16, "969,30,1", [[0, 0.969], [0.969, 0.999], [0.999, 1.0]], tokenizer))
    assert entry.hash == "3177734e3afae46f9004a9f9cfbb4542"
    assert entry.path("sample_index.npy").endswith("3177734e3afae46f9004a9f9cfbb4542-GPTDataset-train-sample_index.npy")
    assert not entry.exists()


def test_existing_needs_every_file_of_an_entry(tmp_path):
    complete = CacheEntry(str(tmp_path), {"class": "GPTDataset", "index_split": "train", "n": 1})
    partial = CacheEntry(str(tmp_path), {"class": "BlendedDataset", "split": "valid", "n": 2})
    elsewhere = CacheEntry(str(tmp_path / "missing"), {"class": "GPTDataset", "index_split": "test"})
    for path in complete.paths().values():
        open(path, "w").close()
    open(partial.path("description.txt"), "w").close()
    assert existing([complete, partial, elsewhere]) == [True, False, False]
    assert [e.exists() for e in (complete, partial, elsewhere)] == [True, False, False]


@pytest.mark.parametrize("elements", [12, DIRECT_MIN // 4 - 40, DIRECT_MIN // 4 + 1, DIRECT_STAGE // 4,
                                      DIRECT_STAGE // 4 * 2 + 999])
def test_write_npy_equals_numpy_save(tmp_path, elements):
    # Sizes around the O_DIRECT threshold and the staging buffer: a buffered file, a direct one whose
    # last block is padded and cut, exactly one staging buffer and two-and-a-bit of them.
    arr = np.random.default_rng(elements).integers(0, 2**31, elements).astype(np.uint32)[::-1].reshape(-1, 1)
    np.save(tmp_path / "ref.npy", arr, allow_pickle=True)
    write_npy(str(tmp_path / "ours.npy"), arr)
    assert (tmp_path / "ours.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
    write_npy(str(tmp_path / "ours.npy"), arr[: len(arr) // 2])  # overwritten by a shorter one: no stale tail
    np.save(tmp_path / "ref.npy", arr[: len(arr) // 2], allow_pickle=True)
    assert (tmp_path / "ours.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()


@pytest.mark.parametrize("weights, size", [([0.25, 0.5, 0.25], 1000), ([3, 1, 7], None), ([1e-300, 0.1, 2.5e10], 0)])
def test_blend_description_spliced_from_children_equals_json_dumps(tmp_path, weights, size):
    tokenizer = {"class": "T", "tokenizer_path": "a \"quoted\" path\nwith a newline", "nested": {"k": [1, {}]},
                 "empty": [], "vocab_size": "32000"}
    children = [CacheEntry(str(tmp_path), gpt_identifiers(f"data/p{i}", n, "valid", 7, 16, None, None, tokenizer))
                for i, n in enumerate([5, None, 0])]
    entry = blend_entry(str(tmp_path), children, "valid", weights, size)
    ids = blend_identifiers([c.identifiers for c in children], "valid", weights, size)
    assert entry.description == json.dumps(ids, indent=4)
    assert entry.hash == CacheEntry(str(tmp_path), ids).hash


def _random_value(rng: random.Random, depth: int):
    scalars = [None, True, False, 0, -7, 2**70, 0.1, 1e-300, -2.5e10, float("inf"), "", "é \"q\"\n\t\\", "\U0001f600"]
    kind = rng.randrange(5 if depth < 3 else 1)
    if kind == 0:
        return rng.choice(scalars)
    if kind in (1, 2):
        items = [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
        return items if kind == 1 else tuple(items)
    keys = ["a", "class", "ü", "", 3, 1.5, True, None]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_describe_equals_json_dumps_indent_4():
    """Megatron's description is json.dumps(indent=4); describe reuses nested values' texts, so
    values that repeat over entries and values of every kind and nesting are checked."""
    rng = random.Random(0)
    shared = {"split_matrix": [(0, 0.969), (0.969, 0.999), (0.999, 1.0)], "tokenizer": {"class": "T", "n": None}}
    for case in range(2000):
        ids = {k: _random_value(rng, 1) for k in rng.sample(["class", "dataset_path", "num_samples", "ü", ""], 3)}
        if case % 3 == 0:
            ids.update(shared)
        if case % 50 == 0:
            ids[7] = "a key json writes as a string"
        assert describe(ids) == json.dumps(ids, indent=4)
    assert describe({}) == "{}"
