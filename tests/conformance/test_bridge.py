"""Megatron-Bridge configurations: what ``megacache.megatron.bridge`` reads from a ConfigContainer as
Bridge writes it to YAML equals what Bridge 0.6.2 itself computes (its loader's sample counts, its
dataset settings, its tokenizer's identity), and the caches megacache builds from that are Bridge's
first run's, file for file and byte for byte. The oracle is tests/support/oracles/bridge_worker.py in the
environment tests/bridge_oracle.sh builds (skipped when it is not built)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import megacache
from megacache.runtime.comm import SingleComm, get_comm
from megacache.errors import MegacacheError
from megacache.runtime.fsio import write_atomic
from megacache.megatron.bridge import read_config
from support import shared_directory
from support.inputs.indexed import write_lengths
from support.oracles.environments import BRIDGE_ROOT as ROOT
from support.oracles.environments import ORACLE_RUNS, SCRIPTS, built, run_key
from support.oracles.environments import WORKER as MEGATRON_WORKER
from support.sweeps import cache_files, megacache_reason
from support.inputs.tokenizer_cases import random_cases
from support.inputs.tokenizer_files import write_tokenizer_files

pytestmark = pytest.mark.oracle_environments

WORKER = os.path.join(SCRIPTS, "bridge_worker.py")
VERSION = "0.19"  # the megatron-core Bridge 0.6.2 runs on (0.19.2 in the oracle)
CONFIGS = 200
PREFIXES = ("a", "b", "c", "d")


def ask(request: dict, timeout: float = 1800) -> list:
    """The Bridge worker's answers (skips the test when the oracle is not built)."""
    if not built(ROOT):
        pytest.skip("Megatron-Bridge oracle not built: run bash tests/bridge_oracle.sh")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([os.path.join(ROOT, "venv", "bin", "python"), WORKER], input=json.dumps(request),
                          capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"Bridge oracle failed:\n{done.stderr[-4000:]}")
    answer = json.loads(done.stdout.rsplit("\n", 2)[-2])
    assert (answer["bridge"], answer["megatron_core"]) == ("0.6.2", "0.19.2"), answer
    return answer["results"]


def write_datasets(root: Path) -> None:
    """Four datasets, each long enough that every split of "9999,8,2" holds tokens (megatron-core
    loops forever on an empty split it is asked samples of)."""
    rng = np.random.default_rng(7)
    for name in PREFIXES:
        write_lengths(str(root / name), rng.integers(1, int(rng.choice([20, 200])), int(rng.integers(3000, 6000))))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("bridge-data")
    write_datasets(root)
    return root


# ---------------------------------------------------------------------------------------------
# Random configurations


@dataclass(frozen=True)
class Run:
    """One random Bridge run of the sweep: its container's sections (Bridge's constructor keywords,
    ``spec``) and where its files are under the oracle run's ``root``: the YAML of the container as
    made (``pre``), the validated YAML Bridge saves (``saved``, its ``logger.save_config_filepath``),
    and Bridge's caches (``theirs``: its ``path_to_cache``, or where the caches Bridge wrote beside
    each prefix were moved)."""

    index: int
    root: str
    spec: dict
    cached: bool          # path_to_cache given (else: Megatron's default beside each prefix)
    sequences: bool       # per_dataset_sequences_path given (the file Megatron-LM's tool writes)

    @property
    def pre(self) -> str:
        return os.path.join(self.root, f"{self.index}.yaml")

    @property
    def saved(self) -> str:
        return os.path.join(self.root, f"{self.index}-validated.yaml")

    @property
    def theirs(self) -> str:
        return os.path.join(self.root, "theirs", str(self.index))

    @property
    def data(self) -> str:
        """The folder of this run's datasets: shared where caches go to path_to_cache, else its own
        (hard links), since Megatron's default cache lies beside each prefix."""
        return self.root if self.cached else os.path.join(self.root, "own", str(self.index))

    @property
    def sequences_path(self) -> str | None:
        return self.spec["dataset"].get("per_dataset_sequences_path")

    def request(self) -> dict:
        item = {"spec": self.spec, "yaml": self.pre}
        if self.sequences:
            item["sequences"] = self.sequences_path
        return item


