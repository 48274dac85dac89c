"""Objects in buckets, as Megatron-LM names them: ``s3://bucket/key`` through boto3, configured as
users configure the AWS tools (AWS_ENDPOINT_URL, AWS_PROFILE, the credential chain, the region), and
``msc://profile/path`` through multi-storage-client and its own profiles file (MSC_CONFIG), imported
only when such a path is used.

Throttling (HTTP 503 SlowDown), server errors and timeouts are retried with backoff (botocore's
standard retry mode, unless the user's configuration names another). Every failure is a
MegacacheError naming the bucket and key, never a credential. Reads stream in bounded chunks, and
an object read in pieces (``ObjectArray``) is fetched by ranged requests for the bytes asked only; a
written object appears under its key only once complete (S3 publishes a multipart upload when it
is completed), and a downloaded file only once whole (``fsio.publish``).
"""

from __future__ import annotations

import io
import os
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timezone

import numpy as np

from ..errors import MegacacheError
from .fsio import publish, remove_quietly, tmp_path, writing

S3 = "s3://"
MSC = "msc://"
#: bytes a read holds at a time, whatever the object's size
CHUNK = 8 << 20
#: objects larger than this are uploaded in parts of this size
PART = 64 << 20
#: attempts per request (the first included) where the user's configuration sets none
ATTEMPTS = 8


def is_object_storage(path: str) -> bool:
    """Whether ``path`` names an object (``s3://``, ``msc://``) rather than a file."""
    return path.startswith((S3, MSC))


@dataclass(frozen=True)
class ObjectPath:
    """An object's URL split as Megatron splits it: the bucket (msc: the profile) up to the first
    slash after the scheme, the key after it."""

    url: str
    scheme: str
    bucket: str
    key: str

    @classmethod
    def parse(cls, url: str) -> "ObjectPath":
        scheme = S3 if url.startswith(S3) else MSC if url.startswith(MSC) else None
        if scheme is None:
            raise MegacacheError(f"{url}: not an object storage path (expected s3://BUCKET/KEY or msc://PROFILE/PATH)")
        bucket, _, key = url[len(scheme):].partition("/")
        if not bucket:
            raise MegacacheError(f"{url}: no {'bucket' if scheme == S3 else 'profile'} named after {scheme}")
        return cls(url, scheme, bucket, key)

    @property
    def local_name(self) -> str:
        """Where Megatron keeps its copy under ``--object-storage-cache-path``: the URL without
        its scheme."""
        return self.url[len(self.scheme):]

    def __str__(self) -> str:
        what = "bucket" if self.scheme == S3 else "profile"
        return f"{self.url} ({what} {self.bucket!r}, key {self.key!r})"


def shown(path: str) -> str:
    """``path`` as a message names it: an object's with its bucket and key spelled out."""
    return str(ObjectPath.parse(path)) if is_object_storage(path) else path


def local_copy(url: str, directory: str) -> str:
    """Megatron's path for its copy of object ``url`` under ``directory``
    (``--object-storage-cache-path``)."""
    return os.path.join(directory, ObjectPath.parse(url).local_name)


# ---------------------------------------------------------------------------------------------
# Clients: one per process, made on first use


_lock = threading.Lock()
#: by process id: a forked process (a DataLoader worker) makes its own, since a client's pooled
#: connections are not to be shared between processes
_clients: dict = {}


def s3_client():
    """boto3's S3 client as the AWS configuration gives it, with retries in botocore's standard
    mode (exponential backoff with jitter; throttling and 5xx retried) unless the configuration
    names a mode."""
    key = ("s3", os.getpid())
    with _lock:
        if key not in _clients:
            try:
                import boto3
                import botocore.config
                import botocore.exceptions
                import botocore.session
            except ModuleNotFoundError:
                raise MegacacheError("s3:// paths need boto3: pip install boto3") from None
            try:
                core = botocore.session.get_session()
                session = boto3.session.Session(botocore_session=core)
                mode = core.get_config_variable("retry_mode")
                attempts = core.get_config_variable("max_attempts") or ATTEMPTS
                config = botocore.config.Config(retries={"mode": "standard" if mode == "legacy" else mode,
                                                         "total_max_attempts": attempts})
                _clients[key] = session.client("s3", config=config)
            except botocore.exceptions.ProfileNotFound as exc:
                raise MegacacheError(f"AWS profile {exc.kwargs.get('profile')!r} (AWS_PROFILE) is not in the AWS "
                                     f"configuration files; name one they define") from None
            except botocore.exceptions.BotoCoreError as exc:
                raise MegacacheError(f"the AWS configuration is not usable for s3:// paths: {exc}") from None
        return _clients[key]


