"""Records what Megatron-LM's own tools/prepare_cache.py writes for whole training commands, in each
version that has the tool (0.18, 0.19 and main), so that the tests check ``megacache build`` given
the same command against it byte for byte without a Megatron-LM checkout. Writes
tests/data/prepare-cache.json: per version and case, the command (every word, as given to both),
the world size it was prepared for, and each file prepare_cache.py wrote (its sha256), or how it
refused.

    python tests/support/record_prepare_cache.py /path/to/Megatron-LM.git

Each version's tree (tools/ and megatron/, at record_training_flags.REFS) runs in the Python 3.12
oracle environment (tests/megatron_oracles.sh), with pybind11 there for the dataset helpers, which
prepare_cache.py compiles; tests/support/prepare_cache_cpu.py stands in for the GPU query.
The datasets are record_megatron_main.DATASETS, made in a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SUPPORT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(SUPPORT))  # tests/: the ``support`` package

from support.oracles import ROOT  # noqa: E402
from support.record_megatron_main import cache_files, dumps, write_datasets  # noqa: E402
from support.record_training_flags import REFS, git  # noqa: E402
from support.training_command import training_command  # noqa: E402

OUT = os.path.join(os.path.dirname(SUPPORT), "data", "prepare-cache.json")
VERSIONS = ("0.18", "0.19", "0.20")

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


def helpers_env(python: str) -> dict:
    """What prepare_cache.py's own ``make`` of megatron/core/datasets' C++ helpers needs to build them
    for ``python``: its ``python3`` first on the path (pybind11's includes), and its extension suffix
    (the Makefile asks ``python3-config``, which a virtual environment does not have)."""
    suffix = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    return {"PATH": f"{os.path.dirname(python)}{os.pathsep}{os.environ['PATH']}", "MAKEFLAGS": f"LIBEXT={suffix}"}


def run_case(tree: str, python: str, root: Path, version: str, name: str, words: list[str], world: int) -> dict:
    cache = f"cache/{version}/{list(CASES).index(name)}"  # each its own: an entry found is not built again
    command = [*words, "--data-cache-path", cache, "--prepare-cache-world-size", str(world)]
    env = {**os.environ, **helpers_env(python), "PYTHONWARNINGS": "ignore", "PYTHONPATH": tree,
           "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    record = {"words": command}
    try:
        done = subprocess.run([python, os.path.join(SUPPORT, "prepare_cache_cpu.py"),
                               os.path.join(tree, "tools", "prepare_cache.py"), *command],
                              capture_output=True, text=True, env=env, cwd=root, timeout=600)
    except subprocess.TimeoutExpired:  # megatron-core loops forever on an empty split asked for samples
        return {**record, "error": "still running after 600 s"}
    if done.returncode == 0:
        record["files"] = cache_files(str(root / cache))
    else:
        record["error"] = done.stderr.strip().splitlines()[-1]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clone", help="a Megatron-LM git repository (bare or not) with the release tags")
    parser.add_argument("--python", default=os.path.join(ROOT, "py312", "bin", "python"),
                        help="the interpreter prepare_cache.py runs in (default: the Python 3.12 oracle environment)")
    args = parser.parse_args()
    commits, cases = {}, []
    with tempfile.TemporaryDirectory() as work:
        root = Path(work, "run")
        write_datasets(root)
        for version in VERSIONS:
            tree = os.path.join(work, version)
            os.makedirs(tree)
            archive = git(args.clone, "archive", REFS[version], "megatron", "tools")
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            commits[version] = git(args.clone, "rev-parse", REFS[version] + "^{commit}", text=True).strip()
            for name, (data, world) in CASES.items():
                case = {"version": version, "name": name,
                        **run_case(tree, args.python, root, version, name, training_command(version, data), world)}
                print(f"{version} {name}: " + (f"{len(case['files'])} files" if "files" in case else
                                                f"refused: {case['error']}"), flush=True)
                cases.append(case)
    recorded = {"recorded_by": "tests/support/record_prepare_cache.py", "commits": commits, "cases": cases}
    with open(OUT + ".tmp", "w", encoding="utf-8") as f:
        f.write(dumps(recorded))
    os.replace(OUT + ".tmp", OUT)


if __name__ == "__main__":
    main()
