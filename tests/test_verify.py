"""megacache verify finds each kind of damage, names the file and the first bad element."""

import numpy as np
import pytest

from corpus import run_megacache
from megacache.formats.indexed import write_dataset
from megacache.verify import verify_dataset


@pytest.fixture
def dataset(tmp_path):
    prefix = str(tmp_path / "d")
    rng = np.random.default_rng(1)
    write_dataset(prefix, [rng.integers(0, 500, rng.integers(0, 20)) for _ in range(50)], np.uint16)
    return prefix


def patch(path, offset, values):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.asarray(values).tobytes())


def test_sound_dataset_passes(dataset):
    assert verify_dataset(dataset, vocab_size=500) == []


def test_damage_is_located(dataset):
    from megacache.formats.indexed import read_layout

    lay = read_layout(dataset + ".idx")
    patch(dataset + ".idx", lay.pointers_offset + 8 * 3, np.int64(999))
    [problem] = verify_dataset(dataset)
    assert problem.startswith(dataset + ".idx: pointer of sequence 3 is 999")


def test_truncated_bin(dataset):
    with open(dataset + ".bin", "r+b") as f:
        f.truncate(f.seek(0, 2) - 2)
    [problem] = verify_dataset(dataset)
    assert "the file is truncated" in problem and problem.startswith(dataset + ".bin")


def test_non_monotone_document_indices(dataset):
    from megacache.formats.indexed import read_layout

    lay = read_layout(dataset + ".idx")
    patch(dataset + ".idx", lay.documents_offset + 8 * 10, np.int64(0))
    problems = verify_dataset(dataset)
    assert any("not monotone at entry 10" in p for p in problems)


def test_token_out_of_vocabulary(dataset):
    patch(dataset + ".bin", 2 * 7, np.uint16(4000))
    [problem] = verify_dataset(dataset, vocab_size=500)
    assert "token 7 has id 4000" in problem


def test_cli_exit_codes(dataset):
    ok = run_megacache(1, "verify", dataset)
    assert ok.stdout.startswith("ok ")
    with open(dataset + ".bin", "ab") as f:
        f.write(b"xx")
    bad = run_megacache(1, "verify", dataset, check=False)
    assert bad.returncode == 2 and "longer than its index says" in bad.stdout