def random_run(rng: random.Random, index: int, root: str) -> Run:
    """One Bridge run: mostly valid, sometimes one Bridge refuses. Half with Hugging Face's tokenizer
    (the BPE of support.inputs.tokenizer_files under ``root/tok``), a quarter without path_to_cache (one
    unweighted prefix per split then: megacache caches a blend only under a cache path), a third
    with the sequences file."""
    cached = rng.random() < 0.75
    sequences = rng.random() < 0.35
    data = root if cached else os.path.join(root, "own", str(index))
    prefixes = [os.path.join(data, p) for p in PREFIXES]
    seed = rng.choice([0, 1234, rng.randrange(2**32)])
    dataset: dict = {"seq_length": rng.choice([16, 64, 128]), "random_seed": seed,
                     "path_to_cache": os.path.join(root, "theirs", str(index)) if cached else None}
    if sequences:
        dataset["per_dataset_sequences_path"] = os.path.join(root, "sequences", f"{index}.json")
    kinds = ["one", "one", "weighted", "weighted", "unweighted", "data_path", "per_split", "per_split"]
    kind = rng.choice(kinds if cached else ["one", "one", "data_path", "per_split"])
    most = 5 if cached else 2
    weights = lambda n: [rng.choice([1.0, 0.3, 2.0, round(rng.uniform(0.1, 5), 3)]) for _ in range(n)]  # noqa: E731
    weighted = (lambda p: rng.random() < p) if cached else (lambda p: False)  # noqa: E731  (a weight makes a blend)
    if kind == "one":
        dataset["blend"] = [[rng.choice(prefixes)], [1.0] if weighted(0.2) else None]
    elif kind in ("weighted", "unweighted"):
        chosen = rng.sample(prefixes, rng.randrange(2, 5))
        dataset["blend"] = [chosen, weights(len(chosen)) if kind == "weighted" else None]
    elif kind == "data_path":
        chosen = rng.sample(prefixes, rng.randrange(1, most - 1 if cached else 2))
        words = [w for p, w in zip(chosen, weights(len(chosen))) for w in (str(w), p)] if weighted(0.6) else chosen
        dataset["data_path"] = " ".join(words) if rng.random() < 0.5 else words
    else:
        per = []
        for i in range(3):
            chosen = rng.sample(prefixes, rng.randrange(1, most - 1 if cached else 2))
            per.append(None if i == 2 and rng.random() < 0.2 else
                       [chosen, weights(len(chosen)) if weighted(0.5) else None])
        dataset["blend_per_split"] = per
    if kind != "per_split":
        dataset["split"] = rng.choice(["9999,8,2", "9999,8,2", "90,5,5", "98,2", "969, 30, 1", "1,1,1"])
        if rng.random() < 0.02:
            del dataset["split"]  # refused: a blend needs a split
    elif rng.random() < 0.02:
        dataset["split"] = "9999,8,2"  # refused with per-split blends
    if rng.random() < 0.3:
        dataset["add_extra_token_to_sequence"] = False
    if rng.random() < 0.3:
        dataset["drop_last_partial_validation_sequence"] = False
    if rng.random() < 0.1:
        dataset["mid_level_dataset_surplus"] = rng.choice([0.0, 0.05])

    micro = rng.choice([1, 1, 2])
    gbs = micro * rng.choice([1, 2, 4, 8])
    train: dict = {"global_batch_size": gbs, "micro_batch_size": micro}
    scheduler: dict = {}
    if rng.random() < 0.7:
        train["train_iters"] = rng.choice([0, 1, 10, 37, 200, 500])
        if rng.random() < 0.2:
            scheduler["lr_decay_iters"] = rng.choice([1, 50])
        if rng.random() < 0.03:
            scheduler[rng.choice(["lr_decay_samples", "lr_warmup_samples"])] = 8  # refused: samples with iterations
    else:
        train["train_samples"] = rng.choice([1, 9, 100, 1000, 3001])
        if rng.random() < 0.2:
            scheduler["lr_decay_samples"] = rng.choice([1, 500])
        if rng.random() < 0.03:
            train["train_iters"] = 5  # refused: two training modes
        elif rng.random() < 0.04:
            scheduler[rng.choice(["lr_decay_iters", "lr_warmup_iters", "max_steps"])] = 8  # refused: iterations
    validation: dict = {}
    if rng.random() < 0.8:
        validation["eval_interval"] = rng.choice([None, 0, 1, 5, 50, 1000])
    if rng.random() < 0.8:
        validation["eval_iters"] = rng.choice([0, 1, 2, 10])
    if rng.random() < 0.2:
        validation["eval_global_batch_size"] = micro * rng.choice([1, 3])
    for name in ("skip_train", "full_validation"):
        if rng.random() < 0.15:
            validation[name] = True
    if rng.random() < 0.1:
        validation["start_eval_at_iter"] = 20
    if rng.random() < 0.1:  # deprecated TrainingConfig fields, which override the validation ones
        train[rng.choice(["eval_iters", "eval_interval"])] = rng.choice([3, 7])
    if rng.random() < 0.5:
        hf = {name: rng.choice([True, False]) for name in ("use_fast", "include_special_tokens") if rng.random() < 0.5}
        tokenizer: dict = {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": os.path.join(root, "tok", "hf"),
                           **({"hf_tokenizer_kwargs": hf} if hf else {})}
    else:
        # the datasets' tokens are uint16: a vocabulary above 65,536 (int32 tokens) only without the
        # sequences file, whose reader takes the token width from the tokenizer
        vocab = [1000, 50257] + ([] if sequences else [70000])
        tokenizer = {"tokenizer_type": "NullTokenizer", "vocab_size": rng.choice(vocab)}
        if rng.random() < 0.2:
            tokenizer["null_tokenizer_eod_id"] = 7
    spec = {"dataset": dataset, "train": train, "validation": validation, "tokenizer": tokenizer,
            "model": {"seq_length": dataset["seq_length"]},
            "logger": {"save_config_filepath": os.path.join(root, f"{index}-validated.yaml")}}
    if scheduler:
        spec["scheduler"] = scheduler
    return Run(index, root, spec, cached, sequences)


