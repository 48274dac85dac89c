"""Megatron's dataset cache: unique descriptions, their md5, the file names derived from them, and
the cache-hit rule (the same in every supported version).

megatron-core keys every cached index by the md5 of a JSON description
(``json.dumps(…, indent=4)``) of the dataset's identity, and names the files
``<md5>-<Class>-<split>-<what>``. Reproducing the description byte for byte is what lets Megatron
find a cache megacache built. See docs/megatron.md §3.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from json.encoder import encode_basestring_ascii
from typing import Any

from ..errors import FormatError

GPT_FILES = ("description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy")
BLEND_FILES = ("description.txt", "dataset_index.npy", "dataset_sample_index.npy")
#: every entry class megacache knows, and its files
ENTRY_FILES = {"GPTDataset": GPT_FILES, "BlendedDataset": BLEND_FILES}
SPLIT_NAMES = ("train", "valid", "test")


def default_cache_dir(dataset_path: str) -> str:
    """Where GPTDataset caches when no ``--data-cache-path`` is given: the prefix used as a directory."""
    return os.path.join(dataset_path, "cache", "GPTDataset_indices")


def gpt_identifiers(dataset_path: str, num_samples: int | None, split_name: str, random_seed: int,
                    seq_length: int, split: str, split_matrix: list, tokenizer: dict) -> dict:
    """GPTDataset's ``unique_identifiers``, keys in Megatron's order (Megatron names
    ``seq_length`` "sequence_length")."""
    return {
        "class": "GPTDataset", "dataset_path": dataset_path, "num_samples": num_samples,
        "index_split": split_name, "random_seed": random_seed, "sequence_length": seq_length,
        "split": split, "split_matrix": split_matrix, "tokenizer": tokenizer,
    }


def blend_identifiers(datasets: list[dict], split_name: str, weights: list, size: int | None) -> dict:
    """BlendedDataset's ``unique_identifiers``."""
    return {"class": "BlendedDataset", "datasets": datasets, "split": split_name, "weights": weights,
            "size": size}


def describe(identifiers: dict) -> str:
    """``json.dumps(identifiers, indent=4)``, exactly, faster: a build describes thousands of
    GPTDatasets on every rank, and json's indenting encoder is pure Python. Each top-level value is
    written as its own text, ``_nested`` one level (as in ``blend_entry``): strings, integers and
    null as json writes them, containers (the split matrix and tokenizer every entry shares)
    indented once per distinct value."""
    if not identifiers or not all(type(k) is str for k in identifiers):
        return json.dumps(identifiers, indent=4)
    return "{\n" + ",\n".join(f"    {encode_basestring_ascii(k)}: {_value_text(v)}"
                                for k, v in identifiers.items()) + "\n}"


def _nested(text: str, depth: int) -> str:
    """A value's ``json.dumps(indent=4)`` text as it appears nested ``depth`` levels deep: each line
    after the first indented by 4·depth more spaces (no JSON string holds a raw newline)."""
    return text.replace("\n", "\n" + "    " * depth)


#: the texts of nested values by their compact encoding, which determines the indented one
_NESTED: dict[str, str] = {}


