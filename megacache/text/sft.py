"""SFT examples tokenized as Megatron-Bridge 0.6.2's GPT SFT dataset serves them to its offline
packer (``tokenize_dataset``): each JSONL line's token ids and the loss mask Bridge's fill step
derives from it. See docs/sft-packing.md §2.

Two forms of example, chosen by the dataset options (Bridge's ``dataset_kwargs``):

* prompt template (``GPTSFTDataset``): the line's fields placed into ``prompt_template``, each piece
  tokenized alone, the prompt side truncated to the sequence length, BOS/SEP/EOS added; the loss
  mask starts one token before the answer (``answer_start_idx - 1``);
* chat (``chat`` with ``use_hf_tokenizer_chat_template``): the conversation rendered and tokenized
  by the Hugging Face tokenizer's chat template, its loss mask the template's assistant mask
  (``{% generation %}`` blocks) or every token, shifted left by one; no truncation.

Then, with ``pad_seq_to_mult`` m > 1, each example is padded with EOD (or cut) so that its sequence
length is a multiple of m, at most ``max_seq_length``.

``tokenize_lines`` takes any range of a file's lines, so that ranks can share a file.
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import InputError, MegacacheError
from .tokenization import BackendTokenizer

#: Bridge's defaults for the options its split builder reads (``build_gpt_sft_split``)
PROMPT_DEFAULTS = {"add_bos": False, "add_eos": True, "add_sep": False, "label_key": "output",
                   "truncation_field": "input", "prompt_template": "{input} {output}",
                   "truncation_method": "right", "answer_only_loss": True}
#: options that change nothing Bridge's offline packer writes (its line index's folder included)
INERT_OPTIONS = ("answer_only_loss", "pad_to_max_length", "get_attention_mask_from_fusion", "index_mapping_dir",
                 "min_seq_length", "output_original_text", "ceil_to_power_2", "global_sample_mapping",
                 "chat_template")
CHAT_OPTIONS = ("chat", "use_hf_tokenizer_chat_template", "chat_loss_mode", "tool_schemas")
PROMPT_OPTIONS = ("add_bos", "add_eos", "add_sep", "sep_id", "label_key", "truncation_field", "prompt_template",
                  "truncation_method", "virtual_tokens", "tokens_to_generate")
#: texts given to the tokenizer in one call
ENCODE_BATCH = 8192
#: the chat loss modes reproduced (Bridge's ``last_turn`` renders conversation prefixes: not yet)
CHAT_LOSS_MODES = ("assistant", "full")
#: Bridge's test for a chat template that marks assistant tokens itself
GENERATION_BLOCK = re.compile(r"\{%-?\s+generation\s+-?%\}")
#: markers of the chat formats whose assistant tokens Bridge finds by scanning for role boundaries
#: instead (``infer_assistant_mask_boundary_config``): any template holding all of one set
BOUNDARY_FORMATS = (("<|im_start|>assistant", "<|im_end|>"),
                    ("<|im_assistant|>", "<|im_user|>", "<|im_system|>", "<|im_middle|>", "<|im_end|>"),
                    ("<|turn>model", "<turn|>"), ("<start_of_turn>model", "<end_of_turn>"),
                    ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                    ("<|start|>", "<|channel|>", "<|message|>"))
#: added tokens Bridge never trains on in a chat (``extract_skipped_token_ids``: its PAD_TOKENS)
SKIPPED_TOKENS = frozenset((
    "<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>", "<image>", "<pad>", "<|begin_of_text|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>",
    "<|image|>", "<image_soft_token>", "<audio_soft_token>", "<start_of_audio>", "<start_of_image>",
    "<end_of_audio>", "<end_of_image>"))


class SFTExamples(NamedTuple):
    """Tokenized examples, as Bridge's fill step takes them."""

    offsets: np.ndarray  # int64[n + 1]: example i's tokens are ids[offsets[i]:offsets[i + 1]]
    ids: np.ndarray  # int64: every example's input_ids, one after another
    loss_mask: np.ndarray  # int8, aligned with ids: the mask fill_packing_strategy gives each token
    mask_ints: np.ndarray  # bool[n]: the example's loss_mask holds an int (EOD padding of a chat example)
    shifted: bool  # the masks are loss_mask shifted left, ending in Bridge's appended False (chat)


@dataclass(frozen=True)
class PromptTemplate:
    """``prompt_template`` split as Bridge splits it: literal pieces and placeholders, each piece
    tokenized alone."""

    keys: tuple[str, ...]  # the placeholders' fields, in order of appearance
    pieces: tuple[tuple[str | None, str], ...]  # (field or None for literal text, the text or the spaces before)
    label_key: str
    truncation_fields: tuple[str, ...]


