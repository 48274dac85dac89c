"""``megacache build`` takes a training command as it is: every flag the chosen Megatron-LM version's
training parser knows (megacache/megatron/training_flags.json, recorded from each version's own
parser) is accepted, those that decide the caches are used and the rest change nothing; a flag that
version does not know, an abbreviation, a flag without its values, a value without a flag, and
flags whose effect megacache does not reproduce are each an error that exits 2 and writes nothing.
``@FILE`` reads words from FILE as a shell splits them; ``--yaml-cfg FILE`` reads Megatron's YAML
arguments as its training does, ignoring the flags beside it."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess

import pytest
import yaml

from megacache.errors import MegacacheError
from megacache.interfaces import cli
from megacache.megatron.command import REFUSED, flags_of
from megacache.megatron.tokenizer import TOKENIZER_FLAGS
from megacache.megatron.training import SIZE_FLAGS, split_sizes
from megacache.megatron.versions import SUPPORTED
from support import run_cli
from support.inputs.indexed import write_lengths
from support.inputs.training_command import other_flags, training_command, training_yaml

DATA = ["--data-path", "d", "--seq-length", "8", "--train-iters", "20", "--global-batch-size", "2",
        "--eval-iters", "2", "--eval-interval", "10", "--split", "90,8,2", "--seed", "7",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"]

#: build's flags that are megacache's own: no version's training has them (else a training command
#: would mean something else to megacache)
MEGACACHE_ONLY = {"-h", "--help", "--bridge-config", "--no-add-extra-token-to-sequence",
                  "--no-drop-last-partial-validation-sequence", "--rebuild-stale", "--megatron-version",
                  "--tokenizer-identifiers", "--tokenizer-from-description", "--megatron-python", "--dry-run",
                  "--json", "--verbose", "--no-rebuild", "--progress-interval"}


def build_flags() -> dict:
    build = next(a for a in cli.build_parser()._actions if a.dest == "command").choices["build"]
    return {name: (1 if a.nargs is None else a.nargs) for a in build._actions for name in a.option_strings}


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_lengths("d", [5, 9, 0, 30, 12] * 40)
    return tmp_path


def files(directory: str) -> dict:
    out = {}
    for name in sorted(os.listdir(directory)):
        if name == ".megacache":  # the build's own state: a manifest naming its cache path
            continue
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_every_tokenizer_and_size_flag_exists_in_the_versions_megacache_says():
    for f in TOKENIZER_FLAGS + SIZE_FLAGS:
        for version in SUPPORTED:
            known = flags_of(version)
            assert [f.exists_in(version)] * len(f.names) == [n in known for n in f.names], (f.names, version)
            if f.exists_in(version):
                assert (known[f.names[0]] == 0) == (f.kind in ("true", "false")), (f.names, version)


def test_build_reads_training_flags_as_training_reads_them_and_its_own_are_no_training_flags():
    every = {name: takes for v in SUPPORTED for name, takes in flags_of(v).items()}
    own = build_flags()
    assert {name for name in own if name not in every} == MEGACACHE_ONLY
    for name, takes in own.items():
        if name in every:  # megacache takes one or more words where training also takes none
            assert takes == every[name] or (takes, every[name]) == ("+", "*"), name


def test_the_example_command_has_more_than_100_flags_in_every_version():
    assert all(len(other_flags(v)) >= 100 for v in SUPPORTED)


@pytest.mark.parametrize("version", SUPPORTED)
def test_a_whole_training_command_builds_what_its_data_flags_build(version, here, capsys):
    version_flags = ["--megatron-version", version]
    assert cli.main(["build", *DATA, *version_flags, "--data-cache-path", "alone"]) == 0
    command = training_command(version, DATA)
    assert cli.main(["build", *command, *version_flags, "--data-cache-path", "whole"]) == 0
    # as a training script holds it: one group to a line, continued with backslashes, commented
    lines = [shlex.join(command[i:i + 2]) + " \\" for i in range(0, len(command), 2)]
    (here / "train.args").write_text("# the training command\n" + "\n".join(lines) + "\n")
    assert cli.main(["build", "@train.args", *version_flags, "--data-cache-path", "file"]) == 0
    built = files("alone")
    assert len(built) == 13 and files("whole") == built and files("file") == built  # 12 and the sequences file
    capsys.readouterr()


@pytest.mark.parametrize("version", SUPPORTED)
def test_a_yaml_configuration_builds_what_the_same_command_builds(version, here, capsys):
    version_flags = ["--megatron-version", version]
    assert cli.main(["build", *training_command(version, DATA), *version_flags, "--data-cache-path", "words"]) == 0
    config = training_yaml(version, [*DATA, "--data-cache-path", "yaml"])
    assert len(config) > 100
    (here / "train.yaml").write_text(yaml.safe_dump(config))
    # as training does, the flags beside --yaml-cfg are ignored, and megacache warns of them
    assert cli.main(["build", "--yaml-cfg", "train.yaml", "--seed", "99", "--lr", "1", *version_flags]) == 0
    assert capsys.readouterr().err == ("megacache build: warning: with --yaml-cfg, training reads its arguments from "
                                       "train.yaml alone and ignores --seed, --lr; so does this build\n")
    assert files("yaml") == files("words")
    # the data path as one string of words, which Megatron's YAML reading splits at whitespace
    config.update(data_path="1 d", data_cache_path="string")
    (here / "train.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["build", "--yaml-cfg", "train.yaml", *version_flags]) == 0
    weighted = [w if w != "d" else "1 d" for w in DATA]
    weighted = weighted[:1] + weighted[1].split() + weighted[2:]
    assert cli.main(["build", *weighted, *version_flags, "--data-cache-path", "list"]) == 0
    assert len(files("string")) == 22 and files("string") == files("list")  # 12, a blend's 9, the sequences file
    capsys.readouterr()


def test_yaml_parallel_sizes_come_from_model_parallel_fitted_to_the_world(here, capsys):
    config = {"data_path": ["d"], "seq_length": 8, "train_iters": 20, "micro_batch_size": 2, "eval_iters": 2,
              "eval_interval": 10, "tokenizer_type": "NullTokenizer", "vocab_size": 100, "split": "90,8,2",
              "tensor_model_parallel_size": 1, "model_parallel": {"tensor_model_parallel_size": 16,
                                                                  "pipeline_model_parallel_size": 2}}
    (here / "train.yaml").write_text(yaml.safe_dump(config))
    # validate_yaml: tensor min(16, 8) = 8, pipeline min(2, 8 // 8) = 1, so data-parallel size 1
    assert cli.main(["build", "--yaml-cfg", "train.yaml", "--prepare-cache-world-size", "8", "--dry-run", "--json",
                     "--megatron-version", "0.19"]) == 0
    import json
    requested = [e["requested"] for e in json.loads(capsys.readouterr().out)["entries"]]
    assert requested == [20 * 2, 3 * 2 * 2, 2 * 2]


YAML_REFUSALS = [
    ("data_path: d\n", "data_path: 'd' is one word, which Megatron-LM reads letter by letter as dataset prefixes; "
                       "write a list: data_path: [d]"),
    ("mock_data: true\n", f"mock_data: --mock-data cannot be built: {REFUSED['--mock-data']}"),
    ("model_parallel: 2\n", "model_parallel: a section of settings is expected, got 2"),
    ("model_parallel: {tensor_model_parallel_size: 0}\n",
     "model_parallel.tensor_model_parallel_size: a positive integer is expected, got 0"),
    ("- data_path\n", "a mapping of Megatron-LM's argument names to values is expected, got list"),
    ("data_path: [d\n", "not YAML (while parsing a flow sequence"),
]


@pytest.mark.parametrize("text, message", YAML_REFUSALS, ids=[m[:30] for _, m in YAML_REFUSALS])
def test_a_yaml_configuration_training_would_not_read_exits_2_naming_the_key(text, message, here, capsys):
    (here / "train.yaml").write_text(text)
    before = sorted(os.listdir())
    status, err = run_cli(["build", "--yaml-cfg", "train.yaml", "--megatron-version", "0.19"], capsys)
    assert status == 2 and sorted(os.listdir()) == before
    assert f"megacache build: error: --yaml-cfg train.yaml: {message}" in err


def test_a_yaml_key_no_argument_reads_is_named_with_what_it_likely_meant(here, capsys):
    (here / "train.yaml").write_text("data_pth: [d]\nrank: 0\n")
    status, err = run_cli(["build", "--yaml-cfg", "train.yaml", "--megatron-version", "0.19"], capsys)
    assert status == 2 and err.splitlines()[:2] == [
        "megacache build: warning: --yaml-cfg train.yaml: data_pth is no argument of Megatron-LM 0.19's training "
        "parser; megacache reads nothing from it; did you mean data_path, metadata_path or test_data_path?",
        "megacache build: warning: --yaml-cfg train.yaml: rank is no argument of Megatron-LM 0.19's training parser; "
        "megacache reads nothing from it"]


def test_megatrons_own_example_yaml_keys_are_arguments_of_its_training():
    # the top-level keys of Megatron-LM 0.16's examples/gpt3/gpt_config.yaml (beside its two sections)
    keys = """use_legacy_models spec micro_batch_size global_batch_size rampup_batch_size
    check_for_nan_in_loss_and_grad num_layers_per_virtual_pipeline_stage encoder_num_layers decoder_num_layers
    rotary_seq_len_interpolation_factor add_position_embedding make_vocab_size_divisible_by group_query_attention
    exit_signal_handler exit_duration_in_mins exit_interval untie_embeddings_and_output_weights
    position_embedding_type rotary_percent openai_gelu squared_relu swiglu onnx_safe bert_binary_head
    max_position_embeddings transformer_impl use_flash_attn seed data_parallel_random_init optimizer lr
    lr_decay_style lr_decay_iters lr_decay_samples lr_warmup_fraction lr_warmup_iters lr_warmup_samples
    lr_warmup_init min_lr weight_decay start_weight_decay end_weight_decay weight_decay_incr_style clip_grad
    adam_beta1 adam_beta2 adam_eps sgd_momentum override_opt_param_scheduler use_checkpoint_opt_param_scheduler
    save save_interval no_save_optim no_save_rng load no_load_optim no_load_rng finetune use_checkpoint_args
    exit_on_missing_checkpoint loss_scale initial_loss_scale min_loss_scale loss_scale_window hysteresis
    accumulate_allreduce_grads_in_fp32 fp16_lm_cross_entropy distributed_backend distributed_timeout_minutes
    overlap_grad_reduce overlap_param_gather scatter_gather_tensors_in_pipeline local_rank lazy_mpu_init
    empty_unused_memory_level use_distributed_optimizer train_iters eval_iters eval_interval skip_train
    data_path split train_data_path valid_data_path test_data_path data_cache_path mock_data vocab_size
    vocab_file merge_file vocab_extra_ids seq_length encoder_seq_length decoder_seq_length num_workers
    tokenizer_type tokenizer_model reset_position_ids reset_attention_mask eod_mask_loss train_samples
    dataloader_type log_interval tensorboard_dir""".split()
    from megacache.megatron.command import destinations

    assert [k for k in keys if k not in destinations("0.16")] == []


def test_verbose_lists_the_flags_set_aside(here, capsys):
    status = cli.main(["build", *DATA, "--num-layers", "2", "--recompute-modules", "core_attn", "mlp", "--bf16",
                       "--lr=3e-4", "--verbose", "--dry-run", "--megatron-version", "0.19"])
    assert status == 0
    assert capsys.readouterr().err == ("megacache build: training flags accepted, which change nothing in the "
                                       "caches: --num-layers 2 --recompute-modules core_attn mlp --bf16 --lr 3e-4\n")


REFUSALS = [
    (["--hidden-sizee", "4"], "--hidden-sizee is not a flag of Megatron-LM 0.19's training; did you mean "
                              "--hidden-size, --ffn-hidden-size or --moe-ffn-hidden-size?"),
    (["--num-layer", "4"], "--num-layer is not a flag of Megatron-LM 0.19's training; flags are not abbreviated "
                           "(as in Megatron-LM): did you mean --num-layers, --num-layers-at-end-in-bf16, "
                           "--num-layers-at-start-in-bf16 or --num-layers-per-virtual-pipeline-stage?"),
    (["--seq", "8"], "--seq is not a flag of Megatron-LM 0.19's training; flags are not abbreviated (as in "
                     "Megatron-LM): did you mean --seq-length or --sequence-parallel?"),
    (["--tokenizer-hf-use-fast"], "--tokenizer-hf-use-fast does not exist in Megatron-LM 0.19 (it exists in 0.16 "
                                  "and 0.17): pass the flags of the Megatron you train with, and --megatron-version "
                                  "to match it"),
    (["--num-layers"], "--num-layers takes a value"),
    (["--bf16=1"], "--bf16 takes no value (got '--bf16=1')"),
    (["--bf16", "1"], "'1': a value that belongs to no flag"),
    (["--mock-data"], f"--mock-data cannot be built: {REFUSED['--mock-data']}"),
    (["--step-batch-size-schedule", "0:8"], "--step-batch-size-schedule cannot be built: "
                                            f"{REFUSED['--step-batch-size-schedule']}"),
]


@pytest.mark.parametrize("words, message", REFUSALS, ids=[" ".join(w) for w, _ in REFUSALS])
def test_a_flag_training_would_not_take_exits_2_and_writes_nothing(words, message, here, capsys):
    before = sorted(os.listdir())
    status, err = run_cli(["build", *DATA, *words, "--megatron-version", "0.19"], capsys)
    assert status == 2 and sorted(os.listdir()) == before
    assert err.endswith(f"megacache build: error: {message}\n")


def test_a_flag_of_a_newer_version_names_the_versions_that_have_it(here, capsys):
    status, err = run_cli(["build", *DATA, "--eval-micro-batch-size", "8", "--megatron-version", "0.17"], capsys)
    assert status == 2
    assert err.endswith("megacache build: error: --eval-micro-batch-size does not exist in Megatron-LM 0.17 (it "
                        "exists in 0.18 to 0.20): pass the flags of the Megatron you train with, and "
                        "--megatron-version to match it\n")


def test_encoder_seq_length_stands_for_seq_length_and_not_beside_it(here, capsys):
    data = [w for w in DATA if w not in ("--seq-length", "8")] + ["--megatron-version", "0.19"]
    assert cli.main(["build", *data, "--encoder-seq-length", "8", "--data-cache-path", "encoder"]) == 0
    assert cli.main(["build", *data, "--seq-length", "8", "--data-cache-path", "seq"]) == 0
    assert files("encoder") == files("seq")
    capsys.readouterr()
    status, err = run_cli(["build", *data, "--seq-length", "8", "--encoder-seq-length", "8"], capsys)
    assert status == 2
    assert err == "megacache build: error: give --seq-length or --encoder-seq-length, not both (Megatron-LM asserts)\n"


def test_argument_files_read_as_a_shell_splits_and_may_nest(tmp_path):
    parser = cli.build_parser()
    (tmp_path / "inner").write_text("--lr 3e-4  # a comment\n")
    (tmp_path / "outer").write_text(f"--split '90, 8, 2' \\\n  --bf16\n@{tmp_path / 'inner'}\n")
    words = cli.with_argument_files(["build", f"@{tmp_path / 'outer'}", "--seed", "3"], parser)
    assert words == ["build", "--split", "90, 8, 2", "--bf16", "--lr", "3e-4", "--seed", "3"]


@pytest.mark.parametrize("content, message", [
    (None, "cannot read the file of arguments (No such file or directory)"),
    ("--split '90, 8\n", "cannot split it into words as a shell would (No closing quotation)"),
    ("@SELF\n", "read again from within itself"),
])
def test_an_argument_file_that_cannot_be_read_exits_2_naming_it(content, message, tmp_path, capsys):
    path = tmp_path / "args"
    if content is not None:
        path.write_text(content.replace("SELF", str(path)))
    status, err = run_cli(["build", f"@{path}"], capsys)
    assert status == 2 and err.endswith(f"megacache: error: @{path}: {message}\n")


def test_the_readme_training_command_is_taken_as_it_is(capsys):
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"), encoding="utf-8").read()
    assignment = readme[readme.index("TRAIN_ARGS=("):]
    assignment = assignment[:assignment.index(")\n") + 1]
    done = subprocess.run(["bash", "-c", f'{assignment}\nprintf "%s\\0" "${{TRAIN_ARGS[@]}}"'], capture_output=True,
                          text=True, check=True)
    words = done.stdout.split("\0")[:-1]
    assert len(words) == 39
    status, err = run_cli(["build", "--megatron-version", "0.19", *words, "--dry-run"], capsys)
    # every flag taken: what stops it is the dataset, which is not on this machine
    assert status == 2 and err == ("megacache build: error: /data/tok/corpus_text_document.idx: index file not found "
                                   "(give each prefix as training gets it: the path without .idx/.bin)\n")


def test_the_global_batch_comes_from_the_world_size_as_validate_args_takes_it():
    flags = dict(train_iters=10, eval_iters=1, eval_interval=5, micro_batch_size=2, tensor_model_parallel_size=2,
                 pipeline_model_parallel_size=2)
    assert split_sizes("0.18", 16, **flags) == (10 * 8, 3 * 8, 8)  # data-parallel size 16 / (2 x 2) = 4
    # from 0.19 on, weight shards over tensor-parallel ranks are one more factor of the model
    assert split_sizes("0.19", 16, tensor_parallel_num_weight_shards=4, **flags) == (10 * 4, 3 * 4, 4)
    with pytest.raises(MegacacheError, match="give --prepare-cache-world-size N"):
        split_sizes("0.19", None, **flags)
    with pytest.raises(MegacacheError, match=r"the world size 6 is not divisible by the model-parallel size 4 "):
        split_sizes("0.19", 6, **flags)
    with pytest.raises(MegacacheError, match="--tensor-parallel-num-weight-shards 3 must be a multiple of "):
        split_sizes("0.19", 16, tensor_parallel_num_weight_shards=3, **flags)
