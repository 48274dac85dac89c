"""Rank init under a two-node torchrun job (one agent per emulated node, rendezvousing over
loopback TCP, gloo between the nodes): ``prepare_cache`` builds the missing cache on the GlusterFS
volume with both nodes' ranks, a second start only opens it, and on each node megatron-core serves
the samples megacache's TokenDataset yields, from that cache (tests/support/systems/torchrun_rank.py)."""

from __future__ import annotations

import json
import os

import numpy as np

from support.systems.faults import final_files
from support.inputs.indexed import write_lengths
from support.systems import TORCHRUN_RANK


def test_prepare_cache_on_two_nodes_then_megatron_core_loads_it_on_both(cluster):
    from megacache.megatron.tokenizer import tokenizer_identifiers

    shared = cluster.volume.path
    prefix = f"{shared}/corpus"
    write_lengths(prefix, np.random.default_rng(4).integers(1, 120, 2000))
    cache = f"{shared}/cache"
    spec = {"prefix": prefix, "seq_length": 32, "sizes": [4000, 200, 50], "split": "90,8,2", "seed": 99, "cache": cache,
            "tokenizer": tokenizer_identifiers("NullTokenizer", vocab_size=1000), "out": f"{shared}/out",
            "tests": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    with open(f"{shared}/spec.json", "w") as f:
        json.dump(spec, f)
    cluster.torchrun(1, TORCHRUN_RANK, f"{shared}/spec.json")
    first = [json.load(open(f"{shared}/out.{r}.json")) for r in range(2)]
    assert [m["built"] for m in first] == [True, True], first
    built = final_files(cache)
    assert len(built) == 13, sorted(built)

    cluster.torchrun(1, TORCHRUN_RANK, f"{shared}/spec.json")
    second = [json.load(open(f"{shared}/out.{r}.json")) for r in range(2)]
    assert [m["built"] for m in second] == [False, False], second
    assert final_files(cache) == built
    for rank in range(2):
        meta = second[rank]
        assert meta["world"] == 2 and meta["len"] == meta["megatron_len"] >= 4000
        batches, expected = np.load(f"{shared}/out.{rank}.npy")
        assert batches.shape == (meta["indices"], 33)
        np.testing.assert_array_equal(batches, expected, err_msg=f"rank {rank}")
