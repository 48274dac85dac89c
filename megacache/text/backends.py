"""Tokenizer backends: the library Megatron runs, or gigatoken, kept exact by a guard.

``tokenization.py`` loads the *reference* tokenizer: the very library Megatron's preprocess_data.py
ends up in (Hugging Face ``tokenizers`` under ``transformers``). gigatoken (a Rust BPE encoder, several
times faster) applies the same pair-merge rule and gives the same ids on every tokenizer we tried,
but that is by design, not by construction for every tokenizer.json. So it only runs behind a guard:

* at load, the self-test: both encode ``SELF_TEST_TEXTS`` plus every added token placed inside text;
  any difference and ``auto`` keeps the reference (``gigatoken`` asked for by name is an error);
* while tokenizing, a deterministic sample of every work unit's documents (``sampled``) is encoded
  again by the reference and compared (``SampleCheck``); the tokenize builder redoes a unit that disagrees with the
  reference, so the bytes written never depend on the backend.

Which tokenizers gigatoken takes: byte-level BPE and SentencePiece-style BPE with byte fallback
(everything else, WordPiece and Unigram among them, it refuses at load and the reference runs), from
a Hugging Face tokenizer.json, a SentencePiece ``.model`` or Megatron's tiktoken rank file.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile

import numpy as np

from ..errors import MegacacheError
from .tokenization import BackendTokenizer, SentencePieceModel, TiktokenVocabulary, Tokenizer

BACKENDS = ("auto", "gigatoken", "hf")

#: Fraction of documents the reference encodes again. The reference is several times slower per
#: token than gigatoken (the more so on text whose words gigatoken's pre-token cache serves well,
#: such as the benchmark's generated text); at this fraction the check costs a few percent of the
#: throughput at most, and still checks about forty documents of every 64 MB work unit.
DEFAULT_VERIFY_FRACTION = 0.0005

#: What the self-test encodes with both backends, besides the tokenizer's own added tokens.
SELF_TEST_TEXTS = (
    "",
    " ",
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\r\nand\n\n\nblank lines\u3000ideographic space\u00a0nbsp",
    "    deeply    indented     words\t\t\tand tabs",
    "combining: e\u0301 a\u0308 n\u0303; precomposed: \u00e9 \u00e4 \u00f1; Hangul \u1100\u1161 \uac00",
    "emoji: \U0001f600\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467 \u2764\ufe0f flags \U0001f1e9\U0001f1ea",
    "CJK \u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 Cyrillic \u043f\u0440\u0438\u0432\u0435\u0442 Arabic \u0645\u0631\u062d\u0628\u0627",
    "def f(x):\n    return {'a': [x ** 2, x // 3]}  # code\n\nif __name__ == '__main__':\n\tprint(f(7))",
    "numbers 0 1 12 123 1234 12345 3.14159 -42 1e-9 0xFF 2026-11-24",
    "a" * 3000,
    "ab " * 1000,
    "\U0001f600" * 300,
    "!!!???...,,,;;;:::---___===+++***",
    "zero\u200bwidth\u200cjoiners\u200d and \ufeffBOM and \u0000 NUL and \x7f DEL",
    "mixed CASE Words ALLCAPS camelCase snake_case kebab-case",
)


class GigatokenTokenizer(Tokenizer):
    """gigatoken's ids for the reference's tokenizer: same name, vocab_size and EOD."""

    backend = "gigatoken"

    def __init__(self, reference: Tokenizer, engine, parallel: bool, id_map=None):
        self.reference = reference
        self._id_map = id_map  # gigatoken's ids to the reference's, where they differ
        self.name = reference.name
        self.vocab_size = reference.vocab_size
        self.eod = reference.eod
        self._engine = engine
        self._parallel = parallel

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        try:
            encoded = self._engine.encode_batch(texts, parallel=self._parallel)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # a Rust panic included
            # What gigatoken refuses (not a list of str, unpaired surrogates): the reference's ids,
            # or its error naming the document.
            return self.reference.encode_batch(texts)
        offsets = np.asarray(encoded.layout.offsets.data)
        lengths = np.diff(offsets)
        ids = np.asarray(encoded.layout.content.data)[offsets[0]:offsets[-1]]
        if self._id_map is not None:
            ids = self._id_map(ids)
        return ids, lengths


def select_backend(reference: Tokenizer, backend: str, threads: int, strict: bool) -> tuple[Tokenizer, str]:
    """The tokenizer to encode with, and a line saying which backend runs and why.

    ``backend``: ``auto`` (gigatoken where it loads the tokenizer and passes the self-test, else the
    reference), ``gigatoken`` (an error where it cannot run exactly) or ``hf`` (the reference).
    ``strict`` makes a failed self-test an error too."""
    if backend not in BACKENDS:
        raise MegacacheError(f"--tokenizer-backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "hf":
        return reference, f"{reference.backend} (--tokenizer-backend hf)"

    def fall_back(why: str, disagreement: bool = False) -> tuple[Tokenizer, str]:
        if backend == "gigatoken" or (strict and disagreement):
            flag = "--tokenizer-backend gigatoken" if backend == "gigatoken" else "--strict-backend"
            raise MegacacheError(f"{flag}: {why}; use --tokenizer-backend auto or hf")
        return reference, f"{reference.backend} ({why})"

    try:
        import gigatoken
    except ImportError:
        return fall_back("the gigatoken package is not installed")
    try:
        engine, id_map = _gigatoken_engine(gigatoken, reference)
    except _NotForGigatoken as exc:
        return fall_back(str(exc))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # errors for what it does not support; a Rust panic is a BaseException
        return fall_back(f"gigatoken cannot load it: {(str(exc).splitlines() or [type(exc).__name__])[0]}")
    fast = GigatokenTokenizer(reference, engine, parallel=threads > 1, id_map=id_map)
    texts = self_test_texts(reference.added_tokens())
    problem = first_difference(fast, reference, texts)
    if problem is not None:
        return fall_back(f"gigatoken disagrees with {reference.backend} on the self-test text {texts[problem]!r}",
                         disagreement=True)
    version = getattr(gigatoken, "__version__", None) or _distribution_version("gigatoken")
    return fast, f"gigatoken {version} (self-test equal to {reference.backend} on {len(texts)} texts)"


class _NotForGigatoken(Exception):
    pass


def _gigatoken_engine(gigatoken, reference: Tokenizer):
    """gigatoken's tokenizer for the same files and the map of its ids to the reference's (None:
    the same ids), or _NotForGigatoken saying why there is none."""
    if isinstance(reference, BackendTokenizer):
        if reference.splits_special_tokens:
            raise _NotForGigatoken("gigatoken always matches special tokens in text, this tokenizer splits them")
        return gigatoken.Tokenizer.from_json(reference.tokenizer_json()), None
    if isinstance(reference, TiktokenVocabulary):
        return _tiktoken_engine(gigatoken, reference)
    if isinstance(reference, SentencePieceModel):
        # gigatoken's conversion lists the control symbols (<s>, </s>) as special tokens, which it
        # then matches in text; SentencePiece never makes them from text, so they are left out.
        from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json

        with open(reference.model_file, "rb") as f:
            converted = json.loads(sentencepiece_to_tokenizer_json(f.read()))
        control = set(reference.control_ids())
        converted["added_tokens"] = [t for t in converted.get("added_tokens") or [] if t["id"] not in control]
        return gigatoken.Tokenizer.from_json(json.dumps(converted)), None
    raise _NotForGigatoken(f"gigatoken does not apply to {reference.name}")


def _tiktoken_engine(gigatoken, reference: TiktokenVocabulary):
    """gigatoken on Megatron's tiktoken vocabulary. gigatoken wants ranks from 0 without gaps, where
    Megatron's ids put the special tokens first: it gets the ranks unshifted and the special tokens
    after them, and ``GigatokenTokenizer`` maps its ids back (``_TiktokenIds``). Its "nemotron"
    pre-tokenizer is Megatron's v2 pattern; v1 has no equal there."""
    if reference.pattern != "v2":
        raise _NotForGigatoken(f"gigatoken has no pre-tokenizer equal to Megatron's tiktoken pattern {reference.pattern}")
    ranks = len(reference.ranks)
    shift = len(reference.special_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ranks.tiktoken")
        with open(path, "w") as f:
            f.writelines(f"{base64.b64encode(token).decode()} {rank - shift}\n" for token, rank in reference.ranks.items())
        engine = gigatoken.Tokenizer.from_tiktoken(
            path, pretokenizer="nemotron", special_tokens={t: ranks + i for i, t in enumerate(reference.special_tokens)})
    return engine, _TiktokenIds(ranks, shift)


class _TiktokenIds:
    """gigatoken's ids to Megatron's: ranks move up past the special tokens, special tokens to the front."""

    def __init__(self, ranks: int, shift: int):
        self.ranks, self.shift = ranks, shift

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = ids.astype(np.int64)
        return np.where(ids >= self.ranks, ids - self.ranks, ids + self.shift)


def self_test_texts(added_tokens: list[str]) -> list[str]:
    """SELF_TEST_TEXTS plus each added token alone, glued to words and spaced out (at most 64)."""
    texts = list(SELF_TEST_TEXTS)
    for token in added_tokens[:64]:
        texts += [token, f"before{token}after", f" {token} ", f"x {token}{token}\n{token}"]
    return texts


def first_difference(tok: Tokenizer, reference: Tokenizer, texts: list[str]) -> int | None:
    """Index of the first text the two encode differently, or None."""
    ids, lengths = tok.encode_batch(texts)
    return _first_unequal(np.arange(len(texts)), ids, lengths, *reference.encode_batch(texts))


def sampled(first: int, count: int, fraction: float, unit: int = 0) -> np.ndarray:
    """Which of documents ``first .. first+count-1`` of work unit ``unit`` the guard checks: a
    boolean mask. A hash of the unit and document numbers decides, so the sample is the same on
    every run and rank count, and different in every unit."""
    if fraction <= 0:
        return np.zeros(count, bool)
    if fraction >= 1:
        return np.ones(count, bool)
    x = np.arange(first, first + count, dtype=np.uint64) + np.uint64(unit << 40)
    # splitmix64's finaliser: a bijection of 64-bit integers that scatters consecutive numbers.
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x < np.uint64(int(fraction * 2.0**64))


class Disagreement(Exception):
    """The fast backend's ids for a document differ from its reference's."""

    def __init__(self, document: int):
        super().__init__(f"document {document}")
        self.document = document  #: its number within the work unit, from 0


class SampleCheck:
    """The guard over one work unit: the ``sampled`` documents of each batch are kept with the fast
    backend's ids and encoded again by the reference a few hundred at a time (one call each: a
    reference call per batch for a document or two costs more than the encoding). ``add`` and
    ``finish`` raise Disagreement."""

    BATCH = 256

    def __init__(self, tok: Tokenizer, fraction: float, unit: int):
        self.tok, self.fraction, self.unit = tok, fraction, unit
        self.checked = 0
        self._texts: list[str] = []
        self._ids: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._numbers: list[np.ndarray] = []

    def add(self, first: int, texts: list[str], ids: np.ndarray, lengths: np.ndarray) -> None:
        """Documents ``first ..`` of the unit: ``texts`` and the fast backend's ``ids``/``lengths``."""
        mask = sampled(first, len(texts), self.fraction, self.unit)
        chosen = np.flatnonzero(mask)
        if chosen.size == 0:
            return
        self._texts += [texts[i] for i in chosen]
        self._ids.append(ids[np.repeat(mask, lengths)])
        self._lengths.append(lengths[chosen])
        self._numbers.append(first + chosen)
        if len(self._texts) >= self.BATCH:
            self.finish()

    def finish(self) -> None:
        if not self._texts:
            return
        ref_ids, ref_lengths = self.tok.reference.encode_batch(self._texts)
        numbers = np.concatenate(self._numbers)
        wrong = _first_unequal(numbers, np.concatenate(self._ids), np.concatenate(self._lengths),
                               ref_ids, ref_lengths)
        self.checked += len(self._texts)
        self._texts, self._ids, self._lengths, self._numbers = [], [], [], []
        if wrong is not None:
            raise Disagreement(wrong)


def _first_unequal(numbers, ids, lengths, ref_ids, ref_lengths) -> int | None:
    """``numbers[k]`` for a document k the two encodings disagree on (the first of a different
    length, else the first with different ids), or None."""
    if np.array_equal(lengths, ref_lengths):
        if np.array_equal(ids, ref_ids):
            return None
        doc = np.repeat(np.arange(len(lengths)), lengths)
        return int(numbers[doc[np.flatnonzero(ids != ref_ids)[0]]])
    return int(numbers[np.flatnonzero(lengths != ref_lengths)[0]])


def _distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "(version unknown)"
