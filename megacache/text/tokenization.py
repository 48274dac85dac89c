"""Tokenizers for ``megacache tokenize``: the ids, EOD and vocab size Megatron's preprocess_data gets.

Megatron-LM's ``tools/preprocess_data.py`` builds its tokenizer with megatron-core's ``build_tokenizer``
and calls ``tokenizer.tokenize(text)`` per document (per sentence), appending ``tokenizer.eod`` with
``--append-eod``; the ``.bin`` dtype follows ``tokenizer.vocab_size``. The SentencePiece types and
TikTokenizer are the ``sentencepiece`` and ``tiktoken`` libraries (``SentencePieceModel``,
``TiktokenVocabulary``; docs/megatron.md §5). Every other file-based text tokenizer wraps a
``transformers`` tokenizer (``HuggingFaceTokenizer``; GPT-2 and BERT
go through ``MegatronHFTokenizer``, a ``HuggingFaceTokenizer`` on the hub's ``gpt2`` /
``bert-large-(un)cased`` tokenizer classes with the given vocabulary) and ``tokenize`` is
``convert_tokens_to_ids(tokenize(text))`` with no special tokens added. So we build the very same
``transformers`` tokenizer from the user's files, apply the special-token defaults Megatron's wrapper
applies, and then encode whole batches with its Rust backend (``tokenizers``), which is what
``transformers`` runs underneath (we refuse classes that tokenize in Python instead). Only the byte
tokenizer needs neither library.

What each tokenizer reports (all checked against megatron-core 0.16.1 in tests/conformance/test_tokenizers.py):

* ``vocab_size`` = ``len(transformers tokenizer)``, i.e. with added tokens (Megatron's choice);
* ``eod`` = the eos token, or the sep token when there is no eos (so ``[SEP]`` for BERT,
  ``<|endoftext|>`` for GPT-2); when no configuration names either (a lone tokenizer.json), a
  conventional end-of-text special token (``CONVENTIONAL_EOD_TOKENS``) if the file defines one, else
  None (pass ``eod_id``);
* ``BertWordPieceCase`` adds Megatron's 100 ``<extra_id_N>`` tokens (vocab_size + 100);
* ``NullTokenizer`` parses space-separated integer ids, ``eod`` = its vocab_size argument.

Where megatron-core 0.16.1 itself cannot load the files, we load them as it would if it could:
GPT2BPETokenizer / BertWordPiece* need the hub repos named above (and pass the vocab file as the
merges file), and a tokenizer.json given by absolute path fails transformers' repo-id check.

Threads: the Rust backend encodes a batch on the ``rayon`` thread pool of the ``tokenizers``
extension. ``TOKENIZERS_PARALLELISM`` is read on every call, but ``RAYON_NUM_THREADS`` only once,
when that pool starts (the first parallel encode or training in the process); afterwards its size is
fixed. ``load_tokenizer(threads=n)`` therefore sets ``TOKENIZERS_PARALLELISM=false`` for n == 1
(always effective) and ``RAYON_NUM_THREADS=n`` otherwise, which takes effect only if it runs before
the first parallel encode of the process: call it before tokenizing anything. A later request for
another size warns.

Nothing in the tokenizer files is executed: ``trust_remote_code`` is off, and ``transformers``
refuses tokenizer directories that ask for custom code.
"""

from __future__ import annotations

import os
import warnings
from itertools import chain
from operator import attrgetter

import numpy as np

from ..errors import MegacacheError
from ..megatron.tokenizer import (BERT_CASED_EXTRA_TOKENS, MEGATRON_TYPES, SENTENCEPIECE_TYPES,
                                 TIKTOKEN_DEFAULT_PATTERN, TIKTOKEN_DEFAULT_VOCAB_SIZE, TIKTOKEN_FILLER,
                                 TIKTOKEN_PATTERNS, TIKTOKEN_REQUIRED_SPECIALS, check_tiktoken)

#: The embedded byte tokenizer: ids 0..255 are UTF-8 bytes, EOD is 256.
BYTE_EOD = 256
BYTE_VOCAB_SIZE = 257

