"""megacache build: the cache directory megatron-core 0.16.1 writes, file for file and byte for byte,
on random configurations, for 1 rank in process and 2-3 ranks under MPI (pytest-mpi)."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from megacache.builders.build import BuildConfig, build
from megacache.megatron.training import split_sizes
from megacache.megatron.versions import SUPPORTED
from megacache.runtime.comm import SingleComm, get_comm
from megacache.errors import MegacacheError
from support.inputs.indexed import write_lengths
from support.oracles.megatron_core import load_mcore
from support.sweeps import (REFUSED_AT_MOST, PrefixSweepConfig, build_and_compare, count_compared, labelled,
                            megatron_build, prefix_build_config, random_config, sweep_configurations,
                            write_sweep_dataset)


def run_both(mcore, comm, workdir: str, c: PrefixSweepConfig, stats: dict | None = None) -> str:
    """Build with megatron-core (rank 0) and megacache (all ranks); compare. Returns a label, and
    counts the comparison in ``stats`` by the dataset's token width."""
    prefix = os.path.join(workdir, "data")
    refusal = None
    if comm.rank == 0:
        write_sweep_dataset(prefix, c.lengths, c.shape)
        refusal = megatron_build(mcore, [prefix], c, os.path.join(workdir, "theirs"))
    comm.wait_quietly()  # while the oracle runs on rank 0
    refusal = comm.bcast(refusal)
    cfg = prefix_build_config(c, prefix, os.path.join(workdir, "ours"))
    result = build_and_compare(cfg, comm, os.path.join(workdir, "theirs"), refusal)
    if result is None:
        return "refused"
    if stats is not None:
        count_compared(stats, c.shape.dtype)
    return "separated" if any(s.plan.separate_final_epoch for s in result.gpt) else "ok"


def sweep(comm, count: int, seed: int) -> dict[str, int]:
    """Outcome counts, plus "uint16 compared", "int32 compared" (comparisons by token width)."""
    mcore = load_mcore() if comm.rank == 0 else None
    rng = np.random.default_rng(seed)
    stats: dict[str, int] = {}
    outcomes = sweep_configurations(comm, (random_config(rng) for _ in range(count)),
                                    lambda workdir, c: run_both(mcore, comm, workdir, c, stats))
    return {**outcomes, **stats}


@pytest.mark.parametrize("kernel_mode", ["native", "jit"], indirect=True)
def test_random_configurations_single_rank(megatron, kernel_mode, report):
    # every configuration through the compiled kernels, as users run them; the first tenth again
    # through numba's JIT
    count = 200 if kernel_mode == "native" else 20
    outcomes = sweep(SingleComm(), count, seed=1)
    report(f"build, 1 rank, {count} configurations, {kernel_mode} kernels: {outcomes}")
    assert labelled(outcomes) == count and outcomes.get("int32 compared", 0) >= count // 5, outcomes
    assert outcomes.get("refused", 0) <= REFUSED_AT_MOST * count, outcomes
    if kernel_mode == "native":
        assert outcomes.get("separated", 0) >= 10, outcomes


def test_memory_mapped_path_single_rank(megatron, monkeypatch):
    # Arrays too large for memory go through the shared, memory-mapped path even on one rank.
    import megacache.builders.gpt as gpt

    monkeypatch.setattr(gpt, "IN_MEMORY_BYTES", 0)
    outcomes = sweep(SingleComm(), 40, seed=2)
    assert labelled(outcomes) == 40 and outcomes.get("refused", 0) <= REFUSED_AT_MOST * 40, outcomes


