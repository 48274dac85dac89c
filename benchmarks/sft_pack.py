"""Preparing Megatron-Bridge's packed SFT files: ``megacache pack --bridge-config`` under ``mpiexec -n
RANKS`` against Bridge 0.6.2's own preparation, ``GPTSFTDatasetBuilder.prepare_data()`` with
``offline_packing_specs.num_tokenizer_workers`` WORKERS (tests/support/oracles/bridge_sft_builder_worker.py
in the oracle environment tests/bridge_oracle.sh builds), on the same finetuning configuration.

The split: EXAMPLES JSONL lines of ``{"input", "output"}``, each side the first one to four
sentences of a document of megacache's generated sample corpus (``sample_corpus.sample_documents``,
seeded), put into a prompt template; the tokenizer is the tests' byte-level BPE ``sft-bpe``
(``tests/support/inputs/tokenizer_files.write_sft_tokenizers``). Only the training split is prepared
(``do_validation: false``). Each run gets a fresh dataset root (the JSONL hard-linked, so Bridge builds
its line index every time), after a ``sync``, timed from outside until its output is durable (its
process, then a ``sync``); the two alternate, and every megacache output is compared byte for byte
with Bridge's. One JSON line per run in benchmarks/results/sft_pack.jsonl: wall seconds, the load
average before it, CPU seconds per process (children included: Bridge's tokenizer workers) and peak
RSS per process (Bridge's main process alone).

    python -m benchmarks.sft_pack [--examples 100000] [--ranks 2] [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from .harness import (BenchmarkFailure, append_record, git_commit, kept_on_failure, machine_info, run_program,
                      same_outputs, shown)
from .suite import installed

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "sft_pack.jsonl")
TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
WORKER = os.path.join(TESTS, "support", "oracles", "bridge_sft_builder_worker.py")
BRIDGE_ORACLE = os.environ.get("MEGACACHE_BRIDGE_ORACLE", os.path.expanduser("~/.cache/megacache/bridge-oracle"))
SEED = 2026
#: the dataset section (Bridge reads the template's ``\\n`` as a newline)
DATASET = {"seq_length": 1024, "seed": 1234,
           "dataset_kwargs": {"prompt_template": "Question: {input}\\n\\nAnswer: {output}"}}
PACK_SIZE = 4096


def write_examples(path: str, count: int, seed: int = SEED) -> None:
    """``count`` JSONL lines of ``{"input", "output"}``: the first one to four sentences of two
    generated documents each."""
    from megacache.text.sample_corpus import sample_documents

    rng = np.random.default_rng(seed)
    prompts, answers = sample_documents(count, seed), sample_documents(count, seed + 1)
    keep = rng.integers(1, 5, size=(count, 2))
    ends = re.compile(r"(?<=[.!])\s+")
    with open(path, "w", encoding="utf-8") as f:
        for prompt, answer, (a, b) in zip(prompts, answers, keep.tolist()):
            line = {"input": " ".join(ends.split(prompt)[:a]), "output": " ".join(ends.split(answer)[:b])}
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def write_config(path: str, root: str, tokenizer: str, workers: int) -> None:
    """A finetuning ConfigContainer's YAML (its dataset and tokenizer sections) packing ``root``'s
    training split."""
    import yaml

    container = {
        "dataset": {"_target_": "megatron.bridge.data.builders.gpt_sft.GPTSFTDatasetConfig", "dataset_root": root,
                    **DATASET, "enable_offline_packing": True, "do_validation": False, "do_test": False,
                    "offline_packing_specs": {"_target_": "megatron.bridge.data.packing.config.PackedSequenceSpecs",
                                              "packed_sequence_size": PACK_SIZE, "num_tokenizer_workers": workers}},
        "tokenizer": {"_target_": "megatron.bridge.training.tokenizers.config.TokenizerConfig",
                      "tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": tokenizer},
    }
    with open(path, "w") as f:
        yaml.safe_dump(container, f)


def bridge_python() -> str:
    """The Bridge 0.6.2 oracle's interpreter (``$MEGACACHE_BRIDGE_ORACLE``, default
    ``~/.cache/megacache/bridge-oracle``)."""
    python = os.path.join(BRIDGE_ORACLE, "venv", "bin", "python")
    if not (os.path.isfile(os.path.join(BRIDGE_ORACLE, "spec.txt")) and os.access(python, os.X_OK)):
        raise BenchmarkFailure(f"no Megatron-Bridge 0.6.2 environment in {BRIDGE_ORACLE}: build it with `bash "
                               "tests/bridge_oracle.sh`, or point MEGACACHE_BRIDGE_ORACLE at one")
    return python


def packed_folder(root: str) -> str:
    """The one folder under ``root/packed`` that Bridge's builder (and megacache) wrote into."""
    found = os.listdir(os.path.join(root, "packed"))
    if len(found) != 1:
        raise BenchmarkFailure(f"{root}/packed holds {found}, not one folder of packed files")
    return os.path.join(root, "packed", found[0])


def run_side(side: str, root: str, tokenizer: str, ranks: int, workers: int, python: str, work: str) -> dict:
    """One timed run of ``side`` ("bridge" or "megacache") preparing ``root``'s training split."""
    config = os.path.join(work, f"{os.path.basename(root)}.yaml")
    write_config(config, root, tokenizer, workers)
    if side == "bridge":
        return run_program([WORKER, config, "--prepare-only"], None, work, phases=False, python=python, durable=True)
    return run_program(["megacache", "pack", "--bridge-config", config], ranks, work, phases=False, durable=True)