def _value_text(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if kind not in (dict, list, tuple):
        return json.dumps(value)
    key = json.dumps(value)  # the C encoder: a few microseconds
    text = _NESTED.get(key)
    if text is None:
        if len(_NESTED) >= 64:
            _NESTED.clear()
        text = _NESTED[key] = _nested(json.dumps(value, indent=4), 1)
    return text


def blend_entry(directory: str, children: list["CacheEntry"], split_name: str, weights: list,
                size: int | None) -> "CacheEntry":
    """A BlendedDataset's entry, its description made from its children's without encoding them
    again (a blend of 1000 datasets is ~1 MB of JSON, on every rank), each at depth 2 (``_nested``)."""
    ids = blend_identifiers([c.identifiers for c in children], split_name, weights, size)
    placeholder = '"\\u0000"'  # how json.dumps writes the one-character string chr(0)
    shell = describe(blend_identifiers([chr(0)], split_name, weights, size))
    texts = ",\n        ".join(_nested(c.description, 2) for c in children)
    return CacheEntry(directory, ids, shell.replace(placeholder, texts, 1))


def description_hash(description: str) -> str:
    return hashlib.md5(description.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """One dataset split's cache files: ``directory/<md5>-<Class>-<split>-<what>``."""

    directory: str
    identifiers: dict[str, Any]
    #: the description when the caller has it already (``blend_entry``)
    text: str | None = field(default=None, repr=False, compare=False)

    @cached_property
    def description(self) -> str:
        return self.text if self.text is not None else describe(self.identifiers)

    @cached_property
    def hash(self) -> str:
        return description_hash(self.description)

    @property
    def class_name(self) -> str:
        return self.identifiers["class"]

    @property
    def split_name(self) -> str:
        ids = self.identifiers
        return ids["index_split"] if "index_split" in ids else ids["split"]

    def _check_known(self) -> None:
        if self.class_name not in ENTRY_FILES or self.split_name not in SPLIT_NAMES:
            # Names read from a description file must never steer a path out of the directory.
            raise FormatError(f"{self.directory}: a cache entry of class {self.class_name!r}, split "
                              f"{self.split_name!r}: megacache knows GPTDataset and BlendedDataset, splits "
                              f"{', '.join(SPLIT_NAMES)}")

    @cached_property
    def names(self) -> tuple[str, ...]:
        self._check_known()
        return ENTRY_FILES[self.class_name]

    @cached_property
    def stem(self) -> str:
        """``<md5>-<Class>-<split>``: every file name of the entry starts with it."""
        self._check_known()
        return f"{self.hash}-{self.class_name}-{self.split_name}"

    def file_name(self, what: str) -> str:
        if what not in self.names:
            raise ValueError(f"{self.class_name} caches have no {what!r} file")
        return f"{self.stem}-{what}"

    def path(self, what: str) -> str:
        return os.path.join(self.directory, self.file_name(what))

    def paths(self) -> dict[str, str]:
        return {what: self.path(what) for what in self.names}

    def exists(self) -> bool:
        """Megatron's cache-hit rule: every file is present."""
        return existing([self])[0]


def existing(entries) -> list[bool]:
    """``entry.exists()`` for many entries."""
    return [all(files) for files in present_files(entries)]


def present_files(entries) -> list[tuple[bool, ...]]:
    """For each entry, whether each of its files (``entry.names``) is there, with one directory
    listing per directory instead of a stat per file (thousands of entries in a blend)."""
    listings: dict[str, set[str]] = {}
    out = []
    for e in entries:
        if e.directory not in listings:
            try:
                listings[e.directory] = {d.name for d in os.scandir(e.directory) if d.is_file()}
            except (FileNotFoundError, NotADirectoryError):
                listings[e.directory] = set()
        names = listings[e.directory]
        out.append(tuple(e.file_name(what) in names for what in e.names))
    return out


def nearest_built(entries, present) -> list[str | None]:
    """For each entry not on disk (``present``: per entry, whether it is), the complete entry of
    its directory, class and split whose description differs from its own in one field only (a
    path spelled otherwise, another seed or tokenizer setting): what differs and that entry's name;
    None where no entry is that near. Megatron hashes the strings as given, so ``data/a`` and
    ``./data/a`` name two caches; this says which one a user likely meant.

    Each directory's descriptions are read once and indexed by every field left out in turn, so a
    lookup costs one probe per field, not one comparison per entry there."""
    index: dict[str, dict] = {}
    out = []
    for e, here in zip(entries, present):
        if here:
            out.append(None)
            continue
        if e.directory not in index:
            index[e.directory] = _descriptions_by_field_left_out(e.directory)
        found = None
        for key in e.identifiers:
            if key in ("class", _SPLIT_KEY[e.class_name]):
                continue  # another class or split is another entry, not a near one
            match = index[e.directory].get((key, _without(e.identifiers, key)))
            if match is not None:
                stem, there = match
                found = f"{stem}-*, built with {_difference(key, there[key], e.identifiers[key])}"
                break
        out.append(found)
    return out


def _descriptions_by_field_left_out(directory: str) -> dict:
    """The complete entries' descriptions in ``directory`` (one listing, one read each), each
    under every (field, its description without that field)."""
    try:
        names = {d.name for d in os.scandir(directory) if d.is_file()}
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out = {}
    for name in sorted(names):
        stem, _, what = name.rpartition("-")
        class_name = stem.split("-")[1] if stem.count("-") == 2 else None
        if what != "description.txt" or class_name not in ENTRY_FILES:
            continue
        if not all(f"{stem}-{w}" in names for w in ENTRY_FILES[class_name]):
            continue  # an entry Megatron would not load is no near miss
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                identifiers = json.load(f)
        except (OSError, ValueError):
            continue  # unreadable: verify reports it
        if isinstance(identifiers, dict):
            for key in identifiers:
                out.setdefault((key, _without(identifiers, key)), (stem, identifiers))
    return out


#: the identifier that names an entry's split, per class
_SPLIT_KEY = {"GPTDataset": "index_split", "BlendedDataset": "split"}


def _without(identifiers: dict, key: str) -> str:
    return json.dumps({k: v for k, v in identifiers.items() if k != key}, sort_keys=True)


def _difference(key: str, there, asked) -> str:
    if isinstance(there, dict) and isinstance(asked, dict):
        keys = [k for k in dict.fromkeys([*there, *asked]) if there.get(k) != asked.get(k)]
        return "; ".join(f"{key}.{k} {there.get(k)!r} instead of {asked.get(k)!r}" for k in keys)
    return f"{key} {there!r} instead of {asked!r}"
