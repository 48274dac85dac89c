"""The conformance sweeps' shared pieces: random configurations (one prefix, blends), megatron-core
building them (the oracle), megacache building the same and comparing whole cache directories, and
running each configuration in a fresh shared directory; the build command line of the system tests."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest

from megacache.builders.build import BuildConfig, build
from megacache.megatron.blends import parse_blend
from megacache.errors import MegacacheError
from megacache.megatron.tokenizer import tokenizer_identifiers
from megacache.megatron.training import split_sizes
from support.inputs.corpus import free_port
from support.inputs.indexed import random_lengths, write_lengths
from support.oracles.megatron_core import megatron_datasets


# What megatron-core's tokenizer for --tokenizer-type NullTokenizer --vocab-size 1000 identifies as
# (the oracle uses that tokenizer; megacache derives its identifiers from the flags alone).
NULL_TOKENIZER = tokenizer_identifiers("NullTokenizer", vocab_size=1000)


SPLITS = ["969, 30, 1", "969,30,1", "90,5,5", "99,1,0", "1,1,1", "100,0,0", "0,1,0", "1,1", "50,50",
          "98,2", "7,2,1"]


@dataclass(frozen=True)
class DatasetShape:
    """How a sweep dataset is stored (``write_lengths``' keywords): its token width, and the sequence
    indices its documents start at (0 to the count; None: one sequence per document)."""

    dtype: str = "uint16"
    documents: list[int] | None = None


@dataclass(frozen=True, eq=False)
class PrefixSweepConfig:
    """A configuration of the one-prefix sweeps: the dataset (its sequence lengths, how it is
    stored) and what the build is asked, each field named as BuildConfig names it."""

    lengths: np.ndarray
    split: str
    sizes: tuple[int | None, int | None, int | None]  # requested samples (train, valid, test); None: one epoch
    seq_length: int
    add_extra_token: bool
    seed: int
    drop_last_partial_validation: bool
    shape: DatasetShape = field(default_factory=DatasetShape)


def random_config(rng: np.random.Generator) -> PrefixSweepConfig:
    count = int(rng.integers(1, 3000))
    lengths = random_lengths(rng, count)
    if lengths.sum() == 0:
        lengths[0] = 5
    seq_length = int(rng.choice([1, 2, 7, 16, 64, 300, 1000]))
    add_extra_token = bool(rng.integers(0, 2))
    tokens = int(lengths.sum())
    sizes = []
    for _ in range(3):
        kind = rng.integers(0, 4)
        # None (one epoch), 0, about one epoch, many epochs
        sizes.append(None if kind == 0 else 0 if kind == 1 else
                     int(rng.integers(1, max(2, tokens // seq_length))) if kind == 2 else
                     int(rng.integers(1, 30) * max(1, tokens // seq_length)))
    # the keywords' order is the order of the draws
    return PrefixSweepConfig(lengths=lengths, split=str(rng.choice(SPLITS)), sizes=tuple(sizes), seq_length=seq_length,
                             add_extra_token=add_extra_token,
                             seed=int(rng.choice([0, 1234, 2**32 - 1, int(rng.integers(0, 2**32))])),
                             drop_last_partial_validation=bool(rng.integers(0, 2)),
                             shape=dataset_shape(np.random.default_rng([count, tokens]), count))


def dataset_shape(rng: np.random.Generator, count: int, dtype: str | None = None) -> DatasetShape:
    """How a sweep dataset of ``count`` sequences is stored: its token width, ``dtype`` or else
    uint16 or int32 (every current LLM vocabulary, 128K to 200K tokens, gives int32), and for about a
    third, documents of several sequences. Drawn from a generator of its own, so that the
    configurations' other draws are what the sweeps' thresholds were set on."""
    dtype = dtype or str(rng.choice(["uint16", "int32"]))
    if count > 1 and rng.random() < 0.3:
        return DatasetShape(dtype, [0, *(np.flatnonzero(rng.random(count - 1) < 0.5) + 1).tolist(), count])
    return DatasetShape(dtype)


def write_sweep_dataset(prefix: str, lengths: np.ndarray, shape: DatasetShape) -> None:
    """A sweep dataset of these sequence lengths, stored as ``shape`` says."""
    write_lengths(prefix, lengths, shape.dtype, shape.documents)


def prefix_build_config(c: PrefixSweepConfig, prefix: str, cache: str) -> BuildConfig:
    """megacache's configuration for ``random_config``'s ``c`` over ``prefix``."""
    return BuildConfig.for_prefix(prefix, seq_length=c.seq_length, sizes=c.sizes, tokenizer=NULL_TOKENIZER,
                                  split=c.split, seed=c.seed, cache_dir=cache, add_extra_token=c.add_extra_token,
                                  drop_last_partial_validation=c.drop_last_partial_validation)


def cache_files(directory: str) -> dict[str, bytes]:
    """Megatron's files in a cache directory (megacache's own state directory left out)."""
    if not os.path.isdir(directory):
        return {}
    return {e.name: open(e.path, "rb").read() for e in sorted(os.scandir(directory), key=lambda e: e.name)
            if e.is_file()}


def snapshot(directory: str) -> dict:
    """Everything a rebuild would change: the directory's listing and mtime, and every file's inode,
    mtime and bytes."""
    files = {}
    for entry in os.scandir(directory):
        if entry.is_dir():  # megacache's state (its manifest): checked one level down
            files[entry.name] = snapshot(entry.path)
            continue
        st = entry.stat()
        with open(entry.path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        files[entry.name] = (st.st_ino, st.st_mtime_ns, st.st_size, digest)
    return {"mtime_ns": os.stat(directory).st_mtime_ns, "files": files}


#: megatron-core's refusals in the sweeps (``support.oracles.megatron_worker.refusal``: the exception, the source
#: line that raised it, its message), each with the reason megacache gives for the same condition (a
#: template of the first's groups, or a function of its match)
REFUSALS = [
    (r"AssertionError in helpers\.py build_sample_idx: assert sample_idx\.min\(\) >= 0",
     r"the last document of the shuffled document index is empty"),
    (r"ValueError in helpers\.py build_sample_idx: assert sample_idx\.min\(\) >= 0.* \| zero-size array",
     r"the split has 0 tokens: no sample of seq_length"),
    # megatron-core's "number" counts only the datasets the blend draws any sample from (it enumerates
    # numpy.unique of the dataset index); megacache names the dataset's place in the blend
    (r"IndexError in blended_dataset\.py _build_indices: .* \| The (\w+) blend oversamples .* requests (\d+) "
     r"samples from GPTDataset number \d+ in excess of its size (\d+)",
     lambda m: rf"the {m[1]} blend takes {int(m[2]):,} samples from .* \(dataset \d+\), which has only {int(m[3]):,}"),
    (r"LoopsForever .* \| the (\w+) split has no tokens and",
     r"the \1 split is (empty|made of empty sequences) .* megatron-core would loop forever"),
    (r"AssertionError in blended_megatron_dataset_builder\.py __init__: assert weights_are_none.* for (\w+) split",
     r"the \1 split has weights but no sample count"),
    (r"AssertionError in blended_dataset\.py __init__: assert all\(map\(lambda _: _ > 0, weights\)\)",
     r"split has no samples, so it gets weight 0 in this unweighted blend, which megatron-core rejects"),
]

#: the most configurations of a sweep megatron-core may refuse, so that a change to the generators
#: that makes the sweeps compare much less fails; every sweep's seeds stay below it
#: (docs/benchmarks.md)
REFUSED_AT_MOST = 0.1


def megacache_reason(refusal: str) -> str:
    """The pattern of megacache's error for megatron-core's ``refusal``."""
    for theirs, ours in REFUSALS:
        found = re.search(theirs, refusal, re.DOTALL)
        if found:
            return "(?s)" + (ours(found) if callable(ours) else found.expand(ours))
    pytest.fail(f"megatron-core refused for a reason REFUSALS does not know: {refusal}. Find the condition, "
                "check that megacache refuses it, and add the pair.")


def build_and_compare(cfg, comm, theirs: str, refusal: str | None):
    """megacache refuses what megatron-core refused, for the same reason (None); else its cache
    directory equals megatron-core's, file for file, byte for byte (the result)."""
    if refusal:
        with pytest.raises(MegacacheError, match=megacache_reason(refusal)):
            build(cfg, comm)
        return None
    result = build(cfg, comm)
    if comm.rank == 0:
        ours, reference = cache_files(cfg.cache_dir), cache_files(theirs)
        assert reference, f"megatron-core wrote no cache in {theirs}: nothing to compare"
        assert sorted(ours) == sorted(reference), set(ours) ^ set(reference)
        for name in reference:
            assert ours[name] == reference[name], name
    comm.barrier()
    return result


