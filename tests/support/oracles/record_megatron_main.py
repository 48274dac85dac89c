"""Records what Megatron-LM main (megatron-core 0.20.0, not yet released, so no wheel) answers to the
tests' questions, so that the tests check megacache's ``--megatron-version 0.20`` without a checkout.
Writes tests/data/megatron-main/:

* ``tokenizer_identities.json``: main's ``build_tokenizer(args).unique_identifiers``, or the error it
  raised, for the random and fixed flag sets of tests/conformance/test_tokenizer_identity.py
  (tests/support/inputs/tokenizer_cases.py), and the tokenizer flags main's arguments.py declares;
* ``caches.json``: the cache files (names and sha256) main's BlendedMegatronDatasetBuilder writes for
  CACHE_CONFIGS, small datasets this script makes;
* ``object_storage_caches.json``: the same for OBJECT_STORAGE_CONFIGS, those datasets read from s3://
  and msc:// paths (``object_storage_cache_path``) in a bucket of moto's S3 server (tests/support/systems/s3server.py),
  to which the script uploads them (``upload_datasets``); and, per build, main given the cache
  ``megacache build`` writes for it (``megacache_loaded``: megacache's files, main's answer, and
  whether main left them as they were).

Each file names the commit it came from. Paths are recorded relative to, or as ``<ROOT>`` for, the
folder the tokenizer files and datasets were made in, so the data is the same on every machine.

    python tests/support/oracles/record_megatron_main.py /path/to/Megatron-LM
    python tests/support/oracles/record_megatron_main.py --object-storage-only /path/to/Megatron-LM

The checkout is a git work tree, or an exported tree with its commit in a ``.commit`` file (its date
is then not known).

Runs in megacache's test environment, which makes the flag sets and files; main's code runs in
tests/support/oracles/megatron_worker.py under the Python 3.12 oracle environment (tests/megatron_oracles.sh),
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

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, TESTS)  # the ``support`` package

from support.oracles.environments import MAIN_DATA, ROOT, WORKER  # noqa: E402
from support.inputs.tokenizer_files import TIKTOKEN_RANKS  # noqa: E402
from support.sweeps import snapshot, words  # noqa: E402

VERSION = "0.20"
PLACEHOLDER = "<ROOT>"

#: datasets made for the cache builds (relative prefixes: their names are hashed): document lengths
DATASETS = {"data/a": (7, 1200), "data/b": (8, 250), "data/c": (9, 120),
            **{f"data/w{i:02d}": (100 + i, 200) for i in range(50)}}


def dataset_lengths(seed: int, count: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 60, count).tolist()


#: the cache builds recorded: main's BlendedMegatronDatasetBuilder(GPTDataset, sizes, ...) under the
#: folder holding DATASETS and the tokenizer files, in megatron_worker.py's terms
CACHE_CONFIGS = [
    dict(name="one prefix, Hugging Face, default split", blend=[["data/a"], None], split="969, 30, 1",
         sizes=[300, 40, 8], seq_length=16, add_extra_token=True, drop_last_partial_validation=True, seed=1234,
         tokenizer=dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="hf")),
    dict(name="one prefix, NullTokenizer", blend=[["data/b"], None], split="98,2,0", sizes=[100, 5, None],
         seq_length=8, add_extra_token=False, drop_last_partial_validation=False, seed=7,
         tokenizer=dict(tokenizer_type="NullTokenizer", vocab_size=1000)),
    dict(name="weighted blend, GPT-2 with gigatoken", blend=[["data/a", "data/b"], [0.3, 0.7]], split="90,5,5",
         sizes=[500, 30, 30], seq_length=12, add_extra_token=True, drop_last_partial_validation=True, seed=1234,
         tokenizer=dict(tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2files/vocab.json",
                        merge_file="gpt2files/merges.txt", use_gigatoken=True)),
    dict(name="blend per split, tiktoken", blend_per_split=[[["data/a", "data/c"], None], [["data/c"], None], None],
         sizes=[200, 20, None], seq_length=16, add_extra_token=True, drop_last_partial_validation=True, seed=99,
         tokenizer=dict(tokenizer_type="TikTokenizer", tokenizer_model="ranks.json",
                        vocab_size=1000 + TIKTOKEN_RANKS)),
]


#: the bucket the object-storage builds read DATASETS from; its name is in their paths, so in the
#: caches' names
BUCKET = "megatron-main"
#: the multi-storage-client profile naming BUCKET, for msc:// paths
PROFILE = "corpus"
#: the training flags whose split sizes (0.20's arithmetic) are the object-storage builds' ``sizes``,
#: for a test that gives them to megacache's CLI
SIZE_FLAGS = dict(train_samples=200, eval_iters=2, eval_interval=50, global_batch_size=8)
_S3 = dict(sizes=[200, 16, 16], seq_length=16, add_extra_token=True, drop_last_partial_validation=True, seed=1234,
           tokenizer=dict(tokenizer_type="NullTokenizer", vocab_size=1000))
#: builds from s3:// paths, each .idx copied under ``object_storage_cache_path`` as training does
OBJECT_STORAGE_CONFIGS = [
    dict(name="one s3:// prefix", blend=[[f"s3://{BUCKET}/data/a"], None], split="90,8,2", **_S3),
    dict(name="weighted blend of s3:// prefixes", blend=[[f"s3://{BUCKET}/data/a", f"s3://{BUCKET}/data/b"],
                                                         [0.3, 0.7]], split="90,8,2", **_S3),
    dict(name="blend per split of s3:// prefixes", blend_per_split=[
        [[f"s3://{BUCKET}/data/a", f"s3://{BUCKET}/data/c"], [2.0, 1.0]], [[f"s3://{BUCKET}/data/b"], None],
        [[f"s3://{BUCKET}/data/c"], None]], **_S3),
    dict(name="weighted blend of msc:// prefixes", blend=[[f"msc://{PROFILE}/data/a", f"msc://{PROFILE}/data/c"],
                                                          [1.0, 2.0]], split="90,8,2", enable_msc=True, **_S3),
    dict(name="weighted blend of 50 s3:// prefixes", blend=[[f"s3://{BUCKET}/data/w{i:02d}" for i in range(50)],
                                                            [float(1 + i % 7) for i in range(50)]], split="90,8,2",
         **_S3),
]


def make_files(root: Path) -> None:
    """The tokenizer files and the datasets, under ``root``."""
    from support.inputs.tokenizer_files import write_tokenizer_files

    write_tokenizer_files(root)
    write_datasets(root)


def write_datasets(root: Path) -> None:
    """DATASETS, under ``root``."""
    from support.inputs.indexed import write_lengths

    for prefix, (seed, count) in DATASETS.items():
        os.makedirs(root / os.path.dirname(prefix), exist_ok=True)
        write_lengths(str(root / prefix), dataset_lengths(seed, count))


def upload_datasets(server, root: Path) -> None:
    """DATASETS (written under ``root``) uploaded to BUCKET on ``server`` (an s3server.S3Server) under
    their relative prefixes."""
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    for prefix in DATASETS:
        for suffix in (".idx", ".bin"):
            client.upload_file(str(root / f"{prefix}{suffix}"), BUCKET, prefix + suffix)


def worker_config(c: dict) -> dict:
    """A CACHE_CONFIGS or OBJECT_STORAGE_CONFIGS entry as megatron_worker.py's caches task takes it
    (run in the folder of the files)."""
    out = {k: v for k, v in c.items() if k != "name"}
    if c in OBJECT_STORAGE_CONFIGS:
        out["object_storage_cache_path"] = idx_cache_dir(c)
    return {**out, "tokenizer_cwd": ".", "path_to_cache": cache_dir(c)}


def cache_dir(c: dict) -> str:
    if c in OBJECT_STORAGE_CONFIGS:
        return f"object-storage-cache/{OBJECT_STORAGE_CONFIGS.index(c)}"
    return f"cache/{CACHE_CONFIGS.index(c)}"


def idx_cache_dir(c: dict) -> str:
    """Where an OBJECT_STORAGE_CONFIGS build copies the .idx files."""
    return f"idx-cache/{OBJECT_STORAGE_CONFIGS.index(c)}"


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


def ask_main(python: str, path: str, cwd: str, request: dict, environment: dict | None = None) -> dict:
    env = {**(environment or os.environ), "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}
    done = subprocess.run([python, WORKER], input=json.dumps(request), capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=3600)
    if done.returncode != 0:
        sys.exit(f"Megatron-LM main's worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.rsplit("\n", 1)[-1])


def commit_of(checkout: str) -> dict:
    if not os.path.exists(os.path.join(checkout, ".git")):
        with open(os.path.join(checkout, ".commit")) as f:
            return {"commit": f.read().strip(), "date": None}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", checkout, *args], capture_output=True, text=True, check=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "date": git("log", "-1", "--format=%cI")}


def record_caches(configs: list[dict], root: str, source: dict, answer) -> dict:
    """What main wrote under ``root`` for ``configs``; ``answer(request)`` is its worker's answer."""
    done = answer({"task": "caches", "configs": [worker_config(c) for c in configs]})
    return {**source, "megatron_core": done["version"], "builds": [
        {"name": c["name"], "error": e, "files": None if e else cache_files(os.path.join(root, cache_dir(c)))}
        for c, e in zip(configs, done["results"])]}


