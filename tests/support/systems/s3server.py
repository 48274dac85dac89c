"""A real S3 API server for the object-storage tests: moto's standalone server (``python -m
moto.server``, from ``moto[server]``) on a free loopback port, started and stopped by the tests, and a
small forwarding proxy in front of it that counts the requests and answers injected faults (HTTP
503 SlowDown) as a throttled store does.

Programs under test are configured as a user configures the AWS tools, through the environment
(``S3Server.environment``): AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION, with the user's own AWS files and the instance metadata service kept out."""

from __future__ import annotations

import contextlib
import http.client
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from support.inputs.corpus import free_port

ACCESS_KEY = "AKIAMEGACACHETEST"
#: the secret every test's server is given; no output may ever show it
SECRET_KEY = "megacache-test-secret-Zq7vXw2"
REGION = "us-east-1"


def moto_available() -> bool:
    try:
        import moto.server  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


class S3Server:
    """moto's server process; ``proxy`` is the endpoint clients are given."""

    def __init__(self, workdir: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(workdir, "moto.log"), "wb")
        self.start()
        self.proxy = Proxy(self.port)
        self.aws_dir = workdir

    def start(self) -> None:
        """moto's server on this port, empty (again, after ``kill``)."""
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1).read()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's server did not start; see {self.log.name}")
                time.sleep(0.1)

    def kill(self) -> None:
        """The server process killed, as a crashed store: its connections drop, its objects are gone."""
        self.process.kill()
        self.process.wait()

    def enforce_credentials(self) -> None:
        """From now on moto checks every request's access key against its IAM users (of which there
        are none): a request signed with any key is refused (403 InvalidAccessKeyId)."""
        # text/plain: a form's body would be parsed away before moto reads it
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset-auth", data=b"0", method="POST",
                                                      headers={"Content-Type": "text/plain"}), timeout=10).read()

    def environment(self, **overrides) -> dict:
        """The environment of a user whose credentials and endpoint are those of this server."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MSC_"))}
        env.update(AWS_ENDPOINT_URL=self.proxy.url, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                   AWS_DEFAULT_REGION=REGION, AWS_EC2_METADATA_DISABLED="true",
                   AWS_CONFIG_FILE=os.path.join(self.aws_dir, "no-aws-config"),
                   AWS_SHARED_CREDENTIALS_FILE=os.path.join(self.aws_dir, "no-aws-credentials"))
        env.update(overrides)
        return {k: v for k, v in env.items() if v is not None}

    def client(self):
        """A boto3 client talking to moto directly (the tests' own setup, never counted)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def bucket(self) -> str:
        """A new empty bucket's name."""
        name = f"mc-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if getattr(self, "proxy", None):
            self.proxy.stop()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up: a killed job's, say
            return
        super().handle_error(request, client_address)


class Proxy:
    """An HTTP proxy in front of moto that records each request's method, path and Range, counts the
    body bytes clients send (``uploaded``) and receive (``downloaded``), and answers the next requests
    matching a test's rule with an injected error."""

    def __init__(self, upstream: int):
        self.requests: list[tuple[str, str, str | None]] = []
        self.uploaded = self.downloaded = 0
        self.faults: list = []   # [predicate(method, path), status, code, remaining]
        #: seconds each request waits before it is forwarded (a slow store)
        self.latency = 0.0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy._lock:
                    proxy.requests.append((self.command, self.path, self.headers.get("Range")))
                    proxy.uploaded += len(body or b"")
                    fault = next((f for f in proxy.faults if f[3] > 0 and f[0](self.command, self.path)), None)
                    if fault:
                        fault[3] -= 1
                if fault:
                    payload = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{fault[2]}</Code>"
                               f"<Message>injected</Message></Error>").encode()
                    self.send_response(fault[1])
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                time.sleep(proxy.latency)
                conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "content-length")}
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                except (OSError, http.client.HTTPException):  # moto is down: drop the connection as a dead store does
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    with proxy._lock:
                        proxy.downloaded += len(data)
                self.send_response(response.status)
                for k, v in response.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", response.getheader("Content-Length") if self.command == "HEAD"
                                 else str(len(data)))
                self.end_headers()
                try:
                    if self.command != "HEAD":
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # a reader done before the range's end hung up
                    self.close_connection = True
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def fail(self, predicate, times: int, status: int = 503, code: str = "SlowDown") -> None:
        """The next ``times`` requests for which ``predicate(method, path)`` holds get ``status``."""
        with self._lock:
            self.faults.append([predicate, status, code, times])

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.uploaded = self.downloaded = 0
            self.faults.clear()
            self.latency = 0.0

    def count(self, method: str, path: str) -> int:
        """Requests seen of ``method`` on ``path`` (the path without its query)."""
        return sum(1 for m, p, _ in self.requests if m == method and p.split("?", 1)[0] == path)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def _running(tmp_path_factory, name: str):
    """A server started in a directory of the session's, stopped after (skips the test where moto
    is not installed)."""
    if not moto_available():
        pytest.skip("moto's S3 server is not installed: pip install 'moto[server]' (the test extra has it)")
    server = S3Server(str(tmp_path_factory.mktemp(name)))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server for the session."""
    with _running(tmp_path_factory, "s3server") as server:
        yield server


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The session's server with its proxy's counts and faults cleared, and this process's
    environment a user's of that server (megacache's clients made afresh from it)."""
    from megacache.runtime import object_storage

    s3_server.proxy.reset()
    for key in list(os.environ):
        if key.startswith(("AWS_", "MSC_")):
            monkeypatch.delenv(key)
    for key, value in s3_server.environment().items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    object_storage._clients.clear()
    yield s3_server
    object_storage._clients.clear()


@pytest.fixture
def own_s3(tmp_path_factory):
    """A server of the test's own, for a test that kills it or makes it check credentials."""
    with _running(tmp_path_factory, "own-s3server") as server:
        yield server


def upload_datasets(server: S3Server, directory, count: int, seed: int) -> list[str]:
    """``count`` small datasets written under ``directory`` (a new folder) as ``partNN`` and
    uploaded to a new bucket as ``s3://BUCKET/tok/partNN``; their prefixes."""
    import numpy as np

    from megacache.formats.indexed import write_dataset

    bucket = server.bucket()
    rng = np.random.default_rng(seed)
    os.makedirs(directory)
    prefixes = []
    for i in range(count):
        local = os.path.join(directory, f"part{i:02d}")
        write_dataset(local, [rng.integers(0, 1000, n).astype(np.uint16) for n in rng.integers(1, 120, 60)],
                      np.uint16)
        for suffix in (".idx", ".bin"):
            server.client().upload_file(local + suffix, bucket, f"tok/part{i:02d}{suffix}")
        prefixes.append(f"s3://{bucket}/tok/part{i:02d}")
    return prefixes


def msc_config(server: S3Server, path: str, profile: str, bucket: str) -> str:
    """A multi-storage-client configuration file at ``path`` whose ``profile`` is ``bucket`` on
    ``server`` (through its proxy), as a user writes one for MSC_CONFIG; its path."""
    import json

    config = {"profiles": {profile: {
        "storage_provider": {"type": "s3", "options": {"base_path": bucket, "endpoint_url": server.proxy.url,
                                                       "region_name": REGION}},
        "credentials_provider": {"type": "S3Credentials", "options": {"access_key": ACCESS_KEY,
                                                                      "secret_key": SECRET_KEY}}}}}
    with open(path, "w") as f:
        json.dump(config, f)
    return path
