"""Black-box harness: the gateway as a real subprocess, driven through its public contract.

Everything here talks to the gateway the way its users do: the command line, S3 over a
socket (real boto3), and the admin HTTP API. Nothing from ``gateway`` is imported.

Reusable by every test level that needs a running gateway (integration, crash faults,
third-party clients such as s3fs or the AWS CLI).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import hmac
import http.client
import json
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

REPO_ROOT = Path(__file__).resolve().parents[1]

REGION = "us-east-1"
DOMAIN = "s3.test"
# The clients' credentials (what the gateway verifies) ...
GATEWAY_ACCESS_KEY = "GWTESTACCESSKEY00001"
GATEWAY_SECRET_KEY = "gw-test-secret/0123456789abcdefghijklmnopqrst"
# ... and the gateway's own upstream credentials: deliberately different.
UPSTREAM_ACCESS_KEY = "UPSTREAMTESTKEY00001"
UPSTREAM_SECRET_KEY = "upstream-test-secret/0123456789abcdefghijkl"

READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0
FLUSH_STATE_HEADER = "x-gateway-flush-state"


# --------------------------------------------------------------------------- small helpers


_HANDED_PORTS: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago and not handed out before in this process.

    The kernel may give the same ephemeral port to two binds in a row once the first
    socket is closed; a gateway asked for ``--listen`` and ``--admin-listen`` on one
    port refuses to start, so ports already handed out are never handed out again.
    Under pytest-xdist each worker takes only ports of its own share (``_is_this_workers``),
    so two workers never hand out one port between a probe and a gateway's bind.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_PORTS and _is_this_workers(port):
            _HANDED_PORTS.add(port)
            return port


def _is_this_workers(port: int) -> bool:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if not worker.startswith("gw") or count <= 1:
        return True
    # Shares of 8 ports, not the port's parity: Linux gives bind(0) even ports by preference.
    return (port >> 3) % count == int(worker[2:]) % count


def unique_bucket_name(prefix: str = "gwt") -> str:
    """A DNS-compatible bucket name (usable with virtual-hosted addressing)."""
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def quoted_md5(data: bytes) -> str:
    """The ETag S3 returns for a single PUT of ``data``: the quoted MD5 hex."""
    return f'"{md5_hex(data)}"'


def crc32_b64(data: bytes) -> str:
    """``x-amz-checksum-crc32`` value: base64 of the big-endian CRC32."""
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def content_md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def payload(size: int, seed: int | str = 0) -> bytes:
    """Deterministic, non-repeating-looking bytes of ``size`` (distinct per seed)."""
    out = bytearray()
    counter = 0
    seed_b = str(seed).encode()
    while len(out) < size:
        out += hashlib.sha256(seed_b + b":" + counter.to_bytes(8, "big")).digest()
        counter += 1
    return bytes(out[:size])


def flush_state(response: dict[str, Any]) -> str | None:
    """The ``x-gateway-flush-state`` header of a boto3 HEAD/GET response."""
    headers: dict[str, str] = response["ResponseMetadata"]["HTTPHeaders"]
    return headers.get(FLUSH_STATE_HEADER)


def error_code(exc: Any) -> str:
    return str(exc.response["Error"]["Code"])


def error_status(exc: Any) -> int:
    return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])


def list_all_keys(client: Any, bucket: str, **kwargs: Any) -> list[str]:
    """Every key of a ListObjectsV2 listing, following continuation tokens."""
    keys: list[str] = []
    for page in list_pages(client, bucket, **kwargs):
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    return keys


def list_pages(client: Any, bucket: str, **kwargs: Any) -> list[dict[str, Any]]:
    """All ListObjectsV2 pages, driven by hand (no paginator) so each token is checked."""
    pages: list[dict[str, Any]] = []
    token: str | None = None
    for _ in range(100_000):
        args = dict(kwargs)
        if token is not None:
            args["ContinuationToken"] = token
        page = client.list_objects_v2(Bucket=bucket, **args)
        pages.append(page)
        if not page.get("IsTruncated"):
            return pages
        token = page["NextContinuationToken"]
        assert token, "IsTruncated without NextContinuationToken"
    raise AssertionError("listing never ended")


def parse_s3_error(body: bytes) -> dict[str, str]:
    """Parse an S3 XML error document into {Code, Message, ...}; raise if it is not one."""
    root = ET.fromstring(body)
    tag = root.tag.split("}", 1)[-1]
    assert tag == "Error", f"not an S3 error document: {body[:300]!r}"
    out: dict[str, str] = {}
    for child in root:
        out[child.tag.split("}", 1)[-1]] = child.text or ""
    return out


# --------------------------------------------------------------------------- HTTP helpers


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def http_request(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> HttpResponse:
    """One raw HTTP/1.1 request with http.client; never raises on HTTP error statuses."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        # skip_accept_encoding: keep the request exactly as given.
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        hdrs = dict(headers or {})
        if not any(k.lower() == "host" for k in hdrs):
            hdrs["Host"] = parts.netloc
        if body is not None and not any(k.lower() == "content-length" for k in hdrs):
            hdrs["Content-Length"] = str(len(body))
        for k, v in hdrs.items():
            conn.putheader(k, v)
        conn.endheaders()
        if body:
            conn.send(body)
        resp = conn.getresponse()
        data = resp.read()
        return HttpResponse(
            status=resp.status,
            headers={k.lower(): v for k, v in resp.getheaders()},
            body=data,
        )
    finally:
        conn.close()