def record_object_storage(python: str, path: str, root: str, source: dict) -> dict:
    """OBJECT_STORAGE_CONFIGS built by main from DATASETS uploaded to a moto server of its own."""
    from support.systems.s3server import S3Server, msc_config

    server = S3Server(root)
    try:
        upload_datasets(server, Path(root))
        environment = server.environment(MSC_CONFIG=msc_config(server, os.path.join(root, "msc.json"), PROFILE, BUCKET))

        def answer(request: dict) -> dict:
            return ask_main(python, path, root, request, environment)

        records = record_caches(OBJECT_STORAGE_CONFIGS, root, source, answer)
        for c, record in zip(OBJECT_STORAGE_CONFIGS, records["builds"]):
            record["megacache_loaded"] = main_loads_megacache(c, root, environment, answer)
        return records
    finally:
        server.stop()


def megacache_build_args(c: dict, cache: str, idx: str, splits_file: str) -> list[str]:
    """``megacache build``'s arguments for an OBJECT_STORAGE_CONFIGS entry, as its training flags
    (SIZE_FLAGS for the sizes): the cache under ``cache``, the .idx copies under ``idx``; a blend per
    split is written to ``splits_file`` and named by --per-split-data-args-path."""
    if c.get("blend_per_split"):
        with open(splits_file, "w") as f:
            json.dump(dict(zip(("train", "valid", "test"), (words(*b) for b in c["blend_per_split"]))), f)
        data = ["--per-split-data-args-path", splits_file]
    else:
        data = ["--data-path", *words(*c["blend"]), "--split", c["split"]]
    args = ["build", *data, "--megatron-version", VERSION, "--seq-length", str(c["seq_length"]),
            "--seed", str(c["seed"]), "--tokenizer-type", c["tokenizer"]["tokenizer_type"],
            "--vocab-size", str(c["tokenizer"]["vocab_size"]), "--data-cache-path", cache,
            "--object-storage-cache-path", idx, "--per-dataset-sequences-path", ""]
    for flag, value in SIZE_FLAGS.items():
        args += [f"--{flag.replace('_', '-')}", str(value)]
    return args