def random_runs(root: str) -> list[Run]:
    rng = random.Random("megacache bridge runs")
    return [random_run(rng, i, root) for i in range(CONFIGS)]


#: Bridge's refusals in the sweep, each with the reason megacache gives for the same configuration
REFUSALS = [
    ("Cannot specify more than one of train_iters, train_samples",
     "Bridge asserts 'Cannot specify more than one of train_iters, train_samples, or num_epochs'"),
    ("split and blend_per_split are incompatible", "'split and blend_per_split are incompatible'"),
    ("split must be provided when blend is not None", r"dataset\.split: missing; Bridge has no default split"),
    ("lr_decay_steps must be > 0", "Bridge refuses a schedule of no steps"),
    ("Cannot mix iteration-based and sample-based scheduler fields",
     "Bridge asserts 'Cannot mix iteration-based and sample-based scheduler fields'"),
    (r"Use lr_decay_iters for iteration-based training, not lr_decay_samples",
     r"scheduler\.lr_decay_samples \(\d+\) does not go with train\.train_iters"),
    (r"Use lr_warmup_iters for iteration-based training, not lr_warmup_samples",
     r"scheduler\.lr_warmup_samples \(\d+\) does not go with train\.train_iters"),
    (r"Use lr_decay_samples for sample-based training, not lr_decay_iters",
     r"scheduler\.lr_decay_iters \(\d+\) does not go with train\.train_samples"),
    (r"Use lr_warmup_samples for sample-based training, not lr_warmup_iters",
     r"scheduler\.lr_warmup_iters \(\d+\) does not go with train\.train_samples"),
    (r"scheduler\.max_steps is only supported for iteration-based training",
     r"scheduler\.max_steps \(\d+\) does not go with train\.train_samples"),
    (r"eval_global_batch_size \(\d+\) must be divisible by eval_micro_batch_size",
     r"is not a multiple of the evaluation micro batch"),
]


def bridge_reason(theirs: str) -> str:
    """The pattern of megacache's message for Bridge's refusal ``theirs``."""
    for pattern, ours in REFUSALS:
        if re.search(pattern, theirs):
            return ours
    pytest.fail(f"Bridge refused for a reason REFUSALS does not know: {theirs}. Find the condition, check that "
                f"megacache refuses it, and add the pair.")


def refuses_as_bridge(action, theirs: str, label: str) -> None:
    try:
        action()
    except MegacacheError as exc:
        assert re.search(bridge_reason(theirs), str(exc)), f"{label}\nmegacache's reason: {exc}"
        return
    raise AssertionError(f"megacache accepts what Bridge refused: {label}")


def refuses(action, label: str) -> None:
    try:
        action()
    except MegacacheError:
        return
    raise AssertionError(f"megacache accepts what Bridge refused: {label}")


def blend_answer(blend) -> list | None:
    if blend is None:
        return None
    return [list(blend.prefixes), None if blend.weights is None else list(blend.weights)]


def assert_same_plan(ours, theirs: dict) -> None:
    """megacache's reading (a BuildConfig) against what Bridge validated."""
    assert list(ours.sizes) == theirs["sizes"]
    assert blend_answer(ours.blend) == theirs["blend"]
    per = theirs["blend_per_split"]
    ours_per = None if ours.blend_per_split is None else [blend_answer(b) for b in ours.blend_per_split]
    assert ours_per == (None if per is None or not any(per) else per)
    assert ours.split == theirs["split"]
    assert (ours.seq_length, ours.seed, ours.cache_dir) == (
        theirs["seq_length"], theirs["seed"], theirs["path_to_cache"])
    assert (ours.add_extra_token, ours.drop_last_partial_validation, ours.surplus) == (
        theirs["add_extra_token"], theirs["drop_last_partial_validation"], theirs["surplus"])
    assert list(ours.tokenizer.items()) == list(theirs["tokenizer"].items())
    assert ours.sequences_path == theirs["sequences_path"]


