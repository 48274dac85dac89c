"""The Modalities oracle: its packer and readers (modalities 0.5.0; tests/run_all.sh installs it
without its training dependencies, which these modules do not import)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

# The packer runs worker processes; it runs in its own interpreter, as a user runs it.
_PACK = """
import json, sys
from pathlib import Path
from modalities.dataloader.create_index import IndexGenerator
from modalities.dataloader.create_packed_data import PackedDataGenerator
from modalities.tokenization.tokenizer_wrapper import PreTrainedHFTokenizer
a = json.loads(sys.argv[1])
src = Path(a["src"])
IndexGenerator(src).create_index(src.with_suffix(".idx"))
PackedDataGenerator(src_path=src, tokenizer=PreTrainedHFTokenizer(pretrained_model_name_or_path=a["tokenizer"]),
                    eod_token=a["eod"], number_of_processes=a["processes"], jq_pattern=".text",
                    processing_batch_size=a["batch"], raw_samples_queue_size=64, processed_samples_queue_size=64,
                    index_path=src.with_suffix(".idx")).run(Path(a["dst"]))
"""


def pack(src: str, tokenizer_dir: str, dst: str, eod: str = "<|endoftext|>", processes: int = 2,
         batch: int = 7) -> bytes:
    """What Modalities' packer writes for the JSON lines file ``src`` (its ``text`` field)."""
    args = dict(src=src, tokenizer=tokenizer_dir, dst=dst, eod=eod, processes=processes, batch=batch)
    proc = subprocess.run([sys.executable, "-c", _PACK, json.dumps(args)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Encountered" not in proc.stderr, proc.stderr[-3000:]  # it drops batches on any bad line
    return Path(dst).read_bytes()


def documents(path: str) -> list[np.ndarray]:
    """Every document as Modalities' PackedMemMapDatasetBase returns it."""
    from modalities.dataloader.dataset import PackedMemMapDatasetBase

    ds = PackedMemMapDatasetBase(raw_data_path=Path(path), sample_key="input_ids")
    return [ds[i]["input_ids"] for i in range(len(ds))]


def samples(path: str, block_size: int, reuse_last_target: bool) -> list[np.ndarray]:
    """Every sample of Modalities' PackedMemMapDatasetContinuous."""
    from modalities.dataloader.dataset import PackedMemMapDatasetContinuous

    ds = PackedMemMapDatasetContinuous(raw_data_path=Path(path), sample_key="input_ids", block_size=block_size,
                                       reuse_last_target=reuse_last_target)
    return [ds[i]["input_ids"] for i in range(len(ds))]
