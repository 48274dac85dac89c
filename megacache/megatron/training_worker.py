"""Runs in the interpreter a user's training runs (``megacache build --megatron-python PYTHON``) and
asks that Megatron for its tokenizer's ``unique_identifiers``. Standalone: only the standard library
and that interpreter's megatron, never megacache (which that interpreter may not have).

Request (JSON on stdin): ``{"cases": [{"words": [...], "attributes": {"MAJOR.MINOR": {...}, ...}},
...]}``: per case, the tokenizer flags as command-line words, and the same flags as ``args``
attributes with the defaults megacache knows for each version (this Megatron's own, else the
newest's). Several cases share one import of Megatron, which takes seconds.
With Megatron-LM's ``megatron/training`` importable (a checkout on PYTHONPATH), its own argument
parser reads the words, so its defaults and destinations apply; with megatron-core alone (a wheel),
``args`` holds the attributes. Either way that Megatron's ``build_tokenizer`` builds the tokenizer,
as ``pretrain_gpt.py`` does.

Answer (the last line of stdout): ``{"version": ..., "answers": [...]}``, per case
``{"parser": "megatron-lm" | "attributes", "identifiers": {...}}`` or ``{"error": "..."}``; or
``{"version": ..., "error": "..."}`` when Megatron does not import.

A request may also hold ``"command": {"words": [...], "world_size": N | null}``: the whole training
command, which that Megatron-LM reads as ``tools/prepare_cache.py`` does (``read_command``); the
answer's ``"command"`` holds what training would build from it, or ``{"error": ...}`` (Megatron
refused it), or ``{"partial": ...}`` (not a whole training command: validate_args needs the model's
flags).
"""

import contextlib
import io
import json
import os
import sys
import traceback
import warnings
from types import SimpleNamespace


def megatron_args(version, words, attributes):
    """``args`` as training has them: Megatron-LM's parser where there is one."""
    try:
        from megatron.training.arguments import parse_args
    except ImportError:
        minor = ".".join(version.split(".")[:2])
        newest = max(attributes, key=lambda v: tuple(map(int, v.split("."))))
        return SimpleNamespace(**attributes.get(minor, attributes[newest])), "attributes"
    argv = sys.argv
    sys.argv = ["pretrain_gpt.py", *words]
    try:
        args = parse_args(ignore_unknown_args=True)
    finally:
        sys.argv = argv
    # What validate_args does with the tokenizer flags before 0.18: the deprecated tiktoken list
    # stands in for the special tokens.
    if getattr(args, "tokenizer_special_tokens", None) is None and getattr(args, "tiktoken_special_tokens", None):
        args.tokenizer_special_tokens = args.tiktoken_special_tokens
    return args, "megatron-lm"


def build(args):
    if getattr(args, "legacy_tokenizer", False):
        from megatron.training.tokenizer import build_tokenizer
    else:
        try:
            from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
        except ImportError:  # megatron-core 0.16
            from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer
    return build_tokenizer(args)


def identifiers(version, case):
    try:
        args, parser = megatron_args(version, case["words"], case["attributes"])
        return {"parser": parser, "identifiers": build(args).unique_identifiers}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


#: the model's flags validate_args requires (every supported version)
_MODEL = ("num_layers", "hidden_size", "num_attention_heads")


def read_command(words, world_size):
    """What training builds from the command ``words`` on ``world_size`` ranks, as this Megatron-LM
    computes it (tools/prepare_cache.py's steps, in versions that lack it too): ``parse_args``,
    ``validate_args`` (``validate_yaml`` for --yaml-cfg), ``update_train_iters``,
    ``get_train_valid_test_num_samples``, ``get_blend_and_blend_per_split`` and the tokenizer's
    identity. Without a world size, the smallest one validate_args accepts (the global batch is then
    given, or megacache refuses the command first). Where no GPU is present, validate_args's question
    of its architecture is answered as for a Hopper: it chooses warnings and communication streams,
    never the data."""
    import torch

    from megatron.training import arguments, get_train_valid_test_num_samples
    from megatron.training.global_vars import set_args
    from megatron.training.training import update_train_iters
    from megatron.training.utils import get_blend_and_blend_per_split

    if not torch.cuda.is_available():
        arguments.get_device_arch_version = lambda: 9
    argv, refusal = sys.argv, io.StringIO()
    sys.argv = ["pretrain_gpt.py", *words]
    try:
        with contextlib.redirect_stderr(refusal):
            args = arguments.parse_args()
    except SystemExit:
        raise ValueError(refusal.getvalue().strip().splitlines()[-1]) from None
    finally:
        sys.argv = argv
    yaml = getattr(args, "yaml_cfg", None) is not None
    model = args.language_model if yaml else args
    missing = [name for name in _MODEL if getattr(model, name, None) is None]
    if missing:
        return {"partial": "no " + ", ".join("--" + m.replace("_", "-") for m in missing)}
    parallel = args.model_parallel if yaml else args
    if world_size is None:
        tp = parallel.tensor_model_parallel_size
        world_size = tp * parallel.pipeline_model_parallel_size * parallel.context_parallel_size
        shards = getattr(args, "tensor_parallel_num_weight_shards", None)
        world_size *= shards // tp if shards else 1
    args.world_size = world_size
    defaults = {"tokenizer_type": "GPT2BPETokenizer"}  # pretrain_gpt.py's
    if yaml:
        from megatron.training.yaml_arguments import validate_yaml

        args = validate_yaml(args, defaults)
    else:
        arguments.validate_args(args, defaults)
    set_args(args)
    if args.rampup_batch_size is not None:  # 0.16 and 0.17 count the ramp-up's iterations with it
        from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator

        init_num_microbatches_calculator(args.rank, args.rampup_batch_size, args.global_batch_size,
                                         args.micro_batch_size, args.data_parallel_size,
                                         getattr(args, "decrease_batch_size_if_needed", False))
    update_train_iters(args)
    sizes = list(get_train_valid_test_num_samples())
    blend, per_split = get_blend_and_blend_per_split(args)
    return {"sizes": sizes, "seq_length": args.seq_length, "seed": args.seed,
            "split": None if per_split else args.split, "blend": blend, "blend_per_split": per_split,
            "data_cache_path": args.data_cache_path, "mid_level_dataset_surplus": args.mid_level_dataset_surplus,
            "identifiers": build(args).unique_identifiers}


def answer_command(request):
    try:
        import megatron.training  # noqa: F401
    except ImportError:
        return {"partial": "its Megatron has no megatron.training: megatron-core alone, not Megatron-LM"}
    try:
        return read_command(request["words"], request.get("world_size"))
    except Exception as exc:  # validate_args refuses by assert
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def main():
    request = json.load(sys.stdin)
    answer = {"version": None}
    # Megatron and the libraries it loads print; the answer owns stdout's last line.
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import megatron.core

            answer["version"] = megatron.core.__version__
            answer["answers"] = [identifiers(answer["version"], case) for case in request["cases"]]
            if request.get("command"):
                answer["command"] = answer_command(request["command"])
        except Exception as exc:
            answer["error"] = f"{type(exc).__name__}: {exc}"
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip the teardown of torch and friends: the answer is out


if __name__ == "__main__":
    main()
