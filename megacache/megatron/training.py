"""How many samples Megatron-LM training asks of each split (``get_train_valid_test_num_samples`` in
``megatron/training/training.py``), per version, from its flags; and the split it uses by default.

* train: ``--train-samples``, else ``--train-iters`` x ``--global-batch-size``.
* valid: none with ``--full-validation``; ``--eval-iters`` x B with ``--skip-train``; else
  P x ``--eval-iters`` x B for P evaluations: ``train_iters // --eval-interval + 1``, less (0.18 on)
  the ``--start-eval-at-iter // --eval-interval`` skipped ones, never below 0.
* test: ``--eval-iters`` x B.
* B is ``--global-batch-size``; from 0.18 on ``--eval-global-batch-size`` when given.
* With ``--train-samples`` alone, training derives ``train_iters`` from the samples
  (``update_train_iters``): ``train_samples // global batch``; in 0.16 and 0.17 with
  ``--rampup-batch-size START INCREMENT SAMPLES``, by counting the iterations of the ramp-up and
  then those of the full batch (0.18 on, the flag is still parsed but no longer used).
* Without ``--global-batch-size``, validate_args takes ``--micro-batch-size`` x the data-parallel
  size: the world size (prepare_cache.py's ``--prepare-cache-world-size``) over tensor x pipeline x
  context parallel sizes (x, from 0.19 on, ``--tensor-parallel-num-weight-shards`` / tensor parallel size).

0.18's ``--step-batch-size-schedule`` and ``--phase-transition-iterations`` are refused
(megatron/command.py): they change the counts in ways megacache does not reproduce.
"""

from __future__ import annotations

import math

from ..errors import MegacacheError
from .flags import Flag, resolve_flags, without_defaults
from .versions import at_least, resolve

#: ``--split`` when ``--data-path`` is given without one (every supported version; spaces are hashed)
DEFAULT_SPLIT = "969, 30, 1"
#: ``--seed`` when not given (every supported version)
DEFAULT_SEED = 1234

#: the training flags that size the splits
SIZE_FLAGS = (
    Flag(("--train-samples",), "int", help="training samples (else --train-iters x --global-batch-size)"),
    Flag(("--train-iters",), "int", help="training iterations (with --global-batch-size)"),
    Flag(("--global-batch-size",), "int", help="samples per iteration"),
    Flag(("--eval-iters",), "int", default=100, help="iterations per evaluation, and of the test split"),
    Flag(("--eval-interval",), "int", help="required unless --full-validation or --skip-train"),
    Flag(("--full-validation",), "true", default=False, help="validate on the whole valid split (one epoch)"),
    Flag(("--skip-train",), "true", default=False, help="evaluation only: one evaluation's valid samples"),
    Flag(("--eval-global-batch-size",), "int", since="0.18", help="samples per evaluation iteration (default: "
         "--global-batch-size)"),
    Flag(("--start-eval-at-iter",), "int", since="0.18", help="the first iteration evaluated"),
    Flag(("--micro-batch-size",), "int", minimum=1, help="with the data-parallel size, the global batch size when "
                                                         "--global-batch-size is not given"),
    Flag(("--tensor-model-parallel-size",), "int", default=1, minimum=1, help="a factor of the model-parallel size"),
    Flag(("--pipeline-model-parallel-size",), "int", default=1, minimum=1, help="a factor of the model-parallel size"),
    Flag(("--context-parallel-size",), "int", default=1, minimum=1, help="a factor of the model-parallel size"),
    Flag(("--tensor-parallel-num-weight-shards",), "int", since="0.19", minimum=1,
         help="weight shards over tensor-parallel ranks, a factor of the model-parallel size"),
    Flag(("--rampup-batch-size",), "list", values=("START", "INCREMENT", "SAMPLES"),
         help="the batch-size ramp-up, which changes train_iters in 0.16 and 0.17"),
)