def _msc():
    try:
        import multistorageclient
    except ModuleNotFoundError:
        raise MegacacheError("msc:// paths need multi-storage-client: pip install multi-storage-client") from None
    return multistorageclient


# ---------------------------------------------------------------------------------------------
# Errors


class ObjectMissing(MegacacheError):
    """The bucket is there, the object is not."""


def _not_found(where: ObjectPath) -> MegacacheError:
    """A missing object's error, saying whether its bucket is missing too (one more request)."""
    import botocore.exceptions

    try:
        s3_client().head_bucket(Bucket=where.bucket)
    except botocore.exceptions.ClientError as exc:
        if _code(exc) in ("404", "NoSuchBucket"):
            return MegacacheError(f"{where}: no bucket {where.bucket!r} at {_endpoint()}")
    return ObjectMissing(f"{where}: bucket {where.bucket!r} has no object {where.key!r}")


def _code(exc) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _endpoint() -> str:
    return s3_client().meta.endpoint_url


@contextmanager
def _errors(where: ObjectPath, doing: str):
    """botocore's and multi-storage-client's failures as MegacacheErrors: built from the error's
    code alone, since a server's message may echo what the request carried."""
    if where.scheme == MSC:
        try:
            yield
        except FileNotFoundError:
            raise ObjectMissing(f"{where}: no such object") from None
        except MegacacheError:
            raise
        except Exception as exc:
            raise MegacacheError(f"{where}: {doing} failed: {type(exc).__name__} (multi-storage-client; check "
                                 f"the profile in its configuration file, MSC_CONFIG)") from None
        return
    import boto3.exceptions
    import botocore.exceptions as bex

    try:
        yield
    except (bex.BotoCoreError, bex.ClientError, boto3.exceptions.S3UploadFailedError) as exc:
        # boto3's transfers wrap the request's error, which they leave as the context
        cause = exc.__context__ if isinstance(exc, boto3.exceptions.S3UploadFailedError) else exc
        raise _translated(where, doing, cause) from None


def _translated(where: ObjectPath, doing: str, exc: BaseException) -> MegacacheError:
    import botocore.exceptions as bex

    if isinstance(exc, (bex.NoCredentialsError, bex.PartialCredentialsError)):
        return MegacacheError(f"{where}: no AWS credentials found: set AWS_ACCESS_KEY_ID and "
                              f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, as for the AWS CLI")
    if isinstance(exc, bex.ClientError):
        code = _code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("404", "NoSuchKey", "NotFound"):
            return _not_found(where)
        if code == "PreconditionFailed":
            return MegacacheError(f"{where}: changed since it was listed (its ETag is another): run the command "
                                  f"again to read it as it is now")
        if code == "NoSuchBucket":
            return MegacacheError(f"{where}: no bucket {where.bucket!r} at {_endpoint()}")
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                    "InvalidToken"):
            return MegacacheError(f"{where}: {doing} refused ({code}): the credentials are wrong or may not "
                                  f"access bucket {where.bucket!r}; check AWS_ACCESS_KEY_ID/AWS_PROFILE")
        return MegacacheError(f"{where}: {doing} failed: {code or 'error'} (HTTP {status}) from {_endpoint()}")
    # connection refused, timeouts, after the retries
    return MegacacheError(f"{where}: {doing} failed at {_endpoint()}: {type(exc).__name__}; is the endpoint "
                          f"(AWS_ENDPOINT_URL) reachable?")


def _object(url: str) -> ObjectPath:
    where = ObjectPath.parse(url)
    if not where.key:
        raise MegacacheError(f"{url}: names a {'bucket' if where.scheme == S3 else 'profile'}, not an object")
    return where