@dataclass(frozen=True)
class SFTFormat:
    """What Bridge's dataset options make of an example (``sft_format``)."""

    chat: bool
    template: PromptTemplate | None
    add_bos: bool
    add_eos: bool
    add_sep: bool
    sep_id: int | None
    truncation_method: str
    virtual_tokens: int
    tokens_to_generate: int
    loss_mode: str
    tool_schemas: object


def sft_format(dataset_kwargs: dict | None, tokenizer: BackendTokenizer) -> SFTFormat:
    """Bridge's ``dataset_kwargs`` for a GPT SFT dataset read from JSONL, checked: the options that
    shape the packed examples, those that change nothing, and a clear refusal of the rest."""
    options = dict(dataset_kwargs or {})
    unknown = sorted(set(options) - set(INERT_OPTIONS) - set(CHAT_OPTIONS) - set(PROMPT_OPTIONS))
    if unknown:
        raise MegacacheError(
            f"dataset_kwargs {', '.join(unknown)}: not reproduced for packed SFT data (megacache reproduces "
            f"{', '.join(sorted(CHAT_OPTIONS + PROMPT_OPTIONS))}, and ignores {', '.join(INERT_OPTIONS)}, "
            "which do not change Bridge 0.6.2's packed files)")
    chat = bool(options.get("chat", False))
    if not isinstance(tokenizer, BackendTokenizer) or getattr(tokenizer, "hf", None) is None:
        raise MegacacheError(f"packed SFT data needs a Hugging Face tokenizer, not {tokenizer.name}")
    if tokenizer.hf.eos_token is None:
        raise MegacacheError(f"{tokenizer.name} has no eos token, which Bridge's SFT examples end with")
    loss_mode = options.get("chat_loss_mode", "assistant")
    if chat:
        if not options.get("use_hf_tokenizer_chat_template", False):
            raise MegacacheError("dataset_kwargs chat without use_hf_tokenizer_chat_template (Bridge's special-token "
                                 "chat format) is not reproduced; set use_hf_tokenizer_chat_template: true")
        if loss_mode not in CHAT_LOSS_MODES:
            raise MegacacheError(f"dataset_kwargs chat_loss_mode {loss_mode!r} is not reproduced; use one of "
                                 f"{', '.join(CHAT_LOSS_MODES)}")
        _check_chat_template(tokenizer, loss_mode)
    tool_schemas = options.get("tool_schemas")
    if isinstance(tool_schemas, str):
        tool_schemas = json.loads(tool_schemas)
    add_sep = bool(options.get("add_sep", PROMPT_DEFAULTS["add_sep"]))
    sep_id = options.get("sep_id")
    add_bos = bool(options.get("add_bos", PROMPT_DEFAULTS["add_bos"]))
    if not chat and add_sep and not isinstance(sep_id, int):
        raise MegacacheError("dataset_kwargs add_sep needs sep_id, the id Bridge puts between prompt and answer")
    if not chat and add_bos and tokenizer.hf.bos_token is None:
        raise MegacacheError(f"dataset_kwargs add_bos: {tokenizer.name} has no bos token")
    method = options.get("truncation_method", PROMPT_DEFAULTS["truncation_method"])
    if not chat and method not in ("left", "right"):
        raise MegacacheError(f"dataset_kwargs truncation_method must be left or right, got {method!r}")
    return SFTFormat(
        chat=chat, template=None if chat else _prompt_template(options), add_bos=add_bos,
        add_eos=bool(options.get("add_eos", PROMPT_DEFAULTS["add_eos"])), add_sep=add_sep, sep_id=sep_id,
        truncation_method=method, virtual_tokens=int(options.get("virtual_tokens", 0)),
        tokens_to_generate=int(options.get("tokens_to_generate", 0)), loss_mode=loss_mode, tool_schemas=tool_schemas)