class _FixedPayloadS3SigV4Auth(S3SigV4Auth):
    """botocore's S3 SigV4 signer with a caller-chosen ``x-amz-content-sha256`` value."""

    def __init__(self, credentials: Credentials, region: str, content_sha256: str) -> None:
        super().__init__(credentials, "s3", region)
        self._content_sha256 = content_sha256

    def payload(self, request: AWSRequest) -> str:
        return self._content_sha256


@dataclass
class SignedRequest:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes
    timestamp: str  # the SigV4 timestamp (YYYYMMDDTHHMMSSZ) the request was signed with
    signature: str  # the seed signature (hex)
    region: str = REGION
    extra: dict[str, Any] = field(default_factory=dict)


def sign_request(
    method: str,
    url: str,
    *,
    access_key: str = GATEWAY_ACCESS_KEY,
    secret_key: str = GATEWAY_SECRET_KEY,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    content_sha256: str | None = None,
    region: str = REGION,
) -> SignedRequest:
    """Sign a raw request with botocore's S3SigV4Auth (header auth).

    ``content_sha256`` defaults to the SHA-256 of ``body``; pass e.g.
    ``STREAMING-UNSIGNED-PAYLOAD-TRAILER`` for aws-chunked uploads.
    """
    if content_sha256 is None:
        content_sha256 = hashlib.sha256(body).hexdigest()
    creds = Credentials(access_key, secret_key)
    auth = _FixedPayloadS3SigV4Auth(creds, region, content_sha256)
    req = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    req.headers["X-Amz-Content-SHA256"] = content_sha256
    auth.add_auth(req)
    final = {k: v for k, v in req.headers.items()}
    authz = final["Authorization"]
    signature = authz.rsplit("Signature=", 1)[1].strip()
    return SignedRequest(
        method=method,
        url=url,
        headers=final,
        body=body,
        timestamp=req.context["timestamp"],
        signature=signature,
        region=region,
    )


def send_signed(req: SignedRequest, body: bytes | None = None) -> HttpResponse:
    return http_request(
        req.method, req.url, body=req.body if body is None else body, headers=req.headers
    )


def object_url(endpoint: str, bucket: str, key: str) -> str:
    """Path-style URL of an object, with the key percent-encoded as botocore does."""
    return f"{endpoint}/{bucket}/{urllib.parse.quote(key, safe='/~')}"


# --------------------------------------------------------------------------- aws-chunked


def aws_chunked_unsigned(
    data: bytes,
    chunk_size: int = 64 * 1024,
    trailers: dict[str, str] | None = None,
) -> bytes:
    """Frame ``data`` as an aws-chunked body without chunk signatures (unsigned + trailer)."""
    out = bytearray()
    for start in range(0, len(data), chunk_size):
        chunk = data[start : start + chunk_size]
        out += f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    out += b"0\r\n"
    for name, value in (trailers or {}).items():
        out += f"{name}:{value}\r\n".encode()
    out += b"\r\n"
    return bytes(out)