def default_caches(run: Run) -> list[str]:
    """Megatron's default cache folders of ``run``'s prefixes (``<prefix>/cache``)."""
    return sorted(e.path for e in os.scandir(run.data) if e.is_dir() and os.path.isdir(os.path.join(e.path, "cache")))


def oracle_run(comm) -> tuple[str, list[Run], list[dict]]:
    """The random runs, their datasets and Bridge's answer to each (its caches on disk), made once
    per machine (in support.oracles.environments.ORACLE_RUNS, keyed by the runs) by rank 0, so that every rank
    count compares against them: the directory, runs and answers."""
    if not built(ROOT):  # on every rank, before any collective
        pytest.skip("Megatron-Bridge oracle not built: run bash tests/bridge_oracle.sh")
    key = run_key([r.spec for r in random_runs("ROOT")], "0.6.2", WORKER, MEGATRON_WORKER)
    root = os.path.join(ORACLE_RUNS, f"bridge-{key}")
    runs = random_runs(root)
    done = os.path.join(root, "done.json")
    error = None
    if comm.rank == 0 and not os.path.exists(done):
        try:
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(os.path.join(root, "sequences"))
            os.makedirs(os.path.join(root, "tok"))
            write_datasets(Path(root))
            write_tokenizer_files(Path(root, "tok"))
            for run in runs:
                if not run.cached:
                    os.makedirs(run.data)
                    for name in os.listdir(root):
                        if name.endswith((".bin", ".idx")):
                            os.link(os.path.join(root, name), os.path.join(run.data, name))
            started = time.monotonic()
            results = ask({"cwd": root, "build": True, "configs": [r.request() for r in runs]})
            print(f"Bridge built {len(runs)} configurations in {time.monotonic() - started:.0f} s")
            for run in runs:  # the caches Bridge wrote beside the prefixes, out of megacache's way
                for cache in default_caches(run):
                    shutil.move(cache, os.path.join(run.theirs, os.path.basename(cache)))
            write_atomic(done, json.dumps(results).encode())
        except BaseException as exc:  # agreed below, so no rank waits forever
            error = exc
    comm.check(error, "running the Megatron-Bridge oracle")
    with open(done) as f:
        return root, runs, json.load(f)


def live_readings(runs: list[Run], directory: str) -> None:
    """megacache's ``BuildConfig.from_bridge`` of each run's live ConfigContainer, in Bridge's
    interpreter, pickled to ``directory/<index>.pickle``."""
    megacache_root = os.path.dirname(os.path.dirname(megacache.__file__))
    ask({"task": "live", "megacache": megacache_root, "cwd": directory,
         "configs": [{"spec": r.spec, "pickle": os.path.join(directory, f"{r.index}.pickle")} for r in runs]})


def cache_tree(run: Run, cache_dir: str | None) -> dict[str, bytes]:
    """Megatron's cache files of ``run`` built with ``cache_dir`` (None: beside each prefix, keyed
    by prefix)."""
    if cache_dir is not None:
        return cache_files(cache_dir)
    return {f"{os.path.basename(d)}/{name}": data for d in default_caches(run)
            for name, data in cache_files(os.path.join(d, "cache", "GPTDataset_indices")).items()}


def their_tree(run: Run) -> dict[str, bytes]:
    if run.cached:
        return cache_files(run.theirs)
    return {f"{name}/{file}": data for name in sorted(os.listdir(run.theirs))
            for file, data in cache_files(os.path.join(run.theirs, name, "cache", "GPTDataset_indices")).items()}


@contextlib.contextmanager
def own_data(run: Run, comm):
    """Exclusive use of ``run``'s dataset folder where its caches go beside the prefixes (another
    test session may compare the same oracle run); megacache's caches there removed afterwards."""
    if run.cached:
        yield
        return
    lock = open(os.path.join(run.root, "own", f"{run.index}.lock"), "w") if comm.rank == 0 else None
    try:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        comm.barrier()
        yield
    finally:
        comm.barrier()
        if lock:
            for cache in default_caches(run):
                shutil.rmtree(os.path.join(cache, "cache"))
            lock.close()


