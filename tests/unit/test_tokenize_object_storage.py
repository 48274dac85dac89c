"""``megacache tokenize --input s3://...`` (and ``msc://``), run as a user runs it against moto's S3
server (tests/support/systems/s3server.py): the same .bin/.idx as a local tokenize of the same files on 1,
2 and 3 ranks, for a prefix and a glob of jsonl, jsonl.gz, jsonl.zst and parquet objects; a path
or glob in a bucket naming what the same local one names; each plain unit one ranged GET; a
finished or failed run's work reused; errors naming the bucket and key, never a secret."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from support.inputs.corpus import documents, file_bytes, megacache_cmd, write_input
from support.systems.faults import leftovers
from support.systems.s3server import SECRET_KEY, msc_config, own_s3, s3, s3_server  # noqa: F401 (fixtures)

from megacache.errors import MegacacheError
from megacache.text.inputs import SUPPORTED, expand_inputs

#: the corpus: every input format, in folders, beside what no input listing takes (another type,
#: hidden files and folders)
FILES = {"corpus/a/part_0.jsonl": (0, 90), "corpus/a/part_1.jsonl.gz": (90, 160),
         "corpus/b/part_2.jsonl.zst": (160, 230), "corpus/b/part_10.parquet": (230, None)}
OTHERS = ["corpus/README.md", "corpus/docs/notes.md", "corpus/.hidden/x.jsonl", "corpus/a/.tmp.jsonl",
          "corpus/b/.x/y.jsonl", "top.jsonl"]
FLAGS = ["--tokenizer", "byte", "--append-eod", "--unit-bytes", "2K"]
GLOB = "corpus/**/*.jsonl*"


def write_tree(directory) -> None:
    docs = documents(300)
    for name, (a, b) in FILES.items():
        os.makedirs(os.path.dirname(directory / name), exist_ok=True)
        write_input(str(directory / name), docs[a:b])
    for name in OTHERS:
        os.makedirs(os.path.dirname(directory / name), exist_ok=True)
        (directory / name).write_text('{"text": "x"}\n')


def upload(server, directory, names=(*FILES, *OTHERS)) -> str:
    """The files ``names`` of ``directory`` in a new bucket, under the same keys; its name."""
    bucket = server.bucket()
    for name in names:
        server.client().upload_file(str(directory / name), bucket, name)
    return bucket


def tokenize(server, ranks: int, inputs: list[str], prefix, *flags: str, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(megacache_cmd(ranks, "tokenize", "--input", *inputs, "--output-prefix", str(prefix), *FLAGS,
                                        *flags), env=server.environment(**env), capture_output=True, text=True,
                          timeout=600)
    assert SECRET_KEY not in done.stdout + done.stderr
    if done.returncode == 0:
        assert f" on {ranks} rank(s)" in done.stdout, done.stdout
    return done


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The corpus as local files, and the bytes a local tokenize of the prefix and of the glob
    writes (on one rank: other rank counts write the same, tests/conformance/test_tokenize.py)."""
    directory = tmp_path_factory.mktemp("local")
    write_tree(directory)
    out = {}
    for name, given in (("prefix", "corpus"), ("glob", GLOB)):
        done = subprocess.run(megacache_cmd(1, "tokenize", "--input", str(directory / given), "--output-prefix",
                                            str(directory / name), *FLAGS), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        out[name] = file_bytes(str(directory / f"{name}_text_document"))
    assert out["prefix"] != out["glob"]
    return directory, out


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_prefix_and_glob_give_the_local_bytes(s3, local, tmp_path, ranks):
    directory, expected = local
    bucket = upload(s3, directory)
    for name, given in (("prefix", f"s3://{bucket}/corpus/"), ("glob", f"s3://{bucket}/{GLOB}")):
        done = tokenize(s3, ranks, [given], tmp_path / name)
        assert done.returncode == 0, done.stderr
        assert file_bytes(str(tmp_path / f"{name}_text_document")) == expected[name], name
    assert not leftovers(str(tmp_path))


def test_msc_profile_gives_the_local_bytes(s3, local, tmp_path):
    directory, expected = local
    bucket = upload(s3, directory)
    config = msc_config(s3, str(tmp_path / "msc.json"), "corpus", bucket)
    done = tokenize(s3, 2, ["msc://corpus/corpus"], tmp_path / "o", MSC_CONFIG=config)
    assert done.returncode == 0, done.stderr
    assert file_bytes(str(tmp_path / "o_text_document")) == expected["prefix"]


def test_paths_and_globs_name_what_the_same_local_ones_name(s3, local):
    """Each path or glob in the bucket names the objects that the same local path names files (by
    the path below the top), or both are refused."""
    directory, _ = local
    bucket = upload(s3, directory)
    for given in ["corpus", "corpus/", "corpus/a", "corpus/b/part_2.jsonl.zst", "corpus/*", "corpus/*/*.jsonl*",
                  "corpus/**/*.parquet", GLOB, "**/part_1*", "corpus/?/part_1*.gz", "corpus/.hidden",
                  "corpus/.*/*.jsonl", "corpus/[ab]", "*.jsonl", "corpus/b/**", "corpus/**", "corpus/a/part_0.json",
                  "corpus/READ*", "corpus/nothing*", "corpus/c/*", "corpus/docs", "corpus/do*", "corpus/*/.x",
                  "corpus/b/.x/y.jsonl", "corpus/**/part_[0-2]*", "corpus/*/", "corpus/**/", "*/b/"]:
        try:
            here = [os.path.relpath(s.path, directory) for s in expand_inputs([os.path.join(directory, given)])]
        except MegacacheError:
            here = "refused"
        try:
            there = [s.path.removeprefix(f"s3://{bucket}/") for s in expand_inputs([f"s3://{bucket}/{given}"])]
        except MegacacheError:
            there = "refused"
        assert there == here, given


def test_each_unit_is_one_ranged_request_and_a_finished_output_none(s3, tmp_path):
    """A plain object's units on one rank: one GET each, from the byte before the unit to 64 KiB
    past its end (to finish its last line); one listing. Run again: the listing only."""
    write_input(str(tmp_path / "in.jsonl"), documents(800))
    size = os.path.getsize(tmp_path / "in.jsonl")
    bucket = upload(s3, tmp_path, ["in.jsonl"])
    unit = 64 << 10
    assert size > 3 * unit
    s3.proxy.reset()
    done = tokenize(s3, 1, [f"s3://{bucket}/in.jsonl"], tmp_path / "o", "--unit-bytes", "64K")
    assert done.returncode == 0, done.stderr
    gets = sorted((r[2] for r in s3.proxy.requests if r[0] == "GET" and r[1] == f"/{bucket}/in.jsonl"),
                  key=lambda r: int(r[6:].split("-")[0]))
    tail = 64 << 10
    assert gets == [f"bytes={max(start - 1, 0)}-{min(start + unit + tail, size) - 1}" for start in range(0, size, unit)]
    assert [(r[0], r[1].split("?")[0]) for r in s3.proxy.requests if r[1] != f"/{bucket}/in.jsonl"] == \
        [("GET", f"/{bucket}")]
    local = subprocess.run(megacache_cmd(1, "tokenize", "--input", str(tmp_path / "in.jsonl"), "--output-prefix",
                                         str(tmp_path / "local"), *FLAGS, "--unit-bytes", "64K"))
    assert local.returncode == 0
    assert file_bytes(str(tmp_path / "o_text_document")) == file_bytes(str(tmp_path / "local_text_document"))

    s3.proxy.reset()
    again = tokenize(s3, 1, [f"s3://{bucket}/in.jsonl"], tmp_path / "o", "--unit-bytes", "64K")
    assert again.returncode == 0, again.stderr
    assert "already there, made from these inputs with these settings: nothing written" in again.stdout
    assert [(r[0], r[1].split("?")[0]) for r in s3.proxy.requests] == [("GET", f"/{bucket}")]


def test_a_failed_run_resumes_with_its_finished_units(s3, local, tmp_path):
    """The store refuses one object's reads: exit 2 naming it, nothing published; run again, the
    units finished before it are reused (their objects unchanged, as the listing says) and the
    output is the local one."""
    directory, expected = local
    bucket = upload(s3, directory)
    zst = f"/{bucket}/corpus/b/part_2.jsonl.zst"
    s3.proxy.fail(lambda method, path: method == "GET" and path == zst, times=100, status=403, code="AccessDenied")
    failed = tokenize(s3, 1, [f"s3://{bucket}/corpus"], tmp_path / "o")
    assert failed.returncode == 2
    assert failed.stderr.startswith(
        f"megacache tokenize: error: 1 rank(s) failed during tokenizing:\n  rank 0: s3://{bucket}/corpus/b/"
        f"part_2.jsonl.zst (bucket '{bucket}', key 'corpus/b/part_2.jsonl.zst'): reading refused (AccessDenied): the "
        f"credentials are wrong or may not access bucket '{bucket}'; check AWS_ACCESS_KEY_ID/AWS_PROFILE\n"), failed.stderr
    assert "a rerun of the same command resumes from them" in failed.stderr
    assert not os.path.exists(tmp_path / "o_text_document.idx")
    finished = len([n for n in os.listdir(tmp_path / ".o.megacache-work") if n.endswith(".done")])
    s3.proxy.reset()
    done = tokenize(s3, 2, [f"s3://{bucket}/corpus"], tmp_path / "o")
    assert done.returncode == 0, done.stderr
    units, reused = map(int, re.search(r"units: (\d+) \((\d+) reused", done.stdout).groups())
    assert finished == reused and 0 < reused < units
    assert s3.proxy.count("GET", f"/{bucket}/corpus/a/part_0.jsonl") == 0
    assert file_bytes(str(tmp_path / "o_text_document")) == expected["prefix"]


def test_a_replaced_object_is_told_by_its_etag(s3, tmp_path):
    """An object replaced by one of the same size after a finished run: the record's ETag tells,
    and the output is refused as made from other inputs; with --overwrite it is made from the
    object as it is."""
    (tmp_path / "in.jsonl").write_text('{"text": "fine"}\n' * 40)
    bucket = upload(s3, tmp_path, ["in.jsonl"])
    assert tokenize(s3, 1, [f"s3://{bucket}/in.jsonl"], tmp_path / "o").returncode == 0
    (tmp_path / "in.jsonl").write_text('{"text": "FINE"}\n' * 40)
    s3.client().upload_file(str(tmp_path / "in.jsonl"), bucket, "in.jsonl")
    refused = tokenize(s3, 1, [f"s3://{bucket}/in.jsonl"], tmp_path / "o")
    assert (refused.returncode, refused.stderr) == (2, (
        f"megacache tokenize: error: the output is there already, not made from these inputs and settings:\n"
        f"  {tmp_path}/o_text_document.bin: input s3://{bucket}/in.jsonl: modified since\n"
        f"Nothing was written. Pass --overwrite to replace it, or give another --output-prefix\n"))
    done = tokenize(s3, 1, [f"s3://{bucket}/in.jsonl"], tmp_path / "o", "--overwrite")
    assert done.returncode == 0, done.stderr
    local = subprocess.run(megacache_cmd(1, "tokenize", "--input", str(tmp_path / "in.jsonl"), "--output-prefix",
                                         str(tmp_path / "local"), *FLAGS))
    assert local.returncode == 0
    assert file_bytes(str(tmp_path / "o_text_document")) == file_bytes(str(tmp_path / "local_text_document"))


def test_a_bad_line_in_an_object_is_located(s3, tmp_path):
    good = '{"text": "fine"}\n'
    (tmp_path / "b.jsonl").write_text(good * 300 + '{"text": "broken\n' + good * 5)
    bucket = upload(s3, tmp_path, ["b.jsonl"])
    done = tokenize(s3, 2, [f"s3://{bucket}/b.jsonl"], tmp_path / "o", "--unit-bytes", "1K")
    assert done.returncode == 2
    assert (f"s3://{bucket}/b.jsonl:line 301: invalid JSON: Unterminated string starting at column 10"
            in done.stderr), done.stderr
    assert not [n for n in os.listdir(tmp_path) if n.startswith("o_")]


def test_missing_bucket_object_and_matches(s3, local, tmp_path):
    directory, _ = local
    bucket = upload(s3, directory)
    endpoint = s3.proxy.url
    cases = {
        "s3://no-such-bucket-71/corpus/": "s3://no-such-bucket-71/corpus/ (bucket 'no-such-bucket-71', key 'corpus/'): "
                                          f"no bucket 'no-such-bucket-71' at {endpoint}",
        f"s3://{bucket}/corpus/c.jsonl": f"s3://{bucket}/corpus/c.jsonl (bucket '{bucket}', key 'corpus/c.jsonl'): "
                                         f"bucket '{bucket}' has no object 'corpus/c.jsonl' and none under it",
        f"s3://{bucket}/corpus/*.csv": f"s3://{bucket}/corpus/*.csv (bucket '{bucket}', key 'corpus/*.csv'): the "
                                       f"pattern matches nothing",
        f"s3://{bucket}/corpus/READ*": f"s3://{bucket}/corpus/README.md (matched by 's3://{bucket}/corpus/READ*'): "
                                       f"unsupported input file type; supported: {SUPPORTED}",
        f"s3://{bucket}/corpus/docs/": f"s3://{bucket}/corpus/docs/ (bucket '{bucket}', key 'corpus/docs/'): no "
                                       f"input objects under it; supported: {SUPPORTED}",
        f"s3://{bucket}/corpus/do*": f"s3://{bucket}/corpus/do* (bucket '{bucket}', key 'corpus/do*'): the pattern "
                                     f"matches no input objects; supported: {SUPPORTED}",
    }
    for given, message in cases.items():
        done = tokenize(s3, 1, [given], tmp_path / "o")
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"megacache tokenize: error: {message}\n"), given
    assert not os.listdir(tmp_path)


def test_wrong_credentials_exit_2_naming_the_bucket_and_no_secret(own_s3, tmp_path):
    bucket = own_s3.bucket()
    own_s3.enforce_credentials()
    done = tokenize(own_s3, 1, [f"s3://{bucket}/corpus/*.jsonl"], tmp_path / "o")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"megacache tokenize: error: s3://{bucket}/corpus/ (bucket '{bucket}', key 'corpus/'): "
                           f"listing refused (InvalidAccessKeyId): the credentials are wrong or may not access bucket '{bucket}'; "
                           f"check AWS_ACCESS_KEY_ID/AWS_PROFILE\n")
    assert not os.listdir(tmp_path)
