"""Acceptance (issues "megatron versions", "megacache build"): megatron-core's own
BlendedMegatronDatasetBuilder, 0.16.1 and 0.19.2 each in its own interpreter, on two gloo ranks under
torchrun (tests/support/oracles/megatron_rank.py), finds a megacache-built cache in a read-only directory, loads it
on both ranks without building, and serves exactly the samples that megacache's arrays describe
(docs/megatron.md §2.10): one prefix, a weighted blend, and per-split blends loaded with
``--dataloader-fast-cache-load``, ``--dataloader-defer-npy-index-mmap`` and the per-dataset
sequences file megacache wrote. 0.16 hashes the null tokenizer; 0.19 a Hugging Face tokenizer with
Megatron-LM 0.19's default flags.

Root ignores write permission bits, so "without building" is proven on its own: every cache file
keeps its inode, mtime and bytes, the directory gains nothing, megatron logs "Load", never "Build and
save" (with deferred maps it logs neither), and on each rank the index arrays are memory maps of the
cache files (a build returns arrays in memory).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from support.inputs.corpus import free_port
from support.oracles.environments import RELEASES, SCRIPTS, interpreter
from support.inputs.tokenizer_files import write_tokenizer_files
from support.sweeps import snapshot

from megacache.interfaces.api import BuildConfig, build, open_cache, split_sizes
from megacache.megatron.blends import parse_blend
from megacache.runtime.comm import SingleComm
from megacache.errors import MegacacheError
from megacache.formats.indexed import write_dataset
from megacache.readers.samples import BlendedSamples
from megacache.megatron.tokenizer import tokenizer_identifiers

pytestmark = pytest.mark.oracle_environments

SEQ_LENGTH = 64
SEED = 1234
SPLIT = "90,8,2"
VOCAB = 1000  # the oracle's null tokenizer (tests/support/oracles/megatron_core.py)
RANKS = 2
SAMPLES_PER_SPLIT = 50
INDEX_ARRAYS = ("document_index", "sample_index", "shuffle_index")


def megatron_getitem_fields(text, pad):
    """tokens, labels and loss_mask of ``dataset[i]`` for raw text (§2.10 steps 7 and 11, x=1)."""
    tokens, labels = text[:, :-1].copy(), text[:, 1:].copy()
    loss_mask = (labels != pad).astype(np.float32)
    tokens[tokens == pad] = 0
    labels[labels == pad] = 0
    return tokens, labels, loss_mask


def write_corpus(prefix: str, seed: int = 11) -> None:
    """Documents of running token ids (so windows are distinguishable), some empty ones included."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 150, 240)
    lengths[[3, 50, 51, 200]] = 0
    stream = (np.arange(lengths.sum()) % VOCAB).astype(np.uint16)
    write_dataset(prefix, np.split(stream, np.cumsum(lengths)[:-1]), np.uint16)


def run_ranks(version: str, spec_path: str, workdir: str) -> None:
    """tests/support/oracles/megatron_rank.py on RANKS processes under torchrun, in megatron-core ``version``'s
    interpreter; fail with its output if any rank fails."""
    python, env = interpreter(version)
    script = os.path.join(SCRIPTS, "megatron_rank.py")
    log = os.path.join(workdir, "torchrun.log")
    with open(log, "w") as out:
        code = subprocess.run([python, "-m", "torch.distributed.run", f"--nproc_per_node={RANKS}",
                               f"--master_port={free_port()}", script, spec_path], stdout=out,
                              stderr=subprocess.STDOUT, env=env, cwd=workdir, timeout=600).returncode
    if code != 0:
        raise AssertionError(f"torchrun exited {code}:\n{Path(log).read_text()[-6000:]}")


def tokenizer_flags(version: str, tmp_path) -> tuple[dict, str]:
    """Megatron-LM flags of the tokenizer training hashes, and the directory they are relative to."""
    if version == "0.16":
        return dict(tokenizer_type="NullTokenizer", vocab_size=VOCAB), str(tmp_path)
    files = tmp_path / "tokenizer"
    files.mkdir()
    write_tokenizer_files(files)
    return dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(files / "hf")), str(files)