def count_compared(stats: dict, dtype: str) -> None:
    """Count a comparison in ``stats`` by its datasets' token width, ``dtype`` ("uint16 compared",
    "int32 compared")."""
    key = f"{dtype} compared"
    stats[key] = stats.get(key, 0) + 1


def labelled(outcomes: dict) -> int:
    """How many configurations a sweep's ``outcomes`` hold: their labels' counts, without the
    comparisons by token width."""
    return sum(v for k, v in outcomes.items() if not k.endswith(" compared"))


#: splits whose every non-empty range holds >= 5 % of the sequences
BLEND_SPLITS = ["90,5,5", "1,1,1", "7,2,1", "95,5", "100,0,0", "80,20", "60,30,10"]


@contextmanager
def torch_group():
    """A one-process gloo group for the oracle: megatron-core 0.16.1 saves a blend's cache only under
    a process group (its BlendedDataset asks for the rank), as under a one-GPU torchrun. Destroyed
    afterwards so that no later test mistakes this process for a torch.distributed job."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0)
    try:
        yield
    finally:
        dist.destroy_process_group()


def random_weights(rng: np.random.Generator, n: int) -> list[float]:
    kind = int(rng.integers(0, 5))
    if kind == 0:
        return rng.random(n).clip(1e-3).tolist()
    if kind == 1:
        return [1.0] * n
    if kind == 2:
        return [round(float(v), 1) for v in rng.integers(1, 10, n) / 10]  # decimals like 0.3
    if kind == 3:
        return [float(v) for v in rng.integers(1, 6, n)]  # integer ratios 3:1:2
    return rng.lognormal(0, 2, n).clip(1e-4).tolist()


@dataclass(frozen=True, eq=False)
class BlendSweepConfig:
    """A configuration of the blend sweeps: the datasets (each one's sequence lengths, how it is
    stored), their weights (None: unweighted), and what the build is asked, each field named as
    BuildConfig names it; ``per_split``: the datasets given per split (``per_split_blends``), not
    split by ``split``."""

    datasets: list[np.ndarray]
    weights: list[float] | None
    split: str
    sizes: tuple[int | None, int | None, int | None]  # requested samples (train, valid, test); None: exhaustive
    seq_length: int
    add_extra_token: bool
    seed: int
    drop_last_partial_validation: bool
    per_split: bool
    shapes: list[DatasetShape]


def random_blend_config(rng: np.random.Generator, huge: bool = False) -> BlendSweepConfig:
    n = 2000 if huge else int(rng.choice([2, 2, 3, 4, 5, 8, 12, 24]))
    datasets = []
    for _ in range(n):
        count = int(rng.integers(20, 60)) if n > 100 else int(rng.integers(20, 400))
        lengths = rng.integers(1, int(rng.choice([8, 64, 400])), count).astype(np.int32)
        datasets.append(lengths)
    seq_length = int(rng.choice([1, 4, 16, 50, 128]))
    scale = 10 ** float(rng.uniform(1, 7 if n <= 5 else 5 if n <= 40 else 3))
    sizes = [int(scale), int(scale * rng.uniform(0, 0.1)), int(scale * rng.uniform(0, 0.02))]
    weighted = rng.random() < 0.7
    per_split = rng.random() < 0.2
    if not weighted and rng.random() < 0.3:
        sizes[int(rng.integers(0, 3))] = None  # exhaustive blending for that split
    # in the order of the draws
    weights = random_weights(rng, n) if weighted else None
    split = "100,0,0" if huge else str(rng.choice(BLEND_SPLITS))
    add_extra_token = bool(rng.integers(0, 2))
    seed = int(rng.integers(0, 2**32))
    drop_last_partial_validation = bool(rng.integers(0, 2))
    shapes = np.random.default_rng([seed, n])
    for lengths in datasets:
        # empty documents in about a third of the larger datasets; never two in a row, so that every
        # split range (>= 5 % of the sequences, BLEND_SPLITS) keeps tokens: megatron-core loops
        # forever on a split of empty sequences it is asked samples of
        if len(lengths) >= 200 and shapes.random() < 0.3:
            odd = np.arange(1, len(lengths), 2)
            lengths[odd[shapes.random(len(odd)) < 0.2]] = 0
    # one token width for the blend, as one tokenizer gives (megacache refuses mixed widths)
    dtype = str(shapes.choice(["uint16", "int32"]))
    return BlendSweepConfig(datasets=datasets, weights=weights, split=split, sizes=tuple(sizes), seq_length=seq_length,
                            add_extra_token=add_extra_token, seed=seed,
                            drop_last_partial_validation=drop_last_partial_validation, per_split=per_split,
                            shapes=[dataset_shape(shapes, len(lengths), dtype) for lengths in datasets])


def words(prefixes: list[str], weights) -> list[str]:
    if weights is None:
        return list(prefixes)
    return [w for pair in zip(map(repr, weights), prefixes) for w in pair]


def per_split_blends(c: BlendSweepConfig, prefixes: list[str]) -> list:
    """Per-split data: train takes every prefix, valid the first half, test one prefix (or none)."""
    half = max(2, len(prefixes) // 2)
    w = c.weights
    return [(prefixes, w), (prefixes[:half], None if w is None else w[:half]),
            None if c.sizes[2] is None else (prefixes[-1:], None if w is None else w[-1:])]


def blend_build_config(c: BlendSweepConfig, prefixes: list[str], cache: str, **tuning) -> BuildConfig:
    """megacache's configuration for ``random_blend_config``'s ``c`` over ``prefixes``."""
    if c.per_split:
        blends = [None if b is None else parse_blend(words(*b)) for b in per_split_blends(c, prefixes)]
        data = dict(blend_per_split=blends, split=None)
    else:
        data = dict(blend=parse_blend(words(prefixes, c.weights)), split=c.split)
    return BuildConfig(seq_length=c.seq_length, sizes=c.sizes, tokenizer=NULL_TOKENIZER, seed=c.seed,
                       cache_dir=cache, add_extra_token=c.add_extra_token,
                       drop_last_partial_validation=c.drop_last_partial_validation, **data, **tuning)


def megatron_data(c: PrefixSweepConfig | BlendSweepConfig, prefixes: list[str]) -> dict:
    """The data of ``c`` over ``prefixes`` as megatron-core's GPTDatasetConfig takes it: ``blend``
    and ``split``, or ``blend_per_split``."""
    if isinstance(c, BlendSweepConfig) and c.per_split:
        return dict(blend_per_split=per_split_blends(c, prefixes))
    return dict(blend=(prefixes, c.weights if isinstance(c, BlendSweepConfig) else None), split=c.split)


def megatron_build(mcore, prefixes, c: PrefixSweepConfig | BlendSweepConfig, cache: str) -> None | str:
    """megatron-core builds and saves every cache of ``random_config``'s or ``random_blend_config``'s
    ``c`` (a blend's in a torch_group); None, or how it refused (``refusal``)."""
    try:
        megatron_datasets(mcore, list(c.sizes), c.seed, c.seq_length, c.add_extra_token,
                          c.drop_last_partial_validation, cache, True, **megatron_data(c, prefixes))
    except Exception as exc:  # megacache must refuse these too, for the same reason
        from support.oracles.megatron_worker import refusal

        return refusal(exc)
    return None


TOKENIZER_FLAGS = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]


