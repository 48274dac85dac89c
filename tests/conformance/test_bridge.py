"""Megatron-Bridge configurations: what ``megacache.megatron.bridge`` reads from a ConfigContainer as
Bridge writes it to YAML equals what Bridge 0.6.2 itself computes (its loader's sample counts, its
dataset settings, its tokenizer's identity), and the caches megacache builds from that are Bridge's
first run's, file for file and byte for byte. The oracle is tests/support/bridge_worker.py in the
environment tests/bridge_oracle.sh builds (skipped when it is not built)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from megacache.runtime.comm import SingleComm, get_comm
from megacache.errors import MegacacheError
from megacache.runtime.fsio import write_atomic
from megacache.megatron.bridge import load_yaml, read_config
from support import shared_directory
from support.oracle import write_lengths
from support.oracles import ORACLE_RUNS, built, run_key
from support.oracles import WORKER as MEGATRON_WORKER
from support.sweeps import cache_files
from support.tokenizer_cases import random_cases
from support.tokenizer_files import write_tokenizer_files

pytestmark = pytest.mark.oracle_environments

ROOT = os.environ.get("MEGACACHE_BRIDGE_ORACLE", os.path.expanduser("~/.cache/megacache/bridge-oracle"))
WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "bridge_worker.py")
VERSION = "0.19"  # the megatron-core Bridge 0.6.2 runs on (0.19.2 in the oracle)
CONFIGS = 120
PREFIXES = ("a", "b", "c", "d")
REFUSALS: list = []


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


def random_spec(rng: random.Random, data, cache: str) -> dict:
    """One ConfigContainer's data, training, validation and tokenizer settings (Bridge's constructor
    keywords), mostly valid, sometimes one that Bridge refuses."""
    prefixes = [str(data / p) for p in PREFIXES]
    seed = rng.choice([0, 1234, rng.randrange(2**32)])
    dataset: dict = {"seq_length": rng.choice([16, 64, 128]), "random_seed": seed, "path_to_cache": cache}
    kind = rng.choice(["one", "one", "weighted", "weighted", "unweighted", "data_path", "per_split", "per_split"])
    weights = lambda n: [rng.choice([1.0, 0.3, 2.0, round(rng.uniform(0.1, 5), 3)]) for _ in range(n)]  # noqa: E731
    if kind == "one":
        dataset["blend"] = [[rng.choice(prefixes)], None if rng.random() < 0.8 else [1.0]]
    elif kind in ("weighted", "unweighted"):
        chosen = rng.sample(prefixes, rng.randrange(2, 5))
        dataset["blend"] = [chosen, weights(len(chosen)) if kind == "weighted" else None]
    elif kind == "data_path":
        chosen = rng.sample(prefixes, rng.randrange(1, 4))
        words = [w for p, w in zip(chosen, weights(len(chosen))) for w in (str(w), p)] if rng.random() < 0.6 else chosen
        dataset["data_path"] = " ".join(words) if rng.random() < 0.5 else words
    else:
        per = []
        for i in range(3):
            chosen = rng.sample(prefixes, rng.randrange(1, 4))
            per.append(None if i == 2 and rng.random() < 0.2 else
                       [chosen, weights(len(chosen)) if rng.random() < 0.5 else None])
        dataset["blend_per_split"] = per
    if kind != "per_split":
        dataset["split"] = rng.choice(["9999,8,2", "9999,8,2", "90,5,5", "98,2", "969, 30, 1", "1,1,1"])
        if rng.random() < 0.03:
            del dataset["split"]  # refused: a blend needs a split
    elif rng.random() < 0.03:
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
    if rng.random() < 0.6:
        train["train_iters"] = rng.choice([0, 1, 10, 37, 200, 500])
    else:
        train["train_samples"] = rng.choice([1, 9, 100, 1000, 3001])
        if rng.random() < 0.03:
            train["train_iters"] = 5  # refused: two training modes
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
    tokenizer: dict = {"tokenizer_type": "NullTokenizer", "vocab_size": rng.choice([1000, 50257, 70000])}
    if rng.random() < 0.2:
        tokenizer["null_tokenizer_eod_id"] = 7
    return {"dataset": dataset, "train": train, "validation": validation, "tokenizer": tokenizer,
            "model": {"seq_length": dataset["seq_length"]}}


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


def oracle_run(comm) -> tuple[str, list[dict], list[dict]]:
    """The random configurations, their datasets and Bridge's answer to each (its caches on disk),
    made once per machine (in support.oracles.ORACLE_RUNS, keyed by the configurations) by
    rank 0, so that every rank count compares against them: the directory, specs and answers."""
    if not built(ROOT):  # on every rank, before any collective
        pytest.skip("Megatron-Bridge oracle not built: run bash tests/bridge_oracle.sh")
    rng = random.Random("megacache bridge")
    key = run_key([random_spec(rng, Path("ROOT"), f"ROOT/theirs/{i}") for i in range(CONFIGS)], "0.6.2", WORKER,
                  MEGATRON_WORKER)
    root = os.path.join(ORACLE_RUNS, f"bridge-{key}")
    rng = random.Random("megacache bridge")
    specs = [random_spec(rng, Path(root), os.path.join(root, "theirs", str(i))) for i in range(CONFIGS)]
    done = os.path.join(root, "done.json")
    error = None
    if comm.rank == 0 and not os.path.exists(done):
        try:
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root)
            write_datasets(Path(root))
            started = time.monotonic()
            results = ask({"cwd": root, "build": True,
                           "configs": [{"spec": s, "yaml": os.path.join(root, f"{i}.yaml")}
                                       for i, s in enumerate(specs)]})
            print(f"Bridge built {len(specs)} configurations in {time.monotonic() - started:.0f} s")
            write_atomic(done, json.dumps(results).encode())
        except BaseException as exc:  # agreed below, so no rank waits forever
            error = exc
    comm.check(error, "running the Megatron-Bridge oracle")
    with open(done) as f:
        return root, specs, json.load(f)


def bridge_sweep(comm) -> dict[str, int]:
    """Every random configuration built by megacache with ``comm``'s ranks from the YAML Bridge wrote,
    compared with Bridge's own build (what it refused, refused by megacache too)."""
    from megacache.builders.build import BuildConfig
    from support.sweeps import build_and_compare

    root, specs, results = oracle_run(comm)
    outcomes: dict = {}
    for i, (spec, theirs) in enumerate(zip(specs, results, strict=True)):
        path = os.path.join(root, f"{i}.yaml")
        label = f"configuration {i}: {json.dumps(spec)}\nBridge: {theirs.get('error')}"
        if theirs.get("stage") == "load":
            raise AssertionError(f"Bridge could not write or read {label}")
        if theirs.get("stage") == "validate":  # Bridge refuses: so must megacache
            refuses(lambda: read_config(path, VERSION), label)
            outcomes["refused"] = outcomes.get("refused", 0) + 1
            REFUSALS.append(theirs["error"][:90])
            continue
        ours = read_config(path, VERSION)
        try:
            assert_same_plan(ours, theirs)
            assert read_config(load_yaml(path), VERSION) == ours  # the same container as a mapping
        except AssertionError as exc:
            raise AssertionError(f"{label}\n{exc}") from None
        with shared_directory(comm, "megacache-bridge-") as workdir:
            cfg = BuildConfig(**{**ours.build_fields(), "cache_dir": os.path.join(workdir, "ours"),
                                 "sequences_path": ""})
            # where megatron-core refused while building, megacache refuses for the same reason
            if build_and_compare(cfg, comm, theirs["path_to_cache"], theirs.get("error")) is None:
                outcomes["refused while building"] = outcomes.get("refused while building", 0) + 1
                continue
            if comm.rank == 0:
                assert sorted(cache_files(cfg.cache_dir)) == sorted(theirs["files"]), label
        kind = "per-split" if ours.blend_per_split else "one prefix" if ours.blend.is_single else "blend"
        outcomes[kind] = outcomes.get(kind, 0) + 1
    return outcomes