def build_form(cfg, run: Run, theirs: dict, comm, workdir: str) -> bool:
    """megacache's build of ``cfg`` (a run's form, its output moved into ``workdir``) compared with
    Bridge's, file for file and byte for byte, sequences file included; False where megatron-core
    refused while building and megacache refused for the same reason."""
    from megacache.builders.build import build

    fields = {"sequences_path": os.path.join(workdir, "sequences.json") if run.sequences else ""}
    if run.cached:
        fields["cache_dir"] = os.path.join(workdir, "ours")
    cfg = dataclasses.replace(cfg, **fields)
    with own_data(run, comm):
        if theirs.get("error"):
            with pytest.raises(MegacacheError, match=megacache_reason(theirs["error"])):
                build(cfg, comm)
            return False
        build(cfg, comm)
        if comm.rank == 0:
            ours, reference = cache_tree(run, cfg.cache_dir), their_tree(run)
            assert reference, f"Bridge wrote no cache for run {run.index}: nothing to compare"
            assert sorted(ours) == sorted(reference), set(ours) ^ set(reference)
            for name in reference:
                assert ours[name] == reference[name], name
            if run.sequences:
                with open(cfg.sequences_path, "rb") as mine, open(run.sequences_path, "rb") as tool:
                    assert mine.read() == tool.read()
    return True


#: the forms of a run's container a user holds, megacache given each
FORMS = ("pre-validation YAML", "validated YAML", "live ConfigContainer")


def bridge_sweep(comm) -> dict[str, int]:
    """Every random run read by megacache in its three forms, each built with ``comm``'s ranks and
    compared with Bridge's own build (what Bridge refused, refused by megacache with its reason)."""
    from megacache.builders.config import BuildConfig

    root, runs, results = oracle_run(comm)
    outcomes: dict = {}

    def count(key: str) -> None:
        outcomes[key] = outcomes.get(key, 0) + 1

    with shared_directory(comm, "megacache-bridge-live-") as live:
        error = None
        if comm.rank == 0:
            try:
                live_readings(runs, live)
            except BaseException as exc:
                error = exc
        comm.check(error, "reading the live ConfigContainers")
        for run, theirs in zip(runs, results, strict=True):
            label = f"run {run.index}: {json.dumps(run.spec)}\nBridge: {theirs.get('error')}"
            with open(os.path.join(live, f"{run.index}.pickle"), "rb") as f:
                live_form = pickle.load(f)
            if theirs.get("stage") == "load":
                raise AssertionError(f"Bridge could not write or read {label}")
            if theirs.get("stage") == "validate":  # Bridge refuses: so must megacache, in every form it has
                refuses_as_bridge(lambda: BuildConfig.from_bridge(run.pre, VERSION), theirs["error"], label)
                assert isinstance(live_form, str) and re.search(bridge_reason(theirs["error"]), live_form), \
                    f"{label}\nlive: {live_form}"
                assert not os.path.exists(run.saved), label  # Bridge saves only what it validated
                count("refused")
                continue
            forms = {FORMS[0]: BuildConfig.from_bridge(run.pre, VERSION), FORMS[2]: live_form}
            if theirs["reload"]:  # Bridge refuses its own validated YAML when run again: so does megacache
                refuses_as_bridge(lambda: BuildConfig.from_bridge(run.saved, VERSION), theirs["reload"],
                                  f"{label}\nBridge on its validated YAML: {theirs['reload']}")
                count("validated YAML refused, as by Bridge")
            else:
                forms[FORMS[1]] = BuildConfig.from_bridge(run.saved, VERSION)
            try:
                for name, cfg in forms.items():
                    assert not isinstance(cfg, str), f"{name}: {cfg}"
                    assert_same_plan(cfg, theirs)
                    assert cfg == forms[FORMS[0]], name
            except AssertionError as exc:
                raise AssertionError(f"{label}\n{exc}") from None
            for name in forms:
                with shared_directory(comm, "megacache-bridge-") as workdir:
                    if not build_form(forms[name], run, theirs, comm, workdir):
                        count("refused while building")
                        break
                count(f"{name} compared")
            else:
                if len(forms) == len(FORMS):
                    count("all three forms compared")
                ours = forms[FORMS[0]]
                count("per-split" if ours.blend_per_split else "one prefix" if ours.blend.is_single else "blend")
                for feature, present in (("Hugging Face tokenizer", run.spec["tokenizer"]["tokenizer_type"] ==
                                          "HuggingFaceTokenizer"), ("no path_to_cache", not run.cached),
                                         ("sequences file", run.sequences)):
                    if present:
                        count(feature)
    return outcomes


def assert_mostly_built(outcomes: dict) -> None:
    built = sum(outcomes.get(k, 0) for k in ("per-split", "one prefix", "blend"))
    assert built >= 0.75 * CONFIGS, outcomes
    assert all(outcomes.get(k, 0) >= 10 for k in ("per-split", "one prefix", "blend", "Hugging Face tokenizer",
                                                  "no path_to_cache", "sequences file")), outcomes
    assert outcomes.get("all three forms compared", 0) >= 100, outcomes


