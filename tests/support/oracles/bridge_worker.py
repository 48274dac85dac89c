"""Runs inside the Megatron-Bridge oracle (tests/bridge_oracle.sh: Bridge 0.6.2 on megatron-core
0.19.2) and answers what Bridge itself does with a ConfigContainer: a JSON request on stdin, a JSON
answer on the last line of stdout. It imports Bridge and megatron-core; megacache only for the
``live`` task, from the folder the request names.

Request: ``{"cwd": DIR, "build": bool, "configs": [...]}``; each configuration is one of

* ``{"yaml": PATH}``: a container Bridge wrote (``ConfigContainer.from_yaml``);
* ``{"dict": {...}}``: the same as a mapping (``ConfigContainer.from_dict``);
* ``{"spec": {...}, "yaml": PATH}``: a container this worker makes from Bridge's configuration classes
  (sections ``train``, ``validation``, ``scheduler``, ``dataset``, ``tokenizer``, ``logger`` of
  constructor keywords, ``model`` with ``seq_length``), written with Bridge's ``to_yaml`` to PATH and
  read back from it, as a user's YAML would be; with ``"sequences": PATH``, the per-dataset sequences
  file Megatron-LM's tool writes for its data is written there first (Bridge reads it as it validates).

For each, what Bridge's pretraining does up to its datasets, on the CPU in a one-process gloo group
(BlendedDataset saves its cache only under a process group): ``pretrain``'s ``runtime_config_update``
(which validates the container), then ``setup``'s steps that run without a GPU, Bridge's own
functions in setup's order: ``maybe_log_and_save_config`` (the validated YAML, to
``logger.save_config_filepath``), ``build_tokenizer``, ``_validate_and_set_vocab_size``, and the
dataset provider ``get_dataset_provider`` bound by ``_bind_dataset_provider_context``; then the
loader's sample counts (``get_train_valid_test_num_samples``) and, with ``build``, its
``build_train_valid_test_datasets`` with that provider: megatron-core's builder writes the caches.
``setup`` itself cannot run on a CPU (``initialize_megatron`` asserts CUDA, and a CUDA tensor is made
before the tokenizer); the two statements it runs inline between the tokenizer and the model (the
tokenizer set on the dataset configuration, and the token width code derived from its vocabulary)
are done as it does them. Where Bridge saved a validated YAML, it is loaded and validated again
(``from_yaml``, ``runtime_config_update``), as a later run given that file would: ``reload`` is None or
Bridge's refusal. The answer per configuration: ``{"error": ...}`` (where Bridge refused), or the
sizes, the dataset settings as validated, the tokenizer's ``unique_identifiers``, ``reload``, and
(with ``build``) the names of the files in the cache directory.

``{"task": "live", "megacache": DIR, "configs": [{"spec": ..., "pickle": PATH}, ...]}``: each spec's
container made as above and, as a user holds it before ``pretrain``, given to megacache's
``BuildConfig.from_bridge`` (megacache imported from DIR): the result, or the message of its
refusal, pickled to PATH.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import traceback
import warnings

warnings.simplefilter("ignore")
logging.disable(logging.WARNING)
os.environ.setdefault("PYTHONWARNINGS", "ignore")


def _imports():
    with contextlib.redirect_stdout(sys.stderr):
        from megatron.bridge.data import loaders
        from megatron.bridge.data.utils import get_dataset_provider
        from megatron.bridge.models import GPTModelProvider
        from megatron.bridge.training import config as bridge_config
        from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer
        from megatron.bridge.training import setup
    return loaders, get_dataset_provider, GPTModelProvider, bridge_config, build_tokenizer, setup


def make_container(spec: dict, modules):
    """A ConfigContainer from Bridge's classes: a tiny GPT, Adam, and the spec's sections."""
    _, _, GPTModelProvider, c, _, _ = modules
    dataset = dict(random_seed=1234, reset_attention_mask=False, reset_position_ids=False, eod_mask_loss=False,
                   dataloader_type="single", num_workers=0)
    dataset.update(spec.get("dataset", {}))
    for key in ("blend", "blend_per_split"):  # JSON has no tuples; Bridge's recipes give (prefixes, weights)
        if dataset.get(key) is not None:
            dataset[key] = tuple(dataset[key]) if key == "blend" else \
                [None if b is None else tuple(b) for b in dataset[key]]
    model = GPTModelProvider(num_layers=1, hidden_size=16, num_attention_heads=2,
                             seq_length=spec.get("model", {}).get("seq_length", dataset.get("seq_length", 128)))
    train = dict(micro_batch_size=1)
    train.update(spec.get("train", {}))
    return c.ConfigContainer(
        model=model, train=c.TrainingConfig(**train), validation=c.ValidationConfig(**spec.get("validation", {})),
        optimizer=c.OptimizerConfig(optimizer="adam", lr=1e-4, use_distributed_optimizer=False),
        scheduler=c.SchedulerConfig(**spec.get("scheduler", {})), dataset=c.GPTDatasetConfig(**dataset),
        logger=c.LoggerConfig(**spec.get("logger", {})),
        tokenizer=c.TokenizerConfig(**spec.get("tokenizer", {})), checkpoint=c.CheckpointConfig(),
        rng=c.RNGConfig(seed=1234))


def load(item: dict, modules):
    c = modules[3]
    if "sequences" in item:
        from megatron_worker import write_sequences_file  # this script's folder

        dataset = item["spec"]["dataset"]
        blend = dataset.get("blend")
        if dataset.get("data_path") is not None:  # its prefixes, as Bridge's finalize reads them
            from megatron.core.datasets.utils import get_blend_from_list

            words = dataset["data_path"]
            blend = get_blend_from_list(words.split() if isinstance(words, str) else list(words))
        write_sequences_file(blend, dataset.get("blend_per_split"), item["sequences"])
    if "spec" in item:
        make_container(item["spec"], modules).to_yaml(item["yaml"])
    if "yaml" in item:
        return c.ConfigContainer.from_yaml(item["yaml"])
    return c.ConfigContainer.from_dict(item["dict"])


def _files(directory: str | None) -> list[str] | None:
    if directory is None or not os.path.isdir(directory):
        return None
    return sorted(e.name for e in os.scandir(directory) if e.is_file())


def setup_data(cfg, modules):
    """``setup``'s steps up to the data that run on a CPU (see the module's notes): the tokenizer and
    the bound dataset provider."""
    _, get_dataset_provider, _, _, build_tokenizer, setup = modules
    setup.maybe_log_and_save_config(cfg)
    tokenizer = build_tokenizer(cfg.tokenizer)
    cfg.model.vocab_size, cfg.model.should_pad_vocab = setup._validate_and_set_vocab_size(
        model_vocab_size=cfg.model.vocab_size, tokenizer_vocab_size=tokenizer.vocab_size,
        use_tokenizer_vocab_size=getattr(cfg.tokenizer, "use_tokenizer_vocab_size", False))
    if hasattr(cfg.dataset, "tokenizer"):
        cfg.dataset.tokenizer = tokenizer
    if getattr(cfg.dataset, "token_dtype_code", None) is None and tokenizer.vocab_size is not None:
        cfg.dataset.token_dtype_code = 4 if tokenizer.vocab_size > 65536 else 8
    provider = setup._bind_dataset_provider_context(get_dataset_provider(cfg.dataset), tokenizer=tokenizer,
                                                    pg_collection=None)
    return tokenizer, provider


def reload(path: str | None, modules) -> str | None:
    """Bridge's refusal of the validated YAML it saved at ``path``, run again (None: accepted)."""
    c = modules[3]
    if path is None or not os.path.isfile(path):
        return None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            c.runtime_config_update(c.ConfigContainer.from_yaml(path))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def run_one(item: dict, build: bool, modules) -> dict:
    loaders, c = modules[0], modules[3]
    try:
        cfg = load(item, modules)
    except Exception as exc:
        return {"error": f"loading: {type(exc).__name__}: {exc}", "stage": "load"}
    try:
        with contextlib.redirect_stdout(sys.stderr):
            c.runtime_config_update(cfg)
            tokenizer, provider = setup_data(cfg, modules)
            sizes = loaders.get_train_valid_test_num_samples(cfg)
        d = cfg.dataset
        answer = {
            "sizes": list(sizes),
            "blend": None if d.blend is None else [list(d.blend[0]), None if d.blend[1] is None else list(d.blend[1])],
            "blend_per_split": None if d.blend_per_split is None else [
                None if b is None else [list(b[0]), None if b[1] is None else list(b[1])] for b in d.blend_per_split],
            "split": d.split, "seq_length": d.sequence_length, "seed": d.random_seed,
            "path_to_cache": d.path_to_cache, "add_extra_token": d.add_extra_token_to_sequence,
            "drop_last_partial_validation": d.drop_last_partial_validation_sequence,
            "surplus": d.mid_level_dataset_surplus, "tokenizer": tokenizer.unique_identifiers,
            "sequences_path": d.per_dataset_sequences_path,
            "reload": reload(cfg.logger.save_config_filepath, modules),
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "stage": "validate",
                "trace": traceback.format_exc(limit=-3)}
    if build:
        from megatron.core.datasets.gpt_dataset import GPTDataset
        from megatron_worker import refusal, stopped_where_it_loops  # this script's folder

        try:
            with contextlib.redirect_stdout(sys.stderr), stopped_where_it_loops(GPTDataset):
                loaders.build_train_valid_test_datasets(cfg, provider)
        except Exception as exc:
            answer.update(error=refusal(exc), stage="build")
        answer["files"] = _files(d.path_to_cache)
    return answer


def live(request: dict, modules) -> list:
    """megacache's reading of each live container (see the module's notes)."""
    import pickle

    sys.path.insert(0, request["megacache"])
    from megacache.builders.config import BuildConfig
    from megacache.errors import MegacacheError

    for item in request["configs"]:
        cfg = make_container(item["spec"], modules)
        try:
            result = BuildConfig.from_bridge(cfg, "0.19")
        except MegacacheError as exc:
            result = str(exc)
        with open(item["pickle"], "wb") as f:
            pickle.dump(result, f)
    return []


def main() -> None:
    request = json.load(sys.stdin)
    os.chdir(request.get("cwd") or os.getcwd())
    modules = _imports()
    import megatron.core
    import torch.distributed as dist
    from megatron.bridge import __version__ as bridge_version

    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp(prefix='megacache-bridge-')}",
                            world_size=1, rank=0)
    if request.get("task") == "live":
        results = live(request, modules)
    else:
        results = [run_one(item, bool(request.get("build")), modules) for item in request["configs"]]
    dist.destroy_process_group()
    sys.stdout.write("\n" + json.dumps({"bridge": bridge_version, "megatron_core": megatron.core.__version__,
                                        "results": results}) + "\n")


if __name__ == "__main__":
    main()
