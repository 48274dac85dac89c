"""``megacache pack --bridge-config`` on Megatron-Bridge finetuning configurations: the packed files
land where Bridge 0.6.2's ``GPTSFTDatasetBuilder`` looks for them, byte for byte what Bridge's own
setup writes, and Bridge's setup run afterwards packs nothing again
(tests/support/oracles/bridge_sft_builder_worker.py in the oracle environment tests/bridge_oracle.sh builds;
those tests are skipped when it is not built). The same files on 1, 2 and 3 ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from megacache.interfaces import cli
from support.inputs.corpus import run_megacache
from support.oracles.environments import BRIDGE_ROOT, SCRIPTS, built
from support.inputs.tokenizer_files import CORPUS, write_sft_tokenizers

WORKER = os.path.join(SCRIPTS, "bridge_sft_builder_worker.py")
WORDS = sorted({w for line in CORPUS for w in line.replace(",", "").split()})
#: (dataset fields beside the root and the packing specs, packing specs), one configuration each
CONFIGS = {
    "prompt": ({"seq_length": 48, "seed": 77, "dataset_kwargs": {"prompt_template": "Q: {input}\\nA: {output}"}},
               {"packed_sequence_size": 64, "pad_seq_to_mult": 4}),
    "chat": ({"seq_length": 64, "seed": 5, "preprocessing": {
        "_target_": "megatron.bridge.data.sft_processing.ChatSFTPreprocessingConfig", "loss_mode": "assistant"}},
             {"packed_sequence_size": 96, "max_single_sequence_length": 80}),
}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sft-tokenizers")
    write_sft_tokenizers(root)
    return root


def write_dataset(root: Path, chat: bool) -> None:
    rng = np.random.default_rng(55 + chat)
    root.mkdir(parents=True)

    def text(most: int) -> str:
        return " ".join(rng.choice(WORDS, int(rng.integers(0, most + 1))))

    for split, n in (("training", 300), ("validation", 40)):
        with open(root / f"{split}.jsonl", "w") as f:
            for _ in range(n):
                line = {"messages": [{"role": "user", "content": text(8)}, {"role": "assistant", "content": text(6)}]} \
                    if chat else {"input": text(12), "output": text(8)}
                f.write(json.dumps(line) + "\n")


def write_config(path: Path, root: Path, tokenizer: Path, kind: str) -> Path:
    """A finetuning ConfigContainer's YAML (its dataset and tokenizer sections), as Bridge writes one."""
    import yaml

    dataset, specs = CONFIGS[kind]
    container = {
        "dataset": {"_target_": "megatron.bridge.data.builders.gpt_sft.GPTSFTDatasetConfig", "dataset_root": str(root),
                    **dataset, "enable_offline_packing": True, "do_validation": True, "do_test": False,
                    "offline_packing_specs": {"_target_": "megatron.bridge.data.packing.config.PackedSequenceSpecs",
                                              **specs}},
        "tokenizer": {"_target_": "megatron.bridge.training.tokenizers.config.TokenizerConfig",
                      "tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": str(tokenizer)},
    }
    path.write_text(yaml.safe_dump(container))
    return path


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def bridge_setup(config: Path) -> dict:
    """Bridge's own fine-tuning data setup on ``config``: what its datasets hold."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([os.path.join(BRIDGE_ROOT, "venv", "bin", "python"), WORKER, str(config)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.rsplit("\n", 2)[-2])


@pytest.mark.oracle_environments
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_bridge_finds_the_packed_files_and_packs_nothing_again(kind, tokenizers, tmp_path, capsys):
    if not built(BRIDGE_ROOT):
        pytest.skip("Megatron-Bridge oracle not built: run bash tests/bridge_oracle.sh")
    tokenizer = tokenizers / "sft-bpe"
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    write_dataset(ours, kind == "chat")
    shutil.copytree(ours, theirs)
    config = write_config(tmp_path / "ours.yaml", ours, tokenizer, kind)

    assert cli.main(["pack", "--bridge-config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "megacache pack: 2 packed file(s) written" in out and "on 1 rank(s)" in out, out
    packed = files(ours)
    assert len([name for name in packed if name.startswith("packed/")]) == 3, sorted(packed)

    # Bridge's setup on a copy of the JSONL writes the same packed files under the same names
    answer = bridge_setup(write_config(tmp_path / "theirs.yaml", theirs, tokenizer, kind))
    assert "error" not in answer, answer
    bridges = {name: data for name, data in files(theirs).items() if name.startswith("packed/")}
    assert bridges == {name: data for name, data in packed.items() if name.startswith("packed/")}

    # and on megacache's files, finds them: nothing written, nothing changed, the same datasets
    assert bridge_setup(config) == answer
    assert files(ours) == packed

    assert cli.main(["pack", "--bridge-config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.count("is there already, left as it is") == 2 and "0 packed file(s) written" in out, out
    assert files(ours) == packed


@pytest.mark.slow
def test_the_files_are_the_same_on_two_and_three_ranks(tokenizers, tmp_path, capsys):
    made = {}
    for ranks in (1, 2, 3):
        root = tmp_path / f"data{ranks}"
        write_dataset(root, chat=False)
        config = write_config(tmp_path / f"{ranks}.yaml", root, tokenizers / "sft-bpe", "prompt")
        if ranks == 1:
            assert cli.main(["pack", "--bridge-config", str(config)]) == 0
        else:
            run_megacache(ranks, "pack", "--bridge-config", str(config))
        made[ranks] = files(root)
    assert len(made[1]) == 5
    assert made[2] == made[1] and made[3] == made[1]


def test_dry_run_names_the_files_and_writes_nothing(tokenizers, tmp_path, capsys):
    root = tmp_path / "data"
    write_dataset(root, chat=False)
    config = write_config(tmp_path / "c.yaml", root, tokenizers / "sft-bpe", "prompt")
    assert cli.main(["pack", "--bridge-config", str(config), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    directory = root / "packed" / f"{str(tokenizers / 'sft-bpe').replace('/', '--')}_pad_seq_to_mult4_sft_"
    assert [line.split()[:2] for line in lines[:3]] == [["to", "write"], ["to", "write"], ["appended", "metadata"]]
    assert lines[0].split()[-1].startswith(str(directory)) and lines[0].endswith("/training_64.idx.parquet")
    assert lines[1].endswith("/validation_64.idx.parquet") and lines[2].endswith("/64_metadata.jsonl")
    assert lines[3] == "megacache pack --dry-run: nothing written"
    assert sorted(files(root)) == ["training.jsonl", "validation.jsonl"]


#: (a change to the prompt configuration's YAML, the message after "CONFIG: ")
REFUSED = {
    "no packing": (lambda c: c["dataset"].update(enable_offline_packing=False),
                   "dataset.offline_packing_specs: Bridge packs nothing without enable_offline_packing: true and "
                   "offline_packing_specs with a packed_sequence_size"),
    "hf source": (lambda c: c["dataset"].update(hf_dataset={"path": "squad"}),
                  "dataset.hf_dataset: Hugging Face sources are not reproduced; give dataset_root, a folder of "
                  "training.jsonl and validation.jsonl"),
    "pretraining data": (lambda c: c["dataset"].update(_target_="megatron.bridge.training.config.GPTDatasetConfig"),
                         "dataset._target_: megatron.bridge.training.config.GPTDatasetConfig is not Bridge's "
                         "fine-tuning data; megacache pack prepares the packed files of GPTSFTDatasetConfig or "
                         "FinetuningDatasetConfig"),
    "single longer than pack": (lambda c: c["dataset"]["offline_packing_specs"].update(max_single_sequence_length=65),
                                "dataset.offline_packing_specs.max_single_sequence_length (65) exceeds "
                                "packed_sequence_size (64); Bridge refuses it"),
    "packed path": (lambda c: c["dataset"]["offline_packing_specs"].update(packed_train_data_path="train.bin"),
                    "dataset.offline_packing_specs.packed_train_data_path: 'train.bin' is neither a .npy file nor "
                    "packed Parquet (a path ending in .parquet or .pq, a glob of such files, a folder of them); "
                    "Bridge refuses it"),
    "tokenizer": (lambda c: c["tokenizer"].update(tokenizer_type="GPT2BPETokenizer"),
                  "tokenizer.tokenizer_type: 'GPT2BPETokenizer'; megacache pack reproduces Bridge's SFT examples "
                  "with a HuggingFaceTokenizer and its tokenizer_model"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_configuration_is_refused_naming_the_field(case, tokenizers, tmp_path, capsys):
    import yaml

    root = tmp_path / "data"
    write_dataset(root, chat=False)
    config = write_config(tmp_path / "c.yaml", root, tokenizers / "sft-bpe", "prompt")
    container = yaml.safe_load(config.read_text())
    change, message = REFUSED[case]
    change(container)
    config.write_text(yaml.safe_dump(container))
    for dry_run in ([], ["--dry-run"]):
        assert cli.main(["pack", "--bridge-config", str(config), *dry_run]) == 2
        assert capsys.readouterr().err == f"megacache pack: error: {config}: {message}\n"
    assert sorted(files(root)) == ["training.jsonl", "validation.jsonl"]


@pytest.mark.slow
def test_a_malformed_line_in_another_ranks_share_stops_every_rank(tokenizers, tmp_path):
    root = tmp_path / "data"
    write_dataset(root, chat=False)
    with open(root / "training.jsonl", "a") as f:
        f.write('{"input": "pack my box", "output": \n')
    config = write_config(tmp_path / "c.yaml", root, tokenizers / "sft-bpe", "prompt")
    done = run_megacache(2, "pack", "--bridge-config", str(config), check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"megacache pack: error: 1 rank(s) failed during tokenizing {root / 'training.jsonl'}"
                                  f":\n  rank 1: {root / 'training.jsonl'}:line 301: not valid JSON"), done.stderr
    assert sorted(files(root)) == ["training.jsonl", "validation.jsonl"]  # no packed file, no share left


def test_the_python_entry_point_writes_what_the_command_writes(tokenizers, tmp_path, capsys):
    import megacache

    made = []
    for how in ("command", "python"):
        root = tmp_path / how
        write_dataset(root, chat=False)
        config = write_config(tmp_path / f"{how}.yaml", root, tokenizers / "sft-bpe", "prompt")
        if how == "command":
            assert cli.main(["pack", "--bridge-config", str(config)]) == 0
        else:
            outcomes = megacache.pack_sft(str(config))
            assert [(o.split.name, o.state) for o in outcomes] == [("training", "written"), ("validation", "written")]
            assert [o.state for o in megacache.pack_sft(str(config))] == ["present", "present"]
        made.append(files(root))
    assert made[0] == made[1] and len(made[0]) == 5


@pytest.fixture(scope="module")
def packed_files(tokenizers, tmp_path_factory) -> tuple[Path, Path]:
    """The training files ``megacache pack`` writes, as Parquet and as ``.npy``."""
    root = tmp_path_factory.mktemp("sft-read")
    write_dataset(root / "data", chat=False)
    config = write_config(root / "c.yaml", root / "data", tokenizers / "sft-bpe", "prompt")
    import yaml

    container = yaml.safe_load(config.read_text())
    specs = container["dataset"]["offline_packing_specs"]
    specs.update(packed_train_data_path=str(root / "train.npy"), packed_val_data_path=str(root / "val.parquet"),
                 packed_metadata_path=str(root / "metadata.jsonl"))
    config.write_text(yaml.safe_dump(container))
    assert cli.main(["pack", "--bridge-config", str(config)]) == 0
    return root / "val.parquet", root / "train.npy"


def check(command: str, path: Path, capsys) -> tuple[int, str, str]:
    status = cli.main([command, str(path)])
    out, err = capsys.readouterr()
    return status, out, err


def test_verify_and_inspect_read_the_packed_files(packed_files, capsys):
    for path in packed_files:
        if path.suffix == ".npy":
            rows = np.load(path, allow_pickle=True)  # megacache's own file, trusted by this test
            packs, examples = len(rows), sum(len(r["seq_start_id"]) for r in rows)
            tokens, longest = sum(len(r["input_ids"]) for r in rows), max(len(r["input_ids"]) for r in rows)
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(path).to_pydict()
            packs, examples = len(table["input_ids"]), sum(map(len, table["seq_start_id"]))
            tokens, longest = sum(map(len, table["input_ids"])), max(map(len, table["input_ids"]))
        status, out, _ = check("verify", path, capsys)
        assert status == 0
        assert out.splitlines()[0] == (f"ok   {path}: {packs:,} packs, {examples:,} examples, {tokens:,} tokens, "
                                       f"longest pack {longest:,} (Megatron-Bridge packed SFT)")
        status, out, _ = check("inspect", path, capsys)
        assert status == 0 and out.startswith(f"packed SFT file {path} (Megatron-Bridge")
        assert f"{packs:,} packs, {examples:,} examples, {tokens:,} tokens" in out and "problem" not in out


def test_a_truncated_parquet_file_is_refused(packed_files, tmp_path, capsys):
    cut = tmp_path / "cut.parquet"
    data = packed_files[0].read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    status, out, err = check("verify", cut, capsys)
    assert status == 2 and out.startswith(f"FAIL {cut}\n  {cut}: not a readable Parquet file (")
    status, out, err = check("inspect", cut, capsys)
    assert status == 2 and err.startswith(f"megacache inspect: error: {cut}: not a readable Parquet file (")


def test_a_bad_seq_start_id_is_named(packed_files, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(packed_files[0]).to_pydict()
    table["seq_start_id"][3] = table["seq_start_id"][3] + [table["seq_start_id"][3][-1]]  # not rising
    bad = tmp_path / "bad.parquet"
    schema = pa.schema([(name, pa.list_(getattr(pa, t)())) for name, t in
                        {"input_ids": "int64", "loss_mask": "int8", "seq_start_id": "int64"}.items()])
    pq.write_table(pa.table(table, schema=schema), bad)
    problem = f"{bad}: 1 pack(s) whose seq_start_id does not rise, the first pack 3"
    status, out, _ = check("verify", bad, capsys)
    assert status == 2 and out.startswith(f"FAIL {bad}\n  {problem}\n")
    status, out, _ = check("inspect", bad, capsys)
    assert status == 2 and out.endswith(f"\n  problem: {problem}\n")


class RunsAShellCommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def npy_with_pickle(packed: Path, path: Path, pickled: bytes) -> Path:
    """``packed``'s numpy header followed by ``pickled``."""
    data = packed.read_bytes()
    header = data[: data.index(b"\n") + 1]
    path.write_bytes(header + pickled)
    return path


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_pickle_that_runs_a_command_is_refused_and_runs_nothing(protocol, packed_files, tmp_path, capsys):
    import pickle
    import pickletools

    marker = tmp_path / "ran"
    pickled = pickle.dumps(RunsAShellCommand(marker), protocol=protocol)
    crafted = npy_with_pickle(packed_files[1], tmp_path / "crafted.npy", pickled)
    header = packed_files[1].read_bytes().index(b"\n") + 1
    at = header + next(pos for op, _, pos in pickletools.genops(pickled) if op.name in ("GLOBAL", "STACK_GLOBAL"))
    message = (f"{crafted}: byte {at}: a global posix.system: only numpy's own reconstruction of an array is "
               "accepted (a crafted file could run code under pickle.load; megacache never loads it)")
    status, out, _ = check("verify", crafted, capsys)
    assert status == 2 and out.startswith(f"FAIL {crafted}\n  {message}\n")
    status, _, err = check("inspect", crafted, capsys)
    assert status == 2 and err == f"megacache inspect: error: {message}\n"
    assert not marker.exists()


