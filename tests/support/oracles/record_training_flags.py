"""Records every flag of each supported version's Megatron-LM training parser, so that ``megacache
build`` takes a training command as it is: the flags it reads are used, every other flag that
version's training knows is accepted, and a flag it does not know is an error. Writes
megacache/megatron/training_flags.json.

Each version's parser is asked, not read: ``add_megatron_arguments`` of that version's
``megatron/training/arguments.py`` builds it in the Python 3.12 oracle environment
(tests/megatron_oracles.sh), with the version's source first on the path, and tools/prepare_cache.py
adds its own flags where the version has it. A new Megatron-LM release is one more entry in REFS and
one run:

    python tests/support/oracles/record_training_flags.py /path/to/Megatron-LM.git

The clone needs the release tags and the main commit below. The oracle environment needs ``six``
beyond what tests/megatron_oracles.sh installs (0.16's BERT tokenizer module imports it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, TESTS)  # the ``support`` package

from support.oracles.environments import ROOT, WORKER, recorded_main  # noqa: E402

from megacache.megatron.command import TABLE_PATH  # noqa: E402
from megacache.megatron.versions import SUPPORTED  # noqa: E402

#: the release whose parser each version's table is (patch releases of one minor version declare the
#: same flags), and for 0.20 the main commit the rest of main's recorded data comes from
REFS = {"0.16": "core_v0.16.1", "0.17": "core_v0.17.1", "0.18": "core_v0.18.2", "0.19": "core_v0.19.0",
        "0.20": recorded_main("caches.json")["commit"]}
assert tuple(REFS) == SUPPORTED


def git(clone: str, *args: str, **kwargs) -> str:
    return subprocess.run(["git", "-C", clone, *args], capture_output=True, check=True, **kwargs).stdout


def record(clone: str, ref: str, python: str) -> dict:
    with tempfile.TemporaryDirectory() as tree:
        archive = git(clone, "archive", ref, "megatron", "tools")
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        tools = os.path.join(tree, "tools")
        request = {"task": "training_flags",
                   "tools": tools if os.path.exists(os.path.join(tools, "prepare_cache.py")) else None}
        done = subprocess.run([python, WORKER], input=json.dumps(request), capture_output=True, text=True,
                              env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": tree}, cwd=tree)
        if done.returncode != 0:
            sys.exit(f"{ref}: the worker failed:\n{done.stderr[-4000:]}")
        answer = json.loads(done.stdout.rsplit("\n", 1)[-1])
    return {"ref": ref, "commit": git(clone, "rev-parse", ref + "^{commit}", text=True).strip(), **answer["results"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clone", help="a Megatron-LM git repository (bare or not) with the release tags")
    parser.add_argument("--python", default=os.path.join(ROOT, "py312", "bin", "python"),
                        help="the interpreter the parsers are built in (default: the Python 3.12 oracle environment)")
    parser.add_argument("--out", default=TABLE_PATH, help="where to write (default: megacache's own table)")
    args = parser.parse_args()
    versions = {}
    for version, ref in REFS.items():
        versions[version] = record(args.clone, ref, args.python)
        print(f"{version} ({ref}): {len(versions[version]['training'])} training flags, "
              f"{len(versions[version]['prepare_cache'])} of prepare_cache.py", flush=True)
    table = {"recorded_by": "tests/support/oracles/record_training_flags.py", "versions": versions}
    with open(args.out + ".tmp", "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