def measure(examples: int, ranks: int, workers: int, repeats: int, results: str) -> list[dict]:
    """``repeats`` alternating pairs (Bridge first in even pairs, megacache first in odd ones); a
    record per run appended to ``results``."""
    from megacache.formats.sft_packed import default_file_name, read_parquet

    python = bridge_python()
    sys.path.insert(0, TESTS)
    from support.inputs.tokenizer_files import write_sft_tokenizers

    work = tempfile.mkdtemp(prefix="megacache-bench-sft-")
    with kept_on_failure(work, "inputs and outputs"):
        os.makedirs(os.path.join(work, "tokenizers"))
        write_sft_tokenizers(Path(work, "tokenizers"))
        tokenizer = os.path.join(work, "tokenizers", "sft-bpe")
        source = os.path.join(work, "training.jsonl")
        write_examples(source, examples)
        # each side once on a small split, unmeasured: megacache's kernels compiled and loaded, both
        # sides' files read once
        installed()
        small = os.path.join(work, "warm")
        write_examples(os.path.join(work, "warm.jsonl"), 1000)
        for side in ("bridge", "megacache"):
            os.makedirs(small)
            os.link(os.path.join(work, "warm.jsonl"), os.path.join(small, "training.jsonl"))
            run_side(side, small, tokenizer, ranks, workers, python, work)
            shutil.rmtree(small)
        machine, commit = machine_info(), git_commit()
        records = []
        for pair in range(repeats):
            walls, roots, load = {}, {}, {}
            for side in (("bridge", "megacache") if pair % 2 == 0 else ("megacache", "bridge")):
                root = roots[side] = os.path.join(work, f"{side}-{pair}")
                os.makedirs(root)
                os.link(source, os.path.join(root, "training.jsonl"))
                load[side] = [round(v, 2) for v in os.getloadavg()]  # what else the machine ran, before this run
                walls[side] = run_side(side, root, tokenizer, ranks, workers, python, work)
            ours, theirs = packed_folder(roots["megacache"]), packed_folder(roots["bridge"])
            compared = same_outputs(ours, theirs)
            with open(os.path.join(theirs, f"{PACK_SIZE}_metadata.jsonl")) as f:
                metadata = json.load(f)[-1]
            rows = read_parquet(os.path.join(theirs, default_file_name("training", PACK_SIZE)))
            metadata.update(packs=rows.packs, examples=rows.examples, tokens=rows.tokens)
            for side, run in walls.items():
                record = {"benchmark": "sft_pack", "date": datetime.date.today().isoformat(),
                          "time": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit,
                          "cores": machine["cpus_usable"], "machine": machine, "examples": examples,
                          "input_bytes": os.path.getsize(source), "dataset": DATASET, "pack_size": PACK_SIZE,
                          "tokenizer": "sft-bpe (tests/support/inputs/tokenizer_files.py)", "pair": pair,
                          "first": next(iter(walls)) == side, "side": side,
                          "ranks": ranks if side == "megacache" else 1,
                          "tokenizer_workers": workers if side == "bridge" else None,
                          "loadavg_before": load[side], "wall_s": round(run["wall_s"], 3),
                          "cpu_s": [round(c, 2) for c in run["cpu_s"]], "rss_kb": run["rss_kb"],
                          "write_bytes": run["write_bytes"], "identical_bytes": compared, "packing": metadata}
                append_record(results, record)
                records.append(record)
            print(f"pair {pair + 1}: Bridge ({workers} tokenizer workers) {walls['bridge']['wall_s']:.2f} s, "
                  f"megacache P={ranks} {walls['megacache']['wall_s']:.2f} s "
                  f"({walls['bridge']['wall_s'] / walls['megacache']['wall_s']:.2f}x), {compared:,} bytes identical",
                  flush=True)
            for root in roots.values():
                shutil.rmtree(root)
        return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sft_pack", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=100_000, help="lines of the training split (default 100000)")
    ap.add_argument("--ranks", type=int, default=2, help="megacache ranks (default 2)")
    ap.add_argument("--workers", type=int, default=2, help="Bridge's num_tokenizer_workers (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating pairs; medians are reported (default 3)")
    ap.add_argument("--results", default=RESULTS, help=f"JSON-lines file to append to (default {shown(RESULTS)})")
    args = ap.parse_args(argv)
    if min(args.examples, args.ranks, args.workers, args.repeats) < 1:
        ap.error("--examples, --ranks, --workers and --repeats must be at least 1")
    try:
        records = measure(args.examples, args.ranks, args.workers, args.repeats, args.results)
    except BenchmarkFailure as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    walls = {side: [r["wall_s"] for r in records if r["side"] == side] for side in ("bridge", "megacache")}
    median = {side: statistics.median(w) for side, w in walls.items()}
    pairs = statistics.median(b / m for b, m in zip(walls["bridge"], walls["megacache"]))
    print(f"medians of {args.repeats}: Bridge {median['bridge']:.2f} s, megacache P={args.ranks} "
          f"{median['megacache']:.2f} s: {median['bridge'] / median['megacache']:.2f}x (the pairs' median ratio "
          f"{pairs:.2f}x); records appended to {shown(args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