# ---------------------------------------------------------------------------------------------
# Reading


def size(url: str) -> int:
    """The object's size in bytes (one HEAD request)."""
    where = _object(url)
    with _errors(where, "reading the size"):
        if where.scheme == MSC:
            return int(_msc().info(url).content_length)
        return int(s3_client().head_object(Bucket=where.bucket, Key=where.key)["ContentLength"])


def exists(url: str) -> bool:
    """Whether the object is there; a missing bucket is an error."""
    try:
        return size(url) >= 0
    except ObjectMissing:
        return False


def read(url: str) -> bytes:
    """A small object whole (an ``.idx`` header, a JSON file)."""
    where = _object(url)
    with _errors(where, "reading"):
        if where.scheme == MSC:
            with _msc().open(url, "rb") as f:
                return bytes(f.read())
        return s3_client().get_object(Bucket=where.bucket, Key=where.key)["Body"].read()


def read_into(url: str, offset: int, out) -> None:
    """Bytes ``[offset, offset + len(out))`` of the object into the writable buffer ``out`` (one
    ranged request, streamed in CHUNK pieces); an object too short is an error."""
    where = _object(url)
    view = memoryview(out).cast("B")
    if not len(view):
        return
    with _errors(where, "reading"):
        if where.scheme == MSC:
            msc = _msc()
            client, path = msc.resolve_storage_client(url)
            data = client.read(path, byte_range=msc.types.Range(offset=offset, size=len(view)))
            got = len(data)
            view[:got] = data
        else:
            body = s3_client().get_object(Bucket=where.bucket, Key=where.key,
                                          Range=f"bytes={offset}-{offset + len(view) - 1}")["Body"]
            got = 0
            while got < len(view):
                piece = body.read(min(CHUNK, len(view) - got))
                if not piece:
                    break
                view[got:got + len(piece)] = piece
                got += len(piece)
            body.close()
    if got != len(view):
        raise MegacacheError(f"{where}: {len(view)} bytes asked at offset {offset}, {got} read: the object is "
                             f"shorter than its reader expects")


class ObjectArray:
    """A read-only 1-D array of ``length`` ``dtype`` elements over an object's bytes, sliced as a
    memory map is: each contiguous slice is one ranged read of exactly its bytes into a new array,
    so a reader holds what it asked for, whatever the object's size."""

    def __init__(self, url: str, dtype, length: int):
        self.url, self.dtype, self.length = url, np.dtype(dtype), int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError(f"{self.url}: an object's elements are read by contiguous slices, not by {key!r}")
        start, stop, step = key.indices(self.length)
        if step != 1:
            raise TypeError(f"{self.url}: an object's elements are read by contiguous slices (step 1)")
        out = np.empty(max(stop - start, 0), dtype=self.dtype)
        read_into(self.url, start * self.dtype.itemsize, out)
        return out


@dataclass(frozen=True)
class Listed:
    """An object as a listing gives it: ``modified`` in ISO 8601, UTC."""

    url: str
    size: int
    etag: str
    modified: str


def _utc(time) -> str:
    return time.astimezone(timezone.utc).isoformat()


def listing(url: str) -> list[Listed]:
    """The object ``url`` names, else every object under it as under a directory (its key and a
    slash; the whole bucket for none), recursively, in key order; markers of empty folders (keys
    ending in a slash) left out. ``msc://``: as multi-storage-client lists the path; ``s3://``: one
    ListObjectsV2 listing of the key as a prefix (a request per 1,000 objects)."""
    where = ObjectPath.parse(url)
    with _errors(where, "listing"):
        if where.scheme == MSC:
            found = [Listed(o.key if o.key.startswith(MSC) else f"{MSC}{where.bucket}/{o.key}", int(o.content_length),
                            o.etag or "", _utc(o.last_modified)) for o in _msc().list(url)]
        else:
            pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.key)
            found = [Listed(f"{S3}{where.bucket}/{o['Key']}", int(o["Size"]), o["ETag"], _utc(o["LastModified"]))
                     for page in pages for o in page.get("Contents", ())]
    found = sorted((o for o in found if not o.url.endswith("/")), key=lambda o: o.url)
    exact = [o for o in found if o.url == url]
    under = url if url.endswith("/") or not where.key else url + "/"
    return exact or [o for o in found if o.url.startswith(under)]


