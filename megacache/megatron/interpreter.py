"""The Megatron a user's training runs, asked directly (``--megatron-python PYTHON``): that
interpreter, in megacache's environment (so a Megatron-LM checkout on PYTHONPATH counts), builds the
tokenizer from the same flags with its own ``build_tokenizer`` (``training_worker.py``, a process of
its own without torch.distributed) and reports the ``unique_identifiers`` that training hashes.

Where megacache's table knows that version, both must agree, or the build stops naming each field
that differs: a patched Megatron, or a table gone wrong, must not pass silently. A Megatron newer
than the table is followed as it answers, the rest of the build following the table's newest version.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

from ..errors import MegacacheError
from .flags import flag_words, resolve_flags
from .tokenizer import TOKENIZER_FLAGS, special_tokens, tokenizer_identifiers
from .versions import SUPPORTED, at_least, minor_of, normalize, resolve

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "training_worker.py")
#: ``args`` attributes build_tokenizer reads beyond the tokenizer flags: its vocabulary padding,
#: which does not enter the identity
_PADDING = dict(make_vocab_size_divisible_by=128, tensor_model_parallel_size=1, rank=0)
#: the attributes megatron-core 0.18 on reads under other names than the flags'
_RENAMED = {"tokenizer_special_tokens": "special_tokens", "tokenizer_metadata": "metadata_path"}


@dataclass
class Identity:
    """The megatron-core version a build follows, and the tokenizer identity it hashes."""

    version: str                        # a supported version
    identifiers: dict
    megatron: str | None = None         # the version the Megatron asked reports, e.g. 0.19.2
    note: str | None = None             # for the user, when the table could not check the answer
    #: what that Megatron-LM builds from the whole training command (training_worker.read_command)
    command: dict | None = None


def identity(given: dict, megatron_version: str | None = None, megatron_python: str | None = None,
             command: dict | None = None) -> Identity:
    """From the tokenizer flags ``given``: asked of the interpreter ``megatron_python`` (checked
    against the table), else megacache's table for ``megatron_version`` (``versions.resolve``).
    ``command`` (``{"words": [...], "world_size": N}``): the whole training command, which that
    interpreter's Megatron-LM also reads (``Identity.command``)."""
    if megatron_python:
        return asked_identifiers(megatron_python, given, megatron_version, command)
    version = resolve(megatron_version)
    return Identity(version, tokenizer_identifiers(megatron_version=version, **given))


def attributes(version: str, given: dict) -> dict:
    """``args`` as Megatron-LM ``version`` parses the tokenizer flags ``given`` (its defaults for the
    rest), under the names its ``build_tokenizer`` reads."""
    args = resolve_flags(TOKENIZER_FLAGS, version, given)
    args["tokenizer_special_tokens"] = special_tokens(version, args)
    if at_least(version, "0.18"):
        args = {_RENAMED.get(k, k): v for k, v in args.items()}
    return {**args, **_PADDING}


def ask(python: str, cases: list[dict], timeout_s: float = 600, command: dict | None = None) -> dict:
    """The worker's answer for the tokenizer flags of each case: ``version``, and ``answers`` (per
    case ``identifiers`` or ``error``) or ``error``; and for ``command``, ``command``."""
    # megacache's defaults for every version it knows; the worker takes its own version's, or the
    # newest's for a Megatron newer than the table.
    request = {"cases": [{"words": flag_words(TOKENIZER_FLAGS, given),
                          "attributes": _attributes_by_version(given)}
                         for given in cases], "command": command}
    try:
        done = subprocess.run([python, WORKER], input=json.dumps(request), capture_output=True, text=True,
                              timeout=timeout_s, env=os.environ.copy())
    except FileNotFoundError:
        raise MegacacheError(f"--megatron-python {python}: no such program; give the Python your training "
                             f"runs (e.g. the python of its virtual environment)") from None
    except PermissionError:
        raise MegacacheError(f"--megatron-python {python}: not executable") from None
    except subprocess.TimeoutExpired:
        raise MegacacheError(f"--megatron-python {python}: no answer within {timeout_s:.0f} s") from None
    except OSError as exc:
        raise MegacacheError(f"--megatron-python {python}: cannot run it ({exc.strerror})") from None
    last = done.stdout.rstrip("\n").rpartition("\n")[2]
    try:
        answer = json.loads(last)
        if not isinstance(answer, dict):
            raise ValueError
    except ValueError:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise MegacacheError(f"--megatron-python {python}: did not answer as a Python interpreter "
                             f"running megacache's worker does (exit status {done.returncode}): "
                             + " | ".join(tail)) from None
    return answer


