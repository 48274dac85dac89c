"""Runs inside the Megatron-Bridge oracle (tests/bridge_oracle.sh: Bridge 0.6.2) and answers what
Bridge's own ``prepare_gpt_sft_packed_data`` writes for given JSONL files: a JSON request on stdin,
a JSON answer on the last line of stdout. Standalone: it imports Bridge, never megacache.

Request: ``{"cases": [...]}``, each ``{"jsonl": TEXT, "tokenizer": DIR, "dataset_kwargs": {...},
"pack_size": P, "max_seq_length": M, "seed": S, "algorithm": A, "pad_seq_to_mult": m,
"output": NAME, "metadata": TEXT or null}``: the JSONL written as ``training.jsonl`` in a fresh
folder (with ``metadata`` as the metadata file's text when given), the tokenizer Bridge builds
for ``HuggingFaceTokenizer`` ``DIR``, and Bridge's builder for a split
(``build_gpt_sft_split``) as the dataset builder, exactly as ``GPTSFTDatasetBuilder`` calls it.
Answer per case: ``{"files": {NAME: BASE64, ...}}`` (the folder's files, the JSONL and Bridge's
line index left out) or ``{"error": ...}`` where Bridge failed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path

warnings.simplefilter("ignore")
logging.disable(logging.WARNING)
os.environ.setdefault("PYTHONWARNINGS", "ignore")


def prepare(case: dict, offline, build_split, build_tokenizer, TokenizerConfig) -> dict:
    with tempfile.TemporaryDirectory(prefix="megacache-sft-rows-") as directory:
        Path(directory, "training.jsonl").write_text(case["jsonl"], encoding="utf-8")
        if case["metadata"] is not None:
            Path(directory, "metadata.json").write_text(case["metadata"])
        try:
            with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(open(os.devnull, "w")):
                tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer",
                                                            tokenizer_model=case["tokenizer"]))
                offline.prepare_gpt_sft_packed_data(
                    input_path=Path(directory, "training.jsonl"), output_path=Path(directory, case["output"]),
                    output_metadata_path=Path(directory, "metadata.json"), packed_sequence_size=case["pack_size"],
                    tokenizer=tokenizer, max_seq_length=case["max_seq_length"], seed=case["seed"],
                    packing_algorithm=case["algorithm"], dataset_kwargs=dict(case["dataset_kwargs"]),
                    pad_seq_to_mult=case["pad_seq_to_mult"], num_tokenizer_workers=1, dataset_builder=build_split)
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"files": {name: base64.b64encode(Path(directory, name).read_bytes()).decode()
                          for name in sorted(os.listdir(directory))
                          if name != "training.jsonl" and not name.startswith("training.jsonl.idx")}}


def main() -> None:
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):
        from megatron.bridge import __version__ as bridge_version
        from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
        from megatron.bridge.data.packing import offline
        from megatron.bridge.training.tokenizers.config import TokenizerConfig
        from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    answers = {"bridge": bridge_version, "cases": []}
    for case in request["cases"]:
        answers["cases"].append(prepare(case, offline, build_gpt_sft_split, build_tokenizer, TokenizerConfig))
    sys.stdout.write("\n" + json.dumps(answers) + "\n")


if __name__ == "__main__":
    main()
