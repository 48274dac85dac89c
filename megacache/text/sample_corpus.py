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


def train_sample_tokenizer(path: str, vocab_size: int = 2000, documents: int = 3000, seed: int = 99,
                           natural: bool = False) -> str:
    """A real byte-level BPE tokenizer (GPT-2 style, ``<|endoftext|>`` special) trained on the sample
    corpus (``natural``: on ``natural_documents``), saved as ``tokenizer.json``: for tests, demos and
    benchmarks, with nothing downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = natural_documents(documents, seed) if natural else sample_documents(documents, seed=seed)
    tok.train_from_iterator(text, trainer)
    tok.save(path)
    return path


# Prose with a natural vocabulary: what tokenizer throughput is measured on. The word lists above
# repeat a few hundred words, which any encoder caching its pre-tokens serves from cache; natural
# text follows Zipf's law over a vocabulary that keeps growing, so encoders meet new words all along.
_ONSETS = ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "st", "tr", "ch", "sh", "th", "pl", "gr", "br", "cr", "fr", "sp", "qu", "wh")
_NUCLEI = ("a", "e", "i", "o", "u", "ea", "ou", "ai", "ie", "y", "oo", "ee")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck", "x", "rt", "ss", "ght")
_FOREIGN = ("café", "naïve", "Zürich", "señor", "東京", "数据", "λόγος", "данные", "🙂", "→", "½",
            "groß", "été", "niño", "Ωmega", "日本語", "한국어", "עברית", "عربى")


def natural_lexicon(size: int, seed: int = 7) -> np.ndarray:
    """``size`` distinct pseudo-words, shortest first (rank 0 is the most frequent word)."""
    rng = np.random.default_rng(seed)
    syllables = np.array([o + n + c for o in _ONSETS for n in _NUCLEI for c in _CODAS])
    words: dict[str, None] = {}
    while len(words) < size:
        count = rng.choice(4, size, p=(0.3, 0.4, 0.2, 0.1)) + 1
        picks = syllables[rng.integers(len(syllables), size=(size, 4))]
        for row, k in zip(picks, count):
            words["".join(row[:k])] = None
    lexicon = np.array(list(words)[:size], dtype=object)
    return lexicon[np.argsort(np.fromiter(map(len, lexicon), int, size), kind="stable")]


def natural_documents(n: int, seed: int = 0, lexicon: np.ndarray | None = None) -> list[str]:
    """``n`` documents of Zipf-distributed pseudo-words in sentences and paragraphs, with
    capitals, punctuation, numbers, a little code and non-ASCII text."""
    lexicon = natural_lexicon(200_000) if lexicon is None else lexicon
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / (np.arange(len(lexicon)) + 2.7))
    cdf /= cdf[-1]
    lengths = np.minimum(rng.lognormal(5.3, 0.9, n).astype(int) + 5, 20_000)  # words per document
    words = lexicon[np.searchsorted(cdf, rng.random(int(lengths.sum())))]
    marks = rng.random(len(words))
    words[marks < 0.004] = [f"{v}" for v in rng.integers(0, 100_000, int((marks < 0.004).sum()))]
    foreign = (marks >= 0.004) & (marks < 0.006)
    words[foreign] = np.array(_FOREIGN, dtype=object)[rng.integers(len(_FOREIGN), size=int(foreign.sum()))]
    ends = rng.random(len(words))
    # After each word: a sentence end, a paragraph end, a comma or a space; a document's first word
    # and the word after an end are capitalised.
    seps = np.select([ends < 0.07, ends >= 0.995, ends > 0.93], [". ", ".\n\n", ", "], " ").astype(object)
    starts = np.zeros(len(words), bool)
    starts[np.r_[0, np.cumsum(lengths)[:-1]]] = True
    capital = np.flatnonzero(starts | np.r_[True, (ends < 0.07) | (ends >= 0.995)][:-1])
    words[capital] = [w.capitalize() for w in words[capital]]
    pieces = np.empty(2 * len(words), dtype=object)
    pieces[0::2], pieces[1::2] = words, seps
    bounds = 2 * np.r_[0, np.cumsum(lengths)]
    docs = ["".join(pieces[a:b]).strip() for a, b in zip(bounds[:-1], bounds[1:])]
    for i in np.flatnonzero(rng.random(n) < 0.03):
        docs[i] += f"\n\n```\ndef f{i}(x):\n    return x * {lengths[i]} + {i % 97}\n```"
    return docs
