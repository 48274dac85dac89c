"""megacache's 0.20 against Megatron-LM main (megatron-core 0.20.0, not yet released): what main
answered at one commit, recorded by tests/support/record_megatron_main.py in tests/data/megatron-main,
so that these run with no checkout and no network. (The tokenizer identities are checked in
test_tokenizer_identity.py.)"""

from __future__ import annotations

import pytest

from megacache.builders.build import BuildConfig, build
from megacache.runtime.comm import SingleComm
from megacache.megatron.blends import parse_blend
from megacache.megatron.tokenizer import TOKENIZER_FLAGS, tokenizer_identifiers
from support.oracles import recorded_main
from support.record_megatron_main import CACHE_CONFIGS, VERSION, cache_dir, cache_files, make_files
from support.sweeps import words


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
    common = dict(seq_length=c["L"], sizes=tuple(c["sizes"]), seed=c["seed"], cache_dir=cache_dir(c),
                  add_extra_token=bool(c["x"]), drop_last_partial_validation=c["drop_last"],
                  megatron_version=VERSION, tokenizer=tokenizer_identifiers(megatron_version=VERSION, **c["tokenizer"]))
    if c.get("blend_per_split"):
        blends = [None if b is None else parse_blend(words(*b)) for b in c["blend_per_split"]]
        cfg = BuildConfig(blend_per_split=blends, split=None, **common)
    else:
        cfg = BuildConfig(blend=parse_blend(words(*c["blend"])), split=c["split"], **common)
    build(cfg, SingleComm())
    assert cache_files(cache_dir(c)) == recorded["files"]
