"""Runs inside the interpreter of one megatron-core version (0.16.1 in the test environment's own
Python; 0.17-0.19 in the Python 3.12 environment of tests/megatron_oracles.sh; 0.20, Megatron-LM main,
in that environment with a main checkout first on PYTHONPATH) and does what a test asks of that
version: a JSON request on stdin, a JSON answer on stdout. Standalone: it imports megatron-core and
numpy, never megacache.

Requests:
* ``{"task": "tokenizers", "cwd": DIR, "cases": [flags, ...]}``: each case's
  ``build_tokenizer(args).unique_identifiers`` (``args``: Megatron-LM's flag defaults of this version
  with the case's flags on top), or ``{"error": "..."}``.
* ``{"task": "tokenizer_flags"}``: the tokenizer flags Megatron-LM's arguments.py declares (a
  checkout's ``megatron.training``; the wheels have none): names, destination, switch or not, default.
* ``{"task": "training_flags", "tools": DIR or null}``: every flag of the training parser
  Megatron-LM's arguments.py builds (``add_megatron_arguments``), and those tools/prepare_cache.py adds
  to it where ``tools`` holds one: each flag's spellings and how many words it takes, and the
  attribute (destination) each training flag sets.
* ``{"task": "caches", "configs": [...]}``: for each configuration (``seq_length``, ``sizes``,
  ``seed``, ``add_extra_token``, ``drop_last_partial_validation``, ``blend`` and ``split`` or
  ``blend_per_split``, named as megacache's BuildConfig names them; the tokenizer's flags), megatron-core's
  ``BlendedMegatronDatasetBuilder(GPTDataset, ...).build()`` writing its cache to ``path_to_cache``;
  the answer per configuration is None or how it refused (``refusal``). A configuration with
  ``object_storage_cache_path`` reads its s3:// or msc:// datasets as training does from a bucket
  (``GPTDatasetConfig.object_storage_cache_path``, ``mmap_bin_files=False``), and gets no sequences
  file; one with ``enable_msc`` turns on megatron-core's multi-storage-client feature first, as
  training's ``--enable-msc`` does, so that its msc:// paths are read through MSC_CONFIG's profiles.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import warnings
from types import SimpleNamespace

warnings.simplefilter("ignore")
os.environ.setdefault("PYTHONWARNINGS", "ignore")

import megatron.core  # noqa: E402

VERSION = ".".join(megatron.core.__version__.split(".")[:2])

# Megatron-LM's arguments.py defaults of every attribute build_tokenizer reads, per version (0.18 on,
# two destinations were renamed: special_tokens, metadata_path).
_COMMON = dict(tokenizer_type=None, tokenizer_model=None, vocab_file=None, merge_file=None, vocab_size=None,
               vocab_extra_ids=0, tiktoken_pattern=None, tiktoken_num_special_tokens=1000,
               tokenizer_sentencepiece_legacy=False, trust_remote_code=False, padded_vocab_size=None,
               make_vocab_size_divisible_by=128, tensor_model_parallel_size=1, rank=0)
DEFAULTS = {
    "0.16": dict(_COMMON, tokenizer_metadata=None, tokenizer_special_tokens=None, legacy_tokenizer=False,
                 tiktoken_special_tokens=None, tokenizer_hf_use_fast=False, tokenizer_hf_include_special_tokens=False),
    "0.17": dict(_COMMON, tokenizer_metadata=None, tokenizer_special_tokens=None, tiktoken_special_tokens=None,
                 tokenizer_hf_use_fast=True, tokenizer_hf_include_special_tokens=True,
                 tokenizer_hf_no_use_fast=False, tokenizer_hf_no_include_special_tokens=False),
    "0.18": dict(_COMMON, metadata_path=None, special_tokens=None, pad_vocab_size=True,
                 tokenizer_sentencepiece_ignore_extra_whitespaces=True, tokenizer_hf_no_use_fast=False,
                 tokenizer_hf_no_include_special_tokens=False, null_tokenizer_eod_id=None,
                 null_tokenizer_pad_id=-1, chat_template=None),
}
DEFAULTS["0.19"] = DEFAULTS["0.18"]
DEFAULTS["0.20"] = dict(DEFAULTS["0.19"], use_gigatoken=False)
RENAMED = {"tokenizer_special_tokens": "special_tokens", "tokenizer_metadata": "metadata_path"}


def megatron_args(flags: dict) -> SimpleNamespace:
    """``args`` as this version's Megatron-LM parses these flags (given by their flag names in snake
    case), including validate_args' copy of the deprecated --tiktoken-special-tokens."""
    args = dict(DEFAULTS[VERSION])
    for key, value in flags.items():
        key = RENAMED.get(key, key) if VERSION >= "0.18" else key
        if key not in args:
            raise KeyError(f"megatron-core {VERSION} has no argument {key}")
        args[key] = value
    if VERSION < "0.18" and args["tokenizer_special_tokens"] is None:
        args["tokenizer_special_tokens"] = args["tiktoken_special_tokens"]
    return SimpleNamespace(**args)


