"""Runs inside the Megatron-Bridge oracle (tests/bridge_oracle.sh: Bridge 0.6.2) and answers what
Bridge's offline SFT packing makes of given example lengths: a JSON request on stdin, a JSON answer
on the last line of stdout. Standalone: it imports Bridge and numpy, never megacache.

Request: ``{"cwd": DIR, "algorithms": [...], "prepare": [...]}``.

* Each of ``algorithms``, ``{"lengths": [...], "pack_size": P, "seed": S}``: Bridge's
  ``first_fit_decreasing(lengths, P)``, and its ``first_fit_shuffle(lengths, P)`` after
  ``np.random.seed(S)``: ``{"decreasing": [[...], ...], "shuffle": [[...], ...]}``.
* Each of ``prepare``, ``{"tokens": [...], "pack_size": P, "max_seq_length": M, "seed": S,
  "algorithm": A}``: Bridge's own ``prepare_gpt_sft_packed_data`` given a dataset whose example i has
  ``tokens[i]`` tokens, every one of them ``i`` (so each packed sequence's first token names its
  example), written as ``.npy``; answered with, per pack, the examples in it and its
  ``seq_start_id`` and token count, and the metadata file's text; or ``{"error": ...}`` where Bridge
  failed. The dataset builder and tokenizer handed to it are stand-ins that serve those examples as
  Bridge's GPTSFTDataset serves tokenized ones (with ``pad_seq_to_mult=1``, nothing pads them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

warnings.simplefilter("ignore")
logging.disable(logging.WARNING)
os.environ.setdefault("PYTHONWARNINGS", "ignore")
#: the stand-in tokenizer's end-of-document id (with pad_seq_to_mult 1 Bridge pads nothing with it)
EOS = -1


class Examples:
    """What Bridge's dataset builder returns, as far as ``tokenize_dataset`` reads it."""

    def __init__(self, tokens: list[int]):
        self.tokens = tokens
        self.tokenizer = SimpleNamespace(eod=EOS)
        self.pad_seq_length_to_mult = 1

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": [i] * self.tokens[i], "loss_mask": [1] * self.tokens[i]}


def prepare(case: dict, directory: str, offline) -> dict:
    import numpy as np

    out = os.path.join(directory, "packed.npy")
    metadata = Path(directory, "metadata.jsonl")
    for path in (out, metadata):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    try:
        with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(open(os.devnull, "w")):
            offline.prepare_gpt_sft_packed_data(
                input_path=Path(directory, "training.jsonl"), output_path=Path(out), output_metadata_path=metadata,
                packed_sequence_size=case["pack_size"], tokenizer=SimpleNamespace(eos_id=EOS),
                max_seq_length=case["max_seq_length"], seed=case["seed"], packing_algorithm=case["algorithm"],
                pad_seq_to_mult=1, num_tokenizer_workers=1,
                dataset_builder=lambda path, **kwargs: Examples(case["tokens"]))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    rows = np.load(out, allow_pickle=True)
    return {
        "examples": [[int(row["input_ids"][s]) for s in row["seq_start_id"]] for row in rows],
        "seq_start_id": [[int(s) for s in row["seq_start_id"]] for row in rows],
        "tokens": [len(row["input_ids"]) for row in rows],
        "metadata": metadata.read_text(),
    }


def main() -> None:
    request = json.load(sys.stdin)
    os.chdir(request.get("cwd") or os.getcwd())
    with contextlib.redirect_stdout(sys.stderr):
        import numpy as np
        from megatron.bridge import __version__ as bridge_version
        from megatron.bridge.data.packing import algorithms, offline

    answers = {"bridge": bridge_version, "algorithms": [], "prepare": []}
    for case in request.get("algorithms", []):
        decreasing = algorithms.first_fit_decreasing(list(case["lengths"]), case["pack_size"])
        np.random.seed(case["seed"])
        shuffled = algorithms.first_fit_shuffle(list(case["lengths"]), case["pack_size"])
        answers["algorithms"].append({"decreasing": decreasing, "shuffle": shuffled})
    with tempfile.TemporaryDirectory(prefix="megacache-sft-packing-") as directory:
        for case in request.get("prepare", []):
            answers["prepare"].append(prepare(case, directory, offline))
    sys.stdout.write("\n" + json.dumps(answers) + "\n")


if __name__ == "__main__":
    main()