def test_random_configurations_equal_bridge():
    outcomes = bridge_sweep(SingleComm())
    print("Bridge configurations, 1 rank:", outcomes)
    assert_mostly_built(outcomes)


@pytest.mark.mpi(min_size=2)
def test_random_configurations_equal_bridge_under_mpi():
    comm = get_comm()
    outcomes = bridge_sweep(comm)
    if comm.rank == 0:
        print(f"Bridge configurations, {comm.size} ranks:", outcomes)
    assert_mostly_built(outcomes)


# ---------------------------------------------------------------------------------------------
# Tokenizers


def bridge_tokenizer(flags: dict, rng: random.Random) -> dict:
    """Bridge's TokenizerConfig keywords for Megatron-LM tokenizer flags: the two renamed fields,
    and each switch either set directly (which Bridge's constructor overwrites from its keyword
    mappings) or through ``hf_tokenizer_kwargs`` / ``sp_tokenizer_kwargs``."""
    renamed = {"tokenizer_metadata": "metadata_path", "tokenizer_special_tokens": "special_tokens"}
    out: dict = {}
    hf: dict = {}
    sp: dict = {}
    for key, value in flags.items():
        through = rng.random() < 0.6
        if key == "tokenizer_hf_no_use_fast" and through:
            hf["use_fast"] = not value
        elif key == "tokenizer_hf_no_include_special_tokens" and through:
            hf["include_special_tokens"] = not value
        elif key == "trust_remote_code" and through:
            hf["trust_remote_code"] = value
        elif key == "tokenizer_sentencepiece_legacy" and through:
            sp["legacy"] = value
        else:
            out[renamed.get(key, key)] = value
    if hf:
        out["hf_tokenizer_kwargs"] = hf
    if sp:
        out["sp_tokenizer_kwargs"] = sp
    return out


def test_tokenizer_identities_equal_bridge(data, tmp_path):
    root = tmp_path / "tok"
    root.mkdir()
    write_tokenizer_files(root)
    rng = random.Random("bridge tokenizers")
    cases = random_cases(VERSION, root)[::6]
    specs = []
    for flags in cases:
        tokenizer = bridge_tokenizer(flags, rng)
        if tokenizer.get("chat_template") and rng.random() < 0.5:  # a template from a file
            (root / "chat.jinja").write_text(tokenizer.pop("chat_template"))
            tokenizer["chat_template_path"] = str(root / "chat.jinja")
        if tokenizer["tokenizer_type"] == "NullTokenizer" and rng.random() < 0.3:
            tokenizer["null_tokenizer_pad_id"] = None
        specs.append({"dataset": {"seq_length": 16, "blend": [[str(data / "a")], None], "split": "98,2"},
                      "train": {"train_iters": 1, "global_batch_size": 1}, "tokenizer": tokenizer})
    request = {"cwd": str(root), "build": False,
               "configs": [{"spec": s, "yaml": str(tmp_path / f"t{i}.yaml")} for i, s in enumerate(specs)]}
    results = ask(request)
    counts: dict = {}
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for i, (spec, theirs) in enumerate(zip(specs, results, strict=True)):
            path = str(tmp_path / f"t{i}.yaml")
            kind = spec["tokenizer"]["tokenizer_type"]
            if "error" in theirs:
                refuses(lambda: read_config(path, VERSION), f"{spec['tokenizer']}: {theirs['error']}")
                counts[kind, "refused"] = counts.get((kind, "refused"), 0) + 1
                continue
            ours = read_config(path, VERSION)
            assert list(ours.tokenizer.items()) == list(theirs["tokenizer"].items()), (
                spec["tokenizer"], ours.tokenizer)
            counts[kind, "equal"] = counts.get((kind, "equal"), 0) + 1
    finally:
        os.chdir(cwd)
    print("Bridge tokenizers:", counts)
    for kind in {k for k, _ in counts}:
        equal, refused = counts.get((kind, "equal"), 0), counts.get((kind, "refused"), 0)
        assert equal >= 0.6 * (equal + refused), counts


# ---------------------------------------------------------------------------------------------
# Messages (no oracle needed)


def minimal(**sections) -> dict:
    config = {"dataset": {"_target_": "megatron.bridge.training.config.GPTDatasetConfig", "blend": [["/d/a"], None],
                          "split": "9999,8,2", "seq_length": 128, "random_seed": 1234},
              "train": {"train_iters": 100, "global_batch_size": 8, "micro_batch_size": 1},
              "validation": {"eval_interval": 10, "eval_iters": 2},
              "tokenizer": {"tokenizer_type": "NullTokenizer", "vocab_size": 1000}}
    for name, fields in sections.items():
        config[name] = {**config[name], **fields}
    return config