def _check_chat_template(tokenizer: BackendTokenizer, loss_mode: str) -> None:
    template = tokenizer.hf.chat_template
    if not isinstance(template, str) or not template:
        raise MegacacheError(f"{tokenizer.name} has no chat template, which chat examples are rendered with")
    if loss_mode == "full":
        return
    if not GENERATION_BLOCK.search(template):
        raise MegacacheError(
            f"the chat template of {tokenizer.name} has no {{% generation %}} block: Bridge 0.6.2 then finds "
            "assistant tokens by scanning for role markers, which megacache does not reproduce; mark the "
            "assistant's text with {% generation %} ... {% endgeneration %}, or use chat_loss_mode full")
    for markers in BOUNDARY_FORMATS:
        if all(marker in template for marker in markers):
            raise MegacacheError(
                f"the chat template of {tokenizer.name} holds {', '.join(markers)}: Bridge 0.6.2 finds assistant "
                "tokens of that format by scanning for role markers, which megacache does not reproduce; use "
                "chat_loss_mode full")


def _prompt_template(options: dict) -> PromptTemplate:
    """Bridge's reading of ``prompt_template``: escapes undone (``unicode_escape`` of its UTF-8, as
    Bridge does, which also turns non-ASCII text into Latin-1 characters), the label's placeholder
    last, and pieces split before each placeholder with the spaces in front of it."""
    raw = options.get("prompt_template", PROMPT_DEFAULTS["prompt_template"])
    label_key = options.get("label_key", PROMPT_DEFAULTS["label_key"])
    if not isinstance(raw, str):
        raise MegacacheError(f"dataset_kwargs prompt_template must be a string, got {type(raw).__name__}")
    template = raw.encode("utf-8").decode("unicode_escape")
    keys = tuple(re.findall(r"{(.*?)}", template))
    if not template.endswith(f"{{{label_key}}}"):
        raise MegacacheError(f"dataset_kwargs prompt_template {raw!r} must end with {{{label_key}}}, the "
                             "placeholder of label_key")
    if len(set(keys)) != len(keys):
        raise MegacacheError(f"dataset_kwargs prompt_template {raw!r} names a field twice")
    field = options.get("truncation_field", PROMPT_DEFAULTS["truncation_field"])
    fields = field.split(",") if field is not None else []
    if fields and keys[0] == "input" and fields[0] == "context":
        fields[0] = "input"  # Bridge's reading of older configurations
    if not set(fields) <= set(keys):
        raise MegacacheError(f"dataset_kwargs truncation_field {field!r} must name fields of prompt_template "
                             f"({', '.join(keys)})")
    placeholders = {f"{{{k}}}": k for k in keys}
    pieces = []
    for piece in re.split("( *?{.+?})", template):
        if not piece:
            continue
        placeholder = piece.lstrip(" ")
        key = placeholders.get(placeholder)
        pieces.append((key, piece[:len(piece) - len(placeholder)] if key is not None else piece))
    return PromptTemplate(keys, tuple(pieces), label_key, tuple(fields))


