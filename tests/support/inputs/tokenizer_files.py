"""Real tokenizer files made by this module, for the oracles' tokenizers: nothing is downloaded."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

#: entries of the tiktoken rank file this module writes (its --vocab-size is this + the special tokens)
TIKTOKEN_RANKS = 290
CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, tokenizers are fun",
          "pack my box with five dozen liquor jugs", "ünïcödé and <|endoftext|> here"] * 20


#: metadata naming a class (Megatron-LM main, 0.20, imports ``class_path``.``class_name``): what main's
#: write_metadata writes, the package that re-exports that class, a class of the text models package
#: main removed, a name without a path; what 0.19's write_metadata wrote; 0.16-0.19's tokenizer_class key
CLASS_METADATA = {
    "class_text": {"class_name": "MegatronTokenizerText", "class_path": "megatron.core.tokenizers.text.text_tokenizer",
                   "chat_template": None},
    "class_text_package": {"class_name": "MegatronTokenizerText", "class_path": "megatron.core.tokenizers.text"},
    "class_gpt": {"class_name": "GPTTokenizer", "class_path": "megatron.core.tokenizers.text.models.gpt_tokenizer"},
    "class_without_path": {"class_name": "MegatronTokenizerText"},
    "written_by_019": {"class_name": None, "class_path": None, "model_type": "gpt", "chat_template": None},
    "tokenizer_class": {"tokenizer_class": True, "tokenizer_class_path": "x", "tokenizer_class_name": "Y"},
}


def write_tokenizer_files(root: Path) -> None:
    """Tokenizer files trained by this function: a byte-level BPE (Hugging Face directory ``hf`` and
    GPT-2 ``gpt2files/{vocab.json,merges.txt}``), a WordPiece ``bertfiles/vocab.txt``, the hub-named
    folders Megatron's GPT-2/BERT wrappers load, and ``meta_<library>_<model_type>.json`` and
    ``meta_<library>_<CLASS_METADATA key>.json`` metadata."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.train_from_iterator(CORPUS, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))

    for d in ("hf", "gpt2files", "bertfiles", "gpt2", "bert-large-uncased", "bert-large-cased"):
        (root / d).mkdir()
    bpe.save(str(root / "hf" / "tokenizer.json"))
    (root / "hf" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|im_end|>"}))
    bpe.model.save(str(root / "gpt2files"))
    wordpiece.model.save(str(root / "bertfiles"))
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(root / "gpt2files" / name, root / "gpt2" / name)
    (root / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    for repo, lower in (("bert-large-uncased", True), ("bert-large-cased", False)):
        shutil.copy(root / "bertfiles" / "vocab.txt", root / repo / "vocab.txt")
        (root / repo / "config.json").write_text(json.dumps({"model_type": "bert"}))
        (root / repo / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
    for library in ("huggingface", "megatron", "sentencepiece", "tiktoken"):
        for model_type in ("default", "default-text", "gpt", "mamba", "bert", "t5"):
            (root / f"meta_{library}_{model_type}.json").write_text(
                json.dumps({"library": library, "model_type": model_type}))
        (root / f"meta_{library}.json").write_text(json.dumps({"library": library}))
        for name, metadata in CLASS_METADATA.items():
            (root / f"meta_{library}_{name}.json").write_text(json.dumps({"library": library, **metadata}))
    write_sentencepiece_model(root / "sp.model")
    write_tiktoken_ranks(root / "ranks.json", bpe)


def write_sentencepiece_model(path) -> None:
    """A small BPE SentencePiece model trained by this function."""
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=str(path)[:-len(".model")], vocab_size=60,
        model_type="bpe", minloglevel=2)


def write_tiktoken_ranks(path, bpe, fillers: int = 0) -> None:
    """A tiktoken rank file (megatron-core's JSON form): the 256 bytes, ``fillers`` entries no UTF-8
    text can produce, then the BPE's merged tokens as bytes (its added tokens left out: no merge
    makes them), TIKTOKEN_RANKS + ``fillers`` entries in all. Fillers change the merged tokens'
    ranks, not their order, so a text splits as without them. Each filler is two earlier entries
    joined, as in a trained rank file (gigatoken derives merges from that): byte 0xff and a byte,
    then two such pairs, then a pair of pairs and a pair; 0xff is in no UTF-8 text."""
    import base64
    import itertools

    byte_of = {c: b for b, c in enumerate(_byte_level_chars())}
    tokens = [bytes([b]) for b in range(256)]
    pairs = [b"\xff" + bytes([b]) for b in range(256)]
    quads = [x + y for x in pairs for y in pairs]
    tokens += itertools.islice(itertools.chain(pairs, quads, (x + y for x in quads for y in pairs)), fillers)
    added = {t.content for t in bpe.get_added_tokens_decoder().values()}
    merged = sorted((i, t) for t, i in bpe.get_vocab().items()
                    if len(t) > 1 and t not in added and all(c in byte_of for c in t))
    tokens += [bytes(byte_of[c] for c in t) for _, t in merged][:TIKTOKEN_RANKS - 256]
    assert len(tokens) == TIKTOKEN_RANKS + fillers
    path.write_text(json.dumps([{"rank": i, "token_bytes": base64.b64encode(t).decode(),
                                 "token_str": t.decode("utf-8", "replace")} for i, t in enumerate(tokens)]))


def _byte_level_chars() -> list[str]:
    """GPT-2's byte-to-character table: byte b is written as this list's character b."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


#: tokenizers for the .pbin tests, by the token size Modalities gives them
PBIN_TOKENIZERS = {"bytes2": 2, "chars1": 1, "words4": 4}
WORDS4_WORDS = 70_000


def write_pbin_tokenizers(root: Path) -> dict[str, Path]:
    """Hugging Face tokenizer directories (tokenizer.json + tokenizer_config.json with EOS
    ``<|endoftext|>``) trained or built by this function, one per .pbin token size: a byte-level BPE
    (2 bytes), a character BPE of under 256 tokens (1 byte), a word-level vocabulary of 70,002
    (4 bytes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from megacache.text.sample_corpus import sample_documents

    text = sample_documents(2000, seed=5)
    made = {}
    bytes2 = Tokenizer(models.BPE())
    bytes2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bytes2.decoder = decoders.ByteLevel()
    bytes2.train_from_iterator(text, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    made["bytes2"] = bytes2
    chars1 = Tokenizer(models.BPE(unk_token="<unk>"))
    chars1.pre_tokenizer = pre_tokenizers.Whitespace()
    chars1.train_from_iterator(text, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<|endoftext|>"]))
    made["chars1"] = chars1
    vocab = {"<unk>": 0, "<|endoftext|>": 1, **{f"w{i}": i + 2 for i in range(WORDS4_WORDS)}}
    words4 = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words4.pre_tokenizer = pre_tokenizers.Whitespace()
    made["words4"] = words4
    dirs = {}
    for name, tok in made.items():
        tok.add_special_tokens(["<|endoftext|>"])
        d = root / name
        d.mkdir(parents=True)
        tok.save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}))
        dirs[name] = d
    return dirs


# Vocabularies above 65,500 tokens (Megatron stores their ids as int32) made from small trained ones:
# unused entries ("fillers") that no text can produce are added so that the trained entries' ids
# spread across the whole range, above 65,535 too. The ids a text gets change; how it is split
# does not.

def widen_bpe(tokenizer_json: str, directory: Path, vocab_size: int, seed: int = 0) -> Path:
    """A Hugging Face directory of the byte-level BPE in ``tokenizer_json`` with ``vocab_size`` ids:
    its tokens and added tokens at random ids, the rest fillers that contain a space, which no
    byte-level pre-tokenized word does (so neither merges nor a whole-word lookup reach them)."""
    import numpy as np

    spec = json.loads(Path(tokenizer_json).read_text())
    vocab = spec["model"]["vocab"]
    added = spec["added_tokens"]
    ids = np.random.default_rng(seed).choice(vocab_size, len(vocab) + len(added), replace=False)
    new_vocab = {token: int(i) for token, i in zip(sorted(vocab, key=vocab.get), ids)}
    for token, i in zip(added, ids[len(vocab):]):
        token["id"] = int(i)
        new_vocab[token["content"]] = int(i)
    used = set(new_vocab.values())
    new_vocab.update((f"filler {i}", i) for i in range(vocab_size) if i not in used)
    spec["model"]["vocab"] = dict(sorted(new_vocab.items(), key=lambda item: item[1]))
    directory.mkdir(parents=True)
    (directory / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}))
    return directory