def build_args(cache: str, data: list[str], seq_length: int, samples: int) -> list[str]:
    return ["build", "--data-path", *data, "--seq-length", str(seq_length), "--train-samples", str(samples),
            "--global-batch-size", "8", "--eval-iters", "10", "--eval-interval", "1000", "--data-cache-path", cache,
            *TOKENIZER_FLAGS]


def build_sizes(samples: int) -> tuple:
    """The sizes ``build_args`` asks for."""
    return split_sizes(train_samples=samples, global_batch_size=8, eval_iters=10, eval_interval=1000)


def sweep_configurations(comm, configurations, run) -> dict[str, int]:
    """``run(workdir, c)`` for each configuration in a fresh shared directory; counts of the labels
    it returns."""
    outcomes: dict[str, int] = {}
    for c in configurations:
        # Rank 0 alone deletes, creates and (in ``run``) runs the oracle: MPICH's blocking calls poll
        # at full speed, so the other ranks wait quietly rather than take its core.
        comm.wait_quietly()
        workdir = comm.bcast(tempfile.mkdtemp(prefix="megacache-sweep-") if comm.rank == 0 else None)
        try:
            label = run(workdir, c)
        finally:
            comm.wait_quietly()
            if comm.rank == 0:
                shutil.rmtree(workdir)
        outcomes[label] = outcomes.get(label, 0) + 1
    return outcomes