def line_bounds(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each example line's (start, end) byte offsets in a JSONL file's bytes, as Bridge's
    ``build_index_from_memdata`` splits it: at every newline, the last line ending with the file
    (newline or not); empty lines at the end are no lines."""
    ends = np.flatnonzero(data == 10)
    if ends.size == 0 or ends[-1] + 1 != data.size:
        ends = np.append(ends, data.size)
    if ends.size > 1:
        real = np.flatnonzero(np.diff(ends) >= 2)  # end k + 1 closes a line of at least one byte
        ends = ends[:real[-1] + 2] if real.size else ends[:1]
    starts = np.concatenate(([0], ends[:-1] + 1))
    return starts.astype(np.int64), ends.astype(np.int64)


def _file_bytes(path: str) -> np.ndarray:
    """A JSONL file's bytes, mapped (a rank reading a range of lines touches those pages only)."""
    try:
        if os.path.getsize(path) == 0:
            raise MegacacheError(f"{path}: the file is empty; Bridge 0.6.2 cannot read an empty JSONL file")
        return np.memmap(path, dtype=np.uint8, mode="r")
    except OSError as exc:
        raise MegacacheError(f"{path}: cannot read the SFT examples ({exc.strerror or exc})") from None


def line_count(path: str) -> int:
    """How many example lines the JSONL file holds (``line_bounds``)."""
    return int(line_bounds(_file_bytes(path))[0].size)


def read_lines(path: str, first: int = 0, stop: int | None = None) -> list[dict]:
    """The JSON objects of lines ``first`` to ``stop`` (all when None) of a JSONL file. A line that
    is not a UTF-8 JSON object is an error naming the file and line."""
    data = _file_bytes(path)
    starts, ends = line_bounds(data)
    stop = starts.size if stop is None else min(stop, starts.size)
    records = []
    for i in range(first, stop):  # one JSON document per line: the parser is per line
        try:
            record = json.loads(data[starts[i]:ends[i]].tobytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InputError(path, f"line {i + 1}", f"not UTF-8 text (byte {exc.start + 1}); Bridge 0.6.2 fails on "
                             "it: fix or remove the line") from None
        except json.JSONDecodeError as exc:
            raise InputError(path, f"line {i + 1}", f"not valid JSON ({exc.msg} at column {exc.colno}); Bridge "
                             "0.6.2 fails on it: fix or remove the line") from None
        if not isinstance(record, dict):
            raise InputError(path, f"line {i + 1}", f"a JSON {type(record).__name__}, not an object of fields")
        records.append(record)
    return records


def tokenize_lines(path: str, tokenizer: BackendTokenizer, fmt: SFTFormat, max_seq_length: int,
                   pad_seq_to_mult: int | None = 1, first: int = 0, stop: int | None = None) -> SFTExamples:
    """Lines ``first`` to ``stop`` of the JSONL file ``path`` as Bridge's offline packer tokenizes
    them with ``max_seq_length`` and ``pad_seq_to_mult`` (``tokenize_dataset``)."""
    if pad_seq_to_mult is not None and pad_seq_to_mult <= 0:
        raise MegacacheError(f"pad_seq_to_mult must be a positive integer, got {pad_seq_to_mult}")
    multiple = max(1, pad_seq_to_mult or 1)
    if multiple > 1 and max_seq_length // multiple == 0:
        raise MegacacheError(f"max_seq_length {max_seq_length} must be at least pad_seq_to_mult {multiple}")
    records = read_lines(path, first, stop)
    # Bridge builds the dataset one token longer when it pads: the padded sequence keeps its label
    stored = max_seq_length + 1 if multiple > 1 else max_seq_length
    if fmt.chat:
        ids, offsets, mask = _chat_examples(records, tokenizer, fmt, path, first)
    else:
        ids, offsets, mask = _prompt_examples(records, tokenizer, fmt, stored, path, first)
    mask_ints = np.zeros(len(records), dtype=bool)
    if multiple > 1:
        ids, offsets, mask, mask_ints = _pad(ids, offsets, mask, fmt, tokenizer.eod, max_seq_length, multiple)
    return SFTExamples(offsets, ids, _fill_mask(offsets, mask, fmt.chat), mask_ints, fmt.chat)


def _chat_examples(records: list[dict], tokenizer: BackendTokenizer, fmt: SFTFormat, path: str, first: int):
    """Each conversation rendered and tokenized by the chat template (one call each: the template is
    Python), its mask the assistant mask (or all ones), less Bridge's skipped tokens."""
    hf = tokenizer.hf
    generation = GENERATION_BLOCK.search(hf.chat_template) is not None
    skipped = np.array(sorted(i for i, t in hf.added_tokens_decoder.items() if str(t) in SKIPPED_TOKENS), np.int64)
    ids, masks = [], []
    for i, record in enumerate(records):
        try:
            conversation = _conversation(record)
        except ValueError as exc:
            raise InputError(path, f"line {first + i + 1}", str(exc)) from None
        kwargs = {"tokenize": True, "add_generation_prompt": False, "return_dict": True}
        tools = record.get("tools")
        if not tools and fmt.tool_schemas is not None:  # the row's own tools first, when it has some
            tools = fmt.tool_schemas
        if tools is not None:
            kwargs["tools"] = tools
        if generation:
            kwargs["return_assistant_tokens_mask"] = True
        try:
            rendered = hf.apply_chat_template(conversation, **kwargs)
        except Exception as exc:  # the template's own errors (jinja, a missing field)
            raise InputError(path, f"line {first + i + 1}", f"the chat template fails on it: {exc}") from None
        example = np.asarray(rendered["input_ids"], dtype=np.int64).reshape(-1)
        assistant = rendered.get("assistant_masks") if generation else None
        if fmt.loss_mode == "full" or assistant is None or len(assistant) != example.size:
            if fmt.loss_mode != "full":
                raise InputError(path, f"line {first + i + 1}", "the chat template's assistant mask does not "
                                 "cover the tokens; use chat_loss_mode full")
            mask = np.ones(example.size, dtype=bool)
        else:
            mask = np.asarray(assistant, dtype=bool)
        ids.append(example)
        masks.append(mask & ~np.isin(example, skipped))
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum([a.size for a in ids], out=offsets[1:])
    return (np.concatenate(ids) if ids else np.zeros(0, np.int64), offsets,
            np.concatenate(masks) if masks else np.zeros(0, bool))


def _conversation(record: dict) -> list[dict]:
    """The record's turns as role/content messages (Bridge's ``normalize_chat_conversation``)."""
    for key in ("messages", "conversation", "conversations"):
        if record.get(key) is not None:
            turns = record[key]
            break
    else:
        raise ValueError("a chat example needs 'messages', 'conversation' or 'conversations'")
    if not isinstance(turns, list):
        raise ValueError(f"'{key}' must be a list of turns")
    messages = []
    for turn in copy.deepcopy(turns):
        if not isinstance(turn, dict):
            raise ValueError(f"'{key}' holds a {type(turn).__name__}, not a turn (an object)")
        if "role" in turn and "content" in turn:
            messages.append(turn)
        elif "from" in turn and "value" in turn:
            role = str(turn["from"]).lower()
            messages.append({"role": {"human": "user", "gpt": "assistant"}.get(role, role), "content": turn["value"]})
        else:
            raise ValueError("a turn needs role and content, or from and value")
    if record.get("system") and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": record["system"]})
    return messages


def _prompt_examples(records: list[dict], tokenizer: BackendTokenizer, fmt: SFTFormat, max_length: int, path: str,
                     first: int):
    """Bridge's ``GPTSFTDataset._process_example``: every example's pieces tokenized in one batch,
    the over-long examples' pieces cut as Bridge cuts them, then BOS, SEP and EOS added. The mask is
    the answer's start (the prompt's token count)."""
    template = fmt.template
    space_sensitive = tokenizer.hf.tokenize("x y") != tokenizer.hf.tokenize("x") + tokenizer.hf.tokenize("y")
    # Bridge drops one leading space of every piece for a tokenizer that is not space sensitive
    pieces = [(key, text[1:] if not space_sensitive and text[:1] == " " else text) for key, text in template.pieces]
    texts = []
    for i, record in enumerate(records):
        values = {}
        for key in template.keys:
            if key not in record:
                if key != template.label_key:  # Bridge's test split may lack the answer
                    raise InputError(path, f"line {first + i + 1}", f"no field {key!r}, which prompt_template "
                                     "places")
                values[key] = ""
            elif not isinstance(record[key], str):
                raise InputError(path, f"line {first + i + 1}", f"field {key!r} is a "
                                 f"{type(record[key]).__name__}, not text")
            else:
                values[key] = record[key].strip(" ")
        texts.extend(text if key is None else text + values[key] for key, text in pieces)
    ids, counts = _encoded(tokenizer, texts)
    n, k = len(records), len(pieces)
    counts = counts.reshape(n, k)
    bos = [tokenizer.hf.convert_tokens_to_ids(tokenizer.hf.bos_token)] if fmt.add_bos else []
    eos = tokenizer.hf.convert_tokens_to_ids(tokenizer.hf.eos_token)
    sep = [fmt.sep_id] if fmt.add_sep else []
    head = bos + [eos] * fmt.virtual_tokens  # virtual tokens' places hold EOS, after BOS
    extra = fmt.virtual_tokens + fmt.add_bos + fmt.add_sep + fmt.add_eos
    total = extra + counts[:, :-1].sum(axis=1) + np.maximum(counts[:, -1], fmt.tokens_to_generate)
    keep = counts.copy()
    starts = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts.reshape(-1), out=starts[1:])
    offset = np.zeros((n, k), dtype=np.int64)  # where each piece's kept tokens begin within it
    cut = np.flatnonzero(total > max_length)  # only the over-long examples are cut
    keep[cut], offset[cut] = _truncated(keep[cut], total[cut] - max_length, fmt, [key for key, _ in pieces])
    offset = offset.reshape(-1)
    # each example: head, its kept prompt tokens, SEP, its kept answer tokens, EOS
    context = len(head) + keep[:, :-1].sum(axis=1) + len(sep)
    lengths = context + keep[:, -1] + fmt.add_eos
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.int64)
    # the pieces' kept tokens, then the fixed tokens around them
    piece_out = offsets[:-1, None] + len(head) + np.concatenate(
        (np.zeros((n, 1), np.int64), np.cumsum(keep, axis=1)[:, :-1]), axis=1)
    piece_out[:, -1] += len(sep)
    flat_keep = keep.reshape(-1)
    source = np.repeat(starts[:-1] + offset - np.cumsum(flat_keep) + flat_keep, flat_keep) + np.arange(flat_keep.sum())
    target = np.repeat(piece_out.reshape(-1) - np.cumsum(flat_keep) + flat_keep, flat_keep) + np.arange(flat_keep.sum())
    out[target] = ids[source]
    for j, token in enumerate(head):
        out[offsets[:-1] + j] = token
    if sep:
        out[offsets[:-1] + context - 1] = sep[0]
    if fmt.add_eos:
        out[offsets[1:] - 1] = eos
    return out, offsets, context