def download(url: str, path: str) -> int:
    """The object copied to the file ``path``, which appears only when whole (streamed under a
    temporary name, then ``fsio.publish``); its size."""
    where = _object(url)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = tmp_path(path, uuid.uuid4().hex[:12])
    try:
        with _errors(where, "downloading"):
            if where.scheme == MSC:
                _msc().download_file(url, tmp)
            else:
                body = s3_client().get_object(Bucket=where.bucket, Key=where.key)["Body"]
                with writing(path), open(tmp, "wb") as f:
                    for piece in iter(lambda: body.read(CHUNK), b""):
                        f.write(piece)
        with writing(path):
            publish(tmp, path)
    finally:
        remove_quietly(tmp)
    return os.path.getsize(path)


class ObjectReader(io.RawIOBase):
    """An object read as an unbuffered binary file (``read``, ``seek``, ``tell``), of the version
    whose ETag is ``etag`` where one is given: ``s3://`` asks for that version (If-Match) and
    fails where the object has changed since it was listed.

    A read before ``end`` starts one ranged request reaching to ``end`` (``msc://``: up to CHUNK
    bytes), which the reads after it that go on from there take their bytes from as far as they
    ask; a read at or past ``end`` asks for exactly its bytes. So memory stays bounded whatever the
    object's size, and reading on to ``end`` takes one request."""

    def __init__(self, url: str, size: int, etag: str | None = None, end: int = 0):
        super().__init__()
        self.where, self.size, self.etag, self.end = _object(url), size, etag, min(end, size)
        self._pos = 0
        self._body = None     # the open request's body, its next byte at self._pos
        self._body_end = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        pos = offset + (0 if whence == io.SEEK_SET else self._pos if whence == io.SEEK_CUR else self.size)
        if pos < 0:
            raise ValueError(f"{self.where}: negative position {pos}")
        if pos != self._pos:
            self._drop()
            self._pos = pos
        return pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return self.readall()
        n = min(n, self.size - self._pos)
        if n <= 0:
            return b""
        with _errors(self.where, "reading"):
            if self._body is None:
                self._request(n)
            piece = self._body.read(min(n, self._body_end - self._pos))
        if not piece:
            raise MegacacheError(f"{self.where}: ends at byte {self._pos}, not at the {self.size} bytes listed: the "
                                 f"object changed while it was read; run the command again")
        self._pos += len(piece)
        if self._pos >= self._body_end:
            self._drop()
        return piece

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        piece = self.read(len(view))
        view[:len(piece)] = piece
        return len(piece)

    def _request(self, n: int) -> None:
        start = self._pos
        stop = min(self.end if start < self.end else start + n, self.size)
        if self.where.scheme == MSC:
            msc = _msc()
            stop = min(stop, start + max(n, CHUNK))
            client, path = msc.resolve_storage_client(self.where.url)
            self._body = io.BytesIO(client.read(path, byte_range=msc.types.Range(offset=start, size=stop - start)))
        else:
            self._body = s3_client().get_object(Bucket=self.where.bucket, Key=self.where.key,
                                                Range=f"bytes={start}-{stop - 1}",
                                                **({"IfMatch": self.etag} if self.etag else {}))["Body"]
        self._body_end = stop

    def _drop(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

    def close(self) -> None:
        self._drop()
        super().close()


# ---------------------------------------------------------------------------------------------
# Writing


def upload_file(path: str, url: str) -> None:
    """The local file ``path`` as object ``url``: in parts of PART bytes when larger, the object
    appearing under its key only when the upload completes."""
    where = _object(url)
    with _errors(where, "uploading"):
        if where.scheme == MSC:
            _msc().upload_file(url, path)
            return
        s3_client().upload_file(path, where.bucket, where.key, Config=_transfer())


def upload_bytes(data: bytes, url: str) -> None:
    """``data`` as object ``url`` (in parts when large), appearing only when complete."""
    where = _object(url)
    with _errors(where, "uploading"):
        if where.scheme == MSC:
            _msc().write(url, bytes(data))
            return
        s3_client().upload_fileobj(io.BytesIO(data), where.bucket, where.key, Config=_transfer())


def _transfer():
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=PART, multipart_chunksize=PART)


