"""Many small shards, as per-task tokenizer jobs write them (NeMo Curator, datatrove, Nemotron data-prep):
``count`` datasets of 0 to 4 documents of 0 to 60 uint16 ids each, the same for a given seed on every
machine (with ``eos``, each document ends with that id, as OLMo's files need). ``write_megatron``
writes them as Megatron prefixes, ``write_ds`` as datatrove ``.ds`` files and ``write_olmo`` as OLMo
token files, holding the same documents (a document without tokens is an empty one in the first two;
OLMo has none, nor files without documents). tests/support/oracles/record_merge_shards.py records what
megatron-core's ``add_index`` chain makes of them."""

from __future__ import annotations

import os

import numpy as np

from megacache.formats.indexed import write_dataset

SEED = 38
VOCAB = 32000
#: the EOS of the OLMo shards: no other id equals it
EOS = VOCAB


def documents(count: int, seed: int = SEED, eos: int | None = None) -> list[list[np.ndarray]]:
    """Each shard's documents; shard k's are the same whatever the count."""
    out = []
    end = [] if eos is None else [eos]
    for k in range(count):
        rng = np.random.default_rng([seed, k])
        lengths = rng.integers(0, 61, rng.integers(0, 5))
        out.append([np.append(rng.integers(0, VOCAB, n, dtype=np.uint16), np.array(end, np.uint16))
                    for n in lengths.tolist()])
    return out


def name(k: int) -> str:
    return f"shard_{k:05d}"


def write_megatron(folder: str, count: int, seed: int = SEED, eos: int | None = None) -> list[str]:
    """The shards as Megatron prefixes ``folder/shard_00000`` ...; returns them in order."""
    os.makedirs(folder, exist_ok=True)
    prefixes = []
    for k, docs in enumerate(documents(count, seed, eos)):
        prefixes.append(os.path.join(folder, name(k)))
        write_dataset(prefixes[-1], docs, np.uint16)
    return prefixes


def write_ds(folder: str, count: int, seed: int = SEED) -> list[str]:
    """The first ``count`` shards as datatrove files ``folder/shard_00000.ds`` (+ ``.ds.index``: uint64
    document ends in tokens); returns them in order."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k, docs in enumerate(documents(count, seed)):
        paths.append(os.path.join(folder, name(k) + ".ds"))
        tokens = np.concatenate(docs) if docs else np.zeros(0, np.uint16)
        tokens.astype("<u2").tofile(paths[-1])
        np.cumsum([len(d) for d in docs], dtype="<u8").tofile(paths[-1] + ".index")
    return paths


def write_olmo(folder: str, count: int, seed: int = SEED) -> list[str]:
    """The first ``count`` shards, each document ending with EOS, as OLMo token files
    ``folder/shard_00000.npy`` (the ids back to back, no header), leaving out those without documents;
    returns them in order."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k, docs in enumerate(documents(count, seed, EOS)):
        if docs:
            paths.append(os.path.join(folder, name(k) + ".npy"))
            np.concatenate(docs).astype("<u2").tofile(paths[-1])
    return paths
