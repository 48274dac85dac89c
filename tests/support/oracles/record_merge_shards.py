"""Records what megatron-core's ``IndexedDatasetBuilder.add_index`` chain (Megatron-LM's
tools/merge_datasets.py) makes of the shards of tests/support/inputs/shards.py, for the merge tests of
tests/conformance/test_merge_shards.py: the sha256 of the merged ``.bin`` and ``.idx`` for each count,
and for the first 2,000 with each document ending with the EOS (``2000+eos``: the OLMo shards).
Writes tests/data/merge-shards.json.

    python tests/support/oracles/record_merge_shards.py

Runs in megacache's test environment, with its megatron-core (0.16.1). ``add_index`` calls
``gc.collect()`` after every input, which frees memory and changes no byte; with torch imported
(megatron-core imports it) a collection walks hundreds of thousands of objects, once for each of
10,000 shards (docs/benchmarks.md, "Merging per-task shards"): the recording makes it a no-op.
tests/conformance/test_merge.py runs the chain itself, collections and all, on a few datasets.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import tempfile
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, TESTS)  # the ``support`` package

from support.inputs import shards  # noqa: E402

DATA = os.path.join(TESTS, "data", "merge-shards.json")
#: the shard counts recorded: the 10,000 merged, and the first 2,000 (as .ds files too)
COUNTS = (10_000, 2_000)


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    gc.collect = lambda *args, **kwargs: 0
    record = {"megatron_core": megatron.core.__version__, "seed": shards.SEED, "merged": {}}
    with tempfile.TemporaryDirectory() as tmp:
        prefixes = shards.write_megatron(os.path.join(tmp, "shards"), max(COUNTS))
        ended = shards.write_megatron(os.path.join(tmp, "ended"), min(COUNTS), eos=shards.EOS)
        cases = [(str(count), prefixes[:count]) for count in COUNTS] + [(f"{min(COUNTS)}+eos", ended)]
        for key, inputs in cases:
            out = os.path.join(tmp, f"merged_{key}")
            builder = IndexedDatasetBuilder(out + ".bin", dtype=np.uint16)
            for prefix in inputs:
                builder.add_index(prefix)
            builder.finalize(out + ".idx")
            record["merged"][key] = {"bin": digest(out + ".bin"), "idx": digest(out + ".idx"),
                                     "bin_bytes": os.path.getsize(out + ".bin")}
    with open(DATA, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"wrote {DATA}")


if __name__ == "__main__":
    main()