def assert_mostly_built(outcomes: dict) -> None:
    assert sum(v for k, v in outcomes.items() if "refused" not in k) >= 0.75 * CONFIGS, outcomes
    assert all(outcomes.get(k, 0) >= 10 for k in ("per-split", "one prefix", "blend")), outcomes


def test_random_configurations_equal_bridge():
    outcomes = bridge_sweep(SingleComm())
    print("Bridge configurations, 1 rank:", outcomes, *sorted(set(REFUSALS)), sep="\n")
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


def test_the_command_line_on_2_and_3_ranks_and_bridge_reuses_every_file(data, tmp_path):
    from support.corpus import run_megacache

    rng = random.Random("bridge command line")
    specs = [random_spec(rng, data, str(tmp_path / "theirs" / str(i))) for i in range(8)]
    results = ask({"cwd": str(tmp_path), "build": True,
                   "configs": [{"spec": s, "yaml": str(tmp_path / f"{i}.yaml")} for i, s in enumerate(specs)]})
    built = [(i, s, r) for i, (s, r) in enumerate(zip(specs, results)) if not r.get("error")]
    assert len(built) >= 5, [r.get("error") for r in results]
    again = []
    for i, spec, theirs in built:
        for ranks in (2, 3):
            # the container Bridge wrote, its cache directory made megacache's
            ours = str(tmp_path / f"ours-{ranks}" / str(i))
            text = open(tmp_path / f"{i}.yaml").read().replace(theirs["path_to_cache"], ours)
            (tmp_path / f"{i}-{ranks}.yaml").write_text(text)
            done = run_megacache(ranks, "build", "--bridge-config", str(tmp_path / f"{i}-{ranks}.yaml"))
            assert f"on {ranks} rank(s)" in done.stdout
            mine = cache_files(ours)
            assert json.loads(mine.pop("sequences_per_dataset.json"))  # megacache's, for fast loading
            assert mine == cache_files(theirs["path_to_cache"]), (i, ranks)
        again.append({"spec": {**spec, "dataset": {**spec["dataset"], "path_to_cache": ours}},
                      "yaml": str(tmp_path / f"{i}-again.yaml")})
    before = {a["spec"]["dataset"]["path_to_cache"]: tree(a["spec"]["dataset"]["path_to_cache"]) for a in again}
    results = ask({"cwd": str(tmp_path), "build": True, "configs": again})
    assert not [r["error"] for r in results if r.get("error")]
    assert {path: tree(path) for path in before} == before  # Bridge found every file: nothing written again


def test_command_line_refuses_megatron_lm_flags_beside_a_bridge_config(tmp_path):
    from support.corpus import run_megacache

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
