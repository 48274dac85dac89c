"""megacache build with blends: the cache directory megatron-core 0.16.1's
BlendedMegatronDatasetBuilder writes (every GPTDataset and BlendedDataset file, byte for byte), on
random blends, for 1 rank in process and 2-3 ranks under MPI (pytest-mpi).

megatron-core 0.16.1 cannot save a blend without a process group (its BlendedDataset calls
get_rank unconditionally), so the oracle runs in a one-process gloo group, as a one-GPU torchrun
would."""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import pytest

from megacache.builders.build import BuildConfig, plan
from megacache.megatron.blends import parse_blend
from megacache.runtime.comm import Comm, SingleComm, get_comm
from support.inputs.indexed import write_lengths
from support.oracles.megatron_core import load_mcore
from support.sweeps import (NULL_TOKENIZER, REFUSED_AT_MOST, BlendSweepConfig, blend_build_config, build_and_compare,
                            count_compared, labelled, megatron_build, random_blend_config, sweep_configurations,
                            torch_group, words, write_sweep_dataset)


def run_both(mcore, comm: Comm, workdir: str, c: BlendSweepConfig, stats: dict, **tuning) -> str:
    prefixes = [os.path.join(workdir, f"d{i:04d}") for i in range(len(c.datasets))]
    refusal = None
    if comm.rank == 0:
        for p, lengths, shape in zip(prefixes, c.datasets, c.shapes):
            write_sweep_dataset(p, lengths, shape)
        refusal = megatron_build(mcore, prefixes, c, os.path.join(workdir, "theirs"))
    comm.wait_quietly()  # while the oracle runs on rank 0
    refusal = comm.bcast(refusal)
    cfg = blend_build_config(c, prefixes, os.path.join(workdir, "ours"), **tuning)
    result = build_and_compare(cfg, comm, os.path.join(workdir, "theirs"), refusal)
    if result is None:
        return "refused"
    count_compared(stats, c.shapes[0].dtype)
    if any(b.chunks > 1 for b in result.blends):
        stats["chunked"] = stats.get("chunked", 0) + 1
        stats["recomputed"] = stats.get("recomputed", 0) + sum(b.recomputed for b in result.blends)
    return "per-split" if c.per_split else "weighted" if c.weights else "unweighted" if result.blends else "ok"


def sweep(comm: Comm, count: int, seed: int, huge: int = 0, **tuning) -> dict[str, int]:
    """Outcome counts, plus "chunked" (blends cut over ranks), "recomputed" (samples repaired) and
    "uint16 compared", "int32 compared" (blends compared by their datasets' token width)."""
    with torch_group() if comm.rank == 0 else nullcontext():
        return _sweep(comm, load_mcore() if comm.rank == 0 else None, count, seed, huge, **tuning)


def _sweep(comm: Comm, mcore, count: int, seed: int, huge: int, **tuning) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    stats: dict[str, int] = {}
    configurations = (random_blend_config(rng, huge=k < huge) for k in range(count))
    outcomes = sweep_configurations(comm, configurations,
                                    lambda workdir, c: run_both(mcore, comm, workdir, c, stats, **tuning))
    return {**outcomes, **stats}


@pytest.mark.parametrize("kernel_mode", ["native", "jit"], indirect=True)
def test_random_blends_single_rank(megatron, kernel_mode, report):
    # Every blend through the compiled kernels, as users run them; the first tenth again through
    # numba's JIT. Small blend blocks: a blend is computed and written in many pieces.
    count = 100 if kernel_mode == "native" else 20
    outcomes = sweep(SingleComm(), count, seed=7, huge=1, blend_block=1000)
    report(f"blend build, 1 rank, {count} blends, {kernel_mode} kernels: {outcomes}")
    assert labelled(outcomes) == count and outcomes.get("refused", 0) <= REFUSED_AT_MOST * count, outcomes
    assert outcomes.get("int32 compared", 0) >= count // 5, outcomes
    assert "chunked" not in outcomes
    if kernel_mode == "native":
        assert min(outcomes.get(k, 0) for k in ("weighted", "unweighted", "per-split")) >= 10, outcomes


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kernel_mode", ["native"], indirect=True)
def test_random_blends_under_mpi(kernel_mode, report):
    comm = get_comm("mpi")
    # Blends are cut into one chunk per rank from 50 samples per rank on, so that the chunked
    # blend and its repair run in this test; no warmup, so that guesses are sometimes wrong; each chunk
    # blended in pieces of 997 samples.
    count = 100
    outcomes = sweep(comm, count, seed=300 + comm.size, blend_min_chunk=50, blend_warmup=0, blend_block=997)
    if comm.rank == 0:
        report(f"blend build, {comm.size} ranks, {count} blends, {kernel_mode} kernels: {outcomes}")
    assert outcomes.get("refused", 0) <= REFUSED_AT_MOST * count, outcomes
    assert outcomes.get("int32 compared", 0) >= count // 5, outcomes
    # The chunked blend ran, and some chunks started from a wrong guess and were repaired.
    assert outcomes.get("chunked", 0) >= count // 4 and outcomes.get("recomputed", 0) > 0, outcomes