def write_from(url: str, size: int, out) -> None:
    """The object's ``size`` bytes appended to the open binary file ``out``, CHUNK bytes at a time."""
    reader = ObjectReader(url, size, end=size)
    try:
        for _ in range(0, size, CHUNK):
            out.write(reader.read(CHUNK))
        if reader.tell() != size:
            raise MegacacheError(f"{reader.where}: shorter than the {size} bytes expected")
    finally:
        reader.close()


def delete(urls: list[str]) -> None:
    """The objects ``urls`` removed (missing ones ignored); ``s3://``: a request per 1,000 objects of
    a bucket."""
    keys: dict[str, list[str]] = {}
    for url in urls:
        where = _object(url)
        if where.scheme == S3:
            keys.setdefault(where.bucket, []).append(where.key)
            continue
        with _errors(where, "deleting"):
            try:
                _msc().delete(url)
            except FileNotFoundError:
                pass
    for bucket, names in keys.items():
        for i in range(0, len(names), 1000):
            with _errors(ObjectPath.parse(f"{S3}{bucket}/{names[i]}"), "deleting"):
                done = s3_client().delete_objects(Bucket=bucket, Delete={
                    "Objects": [{"Key": k} for k in names[i:i + 1000]], "Quiet": True})
            for failed in done.get("Errors", ())[:1]:
                raise MegacacheError(f"{ObjectPath.parse(S3 + bucket + '/' + failed.get('Key', ''))}: deleting "
                                     f"failed: {failed.get('Code', 'error')}")


class MultipartUpload:
    """An ``s3://`` object uploaded in numbered parts, by any process that knows the upload's id;
    nothing is under its key until ``complete``, and ``abort`` drops the parts uploaded. S3's rules:
    every part but the last at least MIN_PART bytes, at most MAX_PARTS parts."""

    MIN_PART = 5 << 20
    MAX_PARTS = 10_000

    def __init__(self, url: str, upload_id: str):
        self.where, self.upload_id = _object(url), upload_id

    @classmethod
    def start(cls, url: str) -> "MultipartUpload":
        where = _object(url)
        with _errors(where, "starting a multipart upload"):
            upload_id = s3_client().create_multipart_upload(Bucket=where.bucket, Key=where.key)["UploadId"]
        return cls(url, upload_id)

    def upload_part(self, number: int, path: str) -> str:
        """The local file ``path`` as part ``number`` (from 1); the part's ETag."""
        with _errors(self.where, f"uploading part {number}"), open(path, "rb") as f:
            return s3_client().upload_part(Bucket=self.where.bucket, Key=self.where.key, UploadId=self.upload_id,
                                           PartNumber=number, Body=f)["ETag"]

    def complete(self, etags: list[str]) -> None:
        """The object published from parts 1, 2, ... whose ETags are ``etags``."""
        parts = [{"PartNumber": n + 1, "ETag": e} for n, e in enumerate(etags)]
        with _errors(self.where, "completing a multipart upload"):
            s3_client().complete_multipart_upload(Bucket=self.where.bucket, Key=self.where.key,
                                                  UploadId=self.upload_id, MultipartUpload={"Parts": parts})

    def abort(self) -> None:
        with _errors(self.where, "aborting a multipart upload"):
            s3_client().abort_multipart_upload(Bucket=self.where.bucket, Key=self.where.key, UploadId=self.upload_id)

    @classmethod
    def abort_unfinished(cls, url: str) -> int:
        """Abort the uploads to ``url`` that were started and never completed nor aborted (a killed
        job's): how many."""
        where = _object(url)
        with _errors(where, "listing multipart uploads"):
            pages = s3_client().get_paginator("list_multipart_uploads").paginate(Bucket=where.bucket, Prefix=where.key)
            found = [u["UploadId"] for page in pages for u in page.get("Uploads", ()) if u["Key"] == where.key]
        for upload_id in found:
            cls(url, upload_id).abort()
        return len(found)
