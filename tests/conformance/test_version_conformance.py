"""megacache build for megatron-core 0.19: the 200-configuration sweeps of test_build.py (one prefix)
and test_blend_build.py (blends) against megatron-core 0.19.2 itself, in its own interpreter
(tests/support/oracles/environments.py), whole cache directories compared byte for byte at 1 rank in the test process
and at 2 and 3 ranks under MPI. Each configuration hashes a tokenizer from a pool of real ones
(Hugging Face with default and varied flags, Null, GPT-2, SentencePiece, tiktoken) that
megatron-core builds with its own build_tokenizer and megacache derives from the same flags.

The oracle's caches depend only on the configurations, so they are built once per machine (in the
system's temporary directory, keyed by the request) and every rank count compares against them."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from megacache.megatron.blends import parse_blend
from megacache.builders.build import BuildConfig
from megacache.runtime.comm import Comm, SingleComm, get_comm
from megacache.runtime.fsio import write_atomic
from megacache.megatron.tokenizer import tokenizer_identifiers
from support.inputs.indexed import write_lengths
from megacache.megatron.interpreter import ask as megatron_ask
from megacache.megatron.interpreter import differences
from support.oracles.environments import ORACLE_RUNS, RELEASES, WORKER, ask, interpreter, run_key
from support.sweeps import megatron_data, random_blend_config, words
from support.sweeps import REFUSED_AT_MOST, build_and_compare, count_compared, labelled, random_config
from support.sweeps import sweep_configurations
from support.inputs.tokenizer_cases import sweep_tokenizers
from support.inputs.tokenizer_files import write_tokenizer_files

pytestmark = pytest.mark.oracle_environments

VERSION = "0.19"
COUNT = 200


def configurations(kind: str, root: str) -> list[dict]:
    """The sweep's configurations as the oracle worker's caches task takes them, each with its
    datasets to write under ``root`` (``prefixes``, their sequence lengths and ``write_lengths``'
    keywords)."""
    rng = np.random.default_rng(19 if kind == "single" else 20)
    pool = sweep_tokenizers(os.path.join(root, "tokenizers"))
    out = []
    for i in range(COUNT):
        c = random_config(rng) if kind == "single" else random_blend_config(rng, huge=i == 0)
        datasets, shapes = ([c.lengths], [c.shape]) if kind == "single" else (c.datasets, c.shapes)
        prefixes = [os.path.join(root, f"c{i:03d}", f"d{j:04d}") for j in range(len(datasets))]
        out.append(dict(seq_length=c.seq_length, sizes=list(c.sizes), seed=c.seed, add_extra_token=c.add_extra_token,
                        drop_last_partial_validation=c.drop_last_partial_validation, **megatron_data(c, prefixes),
                        datasets=[d.tolist() for d in datasets], shapes=[asdict(s) for s in shapes],
                        prefixes=prefixes, tokenizer=pool[i % len(pool)],
                        tokenizer_cwd=os.path.join(root, "tokenizers"),
                        path_to_cache=os.path.join(root, f"c{i:03d}", "theirs")))
    return out


def oracle_run(comm: Comm, kind: str) -> tuple[list[dict], list]:
    """The configurations and megatron-core 0.19.2's answer to each (its caches on disk), made once:
    rank 0 writes the datasets and tokenizer files, asks the oracle, and marks the run done."""
    key = run_key(configurations(kind, "ROOT"), RELEASES[VERSION], WORKER)
    root = os.path.join(ORACLE_RUNS, f"{kind}-{VERSION}-{key}")
    done = os.path.join(root, "done.json")
    error = None
    if comm.rank == 0 and not os.path.exists(done):
        try:
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(os.path.join(root, "tokenizers"))
            write_tokenizer_files(Path(root) / "tokenizers")
            configs = configurations(kind, root)
            for c in configs:
                for prefix, lengths, shape in zip(c["prefixes"], c["datasets"], c["shapes"], strict=True):
                    os.makedirs(os.path.dirname(prefix), exist_ok=True)
                    write_lengths(prefix, lengths, **shape)
            results = ask(VERSION, {"task": "caches", "configs": configs})
            write_atomic(done, json.dumps(results).encode())
        except BaseException as exc:  # agreed below, so no rank waits forever
            error = exc
    comm.check(error, "running the megatron-core 0.19.2 oracle")
    with open(done) as f:
        results = json.load(f)
    return configurations(kind, root), results


def asked_identities(configs: list[dict]) -> dict[str, dict]:
    """The pool's identities as ``--megatron-python`` gets them: megacache's worker in 0.19.2's
    interpreter, its build_tokenizer answering (checked against the table, as a build checks them)."""
    python, env = interpreter(VERSION)
    pool = list({json.dumps(c["tokenizer"]): c for c in configs}.values())
    old = os.getcwd()
    os.chdir(pool[0]["tokenizer_cwd"])
    try:
        answer = megatron_ask(python, [c["tokenizer"] for c in pool])
    finally:
        os.chdir(old)
    assert answer["version"] == "0.19.2", answer
    out = {}
    for c, result in zip(pool, answer["answers"], strict=True):
        ids = result["identifiers"]
        assert differences(ids, tokenizer_identifiers(megatron_version=VERSION, **c["tokenizer"])) == []
        out[json.dumps(c["tokenizer"])] = ids
    return out


def our_config(c: dict, cache: str, tuning: dict, identities: dict | None = None) -> BuildConfig:
    """megacache's configuration for ``c``: its tokenizer identity from megacache's table, or from
    ``identities`` (what the Megatron asked answered)."""
    tokenizer = (identities[json.dumps(c["tokenizer"])] if identities is not None else
                 tokenizer_identifiers(megatron_version=VERSION, **c["tokenizer"]))
    common = dict(seq_length=c["seq_length"], sizes=tuple(c["sizes"]), tokenizer=tokenizer, seed=c["seed"],
                  cache_dir=cache, add_extra_token=c["add_extra_token"],
                  drop_last_partial_validation=c["drop_last_partial_validation"], megatron_version=VERSION)
    if c.get("blend_per_split"):
        blends = [None if b is None else parse_blend(words(*b)) for b in c["blend_per_split"]]
        return BuildConfig(blend_per_split=blends, split=None, **common, **tuning)
    return BuildConfig(blend=parse_blend(words(*c["blend"])), split=c["split"], **common, **tuning)


def sweep(comm: Comm, kind: str, ask_megatron: bool = False, **tuning) -> dict[str, int]:
    """Outcome counts by tokenizer type, plus "uint16 compared", "int32 compared". ``ask_megatron``:
    the identities as ``--megatron-python`` gets them, else from the table."""
    configs, results = oracle_run(comm, kind)
    identities = asked_identities(configs) if ask_megatron else None

    def run(workdir: str, item) -> str:
        c, refusal = item
        result = build_and_compare(our_config(c, os.path.join(workdir, "ours"), tuning, identities), comm,
                                   c["path_to_cache"], refusal)
        if result is None:
            return "refused"
        count_compared(stats, c["shapes"][0]["dtype"])
        return f"{c['tokenizer']['tokenizer_type']}" + (" blend" if result.blends else "")

    stats: dict[str, int] = {}
    return {**sweep_configurations(comm, zip(configs, results), run), **stats}


@pytest.mark.parametrize("kind", ["single", "blend"])
def test_sweep_against_megatron_019_single_rank(kind, report):
    # one rank names the caches as --megatron-python does; the MPI sweeps, from megacache's table
    outcomes = sweep(SingleComm(), kind, ask_megatron=True)
    report(f"{kind} build against megatron-core 0.19.2, 1 rank: {outcomes}")
    assert labelled(outcomes) == COUNT and outcomes.get("refused", 0) <= REFUSED_AT_MOST * COUNT, outcomes
    assert outcomes.get("int32 compared", 0) >= COUNT // 5, outcomes


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["single", "blend"])
def test_sweep_against_megatron_019_under_mpi(kind, report):
    comm = get_comm()
    outcomes = sweep(comm, kind, blend_min_chunk=50, blend_warmup=0)
    if comm.rank == 0:
        report(f"{kind} build against megatron-core 0.19.2, {comm.size} ranks: {outcomes}")
    assert labelled(outcomes) == COUNT and outcomes.get("refused", 0) <= REFUSED_AT_MOST * COUNT, outcomes
    assert outcomes.get("int32 compared", 0) >= COUNT // 5, outcomes
