"""Runs what Megatron-LM's pretrain_gpt.py does with a training command up to its datasets, on one
process without a GPU or torch.distributed: ``python training_datasets_cpu.py ARGS...`` in a
Megatron-LM tree (PYTHONPATH), for versions without tools/prepare_cache.py.

As training does: that version's ``parse_args`` reads the command (``--yaml-cfg`` replacing it with
the YAML file), ``validate_args`` checks it (``validate_yaml`` for a YAML file, as
``initialize_megatron`` chooses), ``set_global_variables`` makes them the global ones (and the
batch-size calculator, the tokenizer, the timers), ``update_train_iters``
derives the iterations, ``get_train_valid_test_num_samples`` counts the samples, the dataset helpers
are compiled, and pretrain_gpt's own ``train_valid_test_datasets_provider`` builds the datasets (and
so their caches). Stood in for: the world size (WORLD_SIZE, read by parse_args), the GPU
architecture validate_args asks when tensor parallelism > 1 (a Hopper, as prepare_cache_cpu.py
answers), the process group (one process of gloo: a blend's build asks its rank) and
``is_dataset_built_on_rank``, which asks the parallel layout (true: this one process builds).
Prints the sample counts as JSON on its last line.

``--as-yaml FILE ARGS...`` first writes the command as a --yaml-cfg file holds it, every argument
that version's parser gives (its defaults for the rest): in the model_parallel and language_model
sections what that version's validate_yaml reads from them, the rest at the top level; then trains
from ``--yaml-cfg FILE`` alone."""

import json
import socket
import sys

import torch.distributed

import megatron.training.arguments as arguments

arguments.get_device_arch_version = lambda: 9
sys.argv = ["pretrain_gpt.py", *sys.argv[1:]]


def as_yaml(path: str) -> None:
    import argparse
    import enum
    import re

    import yaml
    from megatron.training import yaml_arguments

    def plain(value) -> bool:
        if isinstance(value, (list, tuple)):
            return all(plain(v) for v in value)
        return value is None or type(value) in (bool, int, float, str)

    # each section holds what this version's validate_yaml reads from it (an attribute in both a
    # section and the top level is an error when it merges them)
    with open(yaml_arguments.__file__, encoding="utf-8") as f:
        source = f.read()
    config = {section: {} for section in ("model_parallel", "language_model")}
    sections = {key: section for section in config for key in re.findall(rf"args\.{section}\.(\w+)", source)}
    for key, section in sections.items():  # a setting no flag sets (num_moe_experts): unset
        config[section][key] = None
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser())
    flags = {a.dest for a in parser._actions}  # not what parse_args sets beside them (rank, world_size)
    for key, value in vars(arguments.parse_args()).items():
        value = value.value if isinstance(value, enum.Enum) else list(value) if isinstance(value, tuple) else value
        if key not in flags or not plain(value):
            continue
        (config[sections[key]] if key in sections else config)[key] = value
    # From 0.19 on, validate_args derives the weight shards' remat sizes, which the training's start
    # then reads; validate_yaml does not, so a YAML run must give them (training fails without)
    with open(arguments.__file__, encoding="utf-8") as f:
        derived = [k for k in ("gtp_weight_remat_size", "expert_gtp_weight_remat_size") if f"args.{k}" in f.read()]
    config.update({k: 1 for k in derived})
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f)
    sys.argv = ["pretrain_gpt.py", "--yaml-cfg", path]


if sys.argv[1] == "--as-yaml":
    path = sys.argv[2]
    sys.argv = ["pretrain_gpt.py", *sys.argv[3:]]
    as_yaml(path)

import pretrain_gpt  # noqa: E402
from megatron.core.datasets.utils import compile_helpers  # noqa: E402
from megatron.training import get_train_valid_test_num_samples  # noqa: E402
from megatron.training.global_vars import set_global_variables  # noqa: E402
from megatron.training.training import update_train_iters  # noqa: E402

DEFAULTS = {"tokenizer_type": "GPT2BPETokenizer"}  # pretrain_gpt.py's args_defaults

args = arguments.parse_args()
if args.yaml_cfg is not None:
    from megatron.training.yaml_arguments import validate_yaml

    args = validate_yaml(args, DEFAULTS)
else:
    arguments.validate_args(args, DEFAULTS)
set_global_variables(args)
update_train_iters(args)
samples = get_train_valid_test_num_samples()
compile_helpers()
# training's process group, of this one process (a blend's build asks its rank)
with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
pretrain_gpt.is_dataset_built_on_rank = lambda *args, **kwargs: True
pretrain_gpt.train_valid_test_datasets_provider(samples)
print("\n" + json.dumps({"samples": list(samples)}))
