"""megacache's 0.20 against Megatron-LM main (megatron-core 0.20.0, not yet released): what main
answered at one commit, recorded by tests/support/oracles/record_megatron_main.py in tests/data/megatron-main,
so that these run with no checkout and no network. (The tokenizer identities are checked in
test_tokenizer_identity.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from megacache.builders.build import BuildConfig, build
from megacache.runtime.comm import SingleComm
from megacache.megatron.blends import parse_blend
from megacache.megatron.tokenizer import TOKENIZER_FLAGS, tokenizer_identifiers
from megacache.megatron.training import split_sizes
from support.oracles.environments import recorded_main
from support.oracles.record_megatron_main import (BUCKET, CACHE_CONFIGS, OBJECT_STORAGE_CONFIGS, PROFILE, SIZE_FLAGS,
                                                  VERSION, cache_dir, cache_files, make_files,
                                                  megacache_build_args, upload_datasets)
from support.sweeps import words
from support.systems.s3server import msc_config, s3, s3_server  # noqa: F401 (fixtures)


def test_tokenizer_flags_are_those_of_megatron_mains_arguments():
    """Every tokenizer flag main's arguments.py declares, and its default, is a flag of megacache's
    table for 0.20 (switches by the value they store when not given)."""
    recorded = recorded_main("tokenizer_identities.json")["tokenizer_flags"]
    theirs = {tuple(f["names"]): (f["switch"], f["default"]) for f in recorded}
    ours = {f.names: (f.kind in ("true", "false"), f.default) for f in TOKENIZER_FLAGS if f.exists_in(VERSION)}
    # megacache reads --tokenizer-metadata, --tokenizer-special-tokens under their flag names
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    for names, (switch, default) in theirs.items():
        assert ours[names][0] == switch, names
        if ours[names][1] is not None:
            assert ours[names][1] == default, (names, ours[names][1], default)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_main")
    make_files(root)
    return root


@pytest.mark.parametrize("index", range(len(CACHE_CONFIGS)), ids=[c["name"] for c in CACHE_CONFIGS])
def test_cache_files_equal_those_megatron_main_wrote(root, monkeypatch, index):
    """The same configuration built by megacache for 0.20 writes the files main's
    BlendedMegatronDatasetBuilder wrote: the same names (the descriptions' md5) and bytes."""
    c, recorded = CACHE_CONFIGS[index], recorded_main("caches.json")["builds"][index]
    assert recorded["name"] == c["name"] and recorded["error"] is None, recorded
    monkeypatch.chdir(root)  # the prefixes and tokenizer paths are relative to it, as recorded
    common = dict(seq_length=c["seq_length"], sizes=tuple(c["sizes"]), seed=c["seed"], cache_dir=cache_dir(c),
                  add_extra_token=c["add_extra_token"], drop_last_partial_validation=c["drop_last_partial_validation"],
                  megatron_version=VERSION, tokenizer=tokenizer_identifiers(megatron_version=VERSION, **c["tokenizer"]))
    if c.get("blend_per_split"):
        blends = [None if b is None else parse_blend(words(*b)) for b in c["blend_per_split"]]
        cfg = BuildConfig(blend_per_split=blends, split=None, **common)
    else:
        cfg = BuildConfig(blend=parse_blend(words(*c["blend"])), split=c["split"], **common)
    build(cfg, SingleComm())
    assert cache_files(cache_dir(c)) == recorded["files"]


@pytest.fixture(scope="module")
def bucket(root, s3_server):
    """DATASETS in BUCKET on the session's moto server, as the recorder uploaded them to its own."""
    upload_datasets(s3_server, root)
    return BUCKET


@pytest.mark.parametrize("index", range(len(OBJECT_STORAGE_CONFIGS)), ids=[c["name"] for c in OBJECT_STORAGE_CONFIGS])
def test_build_from_object_storage_equals_megatron_main_building_from_it(root, bucket, s3, tmp_path, index):
    """``megacache build --megatron-version 0.20`` on s3:// (or msc://, through a profile file naming
    the bucket) paths writes the files main wrote building from the same paths in a bucket of the same
    content (names and bytes), reading each .idx once and no .bin, and copying each .idx under
    --object-storage-cache-path/<bucket or profile>/ as main does."""
    stored = recorded_main("object_storage_caches.json")
    assert stored["commit"] == recorded_main("caches.json")["commit"]  # one main
    c, recorded = OBJECT_STORAGE_CONFIGS[index], stored["builds"][index]
    assert recorded["name"] == c["name"] and recorded["error"] is None, recorded
    assert split_sizes(VERSION, None, **SIZE_FLAGS) == tuple(c["sizes"])
    args = megacache_build_args(c, str(tmp_path / "cache"), str(tmp_path / "idx"), str(tmp_path / "splits.json"))
    environment = s3.environment(MSC_CONFIG=msc_config(s3, str(tmp_path / "msc.json"), PROFILE, bucket))
    done = subprocess.run([sys.executable, "-m", "megacache", *args], env=environment, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr

    paths = sorted({p for b in c.get("blend_per_split") or [c["blend"]] for p in b[0]})
    keys = [p.split("/", 3)[3] for p in paths]  # scheme://bucket-or-profile/key
    assert [s3.proxy.count("GET", f"/{bucket}/{k}.idx") for k in keys] == [1] * len(keys)
    assert [r for r in s3.proxy.requests if r[0] == "GET" and not r[1].split("?")[0].endswith(".idx")] == []
    for path, key in zip(paths, keys):
        copy = tmp_path / "idx" / path.split("/", 3)[2] / f"{key}.idx"
        assert copy.read_bytes() == (root / f"{key}.idx").read_bytes()
    assert cache_files(str(tmp_path / "cache")) == recorded["files"]
    # main, given the cache megacache wrote (the same files), loaded it and left it as it was
    assert recorded["megacache_loaded"] == {"files": recorded["files"], "error": None, "unchanged": True}