def _attributes_by_version(given: dict) -> dict:
    """``attributes`` for every supported version that has all the flags ``given``."""
    out = {}
    for version in SUPPORTED:
        try:
            out[version] = attributes(version, given)
        except MegacacheError:  # a flag this version lacks
            pass
    return out


def asked_identifiers(python: str, given: dict, requested: str | None = None, command: dict | None = None) -> Identity:
    """The tokenizer identity of the Megatron ``python`` imports, checked against megacache's table
    where it knows that version; ``requested`` (``--megatron-version``) must name the same version.
    ``command``: also asked of it (``ask``)."""
    answer = ask(python, [given], command=command)
    found = answer.get("version")
    if "error" in answer:
        error = answer["error"]
        hint = ("install megatron-core there, or put your Megatron-LM checkout on PYTHONPATH"
                if "No module named 'megatron" in error else "does your training import it?")
        raise MegacacheError(f"--megatron-python {python}: cannot import its Megatron ({error}); {hint}")
    case = answer["answers"][0]
    if "error" in case:
        raise MegacacheError(f"--megatron-python {python}: its megatron-core {found} could not build the "
                             f"tokenizer from these flags: {case['error']}")
    minor = minor_of(found or "")
    if minor is None:
        raise MegacacheError(f"--megatron-python {python}: its megatron.core reports version {found!r}, "
                             f"which is not a version number")
    newest = SUPPORTED[-1]
    known = f"{minor[0]}.{minor[1]}"
    if requested is not None and normalize(requested) != known:
        raise MegacacheError(f"--megatron-version {requested}, but --megatron-python {python} runs megatron-core "
                             f"{found}: give the one your training runs (or leave --megatron-version out)")
    ids = case["identifiers"]
    if known not in SUPPORTED:
        if minor < minor_of(newest):
            raise MegacacheError(f"--megatron-python {python} runs megatron-core {found}, older than the "
                                 f"versions megacache reproduces ({', '.join(SUPPORTED)})")
        return Identity(newest, ids, found,
                        f"megatron-core {found} is newer than megacache's table ({newest}): its own tokenizer "
                        f"identity names the cache; the indices follow {newest}", answer.get("command"))
    table = tokenizer_identifiers(megatron_version=known, **given)
    problems = differences(ids, table)
    if problems:
        raise MegacacheError(
            f"--megatron-python {python} (megatron-core {found}) gives another tokenizer identity than "
            f"megacache's table for {known}, so the cache names would differ:\n"
            + "\n".join(f"  {p}" for p in problems)
            + "\nIf your Megatron is patched, pass its identity with --tokenizer-identifiers FILE.json; "
              "otherwise report this as a megacache bug")
    return Identity(known, ids, found, command=answer.get("command"))


def differences(asked: dict, table: dict) -> list[str]:
    """Each field whose value differs, then (if the values agree) the order of the fields, which the
    description's JSON keeps."""
    out = []
    for key in dict.fromkeys([*asked, *table]):
        if key not in table:
            out.append(f"{key}: this Megatron has {asked[key]!r}, megacache's table has no such field")
        elif key not in asked:
            out.append(f"{key}: megacache's table has {table[key]!r}, this Megatron has no such field")
        elif asked[key] != table[key]:
            out.append(f"{key}: this Megatron has {asked[key]!r}, megacache's table has {table[key]!r}")
    if not out and list(asked) != list(table):
        out.append(f"field order: this Megatron has {list(asked)}, megacache's table has {list(table)}")
    return out


def command_differences(asked: dict, mine: dict) -> list[str]:
    """Each field of what training builds (``training_worker.read_command``) where the Megatron asked
    (``asked``) and megacache's own reading of the same command (``mine``) differ."""
    return [f"{key}: your Megatron has {asked[key]!r}, megacache read {mine[key]!r}"
            for key in mine if key in asked and _plain(asked[key]) != _plain(mine[key])]


def _plain(value):
    """``value`` with tuples as lists, as JSON carries them."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