def widen_sentencepiece(model: Path, out: Path, vocab_size: int) -> Path:
    """The SentencePiece model ``model`` with fillers (pieces of a private-use character no text
    of these tests holds) inserted at its middle piece, so that its later pieces get ids near
    ``vocab_size``."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.read_bytes())
    pieces = list(proto.pieces)
    middle = len(pieces) // 2
    fillers = []
    for i in range(vocab_size - len(pieces)):
        filler = sentencepiece_model_pb2.ModelProto.SentencePiece()
        filler.piece, filler.score = f"\U000f0000{i}", -1e9
        fillers.append(filler)
    del proto.pieces[:]
    proto.pieces.extend(pieces[:middle] + fillers + pieces[middle:])
    out.write_bytes(proto.SerializeToString())
    return out


#: a chat template that marks the assistant's tokens with {% generation %} (and renders tools)
SFT_CHAT_TEMPLATE = (
    "{%- if tools %}tools: {{ tools | tojson }}\n{% endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "<|im_end|>bot: {% generation %}{{ message['content'] }}<pad><|endoftext|>{% endgeneration %}\n"
    "{%- else -%}{{ message['role'] }}: {{ message['content'] }}\n{%- endif -%}"
    "{%- endfor -%}")


def write_sft_tokenizers(root: Path) -> None:
    """Hugging Face tokenizer folders for SFT examples, trained by this function: ``sft-bpe``, a
    byte-level BPE (space sensitive) with BOS, EOS, a ``<pad>`` token Bridge never trains on and
    ``SFT_CHAT_TEMPLATE``; ``sft-wordpiece``, a WordPiece (not space sensitive) of the corpus's
    characters and words whose post-processor adds ``[CLS]`` to every text. Both are the same bytes
    on every call."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>", "<s>", "<|im_end|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (root / "sft-bpe").mkdir()
    bpe.save(str(root / "sft-bpe" / "tokenizer.json"))
    (root / "sft-bpe" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": "<s>",
         "chat_template": SFT_CHAT_TEMPLATE}))
    # WordPiece's trainer orders tied pieces differently from run to run: the vocabulary is listed instead
    text = " ".join(CORPUS).lower()
    chars = sorted(set(text) - {" "})
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars),
              *sorted(set(re.findall(r"[a-z]{2,}", text)))]
    wordpiece = Tokenizer(models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", special_tokens=[("[CLS]", wordpiece.token_to_id("[CLS]"))])
    (root / "sft-wordpiece").mkdir()
    wordpiece.save(str(root / "sft-wordpiece" / "tokenizer.json"))
    (root / "sft-wordpiece" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "[SEP]", "bos_token": "[CLS]",
         "unk_token": "[UNK]"}))