#: End-of-text special tokens, tried in order, when no configuration names an eos or sep token.
CONVENTIONAL_EOD_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")

#: ``--tokenizer-type`` values of Megatron whose ids ``tokenize`` reproduces; the rest of Megatron's
#: types are refused.
SUPPORTED_TYPES = (
    "HuggingFaceTokenizer",
    "GPT2BPETokenizer",
    "BertWordPieceLowerCase",
    "BertWordPieceCase",
    "NullTokenizer",
    *SENTENCEPIECE_TYPES,
    "TikTokenizer",
)
UNSUPPORTED_TYPES = tuple(t for t in MEGATRON_TYPES if t not in SUPPORTED_TYPES)

_SPEC_HELP = (
    "expected 'byte', a Hugging Face tokenizer.json file, a directory holding tokenizer.json or "
    "tokenizer_config.json, a directory holding GPT-2 vocab.json + merges.txt, or a BERT vocab.txt "
    "(file or directory holding one)"
)

NO_TOKENIZER = (
    "no tokenizer given: pass --tokenizer SPEC (a tokenizer.json, a directory holding a Hugging Face "
    "or GPT-2 tokenizer, or a BERT vocab.txt) or --tokenizer-type TYPE with its files, as for "
    "Megatron-LM's preprocess_data.py; --tokenizer byte picks the raw UTF-8 byte tokenizer "
    "(ids 0..255, EOD 256) explicitly"
)

_IDS = attrgetter("ids")

# RAYON_NUM_THREADS in effect when this process first encoded in parallel: the pool size from then on.
_rayon_pool_threads: list[str | None] = []


