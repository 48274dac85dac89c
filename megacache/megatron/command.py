"""A Megatron-LM training command as ``megacache build`` reads it: the whole command line training is
given, verbatim. The flags that decide the caches are megacache's own flags, spelled as Megatron
spells them; every other flag the chosen version's training parser knows is set aside (it changes
nothing in the caches); a flag that version does not know is an error, as it is to training.
Or Megatron's experimental ``--yaml-cfg FILE``, which replaces the command line (``yaml_flags``).

Which flags each version knows, and how many words each takes, is data recorded from that version's
own parser (training_flags.json, by tests/support/oracles/record_training_flags.py), never typed by hand.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re

from ..errors import MegacacheError
from ..runtime.fsio import read_mapping
from .flags import absent_from
from .versions import SUPPORTED

#: every flag of each version's training parser (and of its tools/prepare_cache.py), as
#: tests/support/oracles/record_training_flags.py recorded them from that version's own code
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "training_flags.json")

#: flags of the training command that change what training reads or builds in ways megacache does
#: not reproduce: given, the build stops with the reason instead of building other caches
REFUSED = {
    "--mock-data": "training with --mock-data reads no dataset, so there is no cache to build",
    "--sft": "SFT datasets are not GPTDataset caches (tools/prepare_cache.py refuses it too)",
    "--fim-data": "fill-in-the-middle datasets are not GPTDataset caches (tools/prepare_cache.py refuses it too)",
    "--multiple-validation-sets": "training then builds one validation dataset per blend entry, which megacache "
                                  "does not",
    "--step-batch-size-schedule": "a batch-size schedule changes how many iterations, and so how many validation "
                                  "samples, training asks for (tools/prepare_cache.py refuses it too)",
    "--phase-transition-iterations": "training then asks for the samples of the current phase, which depends on "
                                     "the iteration its checkpoint resumes at",
}

#: a word that is a value although it starts with "-" (argparse's rule: a negative number, when no
#: flag looks like one)
_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@functools.cache
def _recorded() -> dict:
    with open(TABLE_PATH, encoding="utf-8") as f:
        return json.load(f)["versions"]


def flags_of(version: str) -> dict:
    """``version``'s training flags (and its prepare_cache.py's): each spelling and the words it
    takes, as argparse counts them (0, a number, "?", "*" or "+")."""
    recorded = _recorded()[version]
    return {**recorded["training"], **recorded["prepare_cache"]}


def versions_having(flag: str) -> list[str]:
    return [v for v in SUPPORTED if flag in flags_of(v)]


def is_flag(word: str) -> bool:
    """Whether argparse takes ``word`` for a flag rather than a value."""
    return word.startswith("-") and len(word) > 1 and not _NUMBER.match(word) and " " not in word


def nearest(flag: str, known) -> str:
    """What an unknown flag most likely meant, among ``known``: the flags it abbreviates, else the
    ones it resembles; "" when none."""
    longer = sorted({k for k in known if k.startswith(flag)})
    if longer:
        return f"flags are not abbreviated (as in Megatron-LM): did you mean {_either(longer[:5])}?"
    close = difflib.get_close_matches(flag, sorted(set(known)), n=3)
    return f"did you mean {_either(close)}?" if close else ""


def _either(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def set_aside(words: list[str], version: str, own) -> list[list[str]]:
    """The training flags among ``words`` (those ``megacache build``'s own flags, ``own``, left),
    each with its values, in order. Anything else is an error naming it: a flag ``version``'s
    training does not know (with what it most likely meant), one the build refuses (``REFUSED``),
    a flag without the values it takes, a value that belongs to no flag."""
    known = flags_of(version)
    groups: list[list[str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not is_flag(word):
            raise MegacacheError(f"{word!r}: a value that belongs to no flag")
        name, has_value, _ = word.partition("=")
        takes = known.get(name)
        if takes is None:
            raise MegacacheError(_unknown(name, version, [*own, *known]))
        if name in REFUSED:
            raise MegacacheError(f"{name} cannot be built: {REFUSED[name]}")
        i += 1
        values = [word.partition("=")[2]] if has_value else []
        while not has_value and i < len(words) and not is_flag(words[i]) and _wants_more(takes, len(values)):
            values.append(words[i])
            i += 1
        if has_value and takes == 0:
            raise MegacacheError(f"{name} takes no value (got {word!r})")
        if isinstance(takes, int) and len(values) < takes or takes == "+" and not values:
            raise MegacacheError(f"{name} takes {'a value' if takes in (1, '+') else f'{takes} values'}")
        groups.append([name, *values])
    return groups


def training_words(words: list[str], version: str, own: dict) -> list[str]:
    """The training command within ``megacache build``'s ``words``: less the flags of ``own``
    (build's flags, each with the words it takes) that ``version``'s training does not have, and
    their values."""
    training = _recorded()[version]["training"]
    out: list[str] = []
    i = 0
    while i < len(words):
        name, has_value, _ = words[i].partition("=")
        takes = own.get(name) if is_flag(words[i]) and name not in training else None
        if takes is None:
            out.append(words[i])
            i += 1
            continue
        i += 1
        have = 1 if has_value else 0
        while i < len(words) and not is_flag(words[i]) and _wants_more(takes, have):
            i, have = i + 1, have + 1
    return out


def _wants_more(takes, have: int) -> bool:
    return takes in ("*", "+") or (takes == "?" and have < 1) or (isinstance(takes, int) and have < takes)


def _unknown(flag: str, version: str, known: list[str]) -> str:
    elsewhere = versions_having(flag)
    if elsewhere:
        return absent_from(version, flag, elsewhere)
    hint = nearest(flag, known)
    return f"{flag} is not a flag of Megatron-LM {version}'s training" + (f"; {hint}" if hint else "")


#: the sections of a --yaml-cfg file that hold the model's settings rather than flags
YAML_SECTIONS = ("model_parallel", "language_model")
#: the parallel sizes Megatron's YAML reading takes from its model_parallel section (a top-level key
#: of the same name is not read), in the order it clamps them to the world size
_YAML_PARALLEL = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")


def destinations(version: str) -> dict:
    """``version``'s training arguments by the attribute each sets (as a --yaml-cfg file names
    them): each attribute's flag."""
    return _recorded()[version]["destinations"]


def yaml_flags(path: str, version: str, wanted, world_size: int | None = None) -> tuple[dict, list, list]:
    """The arguments a --yaml-cfg file gives training, as Megatron-LM ``version`` reads it
    (``megatron/training/yaml_arguments.py``): its top-level keys are the arguments' attributes, the
    command line's flags are ignored. Returns the ``wanted`` attributes it gives (None left out), the
    other keys it holds, and warnings: a key no argument of ``version`` reads, with the names it most
    likely meant. As Megatron reads it: a ``data_path`` string is split at whitespace; the
    tensor, pipeline and context parallel sizes come from ``model_parallel`` (1 where absent), the
    first two clamped to ``world_size`` as validate_yaml does; the number of weight shards is not
    read. Refused flags (``REFUSED``) set true are refused."""
    config = read_mapping(path, "--yaml-cfg", "a mapping of Megatron-LM's argument names to values is expected", "YAML")
    known = destinations(version)
    flags, warnings = {}, []
    for key, value in config.items():
        where = f"--yaml-cfg {path}: {key}"
        if key in YAML_SECTIONS:
            if not isinstance(value, dict):
                raise MegacacheError(f"{where}: a section of settings is expected, got {value!r}")
            continue
        if key not in known:  # training takes any key, and may read one no flag sets
            hint = nearest(str(key), [*known, *YAML_SECTIONS]).replace("flags are not", "names are not")
            warnings.append(f"{where} is no argument of Megatron-LM {version}'s training parser; megacache reads "
                            f"nothing from it" + (f"; {hint}" if hint else ""))
            continue
        if known[key] in REFUSED and value:
            raise MegacacheError(f"{where}: {known[key]} cannot be built: {REFUSED[known[key]]}")
        if key in wanted and value is not None:
            flags[key] = _yaml_value(where, key, value)
    for key in (*_YAML_PARALLEL, "tensor_parallel_num_weight_shards"):
        flags.pop(key, None)
    flags.update(_yaml_parallel(path, config.get("model_parallel") or {}, world_size))
    return flags, [k for k in config if k not in flags and k not in YAML_SECTIONS], warnings


def _yaml_value(where: str, key: str, value):
    """``value`` as the parsed argument Megatron's code reads."""
    if isinstance(value, dict):
        raise MegacacheError(f"{where}: a value is expected, got a section")
    if key == "data_path" and isinstance(value, str):
        words = value.split()
        if len(words) == 1:  # kept a string, which Megatron then reads letter by letter
            raise MegacacheError(f"{where}: {value!r} is one word, which Megatron-LM reads letter by letter as "
                                 f"dataset prefixes; write a list: data_path: [{value}]")
        value = words
    if isinstance(value, list):
        if any(w is None or isinstance(w, (bool, list, dict)) for w in value):
            raise MegacacheError(f"{where}: a list of words and numbers is expected, got {value!r}")
        return [str(w) for w in value]
    return value


def _yaml_parallel(path: str, section: dict, world_size: int | None) -> dict:
    sizes = {}
    for key in _YAML_PARALLEL:
        value = section.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MegacacheError(f"--yaml-cfg {path}: model_parallel.{key}: a positive integer is expected, "
                                 f"got {value!r}")
        sizes[key] = value
    if world_size is not None:  # validate_yaml fits tensor, then pipeline parallelism to the world
        tp = sizes["tensor_model_parallel_size"] = min(sizes["tensor_model_parallel_size"], world_size)
        sizes["pipeline_model_parallel_size"] = min(sizes["pipeline_model_parallel_size"], world_size // tp)
    return sizes