def test_pack_refuses_a_crafted_pickle_where_its_file_would_be_and_runs_nothing(tokenizers, tmp_path, capsys):
    root = tmp_path / "data"
    write_dataset(root, chat=False)
    config = write_config(tmp_path / "c.yaml", root, tokenizers / "sft-bpe", "prompt")
    import pickle
    import yaml

    container = yaml.safe_load(config.read_text())
    train = tmp_path / "train.npy"
    container["dataset"]["offline_packing_specs"].update(
        packed_train_data_path=str(train), packed_val_data_path=str(tmp_path / "val.parquet"),
        packed_metadata_path=str(tmp_path / "metadata.jsonl"))
    config.write_text(yaml.safe_dump(container))
    marker = tmp_path / "ran"
    np.save(train, np.array([{}], dtype=object), allow_pickle=True)  # an object array's header
    npy_with_pickle(train, train, pickle.dumps(RunsAShellCommand(marker), protocol=4))
    for dry in ([], ["--dry-run"]):
        status = cli.main(["pack", "--bridge-config", str(config), *dry])
        err = capsys.readouterr().err
        assert status == 2, err
        assert err.startswith(f"megacache pack: error: {train}: byte ") and ": a global posix.system: " in err, err
        assert err.rstrip().endswith("Bridge would load this packed file as it is and prepare nothing: remove it "
                                     f"(megacache verify {train} lists every problem) and pack again"), err
    assert not marker.exists() and not (tmp_path / "val.parquet").exists() and not (tmp_path / "metadata.jsonl").exists()