class Tokenizer:
    """A loaded tokenizer: what ``megacache tokenize`` needs from it."""

    name: str  #: short human description
    backend = "builtin"  #: the library that encodes (see backends.py)
    reference: Tokenizer | None = None  #: for a fast backend, the tokenizer whose ids it must equal
    vocab_size: int  #: what Megatron's tokenizer reports as vocab_size (decides uint16 vs int32)
    eod: int | None  #: end-of-document id, None if the tokenizer has none and none was given

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode documents: (all ids concatenated, int64; each document's token count, int64)."""
        raise NotImplementedError

    def added_tokens(self) -> list[str]:
        """Special tokens a text may contain (what a second backend must treat alike)."""
        return []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: vocab_size={self.vocab_size} eod={self.eod}>"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, EOD 256, vocab_size 257 (Megatron's ByteLevelTokenizer's ids)."""

    def __init__(self):
        self.name = "byte-level (UTF-8 bytes, EOD 256)"
        self.vocab_size = BYTE_VOCAB_SIZE
        self.eod = BYTE_EOD

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        try:
            encoded = [text.encode("utf-8") for text in texts]
        except (AttributeError, UnicodeEncodeError) as exc:
            raise _bad_document(texts) from exc
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        ids = np.frombuffer(b"".join(encoded), np.uint8).astype(np.int64)
        return ids, lengths


class NullTextTokenizer(Tokenizer):
    """Megatron's NullTokenizer: a document is its ids written as integers separated by single spaces."""

    def __init__(self, vocab_size: int):
        self.name = f"NullTokenizer (space-separated ids, vocab size {vocab_size})"
        # Megatron's NullTokenizer puts EOD right after the given vocabulary.
        self.vocab_size = vocab_size + 1
        self.eod = vocab_size

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        try:
            pieces = [text.split(" ") for text in texts]
            lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
            ids = np.fromiter(map(int, chain.from_iterable(pieces)), np.int64, int(lengths.sum()))
        except (AttributeError, ValueError, OverflowError) as exc:
            raise _bad_null_document(texts) from exc
        return ids, lengths


class BackendTokenizer(Tokenizer):
    """A ``transformers`` tokenizer, encoded in batches by its Rust backend."""

    backend = "hf"

    def __init__(self, hf_tokenizer, name: str, *, include_special_tokens: bool = False):
        self.name = name
        self.vocab_size = len(hf_tokenizer)
        eos = hf_tokenizer.eos_token
        self.eod = None if eos is None else hf_tokenizer.convert_tokens_to_ids(eos)
        if self.eod is None:
            # Nothing names an eos (a lone tokenizer.json: megatron-core cannot load one by path at
            # all). A conventional end-of-text special token is what such a file means by it.
            special = {t.content: i for i, t in hf_tokenizer.added_tokens_decoder.items() if t.special}
            found = next((t for t in CONVENTIONAL_EOD_TOKENS if t in special), None)
            if found is not None:
                self.eod = special[found]
                self.name += f", EOD {found!r}"
        # transformers runs exactly this backend for `tokenize`/`__call__`, after switching off its
        # truncation and padding and setting how literal special tokens are treated.
        self.hf = hf_tokenizer  # its chat template and special tokens (SFT examples)
        self._backend = hf_tokenizer.backend_tokenizer
        self._backend.no_truncation()
        self._backend.no_padding()
        self.splits_special_tokens = bool(hf_tokenizer.split_special_tokens)
        self._backend.encode_special_tokens = self.splits_special_tokens
        self._add_special_tokens = include_special_tokens
        if not include_special_tokens:
            # Without special tokens a post-processor only sets type ids and offsets, never ids, but it
            # still copies every encoding: work on every document for nothing.
            self._backend.post_processor = None

    def tokenizer_json(self) -> str:
        """The tokenizer.json of exactly what encodes: added tokens and switches included."""
        return self._backend.to_str()

    def added_tokens(self) -> list[str]:
        return [t.content for t in self._backend.get_added_tokens_decoder().values()]

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not _rayon_pool_threads and _parallelism_enabled():
            _rayon_pool_threads.append(os.environ.get("RAYON_NUM_THREADS"))
        try:
            encodings = self._backend.encode_batch_fast(texts, add_special_tokens=self._add_special_tokens)
        except TypeError as exc:
            raise _bad_document(texts) from exc
        lengths = np.fromiter(map(len, encodings), np.int64, len(encodings))
        # Each document's id list is made, copied and freed in turn, while it is still in cache.
        ids = np.fromiter(chain.from_iterable(map(_IDS, encodings)), np.int64, int(lengths.sum()))
        return ids, lengths


class SentencePieceModel(Tokenizer):
    """Megatron's SentencePiece types (SentencePieceTokenizer, GPTSentencePieceTokenizer,
    Llama2Tokenizer): megatron-core builds all three as its sentencepiece library, whose ids are
    ``encode_as_ids(text)`` of the model, vocab_size the model's piece count, EOD its eos id."""

    backend = "sentencepiece"

    def __init__(self, path: str, threads: int):
        try:
            import sentencepiece
        except ImportError as exc:
            raise MegacacheError("SentencePiece tokenizer types need the 'sentencepiece' package: "
                                 "pip install sentencepiece") from exc
        self.model_file = path
        self._model = sentencepiece.SentencePieceProcessor()
        try:
            self._model.Load(path)
        except (OSError, RuntimeError) as exc:
            raise MegacacheError(f"--tokenizer-model {path}: not a SentencePiece model ({exc})") from exc
        self.name = f"SentencePiece model ({path})"
        self.vocab_size = self._model.get_piece_size()
        eos = self._model.eos_id()
        # A model trained without eos says -1, which Megatron would append and wrap.
        self.eod = eos if eos >= 0 else None
        self._threads = threads

    def control_ids(self) -> list[int]:
        """Ids of the control symbols (``<s>``, ``</s>``): never produced from text."""
        return [i for i in range(self.vocab_size) if self._model.is_control(i)]

    def added_tokens(self) -> list[str]:
        model = self._model
        return [model.id_to_piece(i) for i in range(self.vocab_size) if model.is_control(i) or model.is_unknown(i)]

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        try:
            encoded = self._model.encode(texts, out_type=int, num_threads=self._threads)
        except (TypeError, RuntimeError) as exc:
            raise _bad_document(texts) from exc
        return _flatten(encoded)


class TiktokenVocabulary(Tokenizer):
    """Megatron's TikTokenizer: a JSON list of ``{"rank", "token_bytes" (base64), "token_str"}``
    entries whose ids follow ``num_special_tokens`` special tokens; ``encode(text,
    allowed_special="all")``, so special tokens written in the text are special."""

    backend = "tiktoken"

    def __init__(self, path: str, pattern: str | None, vocab_size: int | None, num_special_tokens: int,
                 special_tokens: list[str] | None, threads: int):
        try:
            import tiktoken
        except ImportError as exc:
            raise MegacacheError("TikTokenizer needs the 'tiktoken' package: pip install tiktoken") from exc
        pattern = pattern or TIKTOKEN_DEFAULT_PATTERN
        vocab_size = vocab_size or TIKTOKEN_DEFAULT_VOCAB_SIZE  # 0 too: Megatron passes it only when truthy
        check_tiktoken({"tiktoken_pattern": pattern, "tiktoken_num_special_tokens": num_special_tokens},
                       special_tokens)
        if not num_special_tokens < vocab_size:
            raise MegacacheError(f"--tiktoken-num-special-tokens {num_special_tokens} must be below the "
                                 f"vocabulary size {vocab_size} (megatron-core asserts)")
        special = list(special_tokens or TIKTOKEN_REQUIRED_SPECIALS)
        special += [TIKTOKEN_FILLER.format(id=i) for i in range(len(special), num_special_tokens)]
        if len(set(special)) != len(special):
            raise MegacacheError("the special tokens collide with megatron-core's <SPECIAL_N> fillers")
        ranks = _tiktoken_ranks(path, vocab_size - num_special_tokens, num_special_tokens)
        self.name = f"tiktoken vocabulary ({path}, pattern {pattern}, {num_special_tokens} special tokens)"
        self.vocab_size = vocab_size
        self.eod = special.index("</s>")
        self._encoding = tiktoken.Encoding(name=os.path.basename(os.path.dirname(os.path.abspath(path))),
                                           pat_str=TIKTOKEN_PATTERNS[pattern], mergeable_ranks=ranks,
                                           special_tokens={t: i for i, t in enumerate(special)})
        self.rank_file, self.pattern, self.special_tokens, self.ranks = path, pattern, special, ranks
        self._threads = threads

    def added_tokens(self) -> list[str]:
        return self.special_tokens

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not all(isinstance(t, str) for t in texts):
            raise _bad_document(texts)
        encoded = self._encoding.encode_batch(texts, num_threads=self._threads, allowed_special="all")
        return _flatten(encoded)


def _tiktoken_ranks(path: str, entries: int, shift: int) -> dict[bytes, int]:
    """The first ``entries`` ranks of Megatron's tiktoken JSON file, shifted past the special tokens,
    with megatron-core's checks made errors that name the file and entry."""
    import base64
    import binascii
    import json

    if not path.endswith(".json"):
        raise MegacacheError(f"--tokenizer-model {path}: megatron-core reads a TikTokenizer vocabulary "
                             "from a .json file (a list of rank, token_bytes, token_str entries)")
    try:
        with open(path, encoding="utf-8") as f:
            vocab = json.load(f)
    except (OSError, ValueError) as exc:
        raise MegacacheError(f"--tokenizer-model {path}: cannot read it as JSON ({exc})") from exc
    if not isinstance(vocab, list):
        raise MegacacheError(f"--tokenizer-model {path}: the top level must be a list of entries")
    if len(vocab) < entries:
        raise MegacacheError(
            f"--tokenizer-model {path}: {len(vocab)} entries, but the vocabulary size less the special "
            f"tokens asks for {entries}: pass --vocab-size {len(vocab)} + --tiktoken-num-special-tokens "
            "(megatron-core asserts)")
    ranks: dict[bytes, int] = {}
    for i, entry in enumerate(vocab[:entries]):
        if not (isinstance(entry, dict) and entry.keys() == {"rank", "token_bytes", "token_str"}
                and entry["rank"] == i):
            raise MegacacheError(f"--tokenizer-model {path}: entry {i} must be {{\"rank\": {i}, \"token_bytes\": "
                                 "..., \"token_str\": ...}")
        try:
            token = base64.b64decode(entry["token_bytes"], validate=True)
        except (binascii.Error, TypeError) as exc:
            raise MegacacheError(f"--tokenizer-model {path}: entry {i}: token_bytes is not base64") from exc
        if i < 256 and token != bytes([i]):
            raise MegacacheError(f"--tokenizer-model {path}: entry {i} must be the single byte {i}")
        ranks[token] = i + shift
    if len(ranks) != entries:
        raise MegacacheError(f"--tokenizer-model {path}: some token_bytes repeat")
    return ranks


def _flatten(encoded: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    return np.fromiter(chain.from_iterable(encoded), np.int64, int(lengths.sum())), lengths


def require_tokenizer(spec: str | None, tokenizer_type: str | None, tokenizer_model: str | None = None,
                      vocab_file: str | None = None, merge_file: str | None = None) -> None:
    """A tokenizer must be named, as Megatron-LM's preprocess_data.py requires --tokenizer-type (raw
    bytes are never a silent default), and its files by their type."""
    if tokenizer_type is None:
        if tokenizer_model or vocab_file or merge_file:
            raise MegacacheError(
                "tokenizer files were given without a tokenizer type: add --tokenizer-type "
                f"({', '.join(SUPPORTED_TYPES)}), or pass the file or directory as --tokenizer"
            )
        if spec is None:
            raise MegacacheError(NO_TOKENIZER)


def load_tokenizer(
    spec: str | None = None,
    *,
    tokenizer_type: str | None = None,
    tokenizer_model: str | None = None,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    eod_id: int | None = None,
    threads: int | None = None,
    vocab_size: int | None = None,
    include_special_tokens: bool = False,
    special_tokens: list[str] | None = None,
    tiktoken_pattern: str | None = None,
    tiktoken_num_special_tokens: int = 1000,
) -> Tokenizer:
    """Load the tokenizer named by ``spec`` (``--tokenizer``) or by Megatron's flags.

    ``spec``: "byte" (embedded byte tokenizer), a tokenizer.json, a directory holding a
    Hugging Face tokenizer, a directory holding GPT-2 vocab.json + merges.txt, or a BERT vocab.txt (file
    or directory; lower-case unless ``tokenizer_type="BertWordPieceCase"``).
    Megatron's flags: ``tokenizer_type`` (one of SUPPORTED_TYPES) with ``tokenizer_model``
    (HuggingFaceTokenizer), ``vocab_file`` + ``merge_file`` (GPT2BPETokenizer), ``vocab_file`` (BERT),
    ``vocab_size`` (NullTokenizer), ``tokenizer_model`` (the SentencePiece types: a ``.model`` file),
    ``tokenizer_model`` + ``tiktoken_pattern`` + ``vocab_size`` + ``tiktoken_num_special_tokens``
    (TikTokenizer: a ``.json`` rank file); ``include_special_tokens`` is
    ``--tokenizer-hf-include-special-tokens`` and ``special_tokens`` is ``--tokenizer-special-tokens``. With a ``tokenizer_type``, a ``spec`` path
    stands in for the file flags that are not given.
    ``eod_id`` overrides the tokenizer's EOD. ``threads`` caps the encoding threads (see module doc).
    """
    require_tokenizer(spec, tokenizer_type, tokenizer_model, vocab_file, merge_file)
    if threads is not None:
        _cap_threads(threads)
    if tokenizer_type is None:
        tokenizer = _from_spec(spec, include_special_tokens, special_tokens)
    else:
        tokenizer = _from_megatron_flags(
            tokenizer_type, spec, tokenizer_model, vocab_file, merge_file, vocab_size,
            include_special_tokens, special_tokens, tiktoken_pattern, tiktoken_num_special_tokens,
            threads or 1,
        )
    if eod_id is not None:
        if not 0 <= eod_id < tokenizer.vocab_size:
            raise MegacacheError(
                f"--eod-id {eod_id} is outside the vocabulary of {tokenizer.name} "
                f"(ids 0..{tokenizer.vocab_size - 1})"
            )
        tokenizer.eod = eod_id
    return tokenizer


def _from_spec(spec, include_special_tokens, special_tokens) -> Tokenizer:
    if spec == "byte":
        return ByteTokenizer()
    if os.path.isdir(spec):
        if _has(spec, "tokenizer.json") or _has(spec, "tokenizer_config.json"):
            return _huggingface(spec, include_special_tokens, special_tokens)
        if _has(spec, "vocab.json") and _has(spec, "merges.txt"):
            return _gpt2(
                os.path.join(spec, "vocab.json"), os.path.join(spec, "merges.txt"),
                include_special_tokens, special_tokens,
            )
        if _has(spec, "vocab.txt"):
            return _bert(os.path.join(spec, "vocab.txt"), False, include_special_tokens, special_tokens)
        raise MegacacheError(
            f"--tokenizer {spec}: the directory holds none of tokenizer.json, tokenizer_config.json, "
            f"vocab.json + merges.txt, vocab.txt; {_SPEC_HELP}"
        )
    if os.path.isfile(spec):
        base = os.path.basename(spec)
        if base == "vocab.json" or base == "merges.txt":
            raise MegacacheError(
                f"--tokenizer {spec}: a GPT-2 BPE tokenizer needs both vocab.json and merges.txt: pass "
                "the directory holding them, or --tokenizer-type GPT2BPETokenizer with --vocab-file and "
                "--merge-file"
            )
        if base.endswith(".json"):
            return _huggingface(spec, include_special_tokens, special_tokens)
        if base.endswith(".txt"):
            return _bert(spec, False, include_special_tokens, special_tokens)
        raise MegacacheError(f"--tokenizer {spec}: unknown kind of tokenizer file; {_SPEC_HELP}")
    raise MegacacheError(
        f"--tokenizer {spec}: no such file or directory ({_SPEC_HELP}; nothing is downloaded, so "
        "hub names such as 'gpt2' must first be saved to a local directory)"
    )


def _from_megatron_flags(
    tokenizer_type, spec, tokenizer_model, vocab_file, merge_file, vocab_size,
    include_special_tokens, special_tokens, tiktoken_pattern, tiktoken_num_special_tokens, threads,
) -> Tokenizer:
    if tokenizer_type in UNSUPPORTED_TYPES:
        raise MegacacheError(
            f"--tokenizer-type {tokenizer_type} is not supported; supported: {', '.join(SUPPORTED_TYPES)}"
        )
    if tokenizer_type in SENTENCEPIECE_TYPES:
        path = _required_path(tokenizer_model or spec, "--tokenizer-model", tokenizer_type)
        if special_tokens:
            raise MegacacheError(
                f"--tokenizer-special-tokens with {tokenizer_type} needs Megatron's "
                "--tokenizer-sentencepiece-legacy wrapper, which megacache does not reproduce; give the "
                "model its special tokens when training it")
        return SentencePieceModel(path, threads)
    if tokenizer_type == "TikTokenizer":
        path = _required_path(tokenizer_model or spec, "--tokenizer-model", tokenizer_type)
        return TiktokenVocabulary(path, tiktoken_pattern, vocab_size, tiktoken_num_special_tokens,
                                  special_tokens, threads)
    if tokenizer_type == "HuggingFaceTokenizer":
        path = _required_path(tokenizer_model or spec, "--tokenizer-model", tokenizer_type)
        if vocab_file or merge_file:
            raise MegacacheError(
                "--vocab-file/--merge-file are not supported with HuggingFaceTokenizer: pass the "
                "directory holding the tokenizer files as --tokenizer-model"
            )
        if os.path.isdir(path) and not (_has(path, "tokenizer.json") or _has(path, "tokenizer_config.json")):
            raise MegacacheError(
                f"--tokenizer-model {path}: the directory holds neither tokenizer.json nor tokenizer_config.json"
            )
        return _huggingface(path, include_special_tokens, special_tokens)
    if tokenizer_type == "GPT2BPETokenizer":
        vocab = _required_path(vocab_file or _in_dir(spec, "vocab.json"), "--vocab-file", tokenizer_type)
        merges = _required_path(merge_file or _in_dir(spec, "merges.txt"), "--merge-file", tokenizer_type)
        return _gpt2(vocab, merges, include_special_tokens, special_tokens)
    if tokenizer_type in ("BertWordPieceLowerCase", "BertWordPieceCase"):
        spec_vocab = spec if spec and os.path.isfile(spec) else _in_dir(spec, "vocab.txt")
        vocab = _required_path(vocab_file or spec_vocab, "--vocab-file", tokenizer_type)
        return _bert(vocab, tokenizer_type == "BertWordPieceCase", include_special_tokens, special_tokens)
    if tokenizer_type == "NullTokenizer":
        if vocab_size is None or vocab_size < 1:
            raise MegacacheError(
                "--tokenizer-type NullTokenizer needs --vocab-size (a positive number of ids; EOD is that number)"
            )
        return NullTextTokenizer(vocab_size)
    raise MegacacheError(
        f"unknown --tokenizer-type {tokenizer_type!r}; supported: {', '.join(SUPPORTED_TYPES)}"
    )


def _huggingface(path, include_special_tokens, special_tokens) -> Tokenizer:
    def make(transformers):
        if os.path.isfile(path):
            # What AutoTokenizer builds from a lone tokenizer.json: the generic class, no config. (It
            # first checks the path as a hub repo id, which fails for absolute paths and offline.)
            return transformers.TokenizersBackend(tokenizer_file=path)
        return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)

    return _from_transformers(make, f"Hugging Face tokenizer {path}", special_tokens,
                              f"Hugging Face tokenizer ({path})", include_special_tokens)


def _gpt2(vocab, merges, include_special_tokens, special_tokens) -> Tokenizer:
    # Megatron's GPT2BPETokenizer is transformers' GPT2Tokenizer as configured for the hub's "gpt2".
    return _from_transformers(lambda transformers: transformers.GPT2Tokenizer(vocab=vocab, merges=merges),
                              f"GPT-2 BPE files {vocab} + {merges}", special_tokens,
                              f"GPT-2 BPE ({vocab} + {merges})", include_special_tokens)


def _bert(vocab, cased, include_special_tokens, special_tokens) -> Tokenizer:
    # Megatron's BertWordPiece* are transformers' BertTokenizer as configured for the hub's
    # bert-large-cased / bert-large-uncased; the cased one always gets the <extra_id_N> tokens and
    # ignores --tokenizer-special-tokens.
    kind = "cased" if cased else "lower-case"
    return _from_transformers(lambda transformers: transformers.BertTokenizer(vocab=vocab, do_lower_case=not cased),
                              f"BERT vocabulary {vocab}", list(BERT_CASED_EXTRA_TOKENS) if cased else special_tokens,
                              f"BERT WordPiece {kind} ({vocab})", include_special_tokens)


def _from_transformers(make, files: str, special_tokens, description: str, include_special_tokens) -> Tokenizer:
    """The transformers tokenizer ``make(transformers)`` returns, with megatron-core's special tokens,
    as megacache's ``Tokenizer``; ``files`` says what it is read from when it cannot be."""
    transformers = _import_transformers()
    try:
        hf = make(transformers)
    except Exception as exc:  # transformers raises many types for unreadable files or custom-code tokenizers
        raise MegacacheError(f"cannot load the {files}: {exc}") from exc
    _megatron_special_tokens(hf, special_tokens)
    return _backend_tokenizer(hf, description, include_special_tokens)


def _megatron_special_tokens(hf, additional) -> None:
    """The defaults megatron-core's HuggingFaceTokenizer wrapper sets on every tokenizer it loads.

    A missing sep token becomes the eos token and a missing eos the sep token; likewise bos and cls.
    The additional special tokens (none by default) are set, which adds any not in the vocabulary.
    """
    mapping = {"additional_special_tokens": list(additional or [])}
    if hf.sep_token is None and hf.eos_token:
        mapping["sep_token"] = hf.eos_token
    elif hf.eos_token is None and hf.sep_token:
        mapping["eos_token"] = hf.sep_token
    if hf.bos_token is None and hf.cls_token:
        mapping["bos_token"] = hf.cls_token
    if hf.cls_token is None and hf.bos_token:
        mapping["cls_token"] = hf.bos_token
    hf.add_special_tokens(mapping)


def _backend_tokenizer(hf, name, include_special_tokens) -> BackendTokenizer:
    from transformers import TokenizersBackend

    # Encoding with the backend alone is what transformers does only if the class keeps the generic
    # Python side; a class that rewrites text in Python would give other ids than Megatron.
    cls = type(hf)
    if not (
        isinstance(hf, TokenizersBackend)
        and cls.tokenize is TokenizersBackend.tokenize
        and cls._encode_plus is TokenizersBackend._encode_plus
    ):
        raise MegacacheError(
            f"{name}: transformers loads it as {cls.__name__}, which adds Python steps to the tokenizers "
            "library's; megacache encodes with the library alone and would not give Megatron's ids "
            "(a tokenizer.json that needs no such steps works)"
        )
    return BackendTokenizer(hf, name, include_special_tokens=include_special_tokens)


def _import_transformers():
    try:
        import transformers
    except ImportError as exc:
        raise MegacacheError(
            "this tokenizer needs the 'transformers' package (Megatron builds it with transformers): "
            "pip install transformers; only the byte tokenizer works without it"
        ) from exc
    return transformers


def _cap_threads(threads: int) -> None:
    if threads < 1:
        raise MegacacheError(f"tokenizer threads must be at least 1, not {threads}")
    os.environ["TOKENIZERS_PARALLELISM"] = "false" if threads == 1 else "true"
    if threads > 1:
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        if _rayon_pool_threads and _rayon_pool_threads[0] != str(threads):
            started = _rayon_pool_threads[0] or "one per core"
            warnings.warn(
                f"the tokenizers thread pool already runs with {started} threads in this process; "
                f"{threads} threads take effect only in a new process",
                RuntimeWarning,
                stacklevel=3,
            )


def _parallelism_enabled() -> bool:
    value = os.environ.get("TOKENIZERS_PARALLELISM")
    return value is None or value.lower() not in ("", "off", "false", "f", "no", "n", "0")


def _has(directory: str, name: str) -> bool:
    return os.path.isfile(os.path.join(directory, name))


def _in_dir(spec: str | None, name: str) -> str | None:
    """``spec/name`` when ``spec`` is a directory, else None."""
    return os.path.join(spec, name) if spec and os.path.isdir(spec) else None


def _required_path(path: str | None, flag: str, tokenizer_type: str) -> str:
    if path is None:
        raise MegacacheError(
            f"--tokenizer-type {tokenizer_type} needs {flag} (nothing is downloaded, so Megatron's "
            "default files must be given explicitly)"
        )
    if not os.path.exists(path):
        raise MegacacheError(f"{flag} {path}: no such file or directory")
    return path


def _bad_document(texts) -> MegacacheError:
    """The error for the first document of a batch that is not encodable text."""
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            return MegacacheError(f"document {index} of the batch is a {type(text).__name__}, not text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return MegacacheError(
                f"document {index} of the batch holds an unpaired surrogate {text[exc.start]!r} at "
                f"character {exc.start}, which is not valid Unicode text"
            )
    return MegacacheError("the batch could not be encoded (texts must be a list of str)")


def _bad_null_document(texts) -> MegacacheError:
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            return _bad_document(texts)
        for piece in text.split(" "):
            try:
                value = int(piece)
                np.int64(value)
            except (ValueError, OverflowError):
                return MegacacheError(
                    f"document {index} of the batch: NullTokenizer reads ids written as integers separated "
                    f"by single spaces, and {piece!r} is not one (an empty document is not valid either)"
                )
    return MegacacheError("the batch could not be read as NullTokenizer ids")
