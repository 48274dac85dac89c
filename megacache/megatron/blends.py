"""What a build reads: Megatron-LM's data-path flags, parsed and checked before any work.

* ``--data-path W1 P1 W2 P2 …`` (weighted), ``--data-path P1 P2 …`` (unweighted, blended by
  length), ``--data-path P`` (one dataset; ``--data-path 1.0 P`` is a one-dataset *blend*, with
  another hash), or the same words in a file (``--data-args-path``).
* Per-split blends: ``--train-data-path`` / ``--valid-data-path`` / ``--test-data-path``, or a JSON
  file (``--per-split-data-args-path``) mapping "train"/"valid"/"test" to a list of words or one
  string of them.

Megatron's own parser (``get_blend_from_list``) reads an even word count as weight/prefix pairs
unless *any* weight is not a number, and then treats every word as a prefix; a mixed list such as
``0.3 A B C`` becomes four prefixes, silently. megacache refuses such a list, and weights
that are zero, negative or not finite, duplicate prefixes and too many datasets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..algorithms.blend_sizes import MAX_DATASETS
from ..errors import MegacacheError
from ..formats.paths import is_file
from ..runtime.fsio import read_mapping
from ..runtime.object_storage import shown
from .cache import SPLIT_NAMES


@dataclass(frozen=True)
class Blend:
    """Prefixes and their weights (None: unweighted), as Megatron's ``blend`` tuple."""

    prefixes: tuple[str, ...]
    weights: tuple[float, ...] | None = None

    def as_megatron(self) -> list:
        """As ``get_blend_and_blend_per_split`` gives it: prefixes, and weights or None."""
        return [list(self.prefixes), None if self.weights is None else list(self.weights)]

    @property
    def is_single(self) -> bool:
        """One prefix without a weight: plain GPTDatasets, no BlendedDataset."""
        return len(self.prefixes) == 1 and self.weights is None


