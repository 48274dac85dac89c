"""megacache.megatron.versions: which megatron-core version a run follows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from megacache.errors import MegacacheError
from megacache.megatron.versions import NEWEST, SUPPORTED, UNRELEASED, normalize, resolve


@pytest.mark.parametrize("given, version", [("0.16", "0.16"), ("0.16.1", "0.16"), ("0.17.0", "0.17"),
                                            ("0.18.2", "0.18"), ("0.19", "0.19"), ("0.19.0rc1", "0.19"),
                                            (" 0.19.2 ", "0.19"), ("0.20", "0.20"), ("0.20.0", "0.20"),
                                            ("0.20.0rc0", "0.20"), ("0.20.0+d98e8a64dd", "0.20")])
def test_patch_and_pre_releases_name_their_minor_version(given, version):
    assert normalize(given) == version


@pytest.mark.parametrize("given", ["0.15.3", "0.21", "1.0", "0", "19", "latest", "", "0.19.x"])
def test_other_versions_are_errors_listing_the_supported(given):
    with pytest.raises(MegacacheError, match=r"megacache reproduces megatron-core 0\.16, 0\.17, 0\.18, 0\.19, "
                                             r"0\.20 \(Megatron-LM main, package 0\.20\.0, not yet released\); "
                                             r"patch versions accepted, e\.g\. 0\.19\.2"):
        normalize(given)


def test_the_default_is_the_newest_release_never_main():
    """0.20 is Megatron-LM main: asked for (or run from a main checkout), it is followed; with no
    megatron-core to go by, the newest release is."""
    assert SUPPORTED[-1] == "0.20" and UNRELEASED == ("0.20",)
    assert NEWEST == "0.19"
    assert resolve("0.20") == "0.20"


def _resolved(tmp_path, package_info: str | None) -> str:
    """``resolve(None)`` in a fresh interpreter whose path starts with a Megatron-LM checkout holding
    this package_info.py (None: no megatron on the path at all)."""
    site = tmp_path / "site"
    (site / "megatron" / "core").mkdir(parents=True)
    if package_info is not None:
        (site / "megatron" / "core" / "package_info.py").write_text(package_info)
    code = ("from megacache.megatron.versions import installed, resolve\n"
            "print(installed(), resolve(None))")
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_default_is_the_importable_megatron_cores_version(tmp_path):
    assert _resolved(tmp_path, 'MAJOR = 0\nMINOR = 18\nPATCH = 2\nPRE_RELEASE = ""\n') == "0.18.2 0.18"


def test_a_megatron_lm_main_checkout_on_the_path_is_followed(tmp_path):
    # main's package_info.py, as at the commit docs/megatron-versions.md names
    assert _resolved(tmp_path, "MAJOR = 0\nMINOR = 20\nPATCH = 0\nPRE_RELEASE = ''\n") == "0.20.0 0.20"


def test_no_megatron_core_means_the_newest_release(tmp_path):
    code = ("import importlib.metadata as m, sys\n"
            "def missing(name): raise m.PackageNotFoundError(name)\n"
            "m.version = missing\n"
            "sys.modules['megatron'] = None\n"
            "from megacache.megatron.versions import resolve\n"
            "print(resolve(None))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0.19"


def test_a_megatron_folder_without_megatron_core_is_passed_over(tmp_path):
    # megatron is a namespace package: the next location on the path is the installed 0.16.1
    assert _resolved(tmp_path, None) == "0.16.1 0.16"
