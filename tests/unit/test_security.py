"""What megacache never does with files it reads: unpickle them, follow names out of the cache
directory, or run code shipped with a tokenizer; and what it creates honours the umask."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest

from megacache.builders.build import BuildConfig, build
from megacache.runtime.comm import SingleComm
from megacache.errors import FormatError, MegacacheError
from megacache.megatron.cache import CacheEntry, gpt_identifiers
from megacache.formats.npy import load_npy
from megacache.text.tokenization import load_tokenizer
from support.inputs.indexed import write_lengths
from support.sweeps import NULL_TOKENIZER


class Payload:
    """Unpickling this would create a file: proof that the pickle ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickled_array_is_refused_not_loaded(tmp_path):
    marker = tmp_path / "unpickled"
    path = str(tmp_path / "x-GPTDataset-train-sample_index.npy")
    np.save(path, np.array([Payload(str(marker))], dtype=object), allow_pickle=True)
    with pytest.raises(FormatError, match=f"{path}: not a readable .npy array"):
        load_npy(path)
    assert not marker.exists()


@pytest.mark.parametrize("split", ["../../../tmp/evil", "train/../../x", "nonsense"])
def test_a_description_cannot_steer_file_names_out_of_the_cache(tmp_path, split):
    ids = gpt_identifiers("/data/d", 10, split, 1234, 64, "1,0,0", [[0, 1], None, None], NULL_TOKENIZER)
    entry = CacheEntry(str(tmp_path), ids)
    with pytest.raises(FormatError, match="megacache knows GPTDataset and BlendedDataset, splits train, valid, test"):
        entry.path("sample_index.npy")


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600)])
def test_created_files_honour_the_umask(tmp_path, umask, mode):
    prefix = str(tmp_path / "d")
    write_lengths(prefix, np.full(1000, 50))
    cache = tmp_path / "cache"
    old = os.umask(umask)
    try:
        build(BuildConfig.for_prefix(prefix, seq_length=32, sizes=(100, 10, 10), tokenizer=NULL_TOKENIZER,
                                     cache_dir=str(cache)), SingleComm())
    finally:
        os.umask(old)
    modes = {e.name: stat.S_IMODE(e.stat().st_mode) for e in os.scandir(cache) if e.is_file()}
    modes["manifest.json"] = stat.S_IMODE(os.stat(cache / ".megacache" / "manifest.json").st_mode)
    assert len(modes) == 14 and set(modes.values()) == {mode}, modes  # 12 entry files, sequences, manifest


def test_code_shipped_with_a_tokenizer_is_never_run(tmp_path):
    """A Hugging Face directory whose config asks for its own Python class (``auto_map``, which
    transformers runs only with trust_remote_code): refused, and the module never imported."""
    from support.inputs.corpus import train_bpe

    model = tmp_path / "model"
    model.mkdir()
    train_bpe(str(model / "tokenizer.json"))
    marker = tmp_path / "code-ran"
    (model / "evil_tokenizer.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                             "from transformers import PreTrainedTokenizerFast\n"
                                             "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    (model / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": [None, "evil_tokenizer.EvilTokenizer"]}}))
    with pytest.raises(MegacacheError, match=f"cannot load the Hugging Face tokenizer {model}: .*custom code"):
        load_tokenizer(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(model))
    assert not marker.exists(), "the tokenizer directory's Python code was executed"
