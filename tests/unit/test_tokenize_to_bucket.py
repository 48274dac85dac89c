"""``megacache tokenize --output-prefix s3://...`` (and ``msc://``), run as a user runs it against
moto's S3 server (tests/support/systems/s3server.py): the .bin/.idx objects hold the bytes of a local tokenize
of the same inputs on 1, 2 and 3 ranks, the .bin uploaded in parts from every rank where it is large;
a run stopped or failed leaves nothing under the final keys, and its rerun reuses the units it
finished; errors name the bucket and key, never a secret."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from support.inputs.corpus import documents, file_bytes, megacache_cmd, write_input
from megacache.builders.assemble import upload_groups
from support.systems.s3server import SECRET_KEY, msc_config, own_s3, s3, s3_server  # noqa: F401 (fixtures)

FLAGS = ["--tokenizer", "byte", "--append-eod", "--unit-bytes", "2K"]
DATASET = ("o_text_document.bin", "o_text_document.idx", ".megacache/o_text_document.made-from.json")


def tokenize(server, ranks: int, inputs: list[str], prefix: str, *flags: str,
             **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(megacache_cmd(ranks, "tokenize", "--input", *inputs, "--output-prefix", prefix, *FLAGS,
                                        *flags), env=server.environment(**env), capture_output=True, text=True,
                          timeout=600)
    assert SECRET_KEY not in done.stdout + done.stderr
    return done


def keys(server, bucket: str, under: str = "") -> list[str]:
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=under)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", ()))


def unfinished_uploads(server, bucket: str) -> list[str]:
    return [u["Key"] for u in server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", ())]


def object_bytes(server, bucket: str, prefix: str) -> tuple[bytes, bytes]:
    get = server.client().get_object
    return tuple(get(Bucket=bucket, Key=f"{prefix}.{s}")["Body"].read() for s in ("bin", "idx"))


def local_bytes(tmp_path, inputs: list[str], *flags: str) -> tuple[bytes, bytes]:
    done = subprocess.run(megacache_cmd(1, "tokenize", "--input", *inputs, "--output-prefix",
                                        str(tmp_path / "local"), *FLAGS, *flags), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return file_bytes(str(tmp_path / "local_text_document"))


@pytest.fixture
def corpus(s3, tmp_path):
    """Three jsonl files, local and as objects in a new bucket: (bucket, local paths, the bytes of
    their local tokenize)."""
    docs = documents(300)
    paths = []
    bucket = s3.bucket()
    for i, (a, b) in enumerate([(0, 90), (90, 200), (200, None)]):
        paths.append(str(tmp_path / f"in{i}.jsonl"))
        write_input(paths[-1], docs[a:b])
        s3.client().upload_file(paths[-1], bucket, f"corpus/in{i}.jsonl")
    return bucket, paths, local_bytes(tmp_path, paths)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_bucket_to_bucket_gives_the_local_bytes(s3, corpus, ranks):
    bucket, _, expected = corpus
    done = tokenize(s3, ranks, [f"s3://{bucket}/corpus/"], f"s3://{bucket}/out/o")
    assert done.returncode == 0, done.stderr
    assert f"on {ranks} rank(s)" in done.stdout
    assert object_bytes(s3, bucket, "out/o_text_document") == expected
    assert keys(s3, bucket, "out/") == [f"out/{n}" for n in sorted(DATASET)]
    assert not unfinished_uploads(s3, bucket)

    s3.proxy.reset()
    again = tokenize(s3, ranks, [f"s3://{bucket}/corpus/"], f"s3://{bucket}/out/o")
    assert again.returncode == 0, again.stderr
    assert "already there, made from these inputs with these settings: nothing written" in again.stdout
    assert not [r for r in s3.proxy.requests if r[0] in ("PUT", "POST", "DELETE")]


@pytest.mark.parametrize("ranks", [1, 3])
def test_a_large_bin_is_uploaded_in_parts_from_every_rank(s3, tmp_path, ranks):
    """A .bin of 5 MiB parts (the least S3 takes; moto refuses less) and a last one: one multipart
    upload, its parts numbered in input order whichever rank uploads them, the .idx after it
    completes; throttled uploads of parts and of the completion retried."""
    path = str(tmp_path / "big.jsonl")
    write_input(path, documents(400) * 36)
    bucket = s3.bucket()
    s3.client().upload_file(path, bucket, "big.jsonl")
    expected = local_bytes(tmp_path, [path], "--unit-bytes", "1M")
    assert len(expected[0]) > 16 << 20
    s3.proxy.reset()
    s3.proxy.fail(lambda method, path: method == "PUT" and "partNumber=" in path, times=2)
    s3.proxy.fail(lambda method, path: method == "POST" and "uploadId=" in path, times=1)
    done = tokenize(s3, ranks, [f"s3://{bucket}/big.jsonl"], f"s3://{bucket}/o", "--unit-bytes", "1M",
                    MEGACACHE_UPLOAD_PART_BYTES=str(5 << 20))
    assert done.returncode == 0, done.stderr
    assert object_bytes(s3, bucket, "o_text_document") == expected
    final = [(m, p) for m, p, _ in s3.proxy.requests if p.split("?")[0] in (f"/{bucket}/o_text_document.bin",
                                                                             f"/{bucket}/o_text_document.idx")]
    parts = [p for m, p in final if m == "PUT" and "partNumber=" in p]
    numbers = sorted({int(p.rsplit("partNumber=", 1)[1]) for p in parts})
    assert numbers == list(range(1, len(numbers) + 1)) and 3 <= len(numbers) <= -(-len(expected[0]) // (5 << 20))
    assert len(parts) == len(numbers) + 2  # two throttled, retried
    completed = [i for i, (m, p) in enumerate(final) if m == "POST" and "uploadId=" in p]
    idx_put = [i for i, (m, p) in enumerate(final) if m == "PUT" and p.endswith(".idx")]
    assert len(completed) == 2 and len(idx_put) == 1 and completed[-1] < idx_put[0]
    assert not unfinished_uploads(s3, bucket)
    assert keys(s3, bucket) == sorted(["big.jsonl", *DATASET])


def test_upload_groups_are_runs_of_at_least_the_part_size():
    assert upload_groups([3, 3, 3, 3, 3], 5) == [[0, 1], [2, 3], [4]]
    assert upload_groups([5, 0, 2, 9, 0, 0], 5) == [[0], [1, 2, 3, 4, 5]]  # no empty last part
    assert upload_groups([5, 5, 0, 0], 5) == [[0], [1, 2, 3]]
    assert upload_groups([1, 2], 5) == [[0, 1]]
    assert upload_groups([0, 0], 5) == [[0, 1]]


def test_msc_output_gives_the_local_bytes(s3, corpus, tmp_path):
    bucket, _, expected = corpus
    config = msc_config(s3, str(tmp_path / "msc.json"), "data", bucket)
    done = tokenize(s3, 2, [f"s3://{bucket}/corpus/"], "msc://data/out/o", MSC_CONFIG=config)
    assert done.returncode == 0, done.stderr
    assert object_bytes(s3, bucket, "out/o_text_document") == expected
    assert keys(s3, bucket, "out/") == [f"out/{n}" for n in sorted(DATASET)]


def test_a_failed_run_leaves_nothing_published_and_its_rerun_reuses_units(s3, corpus):
    """The store refuses one input's reads: exit 2, the finished units kept under the work prefix,
    nothing under the final keys; run again on other ranks, they are reused, the bytes the local
    ones, the work prefix gone."""
    bucket, _, expected = corpus
    s3.proxy.fail(lambda method, path: method == "GET" and path == f"/{bucket}/corpus/in2.jsonl", times=100,
                  status=403, code="AccessDenied")
    failed = tokenize(s3, 1, [f"s3://{bucket}/corpus/"], f"s3://{bucket}/out/o")
    assert failed.returncode == 2
    assert f"s3://{bucket}/corpus/in2.jsonl (bucket '{bucket}', key 'corpus/in2.jsonl'): reading refused" \
        in failed.stderr, failed.stderr
    work = keys(s3, bucket, "out/")
    assert work and all(k.startswith("out/.o.megacache-work/") for k in work), work
    assert failed.stderr.endswith(f"It leaves {len(work)} object(s) of its finished units under "
                                  f"s3://{bucket}/out/.o.megacache-work/: a rerun of the same command resumes from "
                                  f"them and removes them\n"), failed.stderr
    finished = len([k for k in work if k.endswith(".done")])
    s3.proxy.reset()
    done = tokenize(s3, 2, [f"s3://{bucket}/corpus/"], f"s3://{bucket}/out/o")
    assert done.returncode == 0, done.stderr
    units, reused = map(int, re.search(r"units: (\d+) \((\d+) reused", done.stdout).groups())
    assert finished == reused and 0 < reused < units
    assert s3.proxy.count("GET", f"/{bucket}/corpus/in0.jsonl") == 0
    assert object_bytes(s3, bucket, "out/o_text_document") == expected
    assert keys(s3, bucket, "out/") == [f"out/{n}" for n in sorted(DATASET)]


def _wait_for(server, job, predicate, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any(predicate(m, p) for m, p, _ in list(server.proxy.requests)):
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.02)


@pytest.mark.slow
def test_a_job_killed_while_uploading_parts_leaves_nothing_and_its_rerun_completes(s3, tmp_path):
    """The job killed (SIGKILL) once its first part is uploaded: no object under the final keys, its
    units under the work prefix; the rerun aborts the upload left, reuses every unit and writes the
    local bytes."""
    path = str(tmp_path / "big.jsonl")
    write_input(path, documents(400) * 24)
    bucket = s3.bucket()
    s3.client().upload_file(path, bucket, "big.jsonl")
    command = megacache_cmd(1, "tokenize", "--input", f"s3://{bucket}/big.jsonl", "--output-prefix",
                            f"s3://{bucket}/o", *FLAGS, "--unit-bytes", "1M")
    env = s3.environment(MEGACACHE_UPLOAD_PART_BYTES=str(5 << 20))
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(s3, job, lambda m, p: m == "PUT" and "partNumber=" in p)
    s3.proxy.latency = 1.0
    job.send_signal(signal.SIGKILL)
    job.communicate()
    s3.proxy.latency = 0.0
    assert not [k for k in keys(s3, bucket) if not k.startswith((".o.megacache-work/", "big.jsonl"))]
    assert unfinished_uploads(s3, bucket) == ["o_text_document.bin"]
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    units, reused = map(int, re.search(r"units: (\d+) \((\d+) reused", again.stdout).groups())
    assert units == reused
    assert object_bytes(s3, bucket, "o_text_document") == local_bytes(tmp_path, [path], "--unit-bytes", "1M")
    assert not unfinished_uploads(s3, bucket)
    assert keys(s3, bucket) == sorted(["big.jsonl", *DATASET])


@pytest.mark.slow
def test_server_killed_mid_tokenize_publishes_nothing_and_a_rerun_completes(own_s3, tmp_path):
    """moto killed while units are uploaded (a slow store makes the window): exit 2 naming a bucket
    and key, no request ever made for the final keys; with the store back the same command
    completes with the local bytes."""
    write_input(str(tmp_path / "in.jsonl"), documents(300))
    bucket = own_s3.bucket()
    own_s3.client().upload_file(str(tmp_path / "in.jsonl"), bucket, "in.jsonl")
    command = megacache_cmd(2, "tokenize", "--input", f"s3://{bucket}/in.jsonl", "--output-prefix",
                            f"s3://{bucket}/out/o", *FLAGS)
    own_s3.proxy.latency = 0.2
    job = subprocess.Popen(command, env=own_s3.environment(AWS_MAX_ATTEMPTS="2"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    _wait_for(own_s3, job, lambda m, p: m == "PUT" and ".o.megacache-work/unit_" in p)
    own_s3.kill()
    out, err = job.communicate(timeout=300)
    assert job.returncode == 2, err
    assert re.search(rf"s3://{bucket}/(\S+) \(bucket '{bucket}', key '\1'\): [a-z ]+ failed at {own_s3.proxy.url}: "
                     rf"\w+; is the endpoint \(AWS_ENDPOINT_URL\) reachable\?", err), err
    assert SECRET_KEY not in out + err
    assert not [p for _, p, _ in own_s3.proxy.requests if p.startswith(f"/{bucket}/out/o_")]

    own_s3.start()
    own_s3.client().create_bucket(Bucket=bucket)
    own_s3.client().upload_file(str(tmp_path / "in.jsonl"), bucket, "in.jsonl")
    own_s3.proxy.latency = 0.0
    again = subprocess.run(command, env=own_s3.environment(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert object_bytes(own_s3, bucket, "out/o_text_document") == local_bytes(tmp_path, [str(tmp_path / "in.jsonl")])
    assert keys(own_s3, bucket, "out/") == [f"out/{n}" for n in sorted(DATASET)]


def test_errors_name_the_bucket_and_key(s3, corpus):
    bucket, paths, _ = corpus
    done = tokenize(s3, 1, paths, "s3://no-such-bucket-72/out/o")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"megacache tokenize: error: s3://no-such-bucket-72/out/o_text_document.idx (bucket "
                           f"'no-such-bucket-72', key 'out/o_text_document.idx'): no bucket 'no-such-bucket-72' at "
                           f"{s3.proxy.url}\n")
    for prefix in (f"s3://{bucket}", f"s3://{bucket}/out/"):
        done = tokenize(s3, 1, paths, prefix)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == (f"megacache tokenize: error: --output-prefix {prefix}: name the datasets' prefix after "
                               f"the bucket and folder (s3://BUCKET/DIR/NAME writes "
                               f"s3://BUCKET/DIR/NAME_text_document.bin/.idx)\n")
    done = tokenize(s3, 1, paths, f"s3://{bucket}/out/o", "--output-format", "pbin")
    assert done.stderr == ("megacache tokenize: error: --output-format pbin: a .pbin is written to a local "
                           "--output-prefix only; write it locally and upload it\n")
    assert keys(s3, bucket, "out") == []


def test_wrong_credentials_exit_2_naming_the_bucket_and_no_secret(own_s3, tmp_path):
    write_input(str(tmp_path / "in.jsonl"), documents(20))
    bucket = own_s3.bucket()
    own_s3.enforce_credentials()
    done = tokenize(own_s3, 1, [str(tmp_path / "in.jsonl")], f"s3://{bucket}/o")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"megacache tokenize: error: s3://{bucket}/o_text_document.idx (bucket '{bucket}', key "
                           f"'o_text_document.idx'): listing refused (InvalidAccessKeyId): the credentials are wrong "
                           f"or may not access bucket '{bucket}'; check AWS_ACCESS_KEY_ID/AWS_PROFILE\n")