def test_an_unexpected_opcode_is_refused(packed_files, tmp_path, capsys):
    import pickle

    rows = np.load(packed_files[1], allow_pickle=True)  # megacache's own file, trusted by this test
    pickled = pickle.dumps(rows, protocol=3)  # unframed, so that a byte can go in
    at = pickled.index(b"]")  # a DUP before the list of rows
    crafted = npy_with_pickle(packed_files[1], tmp_path / "extra.npy", pickled[:at] + b"2" + pickled[at:])
    header = packed_files[1].read_bytes().index(b"\n") + 1
    status, out, _ = check("verify", crafted, capsys)
    assert status == 2
    assert out.startswith(f"FAIL {crafted}\n  {crafted}: byte {header + at}: opcode DUP is not one numpy's "
                          "pickle of Bridge's packed rows uses")
    assert check("verify", npy_with_pickle(packed_files[1], crafted, pickled), capsys)[0] == 0


def test_the_metadata_record_is_held_to_its_file(tokenizers, tmp_path, capsys):
    root = tmp_path / "data"
    write_dataset(root, chat=False)
    config = write_config(tmp_path / "c.yaml", root, tokenizers / "sft-bpe", "prompt")
    assert cli.main(["pack", "--bridge-config", str(config)]) == 0
    training, = root.rglob("training_64.idx.parquet")
    validation = training.with_name("validation_64.idx.parquet")
    metadata = training.with_name("64_metadata.jsonl")
    capsys.readouterr()
    assert cli.main(["verify", str(training), str(validation)]) == 0
    assert capsys.readouterr().out.count("(Megatron-Bridge packed SFT)") == 2
    records = json.loads(metadata.read_text())
    most = records[1]["max_samples_per_bin"]
    records[1]["max_samples_per_bin"] += 1
    metadata.write_text(json.dumps(records))
    status, out, _ = check("verify", validation, capsys)
    assert status == 2 and out == (f"FAIL {validation}\n  {validation}: at most {most:,} examples in a pack; its "
                                   f"record in {metadata} says max_samples_per_bin {most + 1}\n")
    assert check("verify", training, capsys)[0] == 0
    metadata.write_text(json.dumps([{"pack_size": 64}, records[1]]))
    status, out, _ = check("verify", training, capsys)
    assert status == 2 and out == (f"FAIL {training}\n  {metadata}: record 0 does not hold Bridge's fields "
                                   "dataset_max_seqlen, max_samples_per_bin, packing_factor, packing_efficiency, "
                                   "pack_size, min_packed_seqlen\n")