def build_tokenizer(flags: dict):
    if VERSION == "0.16":
        from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer as build
    else:
        from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer as build
    with contextlib.redirect_stdout(io.StringIO()):
        return build(megatron_args(flags))


def tokenizers(request: dict) -> list:
    os.chdir(request["cwd"])  # GPT-2 and BERT load the hub names gpt2, bert-large-*: folders in cwd
    out = []
    for flags in request["cases"]:
        try:
            out.append({"ids": build_tokenizer(flags).unique_identifiers})
        except Exception as exc:  # the test compares refusals too
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


def tokenizer_flags(request: dict) -> list:
    import argparse

    from megatron.training.arguments import _add_tokenizer_args

    parser = argparse.ArgumentParser()
    _add_tokenizer_args(parser)
    return [{"names": a.option_strings, "dest": a.dest, "switch": a.nargs == 0, "default": a.default}
            for a in parser._actions if a.option_strings and a.dest != "help"]


def training_flags(request: dict) -> dict:
    import argparse

    from megatron.training.arguments import add_megatron_arguments

    def described(parser: argparse.ArgumentParser, skip: set) -> dict:
        # nargs None is one word; 0 a switch; a number, "?", "*" or "+" as argparse means them
        return {name: (1 if a.nargs is None else a.nargs) for a in parser._actions if a.dest != "help"
                for name in a.option_strings if name not in skip}

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    training = described(parser, set())
    # the attribute each flag sets, by which --yaml-cfg's keys name them
    destinations = {a.dest: a.option_strings[0] for a in parser._actions if a.dest != "help"}
    prepare_cache = {}
    if request.get("tools"):
        sys.path.insert(0, request["tools"])
        import prepare_cache as tool

        tool.add_prepare_cache_args(parser)
        prepare_cache = described(parser, set(training))
    return {"training": training, "destinations": destinations, "prepare_cache": prepare_cache}


class LoopsForever(Exception):
    """Where megatron-core's GPTDataset would loop forever: counting the epochs of a split that has
    no tokens and is asked for samples."""


@contextlib.contextmanager
def stopped_where_it_loops(gpt_dataset_class):
    """``gpt_dataset_class`` (this version's GPTDataset) raising LoopsForever, naming the split,
    where its epoch count would never end: its own loop's condition on its own split, checked once."""
    count_epochs = gpt_dataset_class._get_num_epochs

    def checked(self, num_tokens_per_epoch: int) -> int:
        if num_tokens_per_epoch == 0 and self.num_samples is not None and (
                self.num_samples * self.config.sequence_length + self.config.add_extra_token_to_sequence > 0):
            raise LoopsForever(f"the {self.index_split.name} split has no tokens and {self.num_samples} "
                               "samples are asked of it")
        return count_epochs(self, num_tokens_per_epoch)

    gpt_dataset_class._get_num_epochs = checked
    try:
        yield
    finally:
        gpt_dataset_class._get_num_epochs = count_epochs


