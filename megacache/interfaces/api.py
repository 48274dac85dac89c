"""megacache from Python: build the caches of a configuration, and open them.

    from megacache import BuildConfig, build, open_cache
    from megacache.megatron.blends import parse_blend

    cfg = BuildConfig(blend=parse_blend(["0.7", "/data/web_text_document", "0.3", "/data/code_text_document"]),
                      seq_length=4096, sizes=(1_000_000, 10_000, 1_000), tokenizer=identifiers,
                      cache_dir="/data/cache")
    build(cfg)                    # every rank of the job (MPI, torch.distributed or one process)
    splits = open_cache(cfg)      # {"train": ..., "valid": ..., "test": ...}
    tokens = splits["train"][0]   # int64[seq_length + 1], as megatron-core's dataset reads it

Or from the flags the training run is given, the megatron-core version resolved once (or asked of the
training's own interpreter) and the sizes and tokenizer identity derived from it::

    cfg = BuildConfig.from_megatron_flags(dict(
        data_path=["/data/web_text_document"], data_cache_path="/data/cache", seq_length=4096,
        train_iters=100_000, global_batch_size=512, eval_iters=10, eval_interval=1000,
        tokenizer_type="HuggingFaceTokenizer", tokenizer_model="/models/tok"),
        megatron_python="/venvs/train/bin/python")     # optional: that Megatron's own build_tokenizer

``open_cache`` needs no other rank: each process plans on its own (reading the sequence lengths)
and memory-maps the files. A dataset in a bucket (``s3://``, ``msc://``) needs ``object_cache``, as
for ``build``: its ``.idx`` is copied there, and each sample reads its ``.bin`` by ranged requests for
the tokens the sample takes (docs/object-storage.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..builders.build import BuildConfig, BuildResult, build, plan
from ..megatron.tokenizer import tokenizer_identifiers
from ..megatron.training import split_sizes
from ..runtime.comm import SingleComm, TorchComm
from ..errors import CacheDamaged, CacheNotBuilt
from ..readers.samples import NO_PAD, BlendedSamples, GPTSamples

__all__ = ["BuildConfig", "BuildResult", "build", "split_sizes", "tokenizer_identifiers", "open_cache", "prepare_cache",
           "PreparedCache", "GPTSamples", "BlendedSamples", "pack_sft"]


def open_cache(cfg: BuildConfig, pad_id: int = NO_PAD) -> dict[str, GPTSamples | BlendedSamples]:
    """The built splits of ``cfg`` by name (one prefix: ``GPTSamples``; blends: ``BlendedSamples``).
    Raises if any entry is missing (``CacheNotBuilt``) or damaged (``CacheDamaged``), naming it and
    how to build it."""
    planned = plan(replace(cfg, rebuild_damaged=False), SingleComm())  # a damaged entry is refused
    missing = [e.entry for e in [*planned.gpt, *planned.blends] if not e.reused]
    if missing:
        raise CacheNotBuilt(
            f"{len(missing)} cache entr{'y is' if len(missing) == 1 else 'ies are'} not built, e.g. "
            f"{missing[0].path('description.txt')}: run `megacache build` (or megacache.interfaces.api.build) with this "
            f"configuration first")
    gpt = {j.index: GPTSamples(planned.datasets[j.data_path], j.entry, cfg.add_extra_token, pad_id)
           for j in planned.gpt}
    if planned.blends:
        opened = {b.name: BlendedSamples([gpt[c.index] for c in b.children], b.entry) for b in planned.blends}
        blended = {b.name for b in planned.blends}
        # per-split data: a split of one prefix is a plain GPTDataset beside the blended ones
        opened.update({j.name: gpt[j.index] for j in planned.gpt if j.name not in blended})
    else:
        opened = {j.name: gpt[j.index] for j in planned.gpt}
    return {name: opened[name] for name in ("train", "valid", "test") if name in opened}


@dataclass(repr=False)
class PreparedCache:
    splits: dict                        # as open_cache returns them
    built: BuildResult | None           # None: the cache was there and was only opened

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name} {len(samples):,} samples" for name, samples in self.splits.items())
        return f"PreparedCache({sizes}; {'already there: opened' if self.built is None else self.built.headline()})"


def prepare_cache(cfg: BuildConfig, timeout_s: float = 3600.0, pad_id: int = NO_PAD) -> PreparedCache:
    """For rank init under torchrun, after ``torch.distributed.init_process_group`` (any backend).

    Every rank tries to open the cache on its own; one small allgather, over a gloo group of its
    own whose timeout (``timeout_s``) is separate from the training collectives', tells whether all
    did. If any could not (another job may be finishing it at this moment, so ranks can see
    different states), every rank builds together (waiting for that job's lock, then reusing what it
    built), then opens. A damaged entry is refused on every rank (``CacheDamaged``), never rebuilt
    under a running training. Every rank must call this with the same configuration."""
    splits, damaged = None, ""
    try:
        splits = open_cache(cfg, pad_id)
    except CacheNotBuilt:
        pass
    except CacheDamaged as exc:  # said on every rank, not left to the others to wait for
        damaged = str(exc)
    comm = TorchComm(timeout_s=timeout_s)
    opened = comm.allgather(damaged or splits is not None)
    refusal = next((o for o in opened if isinstance(o, str)), None)
    if refusal:
        raise CacheDamaged(refusal)
    if all(opened):
        return PreparedCache(splits, None)
    result = build(cfg, comm)
    return PreparedCache(open_cache(cfg, pad_id), result)


def pack_sft(config: str, comm=None) -> list:
    """Megatron-Bridge's packed SFT files of a finetuning ConfigContainer YAML, as ``megacache pack
    --bridge-config`` writes them, on the ranks of ``comm`` (default: the job's, ``get_comm()``).
    Returns each split's outcome (``PackedOutcome``: written, or present and left as it is)."""
    from ..builders.sft_packing import pack_bridge, read_config
    from ..runtime.comm import get_comm

    comm = comm or get_comm()
    return pack_bridge(read_config(config, comm), comm)
