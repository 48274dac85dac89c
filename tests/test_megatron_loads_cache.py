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

from corpus import free_port
from megacache.builders.gpt import GPTBuildConfig, build_gpt, megatron_split_sizes
from megacache.comm import SingleComm
from megacache.formats.indexed import IndexedDataset, bin_path, write_dataset
from megacache.formats.tokenizer_ids import tokenizer_identifiers

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
        st = entry.stat()
        with open(entry.path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        files[entry.name] = (st.st_ino, st.st_mtime_ns, st.st_size, digest)
    return {"mtime_ns": os.stat(directory).st_mtime_ns, "files": files}


def expected_samples(ds, document_index, sample_index, shuffle_index, idx):
    """Megatron's raw sample text (§2.10 steps 1-5) and document ids for dataset indices ``idx``.

    Sample j is the token stream of the document index from (i0, o0) to (i1, o1 + x), padded to L + x:
    read as one gather over that stream rather than piece by piece."""
    lengths = ds.sequence_lengths[document_index].astype(np.int64)
    stream_end = np.cumsum(lengths)
    stream_start = stream_end - lengths
    j = shuffle_index[idx].astype(np.int64)
    (i0, o0), (i1, o1) = sample_index[j].astype(np.int64).T, sample_index[j + 1].astype(np.int64).T
    first, stop = stream_start[i0] + o0, stream_start[i1] + o1 + X
    q = first[:, None] + np.arange(L + X)
    inside = q < stop[:, None]
    q = np.where(inside, q, 0)
    pos = np.searchsorted(stream_end, q, side="right")  # the document-index position holding q
    element = ds.sequence_pointers[document_index[pos]] // ds.dtype.itemsize + (q - stream_start[pos])
    tokens = np.memmap(bin_path(ds.prefix), dtype=ds.dtype, mode="r")
    text = np.where(inside, tokens[element].astype(np.int64), PAD)
    counts = i1 - i0 + 1
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    document_ids = document_index[np.repeat(i0, counts) + within].astype(np.int64)
    return text, document_ids, counts


def megatron_getitem_fields(text):
    """tokens, labels and loss_mask of ``dataset[i]`` for raw text (§2.10 steps 7 and 11, x=1)."""
    tokens, labels = text[:, :-1].copy(), text[:, 1:].copy()
    loss_mask = (labels != PAD).astype(np.float32)
    tokens[tokens == PAD] = 0
    labels[labels == PAD] = 0
    return tokens, labels, loss_mask


def write_corpus(prefix: str) -> None:
    """Documents of running token ids (so windows are distinguishable), some empty ones included."""
    rng = np.random.default_rng(11)
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


def test_megatron_loads_a_read_only_megacache_cache_on_two_gloo_ranks(tmp_path):
    prefix = str(tmp_path / "corpus")
    write_corpus(prefix)
    sizes = megatron_split_sizes(train_samples=560, global_batch_size=8, eval_iters=2, eval_interval=20)
    cfg = GPTBuildConfig(data_path=prefix, seq_length=L, sizes=sizes,
                         tokenizer=tokenizer_identifiers("NullTokenizer", vocab_size=VOCAB), split=SPLIT,
                         seed=SEED, drop_last_partial_validation=False)
    result = build_gpt(cfg, SingleComm())
    # Megatron's default cache location, which megacache also uses: <prefix>/cache/GPTDataset_indices.
    cache = os.path.join(prefix, "cache", "GPTDataset_indices")
    assert os.path.samefile(result.cache_dir, cache)
    plans = {s.name: s.plan for s in result.splits}
    assert list(plans) == ["train", "valid", "test"]
    assert plans["train"].num_epochs >= 2 and plans["train"].separate_final_epoch
    assert not plans["valid"].drop_last and plans["valid"].num_epochs >= 2

    # megacache's view of every split, and the dataset indices each rank will ask megatron for.
    ds = IndexedDataset(prefix)
    arrays = {s.name: {a: np.load(s.entry.path(f"{a}.npy"), allow_pickle=False) for a in INDEX_ARRAYS}
              for s in result.splits}
    rng = np.random.default_rng(5)
    indices = {}
    for name, arr in arrays.items():
        n = len(arr["shuffle_index"])
        assert n == plans[name].num_samples
        last_row = int(np.flatnonzero(arr["shuffle_index"] == n - 1)[0])  # the short one in valid
        for rank in range(RANKS):
            picked = rng.choice(n, size=min(n, SAMPLES_PER_SPLIT - 3), replace=False)
            indices[name, rank] = np.unique(np.concatenate([[0, n - 1, last_row], picked])).tolist()

    cache_root = os.path.join(prefix, "cache")
    spec = {"prefix": prefix, "sizes": list(sizes), "out": str(tmp_path),
            "indices": {f"{name}/{rank}": v for (name, rank), v in indices.items()}}
    spec_path = str(tmp_path / "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)

    subprocess.run(["chmod", "-R", "a-w", cache_root], check=True)
    try:
        before = snapshot(cache)
        run_ranks(spec_path, str(tmp_path))
        after = snapshot(cache)
    finally:
        subprocess.run(["chmod", "-R", "u+w", cache_root], check=True)

    # Loaded, never built: the cache is untouched, ...
    assert after == before
    assert len(before["files"]) == 12
    assert os.listdir(cache_root) == ["GPTDataset_indices"]
    for rank in range(RANKS):
        meta = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert meta["megatron"] == "0.16.1"
        assert meta["world_size"] == RANKS and meta["rank"] == rank
        # ... rank 0 (the rank that builds on a miss) logs loading every split, ...
        if rank == 0:
            assert not [m for m in meta["log"] if "Build and save" in m], meta["log"]
            for name in plans:
                assert f"Load the GPTDataset {name} indices" in meta["log"], (name, meta["log"])
        got = np.load(tmp_path / f"rank{rank}.npz")
        for s in result.splits:
            name = s.name
            # ... and on both ranks megatron's index arrays are memory maps of megacache's files.
            for a in INDEX_ARRAYS:
                mapped = meta["splits"][name][a]
                assert mapped is not None, (rank, name, a, "not a memory map: megatron built it")
                assert os.path.samefile(mapped, s.entry.path(f"{a}.npy")), (rank, name, a, mapped)
            assert meta["splits"][name]["len"] == plans[name].num_samples

            idx = np.asarray(indices[name, rank])
            text, document_ids, counts = expected_samples(ds, **arrays[name], idx=idx)
            np.testing.assert_array_equal(got[f"{name}_text"], text, err_msg=f"rank {rank} {name} text")
            np.testing.assert_array_equal(got[f"{name}_counts"], counts, err_msg=f"rank {rank} {name}")
            np.testing.assert_array_equal(got[f"{name}_document_ids"], document_ids,
                                          err_msg=f"rank {rank} {name} document ids")
            for field, want in zip(("tokens", "labels", "loss_mask"), megatron_getitem_fields(text)):
                np.testing.assert_array_equal(got[f"{name}_{field}"], want, err_msg=f"rank {rank} {name} {field}")
            # Only valid keeps a short last sample, and it is among the ones compared.
            short = (text == PAD).any(axis=1)
            assert short.sum() == (name == "valid"), (rank, name, short.sum())


def rank_main(spec_path: str) -> None:
    """One rank: megatron-core builds its splits against the cache, then reports what it served."""
    import logging
    import warnings

    import megatron.core
    import torch
    import torch.distributed as dist
    from oracle import load_mcore, megatron_splits

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
    datasets = megatron_splits(mcore, spec["prefix"], SPLIT, spec["sizes"], SEED, L, X,
                               drop_last_valid=False)
    meta = {"rank": rank, "world_size": dist.get_world_size(), "megatron": megatron.core.__version__,
            "log": log, "splits": {}}
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, dataset in zip(("train", "valid", "test"), datasets):
            info = {"len": len(dataset)}
            for a in INDEX_ARRAYS:
                arr = getattr(dataset, a)
                info[a] = arr.filename if isinstance(arr, np.memmap) else None
            meta["splits"][name] = info
            idx = spec["indices"][f"{name}/{rank}"]
            queried = [dataset._query_document_sample_shuffle_indices(i) for i in idx]
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
