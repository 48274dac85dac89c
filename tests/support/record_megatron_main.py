"""Records what Megatron-LM main (megatron-core 0.20.0, not yet released, so no wheel) answers to the
tests' questions, so that the tests check megacache's ``--megatron-version 0.20`` without a checkout.
Writes tests/data/megatron-main/:

* ``tokenizer_identities.json``: main's ``build_tokenizer(args).unique_identifiers``, or the error it
  raised, for the random and fixed flag sets of tests/conformance/test_tokenizer_identity.py
  (tests/support/tokenizer_cases.py), and the tokenizer flags main's arguments.py declares;
* ``caches.json``: the cache files (names and sha256) main's BlendedMegatronDatasetBuilder writes for
  CACHE_CONFIGS, small datasets this script makes.

Each file names the commit it came from. Paths are recorded relative to, or as ``<ROOT>`` for, the
folder the tokenizer files and datasets were made in, so the data is the same on every machine.

    python tests/support/record_megatron_main.py /path/to/Megatron-LM

Runs in megacache's test environment, which makes the flag sets and files; main's code runs in
tests/support/oracle_worker.py under the Python 3.12 oracle environment (tests/megatron_oracles.sh),
with the checkout first on its path. The checkout's ``megatron/core/datasets`` needs its compiled
helpers (``make`` there, with pybind11 in that environment), and that environment needs gigatoken,
which main imports for ``--use-gigatoken`` (``--extra-path`` adds a folder holding it instead).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SUPPORT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(SUPPORT))  # tests/: the ``support`` package

from support.oracles import MAIN_DATA, ROOT, WORKER  # noqa: E402
from support.tokenizer_files import TIKTOKEN_RANKS  # noqa: E402

VERSION = "0.20"
PLACEHOLDER = "<ROOT>"

#: datasets made for the cache builds (relative prefixes: their names are hashed): document lengths
DATASETS = {"data/a": (7, 1200), "data/b": (8, 250), "data/c": (9, 120)}


def dataset_lengths(seed: int, count: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 60, count).tolist()


#: the cache builds recorded: main's BlendedMegatronDatasetBuilder(GPTDataset, sizes, ...) under the
#: folder holding DATASETS and the tokenizer files, in oracle_worker.py's terms
CACHE_CONFIGS = [
    dict(name="one prefix, Hugging Face, default split", blend=[["data/a"], None], split="969, 30, 1",
         sizes=[300, 40, 8], L=16, x=1, drop_last=True, seed=1234,
         tokenizer=dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf")),
    dict(name="one prefix, NullTokenizer", blend=[["data/b"], None], split="98,2,0", sizes=[100, 5, None],
         L=8, x=0, drop_last=False, seed=7, tokenizer=dict(tokenizer_type="NullTokenizer", vocab_size=1000)),
    dict(name="weighted blend, GPT-2 with gigatoken", blend=[["data/a", "data/b"], [0.3, 0.7]], split="90,5,5",
         sizes=[500, 30, 30], L=12, x=1, drop_last=True, seed=1234,
         tokenizer=dict(tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2files/vocab.json",
                        merge_file="gpt2files/merges.txt", use_gigatoken=True)),
    dict(name="blend per split, tiktoken", blend_per_split=[[["data/a", "data/c"], None], [["data/c"], None], None],
         sizes=[200, 20, None], L=16, x=1, drop_last=True, seed=99,
         tokenizer=dict(tokenizer_type="TikTokenizer", tokenizer_model="ranks.json",
                        vocab_size=1000 + TIKTOKEN_RANKS)),
]


def make_files(root: Path) -> None:
    """The tokenizer files and the datasets, under ``root``."""
    from support.tokenizer_files import write_tokenizer_files

    write_tokenizer_files(root)
    write_datasets(root)


def write_datasets(root: Path) -> None:
    """DATASETS, under ``root``."""
    from support.oracle import write_lengths

    for prefix, (seed, count) in DATASETS.items():
        os.makedirs(root / os.path.dirname(prefix), exist_ok=True)
        write_lengths(str(root / prefix), dataset_lengths(seed, count))


def worker_config(c: dict) -> dict:
    """A CACHE_CONFIGS entry as oracle_worker.py's caches task takes it (run in the folder of the files)."""
    out = {k: v for k, v in c.items() if k != "name"}
    return {**out, "tokenizer_cwd": ".", "path_to_cache": cache_dir(c)}