def per_split(prefixes: list[str]) -> list:
    """train: a weighted blend of every prefix; valid: the first alone; test: the last two, unweighted."""
    return [(prefixes, [0.5, 0.2, 0.3]), ([prefixes[0]], None), (prefixes[1:], None)]


def megacache_samples(cfg: BuildConfig):
    """Build with megacache (one process), then open the splits with megacache's API."""
    with pytest.raises(MegacacheError, match="not built, e.g. .*description.txt: run `megacache build`"):
        open_cache(cfg)
    result = build(cfg, SingleComm())
    return result, open_cache(cfg)


def words(prefixes, weights):
    return list(prefixes) if weights is None else [w for pair in zip(map(str, weights), prefixes) for w in pair]


CASES = [(version, kind) for version in ("0.16", "0.19")
         for kind in ("one prefix", "weighted blend", "per-split, fast load")]


@pytest.mark.parametrize("version,kind", CASES)
def test_megatron_loads_a_read_only_megacache_cache_on_two_gloo_ranks(tmp_path, version, kind):
    blend = kind != "one prefix"
    fast = kind == "per-split, fast load"
    prefixes = [str(tmp_path / f"corpus{i}") for i in range(3 if blend else 1)]
    for i, prefix in enumerate(prefixes):
        write_corpus(prefix, seed=11 + i)
    flags, tokenizer_cwd = tokenizer_flags(version, tmp_path)
    # Enough samples that the first prefix's train and valid splits take 2+ epochs.
    sizes = split_sizes(version, train_samples=560 * len(prefixes), global_batch_size=8,
                                 eval_iters=2 * len(prefixes), eval_interval=20)
    # One prefix: Megatron's default cache location, <prefix>/cache/GPTDataset_indices; a blend is
    # only cached under --data-cache-path.
    cache = str(tmp_path / "cache") if blend else os.path.join(prefixes[0], "cache", "GPTDataset_indices")
    common = dict(seq_length=SEQ_LENGTH, sizes=sizes, seed=SEED, cache_dir=cache if blend else None,
                  drop_last_partial_validation=False, megatron_version=version,
                  tokenizer=tokenizer_identifiers(megatron_version=version, **flags))
    if fast:
        cfg = BuildConfig(blend_per_split=[None if b is None else parse_blend(words(*b)) for b in per_split(prefixes)],
                          split=None, **common)
    elif blend:
        cfg = BuildConfig(blend=parse_blend(words(prefixes, [0.5, 0.2, 0.3])), split=SPLIT, **common)
    else:
        cfg = BuildConfig.for_prefix(prefixes[0], split=SPLIT, **common)
    result, ours = megacache_samples(cfg)
    assert result.megatron_version == version
    assert all(os.path.samefile(j.entry.directory, cache) for j in result.gpt)
    assert list(ours) == ["train", "valid", "test"]
    if not fast:
        plans = {j.name: j.plan for j in result.gpt if j.request == 0}
        assert plans["train"].num_epochs >= 2 and plans["train"].separate_final_epoch
        assert not plans["valid"].drop_last and plans["valid"].num_epochs >= 2
    if blend:  # Megatron-LM's tools/build_sequences_per_dataset.py file, for --per-dataset-sequences-path
        with open(os.path.join(cache, "sequences_per_dataset.json")) as f:
            # 240 documents, 4 of them empty (no sequence); the header counts 241 document index entries
            assert json.load(f) == {p: [236, 241] for p in prefixes}

    rng = np.random.default_rng(5)
    indices = {}
    for name, samples in ours.items():
        n = len(samples)
        must = [0, n - 1]
        if not isinstance(samples, BlendedSamples):  # the short last valid sample, wherever the shuffle put it
            must.append(int(np.flatnonzero(samples.shuffle_index == n - 1)[0]))
        for rank in range(RANKS):
            picked = rng.choice(n, size=min(n, SAMPLES_PER_SPLIT - 3), replace=False)
            indices[name, rank] = np.unique(np.concatenate([must, picked])).tolist()

    spec = {"prefixes": prefixes, "weights": [0.5, 0.2, 0.3] if blend else None, "split": SPLIT,
            "blend_per_split": per_split(prefixes) if fast else None, "fast": fast,
            "sequences": os.path.join(cache, "sequences_per_dataset.json"), "cache": cache if blend else None,
            "sizes": list(sizes), "seed": SEED, "seq_length": SEQ_LENGTH, "tokenizer": flags,
            "tokenizer_cwd": tokenizer_cwd, "out": str(tmp_path),
            "indices": {f"{name}/{rank}": v for (name, rank), v in indices.items()}}
    spec_path = str(tmp_path / "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)

    read_only = [cache] if blend else [os.path.join(prefixes[0], "cache")]
    subprocess.run(["chmod", "-R", "a-w", *read_only], check=True)
    try:
        before = snapshot(cache)
        run_ranks(version, spec_path, str(tmp_path))
        after = snapshot(cache)
    finally:
        subprocess.run(["chmod", "-R", "u+w", *read_only], check=True)

    # Loaded, never built: the cache is untouched, ...
    assert after == before
    entries = {"one prefix": 3 * 4, "weighted blend": 3 * 3 * 4 + 3 * 3, "per-split, fast load": 6 * 4 + 2 * 3}[kind]
    # + the sequences file (blends: a --data-cache-path) and megacache's state directory
    assert len(before["files"]) == entries + blend + 1
    for rank in range(RANKS):
        meta = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert meta["megatron"] == RELEASES[version]
        assert meta["world_size"] == RANKS and meta["rank"] == rank
        # ... rank 0 (the rank that builds on a miss) logs loading every split (deferred maps log
        # nothing), ...
        assert not [m for m in meta["log"] if "Build and save" in m], meta["log"]
        if rank == 0 and not fast:
            for name in ("train", "valid", "test"):
                assert f"Load the GPTDataset {name} indices" in meta["log"], (name, meta["log"])
            if blend:
                assert meta["log"].count("Load the BlendedDataset indices") == 3, meta["log"]
        got = np.load(tmp_path / f"rank{rank}.npz")
        # the tokenizer's pad id (the null tokenizer has none: -1, megacache's default)
        pad = {meta["splits"][name]["pad"] for name in ours}.pop()
        for name, samples in open_cache(cfg, pad_id=pad).items():
            blended = isinstance(samples, BlendedSamples)
            assert meta["splits"][name]["blended"] == blended
            # ... on both ranks megatron's index arrays are memory maps of megacache's files, ...
            for a, path in meta["splits"][name]["mapped"].items():
                assert path is not None, (rank, name, a, "not a memory map: megatron built it")
                assert os.path.samefile(path, samples.entry.path(f"{a}.npy")), (rank, name, a, path)
            assert meta["splits"][name]["len"] == len(samples)

            # ... and every sample megatron serves is megacache's reader's sample.
            idx = indices[name, rank]
            text = np.stack([samples[k] for k in idx])
            document_ids = [samples.document_ids(k) for k in idx]
            np.testing.assert_array_equal(got[f"{name}_text"], text, err_msg=f"rank {rank} {name} text")
            np.testing.assert_array_equal(got[f"{name}_counts"], [len(d) for d in document_ids])
            np.testing.assert_array_equal(got[f"{name}_document_ids"], np.concatenate(document_ids),
                                          err_msg=f"rank {rank} {name} document ids")
            if blended:
                np.testing.assert_array_equal(got[f"{name}_dataset_id"], [samples.source(k)[0] for k in idx])
            # (megatron-core caches its loss mask before zeroing the pad positions in it, in place: where
            # the pad id is a token id, later samples inherit the first one's zeros, so no comparison)
            fields = ("tokens", "labels", "loss_mask") if pad < 0 else ("tokens", "labels")
            for field, want in zip(fields, megatron_getitem_fields(text, pad)):
                np.testing.assert_array_equal(got[f"{name}_{field}"], want, err_msg=f"rank {rank} {name} {field}")
            # Only valid keeps a short last sample (one prefix: it is among the ones compared); told
            # apart by its padding where the pad id is no token id.
            if pad < 0:
                short = int((text == pad).any(axis=1).sum())
                assert short == 0 or name == "valid", (rank, name, short)
                assert blend or short == (name == "valid"), (rank, name, short)