def _signing_key(secret_key: str, date: str, region: str) -> bytes:
    k = hmac.new(f"AWS4{secret_key}".encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def aws_chunked_signed(
    data: bytes,
    *,
    seed_signature: str,
    timestamp: str,
    secret_key: str = GATEWAY_SECRET_KEY,
    region: str = REGION,
    chunk_size: int = 64 * 1024,
    tamper_chunk: int | None = None,
) -> bytes:
    """Frame ``data`` as STREAMING-AWS4-HMAC-SHA256-PAYLOAD with chained chunk signatures.

    ``tamper_chunk``: index of a chunk whose signature is deliberately corrupted.
    """
    key = _signing_key(secret_key, timestamp[:8], region)
    scope = f"{timestamp[:8]}/{region}/s3/aws4_request"
    empty_hash = hashlib.sha256(b"").hexdigest()
    chunks = [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)] + [b""]
    prev = seed_signature
    out = bytearray()
    for index, chunk in enumerate(chunks):
        sts = "\n".join(
            [
                "AWS4-HMAC-SHA256-PAYLOAD",
                timestamp,
                scope,
                prev,
                empty_hash,
                hashlib.sha256(chunk).hexdigest(),
            ]
        )
        sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        prev = sig
        if tamper_chunk == index:
            sig = ("0" if sig[0] != "0" else "1") + sig[1:]
        out += f"{len(chunk):x};chunk-signature={sig}\r\n".encode() + chunk + b"\r\n"
    return bytes(out)


def signed_chunked_body_length(data_len: int, chunk_size: int = 64 * 1024) -> int:
    sizes = [min(chunk_size, data_len - i) for i in range(0, data_len, chunk_size)] + [0]
    return sum(len(f"{s:x};chunk-signature=") + 64 + 2 + s + 2 for s in sizes)


# --------------------------------------------------------------------------- client clock


@contextlib.contextmanager
def client_clock_offset(offset: datetime.timedelta) -> Iterator[None]:
    """Make botocore sign requests as if its clock were off by ``offset``.

    Patches the pure-Python signer and, when awscrt is installed, the CRT signer botocore
    then prefers.
    """
    import botocore.auth

    modules: list[Any] = [botocore.auth]
    try:
        import botocore.crt.auth

        modules.append(botocore.crt.auth)
    except ImportError:
        pass

    def fake_now(remove_tzinfo: bool = True) -> datetime.datetime:
        now = datetime.datetime.now(datetime.UTC) + offset
        return now.replace(tzinfo=None) if remove_tzinfo else now

    saved = [(m, m.get_current_datetime) for m in modules if hasattr(m, "get_current_datetime")]
    for module, _ in saved:
        module.get_current_datetime = fake_now
    try:
        yield
    finally:
        for module, original in saved:
            module.get_current_datetime = original


# --------------------------------------------------------------------------- name resolution


@contextlib.contextmanager
def resolve_to_loopback(suffix: str = DOMAIN) -> Iterator[None]:
    """Make ``suffix`` and every ``*.suffix`` resolve to 127.0.0.1 inside this process.

    urllib3 (under botocore) and http.client resolve through ``socket.getaddrinfo``.
    """
    real = socket.getaddrinfo

    def fake(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(name, str) and (name == suffix or name.endswith("." + suffix)):
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    socket.getaddrinfo = fake
    try:
        yield
    finally:
        socket.getaddrinfo = real


# --------------------------------------------------------------------------- clients


_SESSIONS = threading.local()


def _session() -> Any:
    """This thread's boto3 session: it keeps the S3 service model it loaded, so a client
    costs ~30 ms of CPU where a fresh session's cost ~140 ms (the suite makes thousands;
    a session is not thread-safe, hence one per thread). Each client gets its own copy of
    the session's event hooks: one registered on a client stays there."""
    session = getattr(_SESSIONS, "session", None)
    if session is None:
        session = _SESSIONS.session = boto3.session.Session()
    return session


def s3_client(
    endpoint: str,
    *,
    access_key: str = GATEWAY_ACCESS_KEY,
    secret_key: str = GATEWAY_SECRET_KEY,
    region: str = REGION,
    addressing_style: str = "path",
    retries: int = 1,
    config: Config | None = None,
    **client_kwargs: Any,
) -> Any:
    """A boto3 S3 client. ``retries`` is total attempts (1 = no retry hides an error)."""
    base = Config(
        region_name=region,
        signature_version="s3v4",  # also for presigned URLs (botocore's default there is v2)
        # botocore's ``max_attempts`` counts retries (1 was one retry, hiding a first 500
        # or a connection reset behind the second attempt's answer); this is the total.
        retries={"total_max_attempts": retries, "mode": "standard"},
        s3={"addressing_style": addressing_style},
        connect_timeout=10,
        read_timeout=120,
    )
    if config is not None:
        base = base.merge(config)
    return _session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=region,
        config=base,
        **client_kwargs,
    )


