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
"""

import contextlib
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
        except Exception as exc:
            answer["error"] = f"{type(exc).__name__}: {exc}"
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip the teardown of torch and friends: the answer is out


if __name__ == "__main__":
    main()
