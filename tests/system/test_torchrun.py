"""Rank init under torchrun (2 processes, gloo): the first start builds the missing cache with both
ranks over megacache's own gloo group, the second start only opens it, and a DataLoader with
DistributedSampler over megacache's TokenDataset yields exactly megatron-core's GPTDataset samples
(read from the same cache by megatron-core itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from support import without_mpi
from support.inputs.corpus import free_port
from support.inputs.indexed import write_lengths
from support.systems import TORCHRUN_RANK


def torchrun(spec_path: str, nproc: int = 2) -> None:
    """The real launcher (``torchrun`` is ``python -m torch.distributed.run``) on
    tests/support/systems/torchrun_rank.py."""
    env = without_mpi(dict(os.environ, PYTHONWARNINGS="ignore"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", TORCHRUN_RANK, spec_path]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def cache_snapshot(cache: str) -> dict:
    return {e.name: (e.stat().st_ino, e.stat().st_mtime_ns) for e in os.scandir(cache) if e.is_file()}


def test_rank_init_builds_once_then_opens_and_feeds_a_distributed_loader(tmp_path):
    from megacache.megatron.tokenizer import tokenizer_identifiers

    rng = np.random.default_rng(4)
    prefix = str(tmp_path / "corpus")
    write_lengths(prefix, rng.integers(1, 120, 400))
    cache = str(tmp_path / "cache")
    spec = {"prefix": prefix, "seq_length": 32, "sizes": [900, 40, 10], "split": "90,8,2", "seed": 99, "cache": cache,
            "tokenizer": tokenizer_identifiers("NullTokenizer", vocab_size=1000), "out": str(tmp_path / "out"),
            "tests": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    spec_path = str(tmp_path / "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)

    torchrun(spec_path)
    first = [json.load(open(tmp_path / f"out.{r}.json")) for r in range(2)]
    assert [m["built"] for m in first] == [True, True], first  # both ranks took part in the build
    snapshot = cache_snapshot(cache)
    assert len(snapshot) == 13 and not [n for n in snapshot if n.startswith(".")]  # + the sequences file

    torchrun(spec_path)
    second = [json.load(open(tmp_path / f"out.{r}.json")) for r in range(2)]
    assert [m["built"] for m in second] == [False, False], second  # opened, nothing rebuilt
    assert cache_snapshot(cache) == snapshot

    for rank in range(2):
        meta = second[rank]
        assert meta["world"] == 2 and meta["len"] == meta["megatron_len"] >= 900
        batches, expected = np.load(tmp_path / f"out.{rank}.npy")
        assert batches.shape == (meta["indices"], 33)
        np.testing.assert_array_equal(batches, expected, err_msg=f"rank {rank}")
