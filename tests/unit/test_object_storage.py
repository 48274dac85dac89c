"""The object-storage layer (megacache/runtime/object_storage.py) against a real S3 API server
(moto's, tests/support/systems/s3server.py), configured through the environment as a user configures the
AWS tools: sizes, whole and ranged reads, listings, downloads, uploads in parts, retries of
throttling, and the errors of a missing bucket or object and of missing credentials."""

from __future__ import annotations

import os

import numpy as np
import pytest

from support.systems.s3server import SECRET_KEY, msc_config, s3, s3_server  # noqa: F401 (fixtures)

from megacache.errors import MegacacheError
from megacache.runtime import object_storage as store
from megacache.runtime.object_storage import ObjectPath


def test_paths_split_as_megatron_splits_them():
    p = ObjectPath.parse("s3://corpus/tok/web_text_document.idx")
    assert (p.scheme, p.bucket, p.key, p.local_name) == ("s3://", "corpus", "tok/web_text_document.idx",
                                                         "corpus/tok/web_text_document.idx")
    assert ObjectPath.parse("msc://profile/a/b").bucket == "profile"
    assert store.local_copy("s3://b/x/y.idx", "/cache") == "/cache/b/x/y.idx"
    assert store.is_object_storage("s3://b/k") and store.is_object_storage("msc://p/k")
    assert not store.is_object_storage("/data/s3://b") and not store.is_object_storage("s3:/b/k")
    with pytest.raises(MegacacheError, match="no bucket named after s3://"):
        ObjectPath.parse("s3:///key")
    with pytest.raises(MegacacheError, match="names a bucket, not an object"):
        store.size("s3://bucket")


def test_reads_sizes_listings_and_downloads(s3, tmp_path):
    bucket = s3.bucket()
    data = np.arange(300_000, dtype=np.int32).tobytes()
    store.upload_bytes(data, f"s3://{bucket}/d/x.bin")
    store.upload_bytes(b"small", f"s3://{bucket}/d/x.idx")
    store.upload_bytes(b"other", f"s3://{bucket}/e/y.idx")
    assert store.size(f"s3://{bucket}/d/x.bin") == len(data)
    assert store.read(f"s3://{bucket}/d/x.idx") == b"small"
    out = np.empty(1000, dtype=np.int32)
    store.read_into(f"s3://{bucket}/d/x.bin", 4 * 5000, out)
    assert np.array_equal(out, np.arange(5000, 6000))
    listed = store.listing(f"s3://{bucket}/d/")
    assert [(o.url, o.size) for o in listed] == [(f"s3://{bucket}/d/x.bin", len(data)), (f"s3://{bucket}/d/x.idx", 5)]
    head = s3.client().head_object(Bucket=bucket, Key="d/x.idx")
    assert (listed[1].etag, listed[1].modified) == (head["ETag"], head["LastModified"].isoformat())
    assert store.listing(f"s3://{bucket}/d") == listed  # a prefix is listed as a directory
    assert store.listing(f"s3://{bucket}/d/x.idx") == listed[1:]  # an object: itself, not d/x.idx*
    assert store.listing(f"s3://{bucket}/d/x") == []
    assert store.exists(f"s3://{bucket}/d/x.idx") and not store.exists(f"s3://{bucket}/d/z.idx")
    local = tmp_path / "copy" / "x.bin"
    assert store.download(f"s3://{bucket}/d/x.bin", str(local)) == len(data)
    assert local.read_bytes() == data
    assert sorted(os.listdir(local.parent)) == ["x.bin"]  # no temporary left
    with pytest.raises(MegacacheError, match=r"1000 bytes asked at offset 1199600, 400 read: the object is shorter"):
        store.read_into(f"s3://{bucket}/d/x.bin", len(data) - 400, np.empty(1000, np.uint8))


def test_missing_bucket_and_object_named_without_secrets(s3, tmp_path):
    bucket = s3.bucket()
    with pytest.raises(MegacacheError) as missing_key:
        store.read(f"s3://{bucket}/no/such.idx")
    assert str(missing_key.value) == (f"s3://{bucket}/no/such.idx (bucket '{bucket}', key 'no/such.idx'): "
                                      f"bucket '{bucket}' has no object 'no/such.idx'")
    with pytest.raises(MegacacheError) as missing_head:
        store.size(f"s3://{bucket}/no/such.idx")
    assert str(missing_head.value) == str(missing_key.value)
    with pytest.raises(MegacacheError) as missing_bucket:
        store.download("s3://no-such-bucket-mc/k.idx", str(tmp_path / "k.idx"))
    assert str(missing_bucket.value).startswith("s3://no-such-bucket-mc/k.idx (bucket 'no-such-bucket-mc', key "
                                                "'k.idx'): no bucket 'no-such-bucket-mc' at http://127.0.0.1:")
    assert not list(tmp_path.iterdir())
    for exc in (missing_key, missing_head, missing_bucket):
        assert SECRET_KEY not in str(exc.value)


def test_no_credentials(s3, monkeypatch):
    bucket = s3.bucket()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store._clients.clear()
    with pytest.raises(MegacacheError, match=rf"^s3://{bucket}/k \(bucket '{bucket}', key 'k'\): no AWS credentials "
                                             r"found: set AWS_ACCESS_KEY_ID"):
        store.size(f"s3://{bucket}/k")


