"""Acceptance (issue "megacache build"): megatron-core 0.16.1's own BlendedMegatronDatasetBuilder, on
two torch.distributed gloo ranks started as torchrun starts them, finds a megacache-built cache in a
read-only directory, loads it on both ranks without building, and serves exactly the samples that
megacache's arrays describe (megatron-compat.md §2.10).

Root ignores write permission bits, so "without building" is proven on its own: every cache file
keeps its inode, mtime and bytes, the directory gains nothing, megatron logs "Load", never "Build and
save", and on each rank the three index arrays are memory maps of the cache files (a build returns
arrays in memory).

Run as a script, this file is one rank of that job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from corpus import free_port

from megacache.api import BuildConfig, build, megatron_split_sizes, open_cache
from megacache.blendspec import parse_blend
from megacache.comm import SingleComm
from megacache.errors import MegacacheError
from megacache.formats.indexed import write_dataset
from megacache.megatron.tokenizer import tokenizer_identifiers

L = 64  # sequence length
X = 1  # add_extra_token_to_sequence (megatron's default)
SEED = 1234
SPLIT = "90,8,2"
VOCAB = 1000  # the oracle's null tokenizer (tests/oracle.py)
PAD = -1  # the null tokenizer has no pad token
RANKS = 2
SAMPLES_PER_SPLIT = 50
INDEX_ARRAYS = ("document_index", "sample_index", "shuffle_index")


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


def megatron_getitem_fields(text):
    """tokens, labels and loss_mask of ``dataset[i]`` for raw text (§2.10 steps 7 and 11, x=1)."""
    tokens, labels = text[:, :-1].copy(), text[:, 1:].copy()
    loss_mask = (labels != PAD).astype(np.float32)
    tokens[tokens == PAD] = 0
    labels[labels == PAD] = 0
    return tokens, labels, loss_mask


def write_corpus(prefix: str, seed: int = 11) -> None:
    """Documents of running token ids (so windows are distinguishable), some empty ones included."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 150, 240)
    lengths[[3, 50, 51, 200]] = 0
    stream = (np.arange(lengths.sum()) % VOCAB).astype(np.uint16)
    write_dataset(prefix, np.split(stream, np.cumsum(lengths)[:-1]), np.uint16)


def run_ranks(spec_path: str, workdir: str) -> None:
    """Start this file as RANKS processes, torchrun-style; fail with their output if any fails."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(RANKS),
               PYTHONWARNINGS="ignore")
    procs, logs = [], []
    for rank in range(RANKS):
        logs.append(os.path.join(workdir, f"rank{rank}.log"))
        with open(logs[-1], "w") as log:
            procs.append(subprocess.Popen([sys.executable, __file__, spec_path], stdout=log,
                                          stderr=subprocess.STDOUT,
                                          env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank))))
    try:
        codes = [p.wait(timeout=300) for p in procs]
    except subprocess.TimeoutExpired:
        codes = ["timed out"] * RANKS
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if codes != [0] * RANKS:
        outputs = [Path(path).read_text() for path in logs]
        raise AssertionError("\n".join(f"rank {r} exited {c}:\n{o}"
                                       for r, (c, o) in enumerate(zip(codes, outputs))))


def megacache_samples(prefixes, weights, cache_dir, sizes):
    """Build with megacache (one process), then open the splits with megacache's API."""
    if weights is None:
        cfg = BuildConfig.for_prefix(prefixes[0], **common_config(sizes, cache_dir))
    else:
        blend = parse_blend([w for pair in zip(map(str, weights), prefixes) for w in pair])
        cfg = BuildConfig(blend=blend, **common_config(sizes, cache_dir))
    with pytest.raises(MegacacheError, match="not built, e.g. .*description.txt: run `megacache build`"):
        open_cache(cfg)
    result = build(cfg, SingleComm())
    return result, open_cache(cfg)


def common_config(sizes, cache_dir):
    return dict(seq_length=L, sizes=sizes, tokenizer=tokenizer_identifiers("NullTokenizer", vocab_size=VOCAB),
                split=SPLIT, seed=SEED, cache_dir=cache_dir, drop_last_partial_validation=False)


