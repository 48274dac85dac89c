"""One rank of a torchrun job of megatron-core training's data path (any supported version, in its own
interpreter; standalone: megatron-core, torch and numpy only): build the tokenizer from Megatron-LM
flags, the datasets with BlendedMegatronDatasetBuilder against a cache directory, and report what it
logged, which index files it mapped, and the samples it served (rank{R}.json / rank{R}.npz).

    python -m torch.distributed.run --nproc_per_node 2 tests/support/oracles/megatron_rank.py SPEC.json
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings

import numpy as np

from megatron_worker import build_tokenizer

SPLITS = ("train", "valid", "test")
GPT_ARRAYS = ("document_index", "sample_index", "shuffle_index")
BLEND_ARRAYS = ("dataset_index", "dataset_sample_index")


def main(spec_path: str) -> None:
    import megatron.core
    import torch
    import torch.distributed as dist
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    warnings.simplefilter("ignore")
    with open(spec_path) as f:
        spec = json.load(f)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: log.append(record.getMessage())
    mlog = logging.getLogger("megatron.core")
    mlog.setLevel(logging.INFO)
    mlog.addHandler(handler)

    cwd = os.getcwd()
    os.chdir(spec["tokenizer_cwd"])
    tokenizer = build_tokenizer(spec["tokenizer"])
    os.chdir(cwd)
    if spec.get("blend_per_split"):
        data = {"blend_per_split": [None if b is None else (b[0], b[1]) for b in spec["blend_per_split"]]}
    else:
        data = {"blend": (spec["prefixes"], spec["weights"]), "split": spec["split"]}
    fast = {}
    if spec.get("fast"):
        with open(spec["sequences"]) as f:
            fast = dict(fast_cache_load=True, defer_npy_index_mmap=True, sequences_per_dataset=json.load(f))
    config = GPTDatasetConfig(
        random_seed=spec["seed"], sequence_length=spec["seq_length"], tokenizer=tokenizer, reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, add_extra_token_to_sequence=True,
        drop_last_partial_validation_sequence=False, path_to_cache=spec["cache"], **data, **fast)
    datasets = BlendedMegatronDatasetBuilder(GPTDataset, spec["sizes"], lambda: True, config).build()

    meta = {"rank": rank, "world_size": dist.get_world_size(), "megatron": megatron.core.__version__, "log": log,
            "splits": {}}
    out = {}

    def mapped(arr):
        return arr.filename if isinstance(arr, np.memmap) else None

    for name, dataset in zip(SPLITS, datasets):
        idx = spec["indices"][f"{name}/{rank}"]
        items = [dataset[i] for i in idx]  # first: deferred maps are made on first use
        blended = hasattr(dataset, "dataset_index")
        if blended:
            sources = [(dataset.datasets[dataset.dataset_index[i]], int(dataset.dataset_sample_index[i])) for i in idx]
            out[f"{name}_dataset_id"] = np.array([dataset.dataset_index[i] for i in idx])
        else:
            sources = [(dataset, i) for i in idx]
        queried = [child._query_document_sample_shuffle_indices(i) for child, i in sources]
        arrays = BLEND_ARRAYS if blended else GPT_ARRAYS
        meta["splits"][name] = {"len": len(dataset), "blended": blended, "pad": int(sources[0][0]._pad_token_id),
                                "mapped": {a: mapped(getattr(dataset, a)) for a in arrays}}
        out[f"{name}_text"] = np.stack([q[0] for q in queried])
        out[f"{name}_counts"] = np.array([len(q[1]) for q in queried])
        out[f"{name}_document_ids"] = np.concatenate([q[1] for q in queried])
        for field in ("tokens", "labels", "loss_mask"):
            out[f"{name}_{field}"] = torch.stack([item[field] for item in items]).numpy()
    np.savez(os.path.join(spec["out"], f"rank{rank}.npz"), **out)
    with open(os.path.join(spec["out"], f"rank{rank}.json"), "w") as f:
        json.dump(meta, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