def test_throttling_is_retried(s3):
    bucket = s3.bucket()
    store.upload_bytes(bytes(range(256)) * 16, f"s3://{bucket}/t.bin")
    path = f"/{bucket}/t.bin"
    s3.proxy.fail(lambda method, p: method == "GET" and p.startswith(path), times=2)
    out = bytearray(100)
    store.read_into(f"s3://{bucket}/t.bin", 1000, out)
    assert bytes(out) == (bytes(range(256)) * 16)[1000:1100]
    assert s3.proxy.count("GET", path) == 3
    assert [r for m, p, r in s3.proxy.requests if m == "GET"] == ["bytes=1000-1099"] * 3


def test_large_upload_in_parts_appears_only_when_complete(s3, tmp_path, monkeypatch):
    bucket = s3.bucket()
    monkeypatch.setattr(store, "PART", 5 << 20)  # S3's smallest part
    data = np.random.default_rng(0).integers(0, 256, (11 << 20), dtype=np.uint8).tobytes()
    (tmp_path / "big").write_bytes(data)
    url = f"s3://{bucket}/out/big.bin"
    # the completion refused past the retries (AWS_MAX_ATTEMPTS, as a user sets it): nothing appears
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    store._clients.clear()
    s3.proxy.fail(lambda method, p: method == "POST" and "uploadId=" in p, times=2, status=500, code="InternalError")
    with pytest.raises(MegacacheError, match=r"uploading failed"):
        store.upload_file(str(tmp_path / "big"), url)
    assert not store.exists(url)
    assert s3.proxy.count("PUT", f"/{bucket}/out/big.bin") == 3  # three parts went up
    store.upload_file(str(tmp_path / "big"), url)
    assert store.read(url) == data


def test_msc_profile_reads_and_writes(s3, tmp_path, monkeypatch):
    bucket = s3.bucket()
    monkeypatch.setenv("MSC_CONFIG", msc_config(s3, str(tmp_path / "msc.json"), "corpus", bucket))
    data = bytes(range(256)) * 10
    store.upload_bytes(data, "msc://corpus/d/x.bin")
    assert s3.client().get_object(Bucket=bucket, Key="d/x.bin")["Body"].read() == data
    assert store.size("msc://corpus/d/x.bin") == len(data)
    out = bytearray(10)
    store.read_into("msc://corpus/d/x.bin", 5, out)
    assert bytes(out) == data[5:15]
    assert [(o.url, o.size) for o in store.listing("msc://corpus/d/")] == [("msc://corpus/d/x.bin", len(data))]
    reader = store.ObjectReader("msc://corpus/d/x.bin", len(data), end=100)
    assert (reader.read(30), reader.read(100), reader.seek(2000), reader.read(1000)) == \
        (data[:30], data[30:100], 2000, data[2000:3000])
    assert store.download("msc://corpus/d/x.bin", str(tmp_path / "x.bin")) == len(data)
    assert not store.exists("msc://corpus/d/nope")
    with pytest.raises(MegacacheError) as missing:
        store.read("msc://corpus/d/nope")
    assert str(missing.value) == "msc://corpus/d/nope (profile 'corpus', key 'd/nope'): no such object"
    with pytest.raises(MegacacheError, match=r"^msc://other/k \(profile 'other', key 'k'\): reading the size failed"):
        store.size("msc://other/k")


def test_object_reader_streams_to_its_end_then_reads_what_is_asked(s3):
    """Reads before ``end`` come from one ranged GET reaching to it, read as far as asked, and a
    seek back starts another; reads past it ask for exactly their bytes; the end of the object
    reads empty, asking nothing."""
    bucket = s3.bucket()
    data = np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    store.upload_bytes(data, f"s3://{bucket}/r.bin")
    [listed] = store.listing(f"s3://{bucket}/r.bin")
    s3.proxy.reset()
    reader = store.ObjectReader(listed.url, listed.size, listed.etag, end=200_000)
    reader.seek(999)
    got = [reader.read(50_000) for _ in range(5)]
    assert [len(g) for g in got] == [50_000, 50_000, 50_000, 49_001, 50_000]
    reader.seek(10)
    assert b"".join(got) == data[999:250_000] and reader.read(5) == data[10:15]
    reader.seek(0, 2)
    assert (reader.tell(), reader.read(10)) == (300_000, b"")
    assert [r for m, p, r in s3.proxy.requests] == ["bytes=999-199999", "bytes=200000-249999", "bytes=10-199999"]
    assert all(m == "GET" for m, _, _ in s3.proxy.requests)


def test_object_reader_refuses_an_object_changed_since_its_listing(s3):
    bucket = s3.bucket()
    store.upload_bytes(b"first version\n", f"s3://{bucket}/c.jsonl")
    [listed] = store.listing(f"s3://{bucket}/c.jsonl")
    store.upload_bytes(b"other version\n", f"s3://{bucket}/c.jsonl")
    with pytest.raises(MegacacheError) as changed:
        store.ObjectReader(listed.url, listed.size, listed.etag, end=listed.size).read(5)
    assert str(changed.value) == (f"s3://{bucket}/c.jsonl (bucket '{bucket}', key 'c.jsonl'): changed since it was "
                                  f"listed (its ETag is another): run the command again to read it as it is now")


@pytest.mark.parametrize("command", [["merge", "s3://corpus/tok/web_text_document", "--output-prefix", "{out}/m"],
                                     ["convert", "s3://corpus/tok/web_text_document", "{out}/m.pbin"]])
def test_merge_and_convert_refuse_a_bucket_input_naming_it(command, tmp_path, capsys):
    from megacache.interfaces import cli

    status = cli.main([w.format(out=tmp_path) for w in command])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err == (f"megacache {command[0]}: error: {store.shown('s3://corpus/tok/web_text_document')}: merge and "
                   "convert read datasets from local or shared paths only; copy it from the bucket first (aws s3 cp, "
                   "or msc's own copy)\n")
    assert os.listdir(tmp_path) == []