def refusal(exc: BaseException) -> str:
    """How megatron-core refused: the exception's class, the file, function and source line of
    megatron-core's (or this file's) that raised it, even from inside numpy, and its message."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "megatron" in f.filename.split(os.sep)[:-1] or f.filename == __file__]
    frame = (ours or frames)[-1]
    return f"{type(exc).__name__} in {os.path.basename(frame.filename)} {frame.name}: {frame.line} | {exc}"


def write_sequences_file(blend, blend_per_split, path: str) -> None:
    """What Megatron-LM's tools/build_sequences_per_dataset.py writes for these data flags: every
    prefix (blend first, then train, valid, test; first appearance) -> its .idx header's (sequence
    count, document count), read by megatron-core's own index reader, dumped with json.dump."""
    from megatron.core.datasets.indexed_dataset import _IndexReader

    prefixes = list(blend[0]) if blend else []
    for b in blend_per_split or []:
        prefixes += list(b[0]) if b else []
    counts = {}
    for prefix in dict.fromkeys(prefixes):
        reader = _IndexReader(prefix + ".idx", False)
        counts[prefix] = (reader.sequence_count, reader.document_count)
    with open(path, "w") as f:
        json.dump(counts, f)


def caches(request: dict) -> list:
    import tempfile

    import torch.distributed as dist
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    # BlendedDataset saves its cache only under a process group (it asks for the rank): one process,
    # as a one-GPU torchrun.
    rendezvous = tempfile.mktemp(prefix="megacache-oracle-")
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", world_size=1, rank=0)

    tokenizers_by_flags: dict = {}
    out = []
    for c in request["configs"]:
        key = json.dumps(c["tokenizer"], sort_keys=True)
        try:
            if key not in tokenizers_by_flags:
                cwd = os.getcwd()
                os.chdir(c.get("tokenizer_cwd", cwd))
                try:
                    tokenizers_by_flags[key] = build_tokenizer(c["tokenizer"])
                finally:
                    os.chdir(cwd)
            data = {"blend_per_split": c["blend_per_split"]} if c.get("blend_per_split") else \
                {"blend": c["blend"], "split": c["split"]}
            if c.get("enable_msc"):
                from megatron.core.msc_utils import MultiStorageClientFeature

                MultiStorageClientFeature.enable()
            if c.get("object_storage_cache_path"):
                data.update(object_storage_cache_path=c["object_storage_cache_path"], mmap_bin_files=False)
            config = GPTDatasetConfig(
                random_seed=c["seed"], sequence_length=c["seq_length"], tokenizer=tokenizers_by_flags[key],
                reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                add_extra_token_to_sequence=bool(c["add_extra_token"]),
                drop_last_partial_validation_sequence=c["drop_last_partial_validation"],
                path_to_cache=c["path_to_cache"], **data)
            with contextlib.redirect_stdout(io.StringIO()), stopped_where_it_loops(GPTDataset):
                BlendedMegatronDatasetBuilder(GPTDataset, c["sizes"], lambda: True, config).build()
            if not c.get("object_storage_cache_path"):
                write_sequences_file(c.get("blend"), c.get("blend_per_split"),
                                     os.path.join(c["path_to_cache"], "sequences_per_dataset.json"))
            out.append(None)
        except Exception as exc:  # megacache must refuse these too, for the same reason
            out.append(refusal(exc))
    return out


def main() -> None:
    request = json.load(sys.stdin)
    answer = {"version": megatron.core.__version__, "results": globals()[request["task"]](request)}
    sys.stdout.write("\n" + json.dumps(answer))


if __name__ == "__main__":
    main()
