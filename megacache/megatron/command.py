"""A Megatron-LM training command as ``megacache build`` reads it: the whole command line training is
given, verbatim. The flags that decide the caches are megacache's own flags, spelled as Megatron
spells them; every other flag the chosen version's training parser knows is set aside (it changes
nothing in the caches); a flag that version does not know is an error, as it is to training.

Which flags each version knows, and how many words each takes, is data recorded from that version's
own parser (training_flags.json, by tests/support/record_training_flags.py), never typed by hand.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re

from ..errors import MegacacheError
from .flags import absent_from
from .versions import SUPPORTED

#: every flag of each version's training parser (and of its tools/prepare_cache.py), as
#: tests/support/record_training_flags.py recorded them from that version's own code
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
    "--yaml-cfg": "megacache does not read Megatron's YAML configuration yet: give its flags on the command line",
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


def _wants_more(takes, have: int) -> bool:
    return takes in ("*", "+") or (takes == "?" and have < 1) or (isinstance(takes, int) and have < takes)


def _unknown(flag: str, version: str, known: list[str]) -> str:
    elsewhere = versions_having(flag)
    if elsewhere:
        return absent_from(version, flag, elsewhere)
    hint = nearest(flag, known)
    return f"{flag} is not a flag of Megatron-LM {version}'s training" + (f"; {hint}" if hint else "")