@pytest.mark.mpi(min_size=2)
def test_each_dataset_is_surveyed_by_one_rank_and_every_rank_plans_alike():
    """Planning a blend opens each dataset on one rank only (dealt round robin), not every dataset
    on every rank, and the plan every rank makes from the gathered surveys equals a one-rank plan."""
    comm = get_comm("mpi")

    def run(workdir: str, _) -> str:
        prefixes = [os.path.join(workdir, f"d{i}") for i in range(7)]
        if comm.rank == 0:
            rng = np.random.default_rng(5)
            for p in prefixes:
                write_lengths(p, rng.integers(0, 500, int(rng.integers(40, 400))))
        comm.barrier()
        cfg = BuildConfig(blend=parse_blend(words(prefixes, [1, 2, 3, 4, 5, 6, 7])), split="90,8,2",
                          seq_length=64, sizes=(2000, 100, 20), tokenizer=NULL_TOKENIZER,
                          cache_dir=os.path.join(workdir, "cache"))
        shared = plan(cfg, comm)
        assert sorted(shared.datasets.opened) == sorted(prefixes[comm.rank::comm.size])
        alone = plan(cfg, SingleComm())
        assert sorted(alone.datasets.opened) == sorted(prefixes)
        assert shared.surveys == alone.surveys
        assert [(t.entry.stem, t.plan, t.split_range) for t in shared.gpt] == \
               [(t.entry.stem, t.plan, t.split_range) for t in alone.gpt]
        return "ok"

    assert sweep_configurations(comm, [None], run) == {"ok": 1}


def test_one_prefix_with_a_weight_is_a_one_dataset_blend(megatron):
    """``--data-path 1.0 PREFIX`` takes Megatron's blend path (surplus-sized GPTDatasets wrapped in
    one-dataset BlendedDatasets, other hashes than ``--data-path PREFIX``), file for file."""
    rng = np.random.default_rng(21)
    c = random_blend_config(rng)
    c = replace(c, datasets=c.datasets[:1], shapes=c.shapes[:1], weights=[1.0], per_split=False, split="90,5,5",
                sizes=(5000, 300, 40))
    stats: dict = {}
    with torch_group():
        mcore = load_mcore()
        outcomes = sweep_configurations(SingleComm(), [c],
                                        lambda workdir, c: run_both(mcore, SingleComm(), workdir, c, stats))
    assert outcomes == {"weighted": 1}


@pytest.mark.parametrize("split", ["100,0,0", "90,10,0"])
def test_weights_on_a_split_without_a_size_are_refused_even_when_the_split_is_empty(megatron, split):
    """``--full-validation`` leaves valid without a sample count; megatron-core asserts that a split
    without one has no weights, for every split, whether or not ``--split`` gives it sequences.
    megacache refuses the same configurations, and still builds them without the weights."""
    rng = np.random.default_rng(22)
    c = random_blend_config(rng)
    c = replace(c, datasets=c.datasets[:3], shapes=c.shapes[:3], weights=[0.5, 0.3, 0.2], per_split=False,
                split=split, sizes=(2000, None, 40))
    stats: dict = {}
    with torch_group():
        mcore = load_mcore()
        for weights, expected in (([0.5, 0.3, 0.2], {"refused": 1}), (None, {"unweighted": 1})):
            outcomes = sweep_configurations(SingleComm(), [replace(c, weights=weights)],
                                            lambda workdir, c: run_both(mcore, SingleComm(), workdir, c, stats))
            assert outcomes == expected, weights
