"""megacache.formats.paths: what a path given to verify, inspect, merge and convert names."""

import os

import numpy as np

from megacache.formats.indexed import write_dataset
from megacache.formats.paths import DIRECTORY, DS, MEGATRON, MISSING, OLMO, PBIN, Named, format_of, named


def dataset(prefix) -> str:
    write_dataset(str(prefix), [np.arange(5), np.arange(3)], np.uint16)
    return str(prefix)


def touch(path) -> str:
    open(path, "wb").close()
    return str(path)


def test_a_megatron_dataset_by_its_prefix_or_either_file(tmp_path):
    d = dataset(tmp_path / "d")
    assert [named(p) for p in (d, d + ".idx", d + ".bin")] == [Named(MEGATRON, d)] * 3


def test_a_prefix_with_its_files_is_a_dataset_when_a_directory_too(tmp_path):
    d = dataset(tmp_path / "d")
    os.makedirs(os.path.join(d, "cache", "GPTDataset_indices"))  # Megatron's default cache directory
    assert named(d) == Named(MEGATRON, d)
    assert named(d + ".idx") == Named(MEGATRON, d)


def test_one_file_of_the_two_makes_a_dataset(tmp_path):
    """Its reader then says which file is missing; a directory named as the prefix does not hide it."""
    d = dataset(tmp_path / "d")
    os.remove(d + ".idx")
    os.mkdir(d)
    assert named(d) == named(d + ".idx") == Named(MEGATRON, d)


def test_a_prefix_that_ends_in_bin_keeps_its_name(tmp_path):
    d = dataset(tmp_path / "d.bin")  # d.bin.idx and d.bin.bin
    assert [named(p) for p in (d, d + ".idx", d + ".bin")] == [Named(MEGATRON, d)] * 3


def test_directories(tmp_path):
    """A directory is one whatever its suffix, while no prefix's files say otherwise."""
    for name in ("cache", "shards.pbin", "tokens.npy", "cache.bin"):
        (tmp_path / name).mkdir()
        assert named(str(tmp_path / name)) == Named(DIRECTORY, str(tmp_path / name))
    touch(tmp_path / "cache.idx")  # a directory cache.bin is then the prefix's missing token file
    assert named(str(tmp_path / "cache.bin")) == Named(MEGATRON, str(tmp_path / "cache"))


def test_other_formats_by_suffix_there_or_not(tmp_path):
    for name, kind in (("a.pbin", PBIN), ("a.ds", DS), ("a.npy", OLMO)):
        there, absent = touch(tmp_path / name), str(tmp_path / f"absent-{name}")
        assert (named(there), named(absent)) == (Named(kind, there), Named(kind, absent))


def test_nothing_there(tmp_path):
    nope = str(tmp_path / "nope")
    assert [named(p) for p in (nope, nope + ".idx", nope + ".bin")] == [Named(MISSING, nope)] * 3
    other = touch(tmp_path / "notes.txt")  # a file, but no dataset
    assert named(other) == Named(MISSING, other)


def test_format_of_names_only(tmp_path):
    assert [format_of(str(tmp_path / n)) for n in ("o.ds", "o.pbin", "o.npy", "o", "o.bin")] == \
        [DS, PBIN, OLMO, MEGATRON, MEGATRON]