def _encoded(tokenizer: BackendTokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The texts' ids one after another and each text's count, encoded ENCODE_BATCH texts at a time:
    the tokenizer's own objects (an Encoding per text, several times the ids' size) live for one
    batch only."""
    parts = [tokenizer.encode_batch(texts[i:i + ENCODE_BATCH]) for i in range(0, len(texts), ENCODE_BATCH)]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([ids for ids, _ in parts]), np.concatenate([counts for _, counts in parts])


def _truncated(keep: np.ndarray, over: np.ndarray, fmt: SFTFormat, keys: list) -> tuple[np.ndarray, np.ndarray]:
    """Bridge's ``_multiple_truncation`` of examples ``over`` tokens too long (``keep``: each
    example's pieces' token counts, a row each): first an even share of ``over`` from each
    truncation field (the first fields a token more while the remainder lasts), each cut by at most
    its length; then what is left from the pieces in turn (from the first piece with ``left``
    truncation, from the answer backwards with ``right``, which first adds the answer's tokens up
    to ``tokens_to_generate``). ``left`` keeps a piece's last tokens, ``right`` its first. Returns
    each piece's token count kept and where its kept tokens begin within it."""
    left = fmt.truncation_method == "left"
    kept = keep.copy()
    fields = np.flatnonzero([key in fmt.template.truncation_fields for key in keys])
    if fields.size:
        share = over[:, None] // fields.size + (np.arange(fields.size) < over[:, None] % fields.size)
        cut = np.minimum(share, kept[:, fields])
        kept[:, fields] -= cut
        over = over - cut.sum(axis=1)
    over = np.where(over > 0, over + (0 if left else np.minimum(keep[:, -1], fmt.tokens_to_generate)), 0)
    # piece after piece in the cutting order, each cut by what is still over, or to nothing
    order = np.arange(kept.shape[1]) if left else np.arange(kept.shape[1])[::-1]
    before = np.cumsum(kept[:, order], axis=1)
    kept[:, order] = np.clip(before - over[:, None], 0, kept[:, order])
    return kept, np.where(left, keep - kept, 0)


