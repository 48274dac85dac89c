"""The four workloads and the suites that size them.

Each workload writes its input data into a work directory and returns a ``Case``: the megacache
command (run under ``mpiexec -n P``) and the reference command (megatron-core, one process), both
writing into a given output directory whose files must then be equal byte for byte. Sizes are the
issue's at factor 1 and scale linearly with it (with floors that keep tiny runs valid):

* ``tokenize``: 100 MB of generated prose with a Zipfian 200k-word vocabulary
  (``sample_corpus.natural_documents``), a 32k byte-level BPE trained on it, ``--append-eod``;
  reference: the tokenizer's ``encode_batch_fast`` on all cores, written through megatron-core's
  ``IndexedDatasetBuilder``; beside it, gigatoken's raw ``encode_batch`` on the same texts and threads.
* ``build_gpt``: one dataset of 2e7 documents (lognormal lengths, mean 1000 tokens, a sparse ``.bin``:
  the indices depend on lengths only), L = 4096, split "969, 30, 1", 2.5 train epochs.
* ``build_blend``: 1000 such datasets, 5e10 tokens in all (lognormal shares), a weighted blend
  with 1.2e7 / 1.2e5 / 1.2e4 samples, L = 4096, split "969,30,1".
* ``blend_kernel``: the greedy blend alone, 1e8 samples over 1000 uniformly random weights.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from megacache.runtime.environment import usable_cores

SEED = 1234
SEQ_LENGTH = 4096
VOCAB_SIZE = 32000
MEAN_LENGTH = 1000.0  # tokens per document
SIGMA = 1.0  # lognormal shape of the document lengths


@dataclass(frozen=True)
class Suite:
    factor: float
    ranks: tuple[int, ...]
    repeats: int
    blend_datasets: int = 1000
    tokenizer_documents: int = 20000  # the BPE's training text
    #: sizes measured one after another (default: ``factor`` alone)
    factors: tuple[float, ...] | None = None
    #: the workloads it runs by default (None: all)
    workloads: tuple[str, ...] | None = None
    #: a start-of-training suite (``start.py``): training's start on 2 gloo ranks, not the workloads
    start: bool = False
    #: tokens per document of ``build_blend``'s datasets (None: MEAN_LENGTH)
    mean_length: float | None = None
    #: the seed's case (``seed.py``): ``build_blend`` once at P ranks with the checks at that scale
    seed_case: bool = False


SUITES = {
    "full": Suite(factor=1.0, ranks=(1, 2, 4, 8), repeats=3),
    # Start-up dominates at this size; one repeat keeps it near 2 minutes on 2 busy cores.
    "quick": Suite(factor=0.01, ranks=(1, 2, 4, 8), repeats=1),
    # Exercises every code path in well under a minute (fewer datasets, a small tokenizer).
    "smoke": Suite(factor=2e-4, ranks=(1, 2), repeats=1, blend_datasets=20, tokenizer_documents=1000),
    # The 1000-dataset build at 1, 3 and 10 times the size (5e11 tokens, 5e8 documents at
    # 10): how time and memory grow with the corpus. Minutes a repeat on 2 cores; megatron-core
    # needs about 11 GB at factor 10.
    "scale": Suite(factor=10.0, ranks=(2,), repeats=1, factors=(1.0, 3.0, 10.0), workloads=("build_blend",)),
    # Training's start on 2 gloo ranks (megatron-core 0.19.2 without and with megacache's cache, and
    # megacache's own API) for the 1000-dataset blend at 1 and 10 times its size (start.py); the
    # ranks are P = 2 whatever --ranks says. Factor 10 needs about 11 GB for megatron-core's build.
    "start": Suite(factor=1.0, ranks=(2,), repeats=3, factors=(1.0, 10.0), start=True),
    # The same at the smoke suite's size (20 datasets), one repeat: the test's size.
    "start-smoke": Suite(factor=2e-4, ranks=(2,), repeats=1, blend_datasets=20, tokenizer_documents=1000, start=True),
    # The seed's case (issue 41; seed.py): build_blend at 100 times its size with documents of 10,000
    # tokens (5e12 tokens, 5e8 documents, 1.2e9 train samples), once at P = 2, with the disk's floor,
    # megacache verify, megatron-core's entries of sampled member datasets, the blend's counts and the
    # 2e9-sample blend alone. About 48 GB of disk at its peak (10 GB of inputs, 37 GB of cache); --factor 1
    # is 1/100 of it.
    "seed": Suite(factor=100.0, ranks=(2,), repeats=1, mean_length=10000.0, workloads=("build_blend",),
                  seed_case=True),
    # The same at a test's size: 20 datasets.
    "seed-smoke": Suite(factor=2e-4, ranks=(2,), repeats=1, blend_datasets=20, mean_length=10000.0,
                        workloads=("build_blend",), seed_case=True),
}


@dataclass
class Case:
    """What one workload runs. ``megacache(out)`` / ``reference(out)``: ``python -m`` arguments
    that write the outputs into the directory ``out``."""

    params: dict
    megacache: Callable[[str], list[str]]
    reference: Callable[[str], list[str]]
    reference_name: str
    #: builds: the data flags (``--data-path``/``--data-args-path`` and ``--split``), the other flags
    #: both sides are given (seed, sequence length, sample counts, surplus, tokenizer), and the
    #: reference's spec (prefixes, weights, sizes, ...)
    data_flags: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    spec: dict = field(default_factory=dict)


def _write_spec(work: str, spec: dict) -> str:
    path = os.path.join(work, "reference-spec.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


# ------------------------------------------------------------------------------------------------
# tokenize


def make_corpus(directory: str, megabytes: float) -> tuple[int, int]:
    """jsonl shards of 4000 generated documents each (zero-padded names, so name order is
    megacache's natural order), stopping once ``megabytes`` are written; (bytes, documents)."""
    from megacache.text.sample_corpus import natural_documents, natural_lexicon

    lexicon = natural_lexicon(200_000)

    os.makedirs(directory, exist_ok=True)
    written = documents = shard = 0
    while written < megabytes * 1e6:
        lines = [json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in natural_documents(4000, shard, lexicon)]
        sizes = np.cumsum([len(line.encode()) for line in lines])
        keep = min(len(lines), int(np.searchsorted(sizes, megabytes * 1e6 - written)) + 1)
        with open(os.path.join(directory, f"shard_{shard:05d}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(lines[:keep])
        written += int(sizes[keep - 1])
        documents += keep
        shard += 1
    return written, documents


def tokenize(work: str, suite: Suite, factor: float) -> Case:
    from megacache.text.sample_corpus import train_sample_tokenizer

    corpus = os.path.join(work, "corpus")
    nbytes, documents = make_corpus(corpus, 100 * factor)
    tokenizer = train_sample_tokenizer(os.path.join(work, "tokenizer.json"), VOCAB_SIZE,
                                       documents=suite.tokenizer_documents, seed=12345, natural=True)
    # Units small enough that 8 ranks all get several (at factor 1 about one per shard).
    unit_bytes = max(1 << 16, nbytes // 32)
    threads = usable_cores()
    spec = _write_spec(work, {"corpus": corpus, "tokenizer": tokenizer, "threads": threads})
    return Case(
        params={"corpus_bytes": nbytes, "documents": documents, "vocab_size": VOCAB_SIZE,
                "tokenizer_documents": suite.tokenizer_documents, "unit_bytes": unit_bytes},
        megacache=lambda out: ["megacache", "tokenize", "--input", corpus, "--output-prefix",
                               os.path.join(out, "corpus"), "--tokenizer", tokenizer, "--append-eod",
                               "--unit-bytes", str(unit_bytes), "--log-interval", "0"],
        reference=lambda out: ["benchmarks.reference", "tokenize", spec, out],
        reference_name=f"tokenizers encode_batch_fast ({threads} threads) + megatron-core IndexedDatasetBuilder",
    )


# ------------------------------------------------------------------------------------------------
# build_gpt and build_blend


def write_dataset(prefix: str, documents: int, seed: int, mean_length: float | None = None) -> np.ndarray:
    """One sequence per document, lognormal lengths (mean ``mean_length``, default MEAN_LENGTH, >= 1),
    a sparse ``.bin``; returns the lengths."""
    from megacache.formats.indexed import IndexLayout, IndexWriter

    rng = np.random.default_rng(seed)
    mu = math.log(mean_length or MEAN_LENGTH) - SIGMA**2 / 2  # the lognormal's mean is exp(mu + sigma^2 / 2)
    lengths = np.maximum(1, np.rint(rng.lognormal(mu, SIGMA, documents))).astype(np.int32)
    layout = IndexLayout(np.dtype(np.uint16), documents, documents + 1)
    IndexWriter.create(prefix + ".idx", prefix + ".bin", layout, 2 * int(lengths.sum(dtype=np.int64)))
    with IndexWriter.open(prefix + ".idx", prefix + ".bin", layout) as w:
        w.write_sequences(0, lengths, 0)
        w.write_documents(0, np.arange(documents + 1, dtype=np.int64))
    return lengths


def blend_shares(datasets: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(each dataset's share of the tokens, its blend weight): lognormal shares, and weights that
    follow them loosely, so some datasets repeat for several epochs, others for less than one."""
    rng = np.random.default_rng(seed)
    share = rng.lognormal(0, 0.5, datasets)
    share /= share.sum()
    weights = np.array([float(f"{w:.6g}") for w in share * rng.lognormal(0, 0.5, datasets)])
    return share, weights


def blend_surplus(work: str, prefixes: list[str], weights: np.ndarray, split: str, sizes: list[int]) -> float:
    """The smallest of a few mid-level surpluses (megatron-core's default 0.005 first) with which
    no split's blend takes more samples from a dataset than it has, from megacache's plan of the
    build: small blends of many datasets need more (megatron-core raises IndexError and says to
    raise it). Both sides are given the same."""
    from megacache.algorithms.blend_kernels import blend_chunk
    from megacache.algorithms.blend_sizes import find_oversampling
    from megacache.megatron.blends import parse_blend
    from megacache.builders.build import BuildConfig, plan
    from megacache.runtime.comm import SingleComm
    from megacache.megatron.tokenizer import tokenizer_identifiers

    blend = parse_blend([word for w, p in zip(weights.tolist(), prefixes) for word in (repr(w), p)])
    tokenizer = tokenizer_identifiers("NullTokenizer", vocab_size=VOCAB_SIZE)
    counts = None
    for surplus in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0):
        cfg = BuildConfig(seq_length=SEQ_LENGTH, sizes=tuple(sizes), tokenizer=tokenizer, blend=blend, split=split,
                          seed=SEED, cache_dir=os.path.join(work, "unused-cache"), surplus=surplus)
        blends = plan(cfg, SingleComm()).blends
        # What each blend takes from each dataset depends on its weights and size only.
        counts = counts or [_blend_counts(blend_chunk, b.weights, b.size) for b in blends]
        if not any(find_oversampling(c, b.lengths) for c, b in zip(counts, blends)):
            return surplus
    raise ValueError(f"no mid-level surplus up to 5 keeps blends of {sizes} samples within their datasets")


def _blend_counts(blend_chunk, weights: np.ndarray, size: int, block: int = 1 << 22) -> np.ndarray:
    """Samples the blend of ``size`` takes from each dataset, blended a block at a time (the seed
    suite's 1.2e9-sample blend would be 12 GB at once)."""
    counts = np.zeros(len(weights), dtype=np.int64)
    idx, sidx = np.empty(min(block, size), np.int16), np.empty(min(block, size), np.int64)
    for start in range(0, size, block):
        n = min(block, size - start)
        counts = blend_chunk(weights, start, counts, idx[:n], sidx[:n])
    return counts


def _build_case(work: str, prefixes: list[str], weights, data_args: list[str], split: str,
                sizes: list[int], samples_flags: list[str], params: dict, surplus: float = 0.005) -> Case:
    fields = {"prefixes": prefixes, "weights": weights, "split": split, "seed": SEED, "seq_length": SEQ_LENGTH,
              "sizes": sizes, "vocab_size": VOCAB_SIZE, "surplus": surplus}
    spec = _write_spec(work, fields)
    flags = ["--seed", str(SEED), "--seq-length", str(SEQ_LENGTH), *samples_flags, "--mid-level-dataset-surplus",
             repr(surplus), "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB_SIZE)]
    common = [*data_args, "--split", split, *flags]
    return Case(
        params={**params, "seq_length": SEQ_LENGTH, "split": split, "seed": SEED, "sizes": sizes,
                "mean_length": params.get("mean_length", MEAN_LENGTH), "sigma": SIGMA,
                "mid_level_dataset_surplus": surplus},
        # the reference is megatron-core 0.16.1's builder alone, which writes no sequences file
        megacache=lambda out: ["megacache", "build", *common, "--megatron-version", "0.16", "--data-cache-path", out,
                               "--per-dataset-sequences-path", ""],
        reference=lambda out: ["benchmarks.reference", "build", spec, out],
        reference_name="megatron-core BlendedMegatronDatasetBuilder.build()",
        data_flags=[*data_args, "--split", split], flags=flags, spec=fields,
    )


def build_gpt(work: str, suite: Suite, factor: float) -> Case:
    from megacache.algorithms.splits import split_matrix, split_ranges
    from megacache.megatron.training import split_sizes

    # eval_iters scales too, so valid and test keep their share of the samples at small factors.
    split, epochs, gbs, eval_iters, eval_interval = "969, 30, 1", 2.5, 512, max(1, round(100 * factor)), 1000
    documents = max(1000, int(2e7 * factor))
    prefix = os.path.join(work, "synthetic_text_document")
    lengths = write_dataset(prefix, documents, SEED)
    a, b = split_ranges(split_matrix(split), documents)[0]
    per_epoch = (int(lengths[a:b].sum(dtype=np.int64)) - 1) // SEQ_LENGTH  # add_extra_token_to_sequence
    train = int(epochs * per_epoch)
    sizes = list(split_sizes(train_samples=train, global_batch_size=gbs, eval_iters=eval_iters,
                             eval_interval=eval_interval))
    flags = ["--train-samples", str(train), "--global-batch-size", str(gbs), "--eval-iters", str(eval_iters),
             "--eval-interval", str(eval_interval)]
    return _build_case(work, [prefix], None, ["--data-path", prefix], split, sizes, flags,
                       {"datasets": 1, "documents": documents, "tokens": int(lengths.sum(dtype=np.int64)),
                        "epochs": epochs})


def build_blend(work: str, suite: Suite, factor: float) -> Case:
    from megacache.megatron.training import split_sizes

    split, datasets, tokens = "969,30,1", suite.blend_datasets, 5e10 * factor
    mean_length = suite.mean_length or MEAN_LENGTH
    share, weights = blend_shares(datasets)
    prefixes, documents, total = [], 0, 0
    for i in range(datasets):
        prefix = os.path.join(work, f"source_{i:04d}_text_document")
        # At least 1000 documents, so the 0.1 % test split holds one (the blend asks every dataset
        # for test samples; from an empty split megatron-core would loop forever).
        n = max(1000, int(tokens * share[i] / mean_length))
        total += int(write_dataset(prefix, n, SEED + 1 + i, mean_length).sum(dtype=np.int64))
        prefixes.append(prefix)
        documents += n
    # train / valid / test = 1.2e7 / 1.2e5 / 1.2e4 at factor 1, as Megatron-LM's loop derives them
    # with a global batch of 1: test = eval_iters, valid = (train // interval + 1) * eval_iters.
    # A blend takes at least ceil(size * w) = 1 sample from every dataset, so a split of fewer than
    # a dozen samples per dataset is all rounding: valid and test stay at least that large.
    test = max(round(12000 * factor), 12 * datasets)
    train = max(round(1.2e7 * factor), 10 * test)
    eval_interval = max(1, train // 9)  # the smallest giving train // interval + 1 == 10 evaluations
    while train // eval_interval + 1 > 10:
        eval_interval += 1
    sizes = list(split_sizes(train_samples=train, global_batch_size=1, eval_iters=test, eval_interval=eval_interval))
    data_args = os.path.join(work, "data_args.txt")
    with open(data_args, "w") as f:
        f.write("".join(f"{w!r} {p}\n" for w, p in zip(weights.tolist(), prefixes)))
    flags = ["--train-samples", str(train), "--global-batch-size", "1", "--eval-iters", str(test),
             "--eval-interval", str(eval_interval)]
    return _build_case(work, prefixes, weights.tolist(), ["--data-args-path", data_args], split, sizes, flags,
                       {"datasets": datasets, "documents": documents, "tokens": total,
                        "mean_length": mean_length},
                       blend_surplus(work, prefixes, weights, split, sizes))


# ------------------------------------------------------------------------------------------------
# blend_kernel


def blend_kernel(work: str, suite: Suite, factor: float) -> Case:
    from megacache.algorithms.blend_sizes import normalize
    from megacache.formats.npy import write_npy

    size, datasets = max(1000, int(1e8 * factor)), 1000
    # Uniform random weights, normalized twice as BlendedMegatronDatasetBuilder and BlendedDataset do.
    weights = normalize(normalize(np.random.default_rng(0).random(datasets)))
    path = os.path.join(work, "weights.npy")
    write_npy(path, weights)
    return Case(
        params={"samples": size, "datasets": datasets, "weights": "uniform random, seed 0"},
        megacache=lambda out: ["benchmarks.kernel", path, str(size), out],
        reference=lambda out: ["benchmarks.reference", "kernel", path, str(size), out],
        reference_name="megatron-core helpers_cpp.build_blending_indices",
    )


WORKLOADS: dict[str, Callable[[str, Suite, float], Case]] = {
    "tokenize": tokenize, "build_gpt": build_gpt, "build_blend": build_blend, "blend_kernel": blend_kernel,
}