def split_sizes(megatron_version: str | None = None, world_size: int | None = None, **flags) -> tuple:
    """Samples per split (train, valid, test) as Megatron-LM ``megatron_version`` training asks for
    them (keywords: the flags in snake case; None or a default is a flag not given), on
    ``world_size`` ranks (needed only without ``global_batch_size``)."""
    version = resolve(megatron_version)
    args = resolve_flags(SIZE_FLAGS, version, without_defaults(SIZE_FLAGS, flags))
    train_samples, train_iters, gbs = args["train_samples"], args["train_iters"], args["global_batch_size"]
    eval_iters, interval, rampup = args["eval_iters"], args["eval_interval"], args["rampup_batch_size"]
    if train_samples is None and train_iters is None:
        raise MegacacheError("give --train-samples, or --train-iters with --global-batch-size")
    if (train_iters and train_samples is not None) or (train_samples and train_iters is not None):
        raise MegacacheError("give --train-samples or --train-iters, not both (Megatron-LM asserts: 'expected "
                             "iteration-based training' or 'expected sample-based training')")
    for dest, value in args.items():
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise MegacacheError(f"--{dest.replace('_', '-')} must not be negative, got {value}")
    if gbs is None and args["micro_batch_size"] is not None:
        gbs = args["micro_batch_size"] * data_parallel_size(version, world_size, args)
    if not gbs and (train_samples is None or eval_iters):
        raise MegacacheError("--global-batch-size is needed to turn iterations into samples: give it, or "
                             "--micro-batch-size and --prepare-cache-world-size (the ranks training runs on), "
                             "from which training derives it")
    if rampup is not None and not at_least(version, "0.18"):
        if train_iters:
            raise MegacacheError("--rampup-batch-size goes with --train-samples (Megatron-LM asserts: 'expected no "
                                 "batch-size rampup for iteration-based training')")
        train_iters = ramped_iterations(train_samples, gbs, *_integers("--rampup-batch-size", rampup))
    elif train_iters is None:  # training derives the iterations from the samples
        train_iters = train_samples // gbs
    train = train_samples if train_samples else train_iters * gbs
    eval_batch = args.get("eval_global_batch_size") or gbs or 0
    if args["full_validation"]:
        valid = None
    elif args["skip_train"]:
        valid = eval_iters * eval_batch
    else:
        if not interval:
            raise MegacacheError("--eval-interval is needed to count the validation samples (Megatron-LM divides "
                                 "--train-iters by it); give the one training uses, or --full-validation")
        evaluations = train_iters // interval + 1
        if at_least(version, "0.18") and args["start_eval_at_iter"] is not None:
            evaluations = max(0, evaluations - args["start_eval_at_iter"] // interval)
        valid = evaluations * eval_iters * eval_batch
    return (train, valid, eval_iters * eval_batch)


def data_parallel_size(version: str, world_size: int | None, args: dict) -> int:
    """Training's data-parallel size on ``world_size`` ranks, as validate_args computes it."""
    if world_size is None:
        raise MegacacheError("without --global-batch-size, training's global batch is --micro-batch-size x the "
                             "data-parallel size, which depends on the ranks it runs on: give "
                             "--prepare-cache-world-size N (or the --global-batch-size training ends up with)")
    tp, pp, cp = (args[f"{kind}_parallel_size"] for kind in ("tensor_model", "pipeline_model", "context"))
    if min(tp, pp, cp) < 1:
        raise MegacacheError(f"the parallel sizes must be positive, got tensor {tp}, pipeline {pp}, context {cp}")
    model = tp * pp * cp
    shards = args.get("tensor_parallel_num_weight_shards")
    if shards is not None:
        if shards < tp or shards % tp:
            raise MegacacheError(f"--tensor-parallel-num-weight-shards {shards} must be a multiple of "
                                 f"--tensor-model-parallel-size {tp} (Megatron-LM refuses it)")
        model *= shards // tp
    if world_size < 1 or world_size % model:
        raise MegacacheError(f"the world size {world_size} is not divisible by the model-parallel size {model} "
                             f"(tensor x pipeline x context parallel sizes; Megatron-LM asserts)")
    return world_size // model


def _integers(flag: str, words) -> list[int]:
    try:
        return [int(w) for w in words]
    except ValueError:
        raise MegacacheError(f"{flag} takes integers, got {' '.join(map(str, words))}") from None


def ramped_iterations(train_samples: int, global_batch: int, start: int, increment: int, ramp_samples: int) -> int:
    """The iterations of sample-based training with a batch-size ramp-up, as Megatron-LM 0.16 and
    0.17's ``update_train_iters`` counts them: one iteration at a time while the samples consumed are
    at most the ramp-up's and the training's, each consuming ``start + k x increment`` samples, k
    being ``int(consumed / (ramp_samples / increments))`` (floating point, as Megatron computes it);
    then the rest at the full batch. This function counts a run of iterations at one batch size at once
    (its length estimated, then settled with the same floating-point test), so the work grows with
    the number of batch sizes, not of iterations."""
    if start < 1 or increment < 1 or ramp_samples < 0:
        raise MegacacheError(f"--rampup-batch-size {start} {increment} {ramp_samples}: the start batch size and "
                             f"the increment must be positive and the samples not negative (Megatron-LM asserts)")
    difference = global_batch - start
    if difference < 0 or difference % increment:
        raise MegacacheError(f"--rampup-batch-size {start} {increment} {ramp_samples}: --global-batch-size "
                             f"{global_batch} must be the start batch size plus a whole number of increments "
                             f"(Megatron-LM asserts)")
    if difference == 0 or ramp_samples == 0:
        raise MegacacheError(f"--rampup-batch-size {start} {increment} {ramp_samples}: Megatron-LM divides by zero "
                             f"on a ramp-up with no increments or no samples")
    per_increment = ramp_samples / (difference // increment)
    limit = min(ramp_samples, train_samples)
    consumed = iterations = 0
    while consumed <= limit:
        step = int(consumed / per_increment)
        batch = start + step * increment
        last = (limit - consumed) // batch + 1   # iterations before the limit stops the ramp-up
        n = min(last, max(1, math.ceil(((step + 1) * per_increment - consumed) / batch)))
        while n > 1 and int((consumed + (n - 1) * batch) / per_increment) != step:
            n -= 1
        while n < last and int((consumed + n * batch) / per_increment) == step:
            n += 1
        consumed += n * batch
        iterations += n
    if train_samples > consumed:
        iterations += (train_samples - consumed) // global_batch
    return iterations