# --------------------------------------------------------------------------- the gateway


class GatewayError(RuntimeError):
    pass


class GatewayProcess:
    """``python -m gateway serve`` as a subprocess on fixed ports and a fixed data dir.

    The same object can be started, killed (SIGKILL) and restarted any number of times;
    ports and data dir stay the same, so clients built from ``.endpoint`` keep working.
    Output goes to ``log_path`` (appended across restarts).
    """

    live: list[GatewayProcess] = []  # running instances, for failure reports

    def __init__(
        self,
        data_dir: Path | str,
        upstream_url: str,
        *,
        access_key: str = GATEWAY_ACCESS_KEY,
        secret_key: str = GATEWAY_SECRET_KEY,
        upstream_access_key: str = UPSTREAM_ACCESS_KEY,
        upstream_secret_key: str = UPSTREAM_SECRET_KEY,
        region: str = REGION,
        domain: str | None = DOMAIN,
        port: int | None = None,
        admin_port: int | None = None,
        extra_args: Iterable[str] = (),
        env: dict[str, str] | None = None,
        log_path: Path | str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.upstream_url = upstream_url
        self.access_key = access_key
        self.secret_key = secret_key
        self.upstream_access_key = upstream_access_key
        self.upstream_secret_key = upstream_secret_key
        self.region = region
        self.domain = domain
        self.port = port or free_port()
        self.admin_port = admin_port or free_port()
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        # Logs live next to the data dir, never inside it.
        self.log_path = (
            Path(log_path)
            if log_path
            else self.data_dir.parent / f"{self.data_dir.name}.gateway.log"
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._stopped_on_purpose = self._term_sent = False

    # ---- addresses

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def vhost_endpoint(self) -> str:
        assert self.domain, "gateway started without --domain"
        return f"http://{self.domain}:{self.port}"

    # ---- lifecycle

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--admin-listen",
            f"127.0.0.1:{self.admin_port}",
            "--data-dir",
            str(self.data_dir),
            "--upstream-endpoint",
            self.upstream_url,
            "--upstream-region",
            self.region,
            "--access-key",
            self.access_key,
            "--secret-key",
            self.secret_key,
        ]
        if self.domain:
            cmd += ["--domain", self.domain]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AWS_", "GATEWAY_")) and k not in ("HTTP_PROXY", "HTTPS_PROXY")
        }
        env.update(
            {
                "AWS_ACCESS_KEY_ID": self.upstream_access_key,
                "AWS_SECRET_ACCESS_KEY": self.upstream_secret_key,
                "AWS_DEFAULT_REGION": self.region,
                "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "NO_PROXY": "*",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = READY_TIMEOUT_S) -> GatewayProcess:
        self.spawn()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self._terminate_quietly()
            raise
        return self

    def spawn(self) -> None:
        """Start the process, not waiting for it to be ready (``wait_ready``)."""
        if self.running:
            raise GatewayError("gateway already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self._stopped_on_purpose = self._term_sent = False
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(),
                cwd=str(REPO_ROOT),
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        GatewayProcess.live.append(self)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll ``/readyz`` until 200; fail with the log tail if the process exits."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            assert self.proc is not None
            rc = self.proc.poll()
            if rc is not None:
                raise GatewayError(
                    f"gateway exited with status {rc} before it was ready:\n{self.log_tail()}"
                )
            try:
                resp = http_request("GET", f"{self.admin}/readyz", timeout=2)
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}: {resp.body[:200]!r}"
            except OSError as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                raise GatewayError(
                    f"gateway not ready after {timeout}s ({last}):\n{self.log_tail()}"
                )
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def crashed(self) -> bool:
        """The process exited although nobody stopped or killed it."""
        return self.proc is not None and not self.running and not self._stopped_on_purpose

    def send_signal(self, signum: int) -> None:
        """Deliver a signal without waiting (e.g. SIGTERM, then watch the shutdown)."""
        assert self.proc is not None
        self._stopped_on_purpose = True
        self.proc.send_signal(signum)

    def wait_exit(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """Wait for the process to exit (after ``send_signal``); returns its exit status."""
        assert self.proc is not None
        rc = self.proc.wait(timeout)
        self._forget()
        return rc

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit status."""
        if self.proc is None:
            return None
        proc = self.proc
        self.terminate()
        if proc.poll() is None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self._forget()
        return proc.returncode

    def terminate(self) -> None:
        """SIGTERM, once per run of the process (a second one stops a gateway at once),
        not waiting for it: ``stop`` waits."""
        if self.proc is None or self._term_sent:
            return
        self._stopped_on_purpose = self._term_sent = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to flush or clean up."""
        if self.proc is None:
            return
        self._stopped_on_purpose = True
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._forget()

    def restart(self, *, hard: bool = True, timeout: float = READY_TIMEOUT_S) -> GatewayProcess:
        """Kill (``hard``) or stop the process, then start it on the same dir and ports."""
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start(timeout)

    def _terminate_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.kill()

    def _forget(self) -> None:
        if self in GatewayProcess.live:
            GatewayProcess.live.remove(self)

    def logged(self, fragment: str, timeout_s: float = 5.0, *, after: str = "") -> str:
        """The log from ``after``'s last occurrence on (all of it by default) once that part
        holds ``fragment``, or as it is at the timeout: lines are written in batches, a few
        tens of milliseconds after what they tell."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.log_path.read_text(errors="replace")
            text = text[text.rfind(after) :] if after and after in text else text
            if fragment in text or time.monotonic() >= deadline:
                return text
            time.sleep(0.02)

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # ---- S3

    def client(self, **kwargs: Any) -> Any:
        """A boto3 S3 client (path-style, no retries) with the gateway's client credentials."""
        kwargs.setdefault("access_key", self.access_key)
        kwargs.setdefault("secret_key", self.secret_key)
        return s3_client(self.endpoint, **kwargs)

    def vhost_client(self, **kwargs: Any) -> Any:
        """A boto3 client using virtual-hosted addressing on ``<bucket>.<domain>:<port>``.

        Use it inside ``resolve_to_loopback()``.
        """
        kwargs.setdefault("access_key", self.access_key)
        kwargs.setdefault("secret_key", self.secret_key)
        return s3_client(self.vhost_endpoint, addressing_style="virtual", **kwargs)

    # ---- admin API

    def admin_request(
        self, method: str, path: str, timeout: float = 60.0, body: bytes | None = None
    ) -> HttpResponse:
        return http_request(method, f"{self.admin}{path}", body=body, timeout=timeout)

    def admin_get(self, path: str, timeout: float = 60.0) -> Any:
        resp = self.admin_request("GET", path, timeout=timeout)
        if resp.status != 200:
            raise GatewayError(f"GET {path} -> {resp.status}: {resp.body[:500]!r}")
        return resp.json()

    def admin_post(self, path: str, timeout: float = 60.0) -> Any:
        resp = self.admin_request("POST", path, timeout=timeout, body=b"")
        if resp.status not in (200, 202, 204):
            raise GatewayError(f"POST {path} -> {resp.status}: {resp.body[:500]!r}")
        return resp.json() if resp.body.strip() else None

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.admin_get("/admin/v1/status")
        return result

    def pause_flush(self) -> None:
        self.admin_post("/admin/v1/flush/pause")

    def resume_flush(self) -> None:
        self.admin_post("/admin/v1/flush/resume")

    @contextlib.contextmanager
    def flush_paused(self) -> Iterator[None]:
        """Pause flushing for the block; always resume afterwards (if still running)."""
        self.pause_flush()
        try:
            yield
        finally:
            if self.running:
                self.resume_flush()

    def drain(
        self,
        bucket: str | None = None,
        prefix: str | None = None,
        timeout: float = 30,
        wait: bool = True,
    ) -> dict[str, Any]:
        """``GET /admin/v1/drain``; returns the JSON body ({drained, pending_objects, ...})."""
        query: dict[str, str] = {"wait": "true" if wait else "false", "timeout": f"{timeout:g}"}
        if bucket is not None:
            query["bucket"] = bucket
        if prefix is not None:
            query["prefix"] = prefix
        path = "/admin/v1/drain?" + urllib.parse.urlencode(query)
        result: dict[str, Any] = self.admin_get(path, timeout=timeout + 30)
        return result

    def drained(
        self, bucket: str | None = None, prefix: str | None = None, timeout: float = 30
    ) -> dict[str, Any]:
        """Drain and assert it finished; returns the drain body."""
        result = self.drain(bucket=bucket, prefix=prefix, timeout=timeout)
        assert result["drained"] is True, f"drain did not finish: {result}"
        return result

    def object_state(self, bucket: str, key: str) -> dict[str, Any]:
        quoted = urllib.parse.quote(key, safe="/")
        result: dict[str, Any] = self.admin_get(f"/admin/v1/objects/{bucket}/{quoted}")
        return result

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of ``/metrics`` (``name`` or ``name_total``; ``labels`` as written
        there, e.g. ``how="sendfile"``); 0 when the labelled sample does not exist yet."""
        text = http_request("GET", f"{self.admin}/metrics", timeout=10).body.decode()
        wanted = {f"{name}{{{labels}}}" if labels else name}
        wanted |= {f"{name}_total{{{labels}}}" if labels else f"{name}_total"}
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample in wanted:
                return float(value)
        if labels:
            return 0.0
        raise AssertionError(f"metric {name} not found")

    def blob_files(self, bucket: str, key: str) -> list[Path]:
        """The body files of a key's local row (one, or one per part), read from the
        journal read-only."""
        conn = sqlite3.connect(f"file:{self.data_dir / 'journal.db'}?mode=ro", uri=True)
        try:
            row = conn.execute(
                "SELECT blob_id, parts FROM objects WHERE bucket = ? AND key = ?", (bucket, key)
            ).fetchone()
        finally:
            conn.close()
        assert row is not None, f"{bucket}/{key} has no local row"
        ids = [row[0]] if row[0] else [part[0] for part in json.loads(row[1])]
        return [self.data_dir / "blobs" / blob_id[:2] / blob_id for blob_id in ids]


def corrupt_file(path: Path) -> None:
    """Flip one byte in the middle: same size, different content (bit rot)."""
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def start_all(gateways: Sequence[GatewayProcess], timeout: float = READY_TIMEOUT_S) -> None:
    """Start the gateways side by side (a gateway's start is mostly its imports: started one
    after another, a fleet of three took 5 s of every test that starts one), then wait for
    each to be ready; on a failure none is left running."""
    try:
        for gw in gateways:
            gw.spawn()
        for gw in gateways:
            gw.wait_ready(timeout)
    except BaseException:
        for gw in gateways:
            gw._terminate_quietly()
        raise


def stop_all(gateways: Sequence[GatewayProcess]) -> None:
    """``stop`` each, their shutdowns side by side."""
    for gw in gateways:
        gw.terminate()
    for gw in gateways:
        gw.stop()


def start_moto() -> tuple[Any, str]:
    """Start moto's ThreadedMotoServer on a free loopback port; returns (server, url)."""
    from moto.server import ThreadedMotoServer

    from gateway.upstream.demo import guard_moto

    guard_moto()  # moto's races (ETag, conditional writes, LIST) would look like ours
    # werkzeug logs every request to stderr; keep test output readable.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def upstream_client(moto_url: str) -> Any:
    """A boto3 client straight to the upstream (moto), bypassing the gateway."""
    return s3_client(
        moto_url,
        access_key=UPSTREAM_ACCESS_KEY,
        secret_key=UPSTREAM_SECRET_KEY,
        retries=3,
    )


def upstream_objects(upstream: Any, bucket: str, prefix: str = "") -> dict[str, dict[str, Any]]:
    """key -> ListObjectsV2 entry for every object in the upstream bucket."""
    out: dict[str, dict[str, Any]] = {}
    for page in list_pages(upstream, bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = obj
    return out


def read_body(response: dict[str, Any]) -> bytes:
    body: bytes = response["Body"].read()
    return body
