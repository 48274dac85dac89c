"""Records what Megatron-LM's own code writes for whole training commands, so that the tests check
``megacache build`` given the same command against it byte for byte without a Megatron-LM checkout:
tools/prepare_cache.py in each version that has it (0.18, 0.19 and main), the training's own start
(tests/support/oracles/training_datasets_cpu.py: pretrain_gpt.py up to its datasets) in 0.16 and 0.17, and
in every version the same commands as a --yaml-cfg file read by the training's start. Writes
tests/data/prepare-cache.json: per version and case, the program that wrote the files, the command
(every word, as given to megacache), the YAML file where there is one, each file written (its
sha256) or how it refused, and what megacache's --megatron-python worker
(megacache/megatron/training_worker.py) reads from the command in that version's tree.

    python tests/support/oracles/record_prepare_cache.py /path/to/Megatron-LM.git

Each version's tree (tools/, megatron/ and pretrain_gpt.py with what it imports, at
record_training_flags.REFS) runs in the Python 3.12 oracle environment (tests/megatron_oracles.sh),
with pybind11 there for the dataset helpers, which both programs compile; prepare_cache_cpu.py and
training_datasets_cpu.py stand in for the GPU (and the training's world size, as WORLD_SIZE).
The datasets are record_megatron_main.DATASETS, made in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, TESTS)  # the ``support`` package
sys.path.insert(0, os.path.dirname(TESTS))  # the repository: ``benchmarks``

from benchmarks.prepare import helpers_env  # noqa: E402
from support.oracles.environments import ROOT  # noqa: E402
from support.oracles.record_megatron_main import cache_files, dumps, write_datasets  # noqa: E402
from support.oracles.record_training_flags import REFS, git  # noqa: E402
from support.inputs.training_command import training_command  # noqa: E402

from megacache.megatron.interpreter import WORKER  # noqa: E402
from megacache.megatron.versions import SUPPORTED  # noqa: E402

OUT = os.path.join(TESTS, "data", "prepare-cache.json")
#: the versions whose tools/prepare_cache.py is recorded; every version's training start is
PREPARE_CACHE = ("0.18", "0.19", "0.20")
#: what a --yaml-cfg case leaves out of the command: validate_yaml allows interleaved pipelines only
#: above 2 pipeline stages (validate_args, which the command is also read with, from 2)
NOT_IN_YAML = ("--num-layers-per-virtual-pipeline-stage",)

#: pretrain_gpt.py and the modules beside it that it imports
TRAINING = ("pretrain_gpt.py", "gpt_builders.py", "model_provider.py")

_SIZES = ["--seq-length", "16", "--eval-iters", "2", "--eval-interval", "10", "--seed", "7",
          "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
#: the data flags of each case (the example command's --micro-batch-size 1 and parallel sizes, tensor 2
#: and pipeline 2, around them), and the world size prepared for
CASES = {
    "one prefix": (["--data-path", "data/a", "--split", "90,8,2", "--train-iters", "30", "--global-batch-size", "8",
                    *_SIZES], 8),
    "weighted blend": (["--data-path", "0.6", "data/a", "0.4", "data/b", "--split", "90,8,2", "--train-iters", "25",
                        "--global-batch-size", "8", *_SIZES], 8),
    "blend per split": (["--train-data-path", "data/a", "data/c", "--valid-data-path", "data/b", "--test-data-path",
                         "data/c", "--train-samples", "300", "--global-batch-size", "4", *_SIZES], 4),
    "global batch from the world size": (["--data-path", "data/b", "--split", "90,8,2", "--train-iters", "20",
                                          *_SIZES], 16),
    "batch-size ramp-up": (["--data-path", "data/a", "--split", "90,8,2", "--train-samples", "400",
                            "--global-batch-size", "16",
                            "--rampup-batch-size", "4", "4", "100", *_SIZES], 8),
}


def without(words: list[str], flags) -> list[str]:
    """``words`` less each of ``flags`` with its values."""
    out, dropping = [], False
    for word in words:
        if word.startswith("--"):
            dropping = word in flags
        if not dropping:
            out.append(word)
    return out


def run_case(tree: str, python: str, root: Path, version: str, program: str, case: int, words: list[str],
             world: int) -> dict:
    # each its own: an entry found is not built again
    cache = f"cache/{version}/{program.split()[-1].lstrip('-')}/{case}"
    env = {**os.environ, **helpers_env(python), "PYTHONWARNINGS": "ignore", "PYTHONPATH": tree,
           "CUDA_DEVICE_MAX_CONNECTIONS": "1", "WORLD_SIZE": str(world)}
    command = [*words, "--data-cache-path", cache]
    record = {"program": program, "words": [*command, "--prepare-cache-world-size", str(world)]}
    if program == "prepare_cache.py":
        run = [os.path.join(HERE, "prepare_cache_cpu.py"), os.path.join(tree, "tools", "prepare_cache.py"),
               *record["words"]]
    elif program == "pretrain_gpt.py":
        run = [os.path.join(HERE, "training_datasets_cpu.py"), *command]
    else:  # the command as a --yaml-cfg file
        yaml_file = f"{version}-{case}.yaml"
        command = without(command, NOT_IN_YAML)
        run = [os.path.join(HERE, "training_datasets_cpu.py"), "--as-yaml", yaml_file, *command]
        record["words"] = ["--yaml-cfg", yaml_file, "--prepare-cache-world-size", str(world)]
    try:
        done = subprocess.run([python, *run], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    except subprocess.TimeoutExpired:  # megatron-core loops forever on an empty split asked for samples
        return {**record, "error": "still running after 600 s"}
    if done.returncode == 0:
        record["files"] = cache_files(str(root / cache))
    else:
        record["error"] = done.stderr.strip().splitlines()[-1]
    if program == "pretrain_gpt.py --yaml-cfg":
        record["yaml"] = (root / yaml_file).read_text(encoding="utf-8")
        command = ["--yaml-cfg", yaml_file]
    record["reading"] = reading(python, env, root, command, world)
    return record


def reading(python: str, env: dict, root: Path, command: list[str], world: int) -> dict:
    """What megacache's worker for --megatron-python answers for ``command`` in this version's tree."""
    request = {"cases": [], "command": {"words": command, "world_size": world}}
    done = subprocess.run([python, WORKER], input=json.dumps(request), capture_output=True, text=True, env=env,
                          cwd=root, timeout=600)
    answer = json.loads(done.stdout.rsplit("\n", 2)[-2])["command"]
    answer.pop("traceback", None)
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clone", help="a Megatron-LM git repository (bare or not) with the release tags")
    parser.add_argument("--python", default=os.path.join(ROOT, "py312", "bin", "python"),
                        help="the interpreter prepare_cache.py runs in (default: the Python 3.12 oracle environment)")
    parser.add_argument("--versions", nargs="+", choices=SUPPORTED, default=list(SUPPORTED),
                        help="record these versions again, keeping the others' records (default: all)")
    args = parser.parse_args()
    commits, cases = {}, []
    if set(args.versions) != set(SUPPORTED):
        with open(OUT, encoding="utf-8") as f:
            kept = json.load(f)
        commits = {v: c for v, c in kept["commits"].items() if v not in args.versions}
        cases = [c for c in kept["cases"] if c["version"] not in args.versions]
    with tempfile.TemporaryDirectory() as work:
        root = Path(work, "run")
        write_datasets(root)
        for version in args.versions:
            tree = os.path.join(work, version)
            os.makedirs(tree)
            archive = git(args.clone, "archive", REFS[version], "megatron", "tools", *TRAINING)
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            commits[version] = git(args.clone, "rev-parse", REFS[version] + "^{commit}", text=True).strip()
            programs = ("prepare_cache.py" if version in PREPARE_CACHE else "pretrain_gpt.py",
                        "pretrain_gpt.py --yaml-cfg")
            for program in programs:
                for i, (name, (data, world)) in enumerate(CASES.items()):
                    case = {"version": version, "name": name, **run_case(
                        tree, args.python, root, version, program, i, training_command(version, data), world)}
                    print(f"{version} {program} {name}: " + (f"{len(case['files'])} files" if "files" in case else
                                                              f"refused: {case['error']}"), flush=True)
                    cases.append(case)
    order = {v: i for i, v in enumerate(SUPPORTED)}
    cases.sort(key=lambda c: order[c["version"]])  # stable: each version's cases as recorded
    recorded = {"recorded_by": "tests/support/oracles/record_prepare_cache.py",
                "commits": {v: commits[v] for v in SUPPORTED}, "cases": cases}
    with open(OUT + ".tmp", "w", encoding="utf-8") as f:
        f.write(dumps(recorded))
    os.replace(OUT + ".tmp", OUT)


if __name__ == "__main__":
    main()