def _pad(ids, offsets, mask, fmt: SFTFormat, eod: int, max_seq_length: int, multiple: int):
    """Bridge's ``_pre_pad_data_point``: each example's sequence length rounded up to a multiple of
    ``multiple`` (at most ``max_seq_length`` rounded down to one), the tokens padded with EOD or
    cut, a chat example's mask padded with 0 (an int: its length's masks become ints)."""
    counts = np.diff(offsets)
    cap = max_seq_length // multiple * multiple
    target = np.minimum(cap, -(-np.maximum(counts - 1, 0) // multiple) * multiple) + 1
    new_offsets = np.zeros_like(offsets)
    np.cumsum(target, out=new_offsets[1:])
    kept = np.minimum(counts, target)
    within = np.arange(int(new_offsets[-1])) - np.repeat(new_offsets[:-1], target)
    example = np.repeat(np.arange(counts.size), target)
    real = within < kept[example]
    source = offsets[example] + within
    new_ids = np.full(int(new_offsets[-1]), eod, dtype=np.int64)
    new_ids[real] = ids[source[real]]
    if fmt.chat:
        new_mask = np.zeros(new_ids.size, dtype=bool)
        new_mask[real] = mask[source[real]]
        return new_ids, new_offsets, new_mask, (target > counts)
    return new_ids, new_offsets, mask, np.zeros(counts.size, dtype=bool)


def _fill_mask(offsets: np.ndarray, mask, chat: bool) -> np.ndarray:
    """The loss mask Bridge's fill step makes of each example: its ``loss_mask`` shifted left by one
    with 0 appended (chat), or 1 from one token before the answer's start (``answer_start_idx``)."""
    counts = np.diff(offsets)
    if chat:
        out = np.zeros(int(offsets[-1]), dtype=np.int8)
        last = offsets[1:] - 1
        inner = np.ones(out.size, dtype=bool)
        inner[last[counts > 0]] = False
        out[np.flatnonzero(inner)] = mask[np.flatnonzero(inner) + 1]
        return out
    within = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], counts)
    return (within >= np.repeat(np.asarray(mask) - 1, counts)).astype(np.int8)
