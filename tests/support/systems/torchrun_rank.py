"""One rank of a torchrun job that calls megacache from rank init (tests/system/test_torchrun.py,
tests/cluster/test_torchrun.py): ``prepare_cache`` builds the missing cache with every rank or opens
it, a DataLoader with DistributedSampler reads megacache's TokenDataset, and megatron-core 0.16.1
serves the same indices from the same cache. Writes ``<out>.<rank>.npy`` (the batches and
megatron-core's samples) and ``<out>.<rank>.json``.

    python -m torch.distributed.run --nproc-per-node 2 tests/support/systems/torchrun_rank.py SPEC.json
"""

import json, os, sys, time, warnings
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

spec = json.load(open(sys.argv[1]))
dist.init_process_group("gloo")
rank = dist.get_rank()
from megacache.interfaces.api import BuildConfig, prepare_cache
from megacache.interfaces.torchdata import TokenDataset
cfg = BuildConfig.for_prefix(spec["prefix"], seq_length=spec["seq_length"], sizes=tuple(spec["sizes"]),
                             tokenizer=spec["tokenizer"], split=spec["split"], seed=spec["seed"],
                             cache_dir=spec["cache"])
t = time.monotonic()
ready = prepare_cache(cfg, timeout_s=120)
seconds = time.monotonic() - t
dataset = TokenDataset(ready.splits["train"])
sampler = DistributedSampler(dataset, shuffle=True, seed=3)
loader = DataLoader(dataset, batch_size=5, sampler=sampler, num_workers=1)
batches = torch.cat(list(loader)).numpy()
indices = list(iter(sampler))

sys.path.insert(0, spec["tests"])
from support.oracles.megatron_core import megatron_splits, load_mcore
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mcore = load_mcore()
    theirs = megatron_splits(mcore, spec["prefix"], spec["split"], spec["sizes"], spec["seed"], spec["seq_length"], 1,
                             True, path_to_cache=spec["cache"])[0]
    expected = np.stack([theirs._query_document_sample_shuffle_indices(i)[0] for i in indices])
np.save(spec["out"] + f".{rank}.npy", np.stack([batches, expected]))
json.dump({"built": ready.built is not None, "seconds": seconds, "len": len(dataset),
           "megatron_len": len(theirs), "indices": len(indices), "world": dist.get_world_size()},
          open(spec["out"] + f".{rank}.json", "w"))
dist.barrier()
dist.destroy_process_group()
