"""How many samples Megatron-LM training asks of each split (``get_train_valid_test_num_samples`` in
``megatron/training/training.py``), per version, from its flags; and the split it uses by default.

* train: ``--train-samples``, else ``--train-iters`` x ``--global-batch-size``.
* valid: none with ``--full-validation``; ``--eval-iters`` x B with ``--skip-train``; else
  P x ``--eval-iters`` x B for P evaluations: ``train_iters // --eval-interval + 1``, less (0.18 on)
  the ``--start-eval-at-iter // --eval-interval`` skipped ones, never below 0.
* test: ``--eval-iters`` x B.
* B is ``--global-batch-size``; from 0.18 on ``--eval-global-batch-size`` when given.
* With ``--train-samples`` alone, training derives ``train_iters = train_samples // global batch``.

Schedules that change the batch size during training (``--rampup-batch-size``, 0.18's
``--step-batch-size-schedule``) and ``--phase-transition-iterations`` are not accepted: they are not
flags of ``megacache build``, so a command using them fails instead of sizing the splits wrongly.
"""

from __future__ import annotations

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
)


def split_sizes(megatron_version: str | None = None, **flags) -> tuple:
    """Samples per split (train, valid, test) as Megatron-LM ``megatron_version`` training asks for
    them (keywords: the flags in snake case; None or a default is a flag not given)."""
    version = resolve(megatron_version)
    args = resolve_flags(SIZE_FLAGS, version, without_defaults(SIZE_FLAGS, flags))
    train_samples, train_iters, gbs = args["train_samples"], args["train_iters"], args["global_batch_size"]
    eval_iters, interval = args["eval_iters"], args["eval_interval"]
    if train_samples is None and train_iters is None:
        raise MegacacheError("give --train-samples, or --train-iters with --global-batch-size")
    if (train_iters and train_samples is not None) or (train_samples and train_iters is not None):
        raise MegacacheError("give --train-samples or --train-iters, not both (Megatron-LM asserts: 'expected "
                             "iteration-based training' or 'expected sample-based training')")
    for dest, value in args.items():
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise MegacacheError(f"--{dest.replace('_', '-')} must not be negative, got {value}")
    if not gbs and (train_samples is None or eval_iters):
        raise MegacacheError("--global-batch-size is needed to turn iterations into samples: without it training "
                             "takes --micro-batch-size x the data-parallel size, which depends on the world size "
                             "and the parallel sizes and which megacache does not compute; give the global batch "
                             "size training runs with")
    if train_iters is None:  # training derives the iterations from the samples
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
