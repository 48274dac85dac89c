"""The training iterations of a batch-size ramp-up, as Megatron-LM 0.16 and 0.17 count them: their
``update_train_iters`` (the same in both, as is megatron-core's ramp-up calculator) steps megatron-core
0.16.1's own ``RampupBatchsizeNumMicroBatchesCalculator`` one iteration at a time; megacache counts
each run of iterations at one batch size at once, and must land on the same number every time,
floating-point edges included."""

from __future__ import annotations

import numpy as np
import pytest

from megacache.errors import MegacacheError
from megacache.megatron.training import ramped_iterations, split_sizes

calculators = pytest.importorskip("megatron.core.num_microbatches_calculator")


def megatron_iterations(train_samples: int, global_batch: int, start: int, increment: int, ramp: int) -> int:
    """megatron/training/training.py's update_train_iters (0.16.1, 0.17.1) with a ramp-up, over
    megatron-core's calculator."""
    calculator = calculators.RampupBatchsizeNumMicroBatchesCalculator(
        global_batch, 1, 1, False, 1, start, increment, ramp)
    iterations = consumed = 0
    while consumed <= ramp and consumed <= train_samples:
        calculator.update(consumed, consistency_check=False)
        consumed += calculator.get_current_global_batch_size()
        iterations += 1
    if train_samples > consumed:
        iterations += (train_samples - consumed) // global_batch
    return iterations


def cases(count: int) -> list[tuple]:
    rng = np.random.default_rng(20261128)
    out = []
    for _ in range(count):
        start, increment = int(rng.integers(1, 64)), int(rng.integers(1, 64))
        global_batch = start + increment * int(rng.integers(1, 40))
        # Megatron's side steps one iteration at a time: ramps of up to some thousands of iterations
        ramp = int(rng.choice([rng.integers(1, 100), rng.integers(1, 2000), rng.integers(1, 100 * start)]))
        train = int(rng.choice([rng.integers(1, 2 * ramp + 2), rng.integers(1, 10**6)]))
        out.append((train, global_batch, start, increment, ramp))
    # where a batch lands exactly on an increment's boundary, and ramps of one sample per increment
    out += [(1000, 8, 2, 2, 6), (1000, 8, 2, 2, 3), (1000, 100, 1, 1, 99), (7, 16, 4, 4, 100), (10**9, 4096, 32, 32,
            300_000_000), (500, 9, 3, 3, 2)]
    return out


@pytest.mark.parametrize("case", cases(300))
def test_ramp_up_iterations_are_megatrons(case):
    assert ramped_iterations(*case) == megatron_iterations(*case)


def test_the_ramp_up_changes_the_validation_samples_in_016_and_017_only():
    flags = dict(train_samples=400, global_batch_size=16, rampup_batch_size=["4", "4", "100"], eval_iters=2,
                 eval_interval=10)
    train_iters = megatron_iterations(400, 16, 4, 4, 100)
    assert train_iters != 400 // 16
    for version in ("0.16", "0.17"):
        assert split_sizes(version, **flags) == (400, (train_iters // 10 + 1) * 2 * 16, 32)
    for version in ("0.18", "0.19", "0.20"):
        assert split_sizes(version, **flags) == (400, (400 // 16 // 10 + 1) * 2 * 16, 32)


@pytest.mark.parametrize("ramp, message", [
    ((4, 4, 0), "Megatron-LM divides by zero on a ramp-up with no increments or no samples"),
    ((16, 4, 100), "Megatron-LM divides by zero on a ramp-up with no increments or no samples"),
    ((5, 4, 100), "--global-batch-size 16 must be the start batch size plus a whole number of increments"),
    ((0, 4, 100), "the start batch size and the increment must be positive and the samples not negative"),
])
def test_a_ramp_up_megatron_cannot_run_is_refused(ramp, message):
    with pytest.raises(MegacacheError, match=message):
        split_sizes("0.16", train_samples=400, global_batch_size=16, rampup_batch_size=list(map(str, ramp)),
                    eval_iters=2, eval_interval=10)