@pytest.mark.parametrize("kind", ["one prefix", "weighted blend"])
def test_megatron_loads_a_read_only_megacache_cache_on_two_gloo_ranks(tmp_path, kind):
    blend = kind != "one prefix"
    prefixes = [str(tmp_path / f"corpus{i}") for i in range(3 if blend else 1)]
    for i, prefix in enumerate(prefixes):
        write_corpus(prefix, seed=11 + i)
    weights = [0.5, 0.2, 0.3] if blend else None
    # Enough samples that the first prefix's train and valid splits take 2+ epochs.
    sizes = megatron_split_sizes(train_samples=560 * len(prefixes), global_batch_size=8,
                                 eval_iters=2 * len(prefixes), eval_interval=20)
    # One prefix: Megatron's default cache location, <prefix>/cache/GPTDataset_indices; a blend is
    # only cached under --data-cache-path.
    cache = str(tmp_path / "cache") if blend else os.path.join(prefixes[0], "cache", "GPTDataset_indices")
    result, ours = megacache_samples(prefixes, weights, cache if blend else None, sizes)
    assert all(os.path.samefile(j.entry.directory, cache) for j in result.gpt)
    plans = {j.name: j.plan for j in result.gpt if j.request == 0}
    assert list(ours) == ["train", "valid", "test"]
    assert plans["train"].num_epochs >= 2 and plans["train"].separate_final_epoch
    assert not plans["valid"].drop_last and plans["valid"].num_epochs >= 2

    rng = np.random.default_rng(5)
    indices = {}
    for name, samples in ours.items():
        n = len(samples)
        must = [0, n - 1]
        if not blend:  # the short last valid sample, wherever the shuffle put it
            must.append(int(np.flatnonzero(samples.shuffle_index == n - 1)[0]))
        for rank in range(RANKS):
            picked = rng.choice(n, size=min(n, SAMPLES_PER_SPLIT - 3), replace=False)
            indices[name, rank] = np.unique(np.concatenate([must, picked])).tolist()

    spec = {"prefixes": prefixes, "weights": weights, "cache": cache if blend else None, "sizes": list(sizes),
            "out": str(tmp_path), "indices": {f"{name}/{rank}": v for (name, rank), v in indices.items()}}
    spec_path = str(tmp_path / "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)

    read_only = [cache] if blend else [os.path.join(prefixes[0], "cache")]
    subprocess.run(["chmod", "-R", "a-w", *read_only], check=True)
    try:
        before = snapshot(cache)
        run_ranks(spec_path, str(tmp_path))
        after = snapshot(cache)
    finally:
        subprocess.run(["chmod", "-R", "u+w", *read_only], check=True)

    # Loaded, never built: the cache is untouched, ...
    assert after == before
    # + the sequences file (blends: a --data-cache-path) and megacache's state directory
    assert len(before["files"]) == 12 * len(prefixes) + (9 + 1 if blend else 0) + 1
    for rank in range(RANKS):
        meta = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert meta["megatron"] == "0.16.1"
        assert meta["world_size"] == RANKS and meta["rank"] == rank
        # ... rank 0 (the rank that builds on a miss) logs loading every split, ...
        if rank == 0:
            assert not [m for m in meta["log"] if "Build and save" in m], meta["log"]
            for name in plans:
                assert f"Load the GPTDataset {name} indices" in meta["log"], (name, meta["log"])
            if blend:
                assert meta["log"].count("Load the BlendedDataset indices") == 3, meta["log"]
        got = np.load(tmp_path / f"rank{rank}.npz")
        for name, samples in ours.items():
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
            if blend:
                np.testing.assert_array_equal(got[f"{name}_dataset_id"], [samples.source(k)[0] for k in idx])
            for field, want in zip(("tokens", "labels", "loss_mask"), megatron_getitem_fields(text)):
                np.testing.assert_array_equal(got[f"{name}_{field}"], want, err_msg=f"rank {rank} {name} {field}")
            # Only valid keeps a short last sample (one prefix: it is among the ones compared).
            short = int((text == PAD).any(axis=1).sum())
            assert short == 0 or name == "valid", (rank, name, short)
            assert blend or short == (name == "valid"), (rank, name, short)


def rank_main(spec_path: str) -> None:
    """One rank: megatron-core builds its splits against the cache, then reports what it served."""
    import logging
    import warnings

    import megatron.core
    import torch
    import torch.distributed as dist
    from oracle import load_mcore, megatron_datasets

    spec = json.loads(Path(spec_path).read_text())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: log.append(record.getMessage())
    mlog = logging.getLogger("megatron.core")
    mlog.setLevel(logging.INFO)
    mlog.addHandler(handler)

    mcore = load_mcore()
    datasets = megatron_datasets(mcore, spec["sizes"], SEED, L, X, False, spec["cache"],
                                 blend=(spec["prefixes"], spec["weights"]), split=SPLIT)
    meta = {"rank": rank, "world_size": dist.get_world_size(), "megatron": megatron.core.__version__,
            "log": log, "splits": {}}
    out = {}

    def mapped(arr):
        return arr.filename if isinstance(arr, np.memmap) else None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, dataset in zip(("train", "valid", "test"), datasets):
            blended = spec["weights"] is not None
            arrays = ("dataset_index", "dataset_sample_index") if blended else INDEX_ARRAYS
            meta["splits"][name] = {"len": len(dataset), "mapped": {a: mapped(getattr(dataset, a)) for a in arrays}}
            idx = spec["indices"][f"{name}/{rank}"]
            if blended:
                sources = [(dataset.datasets[dataset.dataset_index[i]], dataset.dataset_sample_index[i]) for i in idx]
                out[f"{name}_dataset_id"] = np.array([dataset.dataset_index[i] for i in idx])
            else:
                sources = [(dataset, i) for i in idx]
            queried = [child._query_document_sample_shuffle_indices(i) for child, i in sources]
            items = [dataset[i] for i in idx]
            out[f"{name}_text"] = np.stack([t for t, _ in queried])
            out[f"{name}_counts"] = np.array([len(d) for _, d in queried])
            out[f"{name}_document_ids"] = np.concatenate([d for _, d in queried])
            for field in ("tokens", "labels", "loss_mask"):
                out[f"{name}_{field}"] = torch.stack([item[field] for item in items]).numpy()
    np.savez(os.path.join(spec["out"], f"rank{rank}.npz"), **out)
    with open(os.path.join(spec["out"], f"rank{rank}.json"), "w") as f:
        json.dump(meta, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    rank_main(sys.argv[1])
