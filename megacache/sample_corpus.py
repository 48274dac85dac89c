"""The bundled sample corpus: synthetic English-like documents, generated deterministically.

Written for megacache (no external text): sentences are assembled from small word lists by a seeded
RNG, with lognormal document lengths, a sprinkling of non-ASCII words and paragraph breaks, so
tokenizers see realistic variety. Used by the README's end-to-end job, tests and benchmarks.
"""

from __future__ import annotations

import json
import os

import numpy as np

_SUBJECTS = ("the engineer", "a cluster", "the scheduler", "our team", "the dataset", "every rank",
             "the tokenizer", "a small model", "the index", "this job", "the filesystem", "a researcher",
             "the pipeline", "each worker", "the benchmark", "a new node")
_VERBS = ("builds", "reads", "shuffles", "writes", "measures", "checks", "merges", "blends", "counts",
          "maps", "splits", "streams", "caches", "verifies", "publishes", "samples")
_OBJECTS = ("the documents", "a billion tokens", "every shard", "the sample index", "its slice",
            "the shuffle order", "a memory map", "the final epoch", "each prefix", "the weights",
            "a long sequence", "the cache files", "one more batch", "the token stream")
_TAILS = ("before the barrier", "in parallel", "without waiting", "on the shared filesystem",
          "at training start", "in a few minutes", "with bounded memory", "exactly once",
          "for the next run", "byte for byte", "under mpirun", "while the GPUs idle")
_EXTRA = ("café", "naïve", "façade", "Zürich", "München", "señor", "déjà vu", "東京", "数据", "λόγος",
          "данные", "🙂", "→", "½")


def _sentence(rng: np.random.Generator) -> str:
    words = [_SUBJECTS[rng.integers(len(_SUBJECTS))], _VERBS[rng.integers(len(_VERBS))],
             _OBJECTS[rng.integers(len(_OBJECTS))]]
    if rng.random() < 0.6:
        words.append(_TAILS[rng.integers(len(_TAILS))])
    if rng.random() < 0.08:
        words.append(_EXTRA[rng.integers(len(_EXTRA))])
    if rng.random() < 0.15:
        words.append(f"{rng.integers(1, 10000)}")
    text = " ".join(words)
    return text[0].upper() + text[1:] + (". " if rng.random() < 0.9 else "! ")


def sample_documents(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(2.0, 1.0, n).astype(int) + 1, 400)
    docs = []
    for k in lengths:
        sentences = [_sentence(rng) for _ in range(k)]
        for i in range(4, len(sentences), 5 + int(rng.integers(5))):
            sentences[i] = sentences[i].rstrip() + "\n\n"
        docs.append("".join(sentences).strip())
    return docs


def write_sample_corpus(output_dir: str, files: int = 4, documents_per_file: int = 2000,
                        seed: int = 0) -> list[str]:
    """Write ``files`` jsonl shards (``shard_0.jsonl`` …) of ``{"id", "text"}`` documents."""
    os.makedirs(output_dir, exist_ok=True)
    paths = []
    for f in range(files):
        docs = sample_documents(documents_per_file, seed=seed * 1000 + f)
        path = os.path.join(output_dir, f"shard_{f}.jsonl")
        with open(path, "w", encoding="utf-8") as out:
            for i, text in enumerate(docs):
                out.write(json.dumps({"id": f"{f}-{i}", "text": text}, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths


def train_sample_tokenizer(path: str, vocab_size: int = 2000, documents: int = 3000, seed: int = 99) -> str:
    """A real byte-level BPE tokenizer (GPT-2 style, ``<|endoftext|>`` special) trained on the sample
    corpus, saved as ``tokenizer.json``: for tests, demos and benchmarks, with nothing downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(sample_documents(documents, seed=seed), trainer)
    tok.save(path)
    return path