def test_sample_index_walked_in_short_steps_single_rank(megatron, monkeypatch):
    # A rank walks its pieces of the shared document indices a step at a time (the steps its
    # progress is counted in): steps of a few positions give the same rows.
    import megacache.builders.gpt as gpt

    monkeypatch.setattr(gpt, "IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(gpt, "WALK_STEP", 7)
    outcomes = sweep(SingleComm(), 40, seed=3)
    assert labelled(outcomes) == 40 and outcomes.get("refused", 0) <= REFUSED_AT_MOST * 40, outcomes


@pytest.mark.mpi(min_size=2)
def test_sample_index_walked_in_short_steps_under_mpi(monkeypatch):
    # Each rank's pieces in steps, the first of them continuing a task begun on a lower rank.
    import megacache.builders.gpt as gpt

    monkeypatch.setattr(gpt, "IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(gpt, "WALK_STEP", 7)
    outcomes = sweep(get_comm("mpi"), 40, seed=200)
    assert labelled(outcomes) == 40 and outcomes.get("refused", 0) <= REFUSED_AT_MOST * 40, outcomes


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kernel_mode", ["native"], indirect=True)
def test_random_configurations_under_mpi(kernel_mode, report):
    comm = get_comm("mpi")
    outcomes = sweep(comm, 200, seed=100 + comm.size)
    if comm.rank == 0:
        report(f"build, {comm.size} ranks, 200 configurations, {kernel_mode} kernels: {outcomes}")
    assert labelled(outcomes) == 200 and outcomes.get("refused", 0) <= REFUSED_AT_MOST * 200, outcomes
    assert outcomes.get("int32 compared", 0) >= 40, outcomes


def test_worked_examples_5_and_8(tmp_path, megatron):
    mcore = load_mcore()
    lengths = np.array([5, 7, 3, 9, 4, 6, 8, 2, 10, 1])
    for c in (PrefixSweepConfig(lengths=lengths, split="1,0,0", sizes=(7, None, None), seq_length=8,
                                add_extra_token=True, seed=1234, drop_last_partial_validation=True),
              PrefixSweepConfig(lengths=lengths, split="0,1,0", sizes=(None, None, None), seq_length=8,
                                add_extra_token=True, seed=1234, drop_last_partial_validation=False)):
        d = tempfile.mkdtemp(dir=tmp_path)
        assert run_both(mcore, SingleComm(), d, c) in ("ok", "separated")


# Megatron-LM's get_train_valid_test_num_samples at each version's tag (0.20: main's, the same function), run
# with these flags (micro-batch 1, --eval-interval 100 --eval-iters 10): (train, valid, test).
SIZES_BY_VERSION = [
    (SUPPORTED, dict(train_iters=1000, global_batch_size=8), (8000, 880, 80)),
    (SUPPORTED, dict(train_samples=8000, global_batch_size=8), (8000, 880, 80)),
    (SUPPORTED, dict(train_iters=1000, global_batch_size=8, skip_train=True), (8000, 80, 80)),
    (SUPPORTED, dict(train_iters=1000, global_batch_size=8, full_validation=True), (8000, None, 80)),
    (("0.18", "0.19", "0.20"), dict(train_iters=1000, global_batch_size=8, eval_global_batch_size=16),
     (8000, 1760, 160)),
    (("0.18", "0.19", "0.20"), dict(train_iters=1000, global_batch_size=8, start_eval_at_iter=300), (8000, 640, 80)),
]


@pytest.mark.parametrize("versions,flags,sizes", SIZES_BY_VERSION)
def test_split_sizes_as_megatron_training_computes_them(versions, flags, sizes):
    for version in versions:
        assert split_sizes(version, eval_interval=100, eval_iters=10, **flags) == sizes, version
    assert split_sizes(train_iters=500, global_batch_size=8, eval_iters=10, eval_interval=100) == (4000, 480, 80)
    assert split_sizes(train_samples=1000, global_batch_size=10, eval_iters=2, eval_interval=30) == (1000, 80, 20)


def test_split_size_flags_of_other_versions_and_missing_ones_are_errors():
    with pytest.raises(MegacacheError, match=r"--eval-global-batch-size does not exist in Megatron-LM 0\.17 \(it "
                                             r"exists in 0\.18 to 0\.20\)"):
        split_sizes("0.17", train_iters=10, global_batch_size=8, eval_interval=5, eval_global_batch_size=16)
    with pytest.raises(MegacacheError, match="--eval-interval is needed to count the validation samples"):
        split_sizes("0.19", train_iters=10, global_batch_size=8)
    assert split_sizes("0.19", train_iters=10, global_batch_size=8, full_validation=True) == (80, None, 800)


@pytest.mark.parametrize("change, message", [
    (dict(seq_length=0), "--seq-length must be a positive integer"),
    (dict(seq_length=2**31 - 1), r"--seq-length 2147483647 \(\+1\) does not fit Megatron's int32 arithmetic"),
    (dict(seed=2**32), "outside numpy's RandomState range"),
    (dict(split="969,30,1", sizes=(10, 5, 10)), r"the test split is empty \('969,30,1' of 40 sequences"),
    (dict(data_path="/nonexistent/prefix"), "index file not found"),
    (dict(sizes=(10, -1, 10)), "the valid sample count must be a non-negative integer"),
    (dict(tokenizer={"class": "t", "vocab_size": 1000}), r"the tokenizer identity's 'vocab_size' is 1000 \(int\): "
                                                          r"Megatron's unique_identifiers hold strings .* give '1000'"),
])
def test_megatron_failure_modes_become_clear_errors(tmp_path, change, message):
    write_lengths(str(tmp_path / "d"), np.full(40, 20))
    base = dict(data_path=str(tmp_path / "d"), seq_length=16, sizes=(10, 5, 10), tokenizer={"class": "t"},
                split="1,0,1", cache_dir=str(tmp_path / "cache"))
    base.update(change)
    with pytest.raises(MegacacheError, match=message):
        build(BuildConfig.for_prefix(**base), SingleComm())
    assert not os.path.exists(tmp_path / "cache") or not os.listdir(tmp_path / "cache")
