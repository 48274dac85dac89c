"""megacache.megatron.versions: which megatron-core version a run follows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from megacache.errors import MegacacheError
from megacache.megatron.versions import normalize


@pytest.mark.parametrize("given, version", [("0.16", "0.16"), ("0.16.1", "0.16"), ("0.17.0", "0.17"),
                                            ("0.18.2", "0.18"), ("0.19", "0.19"), ("0.19.0rc1", "0.19"),
                                            (" 0.19.2 ", "0.19")])
def test_patch_and_pre_releases_name_their_minor_version(given, version):
    assert normalize(given) == version


@pytest.mark.parametrize("given", ["0.15.3", "0.20", "1.0", "0", "19", "latest", "", "0.19.x"])
def test_other_versions_are_errors_listing_the_supported(given):
    with pytest.raises(MegacacheError, match=r"megacache reproduces megatron-core 0\.16, 0\.17, 0\.18, 0\.19"):
        normalize(given)


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


def test_a_megatron_folder_without_megatron_core_is_passed_over(tmp_path):
    # megatron is a namespace package: the next location on the path is the installed 0.16.1
    assert _resolved(tmp_path, None) == "0.16.1 0.16"