def test_sizes_follow_bridges_loader():
    assert read_config(minimal(), VERSION).sizes == (800, (100 // 10 + 1) * 2 * 8, 16)
    # samples: the iterations are samples // batch; no interval, no validation samples
    ours = read_config(minimal(train={"train_iters": None, "train_samples": 801}, validation={"eval_interval": None}),
                       VERSION)
    assert ours.sizes == (801, 0, 16)
    # the deprecated training fields win; the eval batch replaces the batch in valid and test
    ours = read_config(minimal(train={"eval_iters": 3}, validation={"eval_global_batch_size": 4}), VERSION)
    assert ours.sizes == (800, 11 * 3 * 4, 12)
    # skip_train and full_validation change nothing in Bridge's counts
    ours = read_config(minimal(validation={"skip_train": True, "full_validation": True}), VERSION)
    assert ours.sizes == (800, 176, 16)


@pytest.mark.parametrize("sections, field", [
    (dict(dataset={"split": None}), "dataset.split"),
    (dict(dataset={"blend": None}), "dataset.blend"),
    (dict(dataset={"blend_per_split": [[["/d/a"], None], None, None]}), "dataset.blend"),
    (dict(dataset={"_target_": "megatron.bridge.training.config.MockGPTDatasetConfig"}), "dataset._target_"),
    (dict(dataset={"seq_length": None}), "dataset.seq_length"),
    (dict(train={"train_samples": 10}), "train.train_samples"),
    (dict(train={"num_epochs": 1}), "train.num_epochs"),
    (dict(train={"global_batch_size": None}), "train.global_batch_size"),
    (dict(validation={"eval_iters": None}), "validation.eval_iters"),
    (dict(tokenizer={"tokenizer_type": "HuggingFaceTokenizer"}), "tokenizer.tokenizer_model"),
    (dict(tokenizer={"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": "org/model",
                     "hf_tokenizer_kwargs": {"revision": "main"}}), "tokenizer.hf_tokenizer_kwargs"),
])
def test_refusals_name_the_field(sections, field):
    with pytest.raises(MegacacheError, match=field.replace(".", r"\.")):
        read_config(minimal(**sections), VERSION)


@pytest.mark.parametrize("dataset, message", [
    ({"seq_length": 0}, "dataset.seq_length must be a positive integer, got 0"),
    ({"sequence_length": -2, "seq_length": None}, "dataset.sequence_length must be a positive integer, got -2"),
    ({"seq_length": 2**31 - 1}, r"dataset.seq_length 2147483647 \(\+1\) does not fit Megatron's int32 arithmetic"),
    ({"random_seed": -1}, "dataset.random_seed must be a non-negative integer, got -1"),
])
def test_values_checked_by_the_build_config_are_named_as_the_configuration_names_them(dataset, message, tmp_path):
    import yaml
    from megacache.builders.config import BuildConfig

    with pytest.raises(MegacacheError, match=f"^{message}$"):
        BuildConfig.from_bridge(minimal(dataset=dataset), VERSION)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(minimal(dataset=dataset)))
    with pytest.raises(MegacacheError, match=f"^{re.escape(str(path))}: {message}$"):
        BuildConfig.from_bridge(str(path), VERSION)


def test_a_live_container_is_read_as_it_is():
    """Bridge's constructor overwrites the Hugging Face switches from hf_tokenizer_kwargs: a mapping
    (YAML) is constructed, so that applies; a live object was constructed already and is read as is."""
    from types import SimpleNamespace

    tokenizer = {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": "./hf", "tokenizer_hf_no_use_fast": True,
                 "hf_tokenizer_kwargs": {}}
    mapping = minimal(tokenizer=tokenizer)
    assert read_config(mapping, VERSION).tokenizer["use_fast"] == "True"
    live = SimpleNamespace(**{name: SimpleNamespace(**section) for name, section in mapping.items()})
    ours = read_config(live, VERSION)
    assert ours.tokenizer["use_fast"] == "False"
    assert ours.sizes == read_config(mapping, VERSION).sizes and ours.blend == read_config(mapping, VERSION).blend


# ---------------------------------------------------------------------------------------------
# The command line, on several ranks, and Bridge on megacache's cache


def tree(directory: str) -> dict[str, tuple[int, bytes]]:
    """Every file under ``directory``: its modification time and bytes."""
    out = {}
    for d, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = (os.stat(path).st_mtime_ns, f.read())
    return out


def moved(run: Run, yaml_path: str, directory: Path) -> tuple[Path, str, str]:
    """``run``'s YAML at ``yaml_path`` with its cache path and sequences file moved into ``directory``:
    the new YAML, cache path and sequences path."""
    cache, sequences = str(directory / "cache"), str(directory / "sequences.json")
    text = Path(yaml_path).read_text().replace(run.theirs, cache)
    if run.sequences:
        text = text.replace(run.sequences_path, sequences)
    path = directory / os.path.basename(yaml_path)
    directory.mkdir(parents=True)
    path.write_text(text)
    return path, cache, sequences


def test_the_command_line_on_2_and_3_ranks_and_bridge_reuses_every_file(tmp_path):
    """``megacache build --bridge-config`` on the validated YAML Bridge saved (the container as made
    where Bridge refuses its own again) of runs with a cache path, Hugging Face's tokenizer and the
    sequences file among them; then Bridge, given megacache's cache and sequences file, writes
    nothing."""
    from support.inputs.corpus import run_megacache

    _, runs, results = oracle_run(SingleComm())
    chosen = [(r, t) for r, t in zip(runs, results) if r.cached and not t.get("error")]
    chosen = ([c for c in chosen if c[0].sequences and c[0].spec["tokenizer"]["tokenizer_type"] != "NullTokenizer"][:3]
              + [c for c in chosen if not c[0].sequences][:3])
    assert len(chosen) == 6
    again = []
    for run, theirs in chosen:
        source = run.pre if theirs["reload"] else run.saved
        for ranks in (2, 3):
            path, cache, sequences = moved(run, source, tmp_path / f"{run.index}-{ranks}")
            done = run_megacache(ranks, "build", "--bridge-config", str(path))
            assert f"on {ranks} rank(s)" in done.stdout
            mine = cache_files(cache)
            if run.sequences:
                assert Path(sequences).read_bytes() == Path(run.sequences_path).read_bytes()
            else:
                assert json.loads(mine.pop("sequences_per_dataset.json"))  # megacache's, for fast loading
            assert mine == cache_files(run.theirs), (run.index, ranks)
        dataset = {**run.spec["dataset"], "path_to_cache": cache}
        if run.sequences:
            dataset["per_dataset_sequences_path"] = sequences
        spec = {**run.spec, "dataset": dataset, "logger": {"save_config_filepath": str(path) + ".saved"}}
        again.append({"spec": spec, "yaml": str(path) + ".again"})
    before = {a["spec"]["dataset"]["path_to_cache"]: tree(a["spec"]["dataset"]["path_to_cache"]) for a in again}
    results = ask({"cwd": str(tmp_path), "build": True, "configs": again})
    assert not [r["error"] for r in results if r.get("error")]
    assert {path: tree(path) for path in before} == before  # Bridge found every file: nothing written again


def test_the_command_line_refuses_what_bridge_refuses(tmp_path):
    """What Bridge refused in the sweep, and the validated YAML it saved of a train_samples run (which
    it refuses when run again), refused by ``megacache build --bridge-config``: exit 2, Bridge's
    reason, nothing written."""
    from support.inputs.corpus import run_megacache

    _, runs, results = oracle_run(SingleComm())
    cases = [(r, r.pre, t["error"]) for r, t in zip(runs, results) if t.get("stage") == "validate"]
    reasons = {bridge_reason(error) for _, _, error in cases}
    assert len(reasons) >= 5, reasons
    cases += [(r, r.saved, t["reload"]) for r, t in zip(runs, results) if not t.get("error") and t["reload"]][:2]
    seen = set()
    for run, source, error in cases:
        if bridge_reason(error) in seen and source == run.pre:
            continue  # one of each reason
        seen.add(bridge_reason(error))
        directory = tmp_path / str(run.index)
        path, cache, sequences = moved(run, source, directory)
        done = run_megacache(1, "build", "--bridge-config", str(path), check=False)
        assert done.returncode == 2, (run.index, done.stdout, done.stderr)
        assert re.search(f"megacache build: error: .*{bridge_reason(error)}", done.stderr), (error, done.stderr)
        assert sorted(os.listdir(directory)) == [path.name]  # no cache, no sequences file
        if not run.cached:
            assert not default_caches(run)


def test_command_line_refuses_megatron_lm_flags_beside_a_bridge_config(tmp_path):
    from support.inputs.corpus import run_megacache

    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(minimal()))
    done = run_megacache(1, "build", "--bridge-config", str(path), "--seq-length", "8", "--vocab-size", "9",
                         check=False)
    assert done.returncode == 2
    assert f"--bridge-config {path} describes the run (data, sizes, tokenizer, cache path); leave out " \
           "--seq-length, --vocab-size" in done.stderr
    done = run_megacache(1, "build", "--bridge-config", str(path), "--dry-run", check=False)
    assert done.returncode == 2 and "/d/a.idx: index file not found" in done.stderr