def cache_dir(c: dict) -> str:
    return f"cache/{CACHE_CONFIGS.index(c)}"


def cache_files(directory: str) -> dict[str, str]:
    """Each file of a cache directory (megacache's own state directory left out): its sha256."""
    return {e.name: hashlib.sha256(open(e.path, "rb").read()).hexdigest()
            for e in sorted(os.scandir(directory), key=lambda e: e.name) if e.is_file()}


def _placed(value, old: str, new: str):
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_placed(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _placed(v, old, new) for k, v in value.items()}
    return value


def dumps(data: dict) -> str:
    """JSON with one line per entry of each top-level list or object (a flag set and its answer)."""
    def one(value) -> str:
        return json.dumps(value, ensure_ascii=False)

    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value:
            inner = ",\n".join(f"  {one(v)}" for v in value)
            lines.append(f" {one(key)}: [\n{inner}\n ]")
        elif isinstance(value, dict) and value:
            inner = ",\n".join(f"  {one(k)}: {one(v)}" for k, v in value.items())
            lines.append(f" {one(key)}: {{\n{inner}\n }}")
        else:
            lines.append(f" {one(key)}: {one(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def ask_main(python: str, path: str, cwd: str, request: dict) -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}
    done = subprocess.run([python, WORKER], input=json.dumps(request), capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=3600)
    if done.returncode != 0:
        sys.exit(f"Megatron-LM main's worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.rsplit("\n", 1)[-1])


def commit_of(checkout: str) -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", checkout, *args], capture_output=True, text=True, check=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "date": git("log", "-1", "--format=%cI")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", help="a Megatron-LM main checkout (its datasets helpers compiled)")
    parser.add_argument("--extra-path", action="append", default=[], metavar="DIR",
                        help="a folder put on main's path after the checkout (gigatoken)")
    parser.add_argument("--python", default=os.path.join(ROOT, "py312", "bin", "python"),
                        help="the interpreter main runs in (default: the Python 3.12 oracle environment)")
    parser.add_argument("--out", default=MAIN_DATA, help="where to write (default tests/data/megatron-main)")
    args = parser.parse_args()
    from support.tokenizer_cases import fixed_cases, random_cases

    checkout = os.path.abspath(args.checkout)
    path = os.pathsep.join([checkout, *map(os.path.abspath, args.extra_path)])
    source = commit_of(checkout)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="megacache-main-") as tmp:
        root = os.path.realpath(tmp)
        make_files(Path(root))

        random_flags = random_cases(VERSION, PLACEHOLDER)
        fixed = fixed_cases(VERSION, PLACEHOLDER)
        cases = _placed(random_flags + list(fixed.values()), PLACEHOLDER, root)
        answer = ask_main(args.python, path, root, {"task": "tokenizers", "cwd": root, "cases": cases})
        version = answer["version"]
        if not version.startswith(f"{VERSION}."):
            sys.exit(f"{checkout} is megatron-core {version}, not {VERSION}")
        results = _placed(answer["results"], root, PLACEHOLDER)
        flags = ask_main(args.python, path, root, {"task": "tokenizer_flags"})["results"]
        identities = {
            **source, "megatron_core": version,
            "random": [{"flags": f, **r} for f, r in zip(random_flags, results)],
            "fixed": {name: {"flags": f, **r} for (name, f), r in zip(fixed.items(), results[len(random_flags):])},
            "tokenizer_flags": flags,
        }

        configs = [worker_config(c) for c in CACHE_CONFIGS]
        errors = ask_main(args.python, path, root, {"task": "caches", "configs": configs})["results"]
        caches = {**source, "megatron_core": version, "builds": [
            {"name": c["name"], "error": e, "files": None if e else cache_files(os.path.join(root, cache_dir(c)))}
            for c, e in zip(CACHE_CONFIGS, errors)]}

    for name, data in (("tokenizer_identities.json", identities), ("caches.json", caches)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(dumps(data))
    equal = sum("ids" in r for r in results)
    print(f"megatron-core {version} at {source['commit'][:10]} ({source['date']}): {len(results)} flag sets "
          f"({equal} identities, {len(results) - equal} errors), {len(CACHE_CONFIGS)} cache builds "
          f"({sum(e is not None for e in errors)} errors) -> {args.out}")


if __name__ == "__main__":
    main()