def main_loads_megacache(c: dict, root: str, environment: dict, answer) -> dict:
    """``megacache build`` of an OBJECT_STORAGE_CONFIGS entry (this process's megacache, in ``root``),
    then main's builder given megacache's cache: megacache's files, main's answer (None, or how it
    refused) and whether main left the cache as it was (``snapshot``: nothing built or rewritten)."""
    index = OBJECT_STORAGE_CONFIGS.index(c)
    cache = os.path.join(root, f"megacache-cache/{index}")
    args = megacache_build_args(c, cache, os.path.join(root, f"megacache-idx/{index}"),
                                os.path.join(root, f"megacache-splits-{index}.json"))
    done = subprocess.run([sys.executable, "-m", "megacache", *args], cwd=root, env=environment,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"megacache build failed for {c['name']!r}:\n{done.stderr[-4000:]}")
    before = snapshot(cache)
    config = {**worker_config(c), "path_to_cache": cache, "object_storage_cache_path": f"main-idx/{index}"}
    error = answer({"task": "caches", "configs": [config]})["results"][0]
    return {"files": cache_files(cache), "error": error, "unchanged": snapshot(cache) == before}


def write(out: str, name: str, data: dict) -> None:
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        f.write(dumps(data))


def built(records: dict) -> str:
    return f"{len(records['builds'])} cache builds ({sum(b['error'] is not None for b in records['builds'])} errors)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", help="a Megatron-LM main checkout (its datasets helpers compiled)")
    parser.add_argument("--extra-path", action="append", default=[], metavar="DIR",
                        help="a folder put on main's path after the checkout (gigatoken)")
    parser.add_argument("--python", default=os.path.join(ROOT, "py312", "bin", "python"),
                        help="the interpreter main runs in (default: the Python 3.12 oracle environment)")
    parser.add_argument("--out", default=MAIN_DATA, help="where to write (default tests/data/megatron-main)")
    parser.add_argument("--object-storage-only", action="store_true",
                        help="record object_storage_caches.json only, leaving the other files as they are")
    args = parser.parse_args()
    from support.inputs.tokenizer_cases import fixed_cases, random_cases

    checkout = os.path.abspath(args.checkout)
    path = os.pathsep.join([checkout, *map(os.path.abspath, args.extra_path)])
    source = commit_of(checkout)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="megacache-main-") as tmp:
        root = os.path.realpath(tmp)
        make_files(Path(root))
        stored = record_object_storage(args.python, path, root, source)
        version = stored["megatron_core"]
        if not version.startswith(f"{VERSION}."):
            sys.exit(f"{checkout} is megatron-core {version}, not {VERSION}")
        write(args.out, "object_storage_caches.json", stored)
        print(f"megatron-core {version} at {source['commit'][:10]} ({source['date']}): "
              f"{built(stored)} from object storage -> {args.out}")
        if args.object_storage_only:
            return

        random_flags = random_cases(VERSION, PLACEHOLDER)
        fixed = fixed_cases(VERSION, PLACEHOLDER)
        cases = _placed(random_flags + list(fixed.values()), PLACEHOLDER, root)
        answer = ask_main(args.python, path, root, {"task": "tokenizers", "cwd": root, "cases": cases})
        results = _placed(answer["results"], root, PLACEHOLDER)
        flags = ask_main(args.python, path, root, {"task": "tokenizer_flags"})["results"]
        identities = {
            **source, "megatron_core": version,
            "random": [{"flags": f, **r} for f, r in zip(random_flags, results)],
            "fixed": {name: {"flags": f, **r} for (name, f), r in zip(fixed.items(), results[len(random_flags):])},
            "tokenizer_flags": flags,
        }
        caches = record_caches(CACHE_CONFIGS, root, source, lambda request: ask_main(args.python, path, root, request))

    write(args.out, "tokenizer_identities.json", identities)
    write(args.out, "caches.json", caches)
    equal = sum("ids" in r for r in results)
    print(f"{len(results)} flag sets ({equal} identities, {len(results) - equal} errors), {built(caches)} "
          f"-> {args.out}")


if __name__ == "__main__":
    main()
