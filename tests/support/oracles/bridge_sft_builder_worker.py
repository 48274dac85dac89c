"""Runs inside the Megatron-Bridge oracle (tests/bridge_oracle.sh: Bridge 0.6.2): Bridge's own
fine-tuning data setup (``GPTSFTDatasetBuilder(config, tokenizer).build()``, which prepares the
packed files on rank 0 and then opens the datasets) on a finetuning ConfigContainer YAML.
Standalone: it imports Bridge, never megacache.

argv: the YAML path, then ``--prepare-only`` to run only the builder's preparation
(``prepare_data()``, what rank 0 runs before the barrier: the packed files written, nothing
opened; benchmarks/sft_pack.py times it). The ``dataset`` section becomes a ``GPTSFTDatasetConfig``
(its ``offline_packing_specs`` a ``PackedSequenceSpecs``), the ``tokenizer`` section a
``TokenizerConfig``, each from its fields (``_target_`` left out); a ``preprocessing`` section the
class its ``_target_`` names. Answer, the last line of stdout: ``{"train": N, "validation": N}``,
the packed sequences of each dataset Bridge opened (``{"prepared": true}`` with
``--prepare-only``), or ``{"error": ...}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import warnings

warnings.simplefilter("ignore")
logging.disable(logging.WARNING)
os.environ.setdefault("PYTHONWARNINGS", "ignore")


def fields(section: dict) -> dict:
    return {k: v for k, v in section.items() if k != "_target_"}


def instance(section: dict):
    """The object a section with a ``_target_`` names, made from its fields."""
    import importlib

    module, name = section["_target_"].rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**fields(section))


def main() -> None:
    import yaml

    with open(sys.argv[1]) as f:
        container = yaml.safe_load(f)
    with contextlib.redirect_stdout(sys.stderr):
        from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetBuilder, GPTSFTDatasetConfig
        from megatron.bridge.data.packing import PackedSequenceSpecs
        from megatron.bridge.training.tokenizers.config import TokenizerConfig
        from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

        try:
            dataset = fields(container["dataset"])
            dataset["offline_packing_specs"] = PackedSequenceSpecs(**fields(dataset["offline_packing_specs"]))
            if isinstance(dataset.get("preprocessing"), dict):
                dataset["preprocessing"] = instance(dataset["preprocessing"])
            config = GPTSFTDatasetConfig(**dataset)
            tokenizer = build_tokenizer(TokenizerConfig(**fields(container["tokenizer"])))
            builder = GPTSFTDatasetBuilder(config=config, tokenizer=tokenizer)
            if sys.argv[2:] == ["--prepare-only"]:
                builder.prepare_data()
                answer = {"prepared": True}
            else:
                train, validation, _ = builder.build()
                answer = {"train": len(train), "validation": None if validation is None else len(validation)}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
