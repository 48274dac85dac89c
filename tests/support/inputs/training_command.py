"""A training command as users have it: the flags of a Megatron-LM example script (model, optimizer,
parallelism, mixed precision, logging, checkpointing), which ``megacache build`` must take verbatim
beside the data flags. Each version gets the flags its training parser knows (the recorded table),
so every command is one that version's training accepts; ``training_yaml`` is the same command as
Megatron's --yaml-cfg file."""

from __future__ import annotations

import shlex

from megacache.megatron.command import YAML_SECTIONS, destinations, flags_of

#: flag groups in the style of Megatron-LM's examples/ scripts; none of them changes the caches
MODEL = """
--use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
--group-query-attention --num-query-groups 8 --kv-channels 128 --max-position-embeddings 8192
--position-embedding-type rope --rotary-base 500000 --rotary-percent 1.0 --use-rotary-position-embeddings
--normalization RMSNorm --norm-epsilon 1e-5 --swiglu --untie-embeddings-and-output-weights
--disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0 --init-method-std 0.0134
--make-vocab-size-divisible-by 128 --attention-softmax-in-fp32 --no-masked-softmax-fusion
--apply-layernorm-1p --qk-layernorm --transformer-impl local --spec megatron.core.models.gpt.gpt_layer_specs
--no-position-embedding --attention-backend auto
"""
OPTIMIZER = """
--micro-batch-size 1 --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-fraction 0.01
--weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --clip-grad 1.0
--optimizer adam --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
--weight-decay-incr-style constant --loss-scale-window 1000
--initial-loss-scale 65536 --min-loss-scale 1.0 --hysteresis 2 --accumulate-allreduce-grads-in-fp32
"""
PARALLEL = """
--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --context-parallel-size 1 --sequence-parallel
--num-layers-per-virtual-pipeline-stage 4 --cp-comm-type p2p --distributed-backend nccl
--distributed-timeout-minutes 60 --ddp-bucket-size 40000000 --tp-comm-overlap --no-gradient-accumulation-fusion
--recompute-granularity selective --recompute-modules core_attn mlp --use-flash-attn --cross-entropy-loss-fusion
--no-bias-swiglu-fusion --no-bias-dropout-fusion --no-rope-fusion --expert-model-parallel-size 1
--manual-gc --manual-gc-interval 100 --empty-unused-memory-level 0
"""
PRECISION = """
--bf16 --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --first-last-layers-bf16
--num-layers-at-start-in-bf16 1 --num-layers-at-end-in-bf16 1
"""
LOGGING = """
--log-interval 1 --log-throughput --log-params-norm --log-num-zeros-in-grad --log-timers-to-tensorboard
--log-validation-ppl-to-tensorboard --log-memory-to-tensorboard --log-world-size-to-tensorboard
--tensorboard-dir /tmp/tb --tensorboard-log-interval 1 --tensorboard-queue-size 5 --timing-log-level 0
--timing-log-option minmax --wandb-project megacache-tests --wandb-exp-name llama-8b --wandb-save-dir /tmp/wandb
--logging-level 20 --log-straggler --straggler-minmax-count 1 --no-barrier-with-level-1-timing
"""
CHECKPOINTING = """
--save /tmp/checkpoints --load /tmp/checkpoints --save-interval 1000 --ckpt-format torch_dist
--async-save --ckpt-fully-parallel-load --no-save-optim --no-save-rng --dist-ckpt-strictness log_all
--exit-interval 100000 --exit-duration-in-mins 230 --exit-signal-handler
"""
RUN = """
--num-workers 2 --dataloader-type single --no-create-attention-mask-in-dataloader --reset-position-ids
--eod-mask-loss --num-dataset-builder-threads 1 --no-mmap-bin-files
"""
GROUPS = (MODEL, OPTIMIZER, PARALLEL, PRECISION, LOGGING, CHECKPOINTING, RUN)


def groups(text: str) -> list[list[str]]:
    """Words in groups of one flag and its values."""
    out: list[list[str]] = []
    for word in shlex.split(text):
        if word.startswith("--"):
            out.append([word])
        else:
            out[-1].append(word)
    return out


def other_flags(version: str) -> list[list[str]]:
    """The example flags ``version``'s training knows, grouped with their values."""
    known = flags_of(version)
    return [g for text in GROUPS for g in groups(text) if g[0] in known]


def training_command(version: str, data_flags: list[str]) -> list[str]:
    """``data_flags`` amid a whole training command of ``version``, as a user pastes it."""
    others = other_flags(version)
    half = len(others) // 2
    return [w for g in others[:half] for w in g] + data_flags + [w for g in others[half:] for w in g]


def training_yaml(version: str, data_flags: list[str]) -> dict:
    """``training_command(version, data_flags)`` as a --yaml-cfg file holds it: each flag under the
    attribute it sets (a switch true, or false where it turns its setting off), numbers as numbers,
    the parallel sizes in the model_parallel section; a model setting in language_model."""
    attribute = {}
    for dest, flag in destinations(version).items():
        attribute[flag] = dest
    for dest in destinations(version):  # a flag's other spellings, e.g. --no-x setting x
        for name in flags_of(version):
            if name.replace("--no-", "--") == f"--{dest.replace('_', '-')}" and name not in attribute:
                attribute[name] = dest
    config: dict = {section: {} for section in YAML_SECTIONS}
    for flag, *values in groups(" ".join(training_command(version, data_flags))):
        dest = attribute[flag]
        if not values:
            value = not flag.startswith(("--no-", "--disable-"))
        elif flags_of(version)[flag] == 1:
            value = _scalar(values[0])
        else:
            value = [_scalar(v) for v in values]
        section = {"tensor_model_parallel_size": "model_parallel", "pipeline_model_parallel_size": "model_parallel",
                   "context_parallel_size": "model_parallel", "num_layers": "language_model",
                   "hidden_size": "language_model", "num_attention_heads": "language_model"}.get(dest)
        (config[section] if section else config)[dest] = value
    return config


def _scalar(word: str):
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            pass
    return word