def _number(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:
        return None


def parse_blend(words: list[str], source: str = "--data-path") -> Blend:
    """A blend from Megatron's words; ``source`` names the flag or file in errors."""
    words = [w for w in words if w.strip()]
    if not words:
        raise MegacacheError(f"{source}: no dataset prefixes given")
    numbers = [_number(w) for w in words]
    if len(words) % 2 == 1:
        if any(n is not None for n in numbers):
            raise MegacacheError(
                f"{source}: {len(words)} words, some of them numbers ({' '.join(words)}): weighted "
                f"blends are WEIGHT PREFIX pairs, an even count. Give a weight to every prefix, or none")
        weights = None
        prefixes = words
    else:
        weight_words, prefixes = words[0::2], words[1::2]
        weights = [_number(w) for w in weight_words]
        if all(w is None for w in weights) and all(n is None for n in numbers):
            weights, prefixes = None, words
        else:
            for i, (word, w) in enumerate(zip(weight_words, weights)):
                if w is None:
                    raise MegacacheError(
                        f"{source}: word {2 * i + 1} ({word!r}) should be the weight of {prefixes[i]!r}: "
                        f"weighted blends are WEIGHT PREFIX pairs")
            for i, (prefix, n) in enumerate(zip(prefixes, numbers[1::2])):
                if n is not None:
                    raise MegacacheError(
                        f"{source}: word {2 * i + 2} ({prefix!r}) is a number where a prefix should be: "
                        f"weighted blends are WEIGHT PREFIX pairs")
    prefixes = [p.strip() for p in prefixes]
    if weights is not None:
        for prefix, w in zip(prefixes, weights):
            if not math.isfinite(w) or w <= 0:
                raise MegacacheError(
                    f"{source}: the weight of {prefix!r} is {w!r}; weights must be positive and finite "
                    f"(megatron-core asserts on zero and loops or crashes on the others). Drop the "
                    f"prefix instead of giving it weight 0")
    seen: dict[str, int] = {}
    for i, prefix in enumerate(prefixes):
        if prefix in seen:
            raise MegacacheError(
                f"{source}: prefix {prefix!r} is given twice (datasets {seen[prefix]} and {i}); "
                f"give it once, with the summed weight")
        seen[prefix] = i
    if len(prefixes) > MAX_DATASETS:
        raise MegacacheError(
            f"{source}: {len(prefixes)} datasets; a Megatron blend holds at most {MAX_DATASETS} (its "
            f"dataset index is int16). Merge small prefixes with `megacache merge`")
    return Blend(tuple(prefixes), None if weights is None else tuple(weights))


def read_data_args(path: str) -> Blend:
    """``--data-args-path``: the --data-path words, whitespace-separated, in a file."""
    try:
        with open(path, encoding="utf-8") as f:
            words = f.read().split()
    except OSError as exc:
        raise MegacacheError(f"--data-args-path {path}: cannot read it ({exc.strerror})") from None
    return parse_blend(words, source=path)


def read_per_split_data_args(path: str) -> list[Blend | None]:
    """``--per-split-data-args-path``: JSON with "train", "valid" and "test", each a list of words
    or one string of them (Megatron requires all three keys)."""
    spec = read_mapping(path, "--per-split-data-args-path", "expected a JSON object with keys train, valid, test")
    blends: list[Blend | None] = []
    for name in SPLIT_NAMES:
        if name not in spec:
            raise MegacacheError(f"{path}: key {name!r} is missing (Megatron reads all three; use null "
                                 f"for a split without data)")
        words = spec[name]
        if words is None:
            blends.append(None)
            continue
        if isinstance(words, str):
            words = words.split()
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise MegacacheError(f"{path}: {name!r} must be a list of strings or one string, got {words!r}")
        blends.append(parse_blend(words, source=f"{path} [{name!r}]"))
    return blends


def blend_from_flags(data_path: list[str] | None = None, data_args_path: str | None = None,
                     split_data_paths: tuple | None = None,
                     per_split_data_args_path: str | None = None) -> tuple[Blend | None, list | None]:
    """``(blend, blend_per_split)`` from Megatron-LM's data flags, exactly one of them set."""
    split_data_paths = split_data_paths or (None, None, None)
    forms = [f for f, v in (("--data-path", data_path), ("--data-args-path", data_args_path),
                            ("--per-split-data-args-path", per_split_data_args_path)) if v]
    split_flags = [f"--{name}-data-path" for name, words in zip(SPLIT_NAMES, split_data_paths) if words]
    if len(forms) + bool(split_flags) != 1:  # the three split flags are one form
        given = forms + split_flags
        raise MegacacheError(
            "give the data as exactly one of --data-path, --data-args-path, --per-split-data-args-path "
            "or --train/valid/test-data-path" + (f" (got {', '.join(given)})" if given else ""))
    if data_path:
        return parse_blend(data_path), None
    if data_args_path:
        return read_data_args(data_args_path), None
    if per_split_data_args_path:
        return None, read_per_split_data_args(per_split_data_args_path)
    return None, [None if not words else parse_blend(words, f"--{name}-data-path")
                  for name, words in zip(SPLIT_NAMES, split_data_paths)]


def check_prefixes_exist(prefixes) -> None:
    """Every prefix's .idx and .bin are there: the first missing file named, and how many more
    prefixes lack theirs."""
    # A message for a dataset that is not there, before any work: the datasets are only read, so
    # one removed after this is an error when it is opened, never a wrong output.
    missing = [p for p in prefixes if not (is_file(p + ".idx") and is_file(p + ".bin"))]
    if missing:
        first = missing[0]
        message = (f"{shown(first + '.idx')}: index file not found" if not is_file(first + ".idx") else
                   f"{shown(first + '.bin')}: token file not found (its index {first}.idx exists)")
        if len(missing) > 1:
            listed = ", ".join(missing[1:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            message += f"; {len(missing) - 1} more dataset prefix(es) lack their .idx or .bin: {listed}"
        raise MegacacheError(message + " (give each prefix as training gets it: the path without .idx/.bin)")