def test_explicit_packed_paths_put_the_metadata_in_bridges_default_folder(tokenizers, tmp_path, capsys):
    import yaml

    root = tmp_path / "data"
    write_dataset(root, chat=False)
    config = write_config(tmp_path / "c.yaml", root, tokenizers / "sft-bpe", "prompt")
    container = yaml.safe_load(config.read_text())
    container["dataset"]["offline_packing_specs"].update(packed_train_data_path=str(tmp_path / "out" / "train.parquet"),
                                                         packed_val_data_path=str(tmp_path / "out" / "val.parquet"))
    config.write_text(yaml.safe_dump(container))
    assert cli.main(["pack", "--bridge-config", str(config)]) == 0
    out = capsys.readouterr().out
    # Bridge's builder names the metadata file in its default folder, which it makes when it names it
    metadata, = root.glob("packed/*_pad_seq_to_mult4_sft_*/64_metadata.jsonl")
    assert f"metadata {metadata}" in out, out
    assert [r["pack_size"] for r in json.loads(metadata.read_text())] == [64, 64]
    assert sorted(files(tmp_path / "out")) == ["train.parquet", "val.parquet"]
    assert cli.main(["verify", str(tmp_path / "out" / "train.parquet"), str(tmp_path / "out" / "val.parquet")]) == 0


def test_a_metadata_folder_that_cannot_be_made_stops_the_run_before_any_file(tokenizers, tmp_path, capsys):
    import yaml

    root = tmp_path / "data"
    write_dataset(root, chat=False)
    config = write_config(tmp_path / "c.yaml", root, tokenizers / "sft-bpe", "prompt")
    container = yaml.safe_load(config.read_text())
    (tmp_path / "taken").write_text("a file where the metadata's folder would be")
    metadata = tmp_path / "taken" / "meta" / "64_metadata.jsonl"
    container["dataset"]["offline_packing_specs"].update(packed_train_data_path=str(tmp_path / "out" / "train.parquet"),
                                                         packed_metadata_path=str(metadata))
    config.write_text(yaml.safe_dump(container))
    assert cli.main(["pack", "--bridge-config", str(config)]) == 2
    assert capsys.readouterr().err == (f"megacache pack: error: {metadata}: cannot write (Not a directory); make room "
                                       "for the output (disk space, quota, file-size limit) in a writable directory "
                                       "and run again\n")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert sorted(files(root)) == ["training.jsonl", "validation.jsonl"]
