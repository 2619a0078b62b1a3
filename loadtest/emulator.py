"""A throttling S3 emulator: the "real bucket" for load tests of the gateway.

It speaks enough S3 (path-style only, signatures ignored) for the gateway's aiobotocore
upstream client and for boto3 writing directly, and it behaves like a distant, rate-limited
S3 endpoint:

* ``latency_ms``: every S3 request waits this long before it is served;
* ``bandwidth``: one token bucket (bytes/s) shared by every connection paces request and
  response bodies (0 = unlimited);
* ``prefix_rate``: one token bucket (requests/s, burst ``prefix_burst``, default one second
  worth) per ``(bucket, partition)``, where the partition is the first ``prefix_depth`` path
  segments of the key (chosen independently of the gateway's lanes: a fresh S3 bucket
  throttles coarsely); an object-level request that finds its bucket empty is answered
  ``503 SlowDown`` (S3 XML). Every object-level operation counts (reads, writes, multipart
  steps, CopyObject against its destination); bucket-level calls (lists, DeleteObjects) do
  not. ``limit_schedule`` changes the limit mid-run, ``storm`` refuses everything for a
  while, ``split_after`` splits a partition after sustained load (``throttle.py``);
* ``store_bodies=False``: objects keep only their size and MD5; GETs then return zero bytes
  of the right length (with the original ETag and the header ``x-emulator-body: discarded``).

Every S3 request is appended to an in-memory log (``GET /_emulator/log``, JSON; ``DELETE``
resets the log and the counters) and optionally to a JSON-lines file. ``GET
/_emulator/stats`` has counters, ``GET /_emulator/objects?bucket=B[&prefix=P]`` sizes and
ETags of what is stored, ``GET|POST /_emulator/config`` reads or changes the throttles.

Use it from the command line (``python loadtest/emulator.py --help``), in asyncio
(``Emulator``) or from synchronous tests (``EmulatorThread``, like moto's
``ThreadedMotoServer``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import contextlib
import email.utils
import hashlib
import json
import re
import signal
import sys
import threading
import time
import urllib.parse
import uuid
import zlib
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from aiohttp import web
from throttle import PrefixLimiter, TokenBucket, prefix_of

__all__ = ["Emulator", "EmulatorThread", "PrefixLimiter", "TokenBucket", "parse_size", "prefix_of"]

try:  # CRC32C / CRC64NVME checksums (a dependency of the gateway)
    from awscrt import checksums as _crt
except ImportError:  # pragma: no cover
    _crt = None

KIB = 1024
MIB = 1024 * KIB
CHUNK = 64 * KIB
NS = "http://s3.amazonaws.com/doc/2006-03-01/"
REGION = "us-east-1"
CONTROL = "/_emulator/"
# Stored system headers, returned on GET/HEAD as they were sent.
SYSTEM_HEADERS = (
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
)
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


# -- state ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Meta:
    content_type: str = "binary/octet-stream"
    user: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Blob:
    """An object or a part: size, MD5, the body when stored."""

    size: int
    md5: bytes
    body: bytes | None
    modified: float = field(default_factory=time.time)
    checksums: dict[str, str] = field(default_factory=dict)

    @property
    def md5_hex(self) -> str:
        return self.md5.hex()


@dataclass(slots=True)
class StoredObject:
    blob: Blob
    etag: str
    meta: Meta
    part_sizes: list[int] = field(default_factory=list)  # multipart objects only


@dataclass(slots=True)
class Upload:
    upload_id: str
    bucket: str
    key: str
    meta: Meta
    initiated: float = field(default_factory=time.time)
    parts: dict[int, Blob] = field(default_factory=dict)


@dataclass(slots=True)
class Bucket:
    name: str
    created: float = field(default_factory=time.time)
    objects: dict[str, StoredObject] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # sorted

    def put(self, key: str, obj: StoredObject) -> None:
        if key not in self.objects:
            bisect.insort(self.keys, key)
        self.objects[key] = obj

    def delete(self, key: str) -> bool:
        if self.objects.pop(key, None) is None:
            return False
        del self.keys[bisect.bisect_left(self.keys, key)]
        return True


class S3Error(Exception):
    def __init__(self, status: int, code: str, message: str, **headers: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.headers = status, code, message, headers


def _no_bucket(name: str) -> S3Error:
    return S3Error(404, "NoSuchBucket", f"The specified bucket does not exist: {name}")


# -- requests -------------------------------------------------------------------------------


@dataclass(slots=True)
class Ctx:
    """One S3 request being served, and its log entry."""

    request: web.Request
    op: str
    bucket: str
    key: str
    query: dict[str, str]
    bytes_in: int = 0
    bytes_out: int = 0
    limited_s: float | None = None  # when the prefix limiter answered (clock time)
    pacer: TokenBucket | None = None  # this request's own bandwidth (request_bandwidth)


_LIST_PARAMS = {
    "list-type",
    "prefix",
    "delimiter",
    "max-keys",
    "continuation-token",
    "start-after",
    "encoding-type",
    "fetch-owner",
    "marker",
}
_BUCKET_OPS = {"HEAD": "HeadBucket", "PUT": "CreateBucket", "DELETE": "DeleteBucket"}


def classify(method: str, bucket: str, key: str, query: Iterable[str], headers: Any) -> str:
    """The S3 operation name of a path-style request ("Unsupported" when not served)."""
    q = set(query) - {"x-id"}  # botocore adds ?x-id=<Operation> to some requests
    copy = "x-amz-copy-source" in headers
    if not bucket:
        return "ListBuckets" if method == "GET" else "Unsupported"
    if not key:
        if method == "GET":
            if "uploads" in q:
                return "ListMultipartUploads"
            if "location" in q:
                return "GetBucketLocation"
            if q <= _LIST_PARAMS:
                return "ListObjectsV2" if "list-type" in q else "ListObjects"
            return "Unsupported"
        if method == "POST":
            return "DeleteObjects" if q == {"delete"} else "Unsupported"
        return "Unsupported" if q else _BUCKET_OPS.get(method, "Unsupported")
    if method == "PUT":
        if "uploadId" in q:
            return "UploadPartCopy" if copy else "UploadPart"
        if q:
            return "Unsupported"
        return "CopyObject" if copy else "PutObject"
    if method == "POST":
        if "uploads" in q:
            return "CreateMultipartUpload"
        return "CompleteMultipartUpload" if "uploadId" in q else "Unsupported"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in q else "DeleteObject"
    if method in ("GET", "HEAD"):
        if "uploadId" in q:
            return "ListParts" if method == "GET" else "Unsupported"
        if {k for k in q if not k.startswith("response-")} - {"partNumber", "versionId"}:
            return "Unsupported"
        return "GetObject" if method == "GET" else "HeadObject"
    return "Unsupported"


def _xml(root: str, body: str) -> bytes:
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{NS}">{body}</{root}>'.encode()


def _el(name: str, value: object) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"<{name}>{escape(str(value))}</{name}>"


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


def _http_date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def _quote(text: str) -> str:
    return f'"{text}"'


def _xml_children(body: bytes) -> ElementTree.Element:
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise S3Error(400, "MalformedXML", "The XML you provided was not well-formed") from exc
    for el in root.iter():
        el.tag = el.tag.rsplit("}", 1)[-1]
    return root


class _Hashers:
    """MD5 plus whichever x-amz-checksum-* algorithms the request names."""

    ALGOS = ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")

    def __init__(self, wanted: Iterable[str]) -> None:
        self.md5 = hashlib.md5()
        self.crc: dict[str, int] = {}
        self.digests: dict[str, Any] = {}
        for algo in set(wanted):
            if algo in ("sha1", "sha256"):
                self.digests[algo] = hashlib.new(algo)
            elif algo == "crc32" or (algo in ("crc32c", "crc64nvme") and _crt is not None):
                self.crc[algo] = 0

    def update(self, data: bytes) -> None:
        self.md5.update(data)
        for h in self.digests.values():
            h.update(data)
        for algo, value in self.crc.items():
            if algo == "crc32":
                self.crc[algo] = zlib.crc32(data, value)
            else:
                self.crc[algo] = getattr(_crt, algo)(data, value)

    def values(self) -> dict[str, str]:
        out = {a: base64.b64encode(h.digest()).decode() for a, h in self.digests.items()}
        for algo, value in self.crc.items():
            width = 8 if algo == "crc64nvme" else 4
            out[algo] = base64.b64encode(value.to_bytes(width, "big")).decode()
        return out


# -- the server -----------------------------------------------------------------------------


class Emulator:
    """The emulator in the running event loop: ``await start()``, ``await stop()``."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_ms: float = 35.0,
        bandwidth: float = 0.0,
        request_bandwidth: float = 0.0,
        prefix_rate: float = 0.0,
        prefix_depth: int = 1,
        prefix_burst: float | None = None,
        limit_schedule: Iterable[tuple[float, float]] = (),
        storm: tuple[float, float] | None = None,
        split_after: float | None = None,
        store_bodies: bool = True,
        buckets: Iterable[str] = (),
        log_path: str | None = None,
        retry_after: float | None = None,
        min_part_size: int = 5 * MIB,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host, self._port = host, port
        self.store_bodies = store_bodies
        self.retry_after = retry_after
        self.min_part_size = min_part_size
        self.log: list[dict[str, Any]] = []
        self.buckets: dict[str, Bucket] = {name: Bucket(name) for name in buckets}
        self.uploads: dict[str, Upload] = {}
        self._clock = clock
        self._t0 = clock()
        self._log_path = log_path
        self._log_file: IO[str] | None = None
        self._runner: web.AppRunner | None = None
        self._counts: Counter[tuple[str, int]] = Counter()
        self._bytes = Counter[str]()
        self.request_bandwidth = 0.0
        self.configure(
            latency_ms=latency_ms,
            bandwidth=bandwidth,
            request_bandwidth=request_bandwidth,
            prefix_rate=prefix_rate,
            prefix_depth=prefix_depth,
            prefix_burst=prefix_burst,
            limit_schedule=limit_schedule,
            storm=storm,
            split_after=split_after,
        )

    # -- configuration and lifecycle --------------------------------------------------------

    def configure(
        self,
        *,
        latency_ms: float | None = None,
        bandwidth: float | None = None,
        request_bandwidth: float | None = None,
        prefix_rate: float | None = None,
        prefix_depth: int | None = None,
        prefix_burst: float | None = None,
        limit_schedule: Iterable[tuple[float, float]] | None = None,
        storm: tuple[float, float] | None = None,
        split_after: float | None = None,
    ) -> None:
        """Change throttles (None keeps a setting; ``prefix_burst`` None: one second's
        worth). The limiter restarts: full buckets, its clock (``t0``) at the next request.

        ``request_bandwidth`` caps each request's own body bytes/s (S3 serves one
        connection at ~100 MB/s whatever the bucket's total), on top of ``bandwidth``."""
        if request_bandwidth is not None:
            self.request_bandwidth = float(request_bandwidth)
        old = getattr(self, "_limiter", None)
        if latency_ms is not None:
            self.latency_ms = float(latency_ms)
        if bandwidth is not None:
            self.bandwidth = float(bandwidth)
            self._pacer = (
                TokenBucket(self.bandwidth, max(CHUNK, self.bandwidth / 20), self._clock)
                if self.bandwidth > 0
                else None
            )
        self._limiter = PrefixLimiter(
            rate=prefix_rate if prefix_rate is not None else old.rate if old else 0.0,
            depth=prefix_depth if prefix_depth is not None else old.depth if old else 1,
            burst=prefix_burst if prefix_burst is not None else None,
            clock=self._clock,
            schedule=(
                limit_schedule if limit_schedule is not None else old.schedule if old else ()
            ),
            storm=storm if storm is not None else old.storm if old else None,
            split_after=split_after
            if split_after is not None
            else (old.split_after if old else None),
        )

    def config(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms,
            "bandwidth": self.bandwidth,
            "request_bandwidth": self.request_bandwidth,
            "prefix_rate": self._limiter.rate,
            "prefix_depth": self._limiter.depth,
            "prefix_burst": self._limiter.burst,
            "limit_schedule": self._limiter.schedule,
            "storm": self._limiter.storm,
            "split_after": self._limiter.split_after,
            "store_bodies": self.store_bodies,
            "retry_after": self.retry_after,
            "min_part_size": self.min_part_size,
        }

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self._port, backlog=1024).start()
        self._port = int(self._runner.addresses[0][1])
        if self._log_path:
            self._log_file = open(self._log_path, "a", encoding="utf-8")  # noqa: SIM115

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def reset_log(self) -> None:
        self.log.clear()
        self._counts.clear()
        self._bytes.clear()

    def stats(self) -> dict[str, Any]:
        by_op: dict[str, dict[str, int]] = defaultdict(dict)
        by_status: Counter[str] = Counter()
        for (op, status), n in self._counts.items():
            by_op[op][str(status)] = n
            by_status[str(status)] += n
        return {
            "requests": sum(self._counts.values()),
            "by_op": dict(by_op),
            "by_status": dict(by_status),
            "slowdown": self._bytes["slowdown"],
            "bytes_in": self._bytes["in"],
            "bytes_out": self._bytes["out"],
            "objects": sum(len(b.objects) for b in self.buckets.values()),
            "object_bytes": sum(
                o.blob.size for b in self.buckets.values() for o in b.objects.values()
            ),
            "uploads_in_progress": len(self.uploads),
            "prefixes_seen": self._limiter.prefixes,
            "limiter": self._limiter_state(),
            "config": self.config(),
        }

    def _limiter_state(self) -> dict[str, Any]:
        state = self._limiter.describe()
        t0 = state.pop("t0")
        state["t0_wall"] = None if t0 is None else time.time() - (self._clock() - t0)
        return state

    def objects(self, bucket: str, prefix: str = "") -> dict[str, dict[str, Any]]:
        b = self.buckets.get(bucket)
        if b is None:
            return {}
        return {
            k: {"size": o.blob.size, "etag": o.etag, "parts": len(o.part_sizes)}
            for k, o in b.objects.items()
            if k.startswith(prefix)
        }

    # -- dispatch ---------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        raw_path = request.raw_path.split("?", 1)[0]
        if raw_path.startswith(CONTROL):
            return await self._control(request, raw_path[len(CONTROL) :])
        started, ts = self._clock(), time.time()
        bucket, _, key = urllib.parse.unquote(raw_path.lstrip("/")).partition("/")
        query = {k: v for k, v in request.query.items()}
        op = classify(request.method, bucket, key, query, request.headers)
        ctx = Ctx(request, op, bucket, key, query)
        if self.request_bandwidth > 0:
            rate = self.request_bandwidth
            ctx.pacer = TokenBucket(rate, max(CHUNK, rate / 20), self._clock)
        code = None
        try:
            if self.latency_ms > 0:
                await asyncio.sleep(self.latency_ms / 1000)
            resp = await self._serve(ctx)
        except S3Error as exc:
            code = exc.code
            resp = await self._error(ctx, exc)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            code = "ClientDisconnected"  # logged as 499, as nginx does; nobody reads it
            resp = web.Response(status=499, text=str(exc))
        except Exception as exc:  # a bug here must not look like an S3 answer
            code = "InternalError"
            resp = await self._error(ctx, S3Error(500, "InternalError", repr(exc)))
        self._record(ctx, resp.status, code, started, ts)
        return resp

    async def _serve(self, ctx: Ctx) -> web.StreamResponse:
        handler = getattr(self, "_op_" + ctx.op, None)
        if handler is None:
            raise S3Error(501, "NotImplemented", f"{ctx.op} is not implemented by the emulator")
        if ctx.bucket and ctx.op not in ("CreateBucket",) and ctx.bucket not in self.buckets:
            raise _no_bucket(ctx.bucket)
        if ctx.key:
            ctx.limited_s = self._clock()
        if ctx.key and not self._limiter.allow(ctx.bucket, ctx.key):
            raise S3Error(503, "SlowDown", "Please reduce your request rate.")
        resp: web.StreamResponse = await handler(ctx)
        return resp

    async def _error(self, ctx: Ctx, exc: S3Error) -> web.Response:
        # Drain an unread body (not charged to the bandwidth) so the connection stays usable.
        with contextlib.suppress(Exception):
            while await ctx.request.content.readany():
                pass
        headers = {"x-amz-request-id": uuid.uuid4().hex[:16].upper(), **exc.headers}
        if exc.code == "SlowDown" and self.retry_after:
            headers["Retry-After"] = f"{self.retry_after:g}"
        if ctx.request.method == "HEAD" or exc.status == 304:
            return web.Response(status=exc.status, headers=headers)
        resource = f"/{ctx.bucket}/{ctx.key}" if ctx.key else f"/{ctx.bucket}"
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<Error>'
            + _el("Code", exc.code)
            + _el("Message", exc.message)
            + _el("Resource", resource)
            + _el("RequestId", headers["x-amz-request-id"])
            + "</Error>"
        ).encode()
        return web.Response(
            status=exc.status, body=body, headers=headers, content_type="application/xml"
        )

    def _record(self, ctx: Ctx, status: int, code: str | None, started: float, ts: float) -> None:
        now = self._clock()
        entry = {
            "seq": len(self.log),
            "t": round(started - self._t0, 6),
            # When the limiter answered (after the latency): the moment a token counts.
            "t_limit": None if ctx.limited_s is None else round(ctx.limited_s - self._t0, 6),
            "ts": ts,
            "ts_end": ts + (now - started),
            "duration_ms": round((now - started) * 1000, 3),
            "method": ctx.request.method,
            "op": ctx.op,
            "range": ctx.request.headers.get("Range"),
            "bucket": ctx.bucket,
            "key": ctx.key,
            "prefix": prefix_of(ctx.key, self._limiter.depth) if ctx.key else None,
            "partition": self._limiter.partition_of(ctx.bucket, ctx.key) if ctx.key else None,
            "status": status,
            "code": code,
            "bytes_in": ctx.bytes_in,
            "bytes_out": ctx.bytes_out,
            "bytes": ctx.bytes_in + ctx.bytes_out,
            "latency_ms": self.latency_ms,
        }
        self.log.append(entry)
        self._counts[(ctx.op, status)] += 1
        self._bytes["in"] += ctx.bytes_in
        self._bytes["out"] += ctx.bytes_out
        if code == "SlowDown":
            self._bytes["slowdown"] += 1
        if self._log_file is not None:
            self._log_file.write(json.dumps(entry) + "\n")

    async def _control(self, request: web.Request, what: str) -> web.Response:
        if what == "log" and request.method == "GET":
            since = int(request.query.get("since", "0"))
            return web.json_response(self.log[since:])
        if what == "log" and request.method == "DELETE":
            self.reset_log()
            return web.json_response({"reset": True})
        if what == "stats":
            return web.json_response(self.stats())
        if what == "objects":
            bucket = request.query.get("bucket", "")
            return web.json_response(self.objects(bucket, request.query.get("prefix", "")))
        if what == "config" and request.method == "POST":
            allowed = (
                "latency_ms",
                "bandwidth",
                "request_bandwidth",
                "prefix_rate",
                "prefix_depth",
                "prefix_burst",
                "limit_schedule",
                "storm",
                "split_after",
            )
            changes = await request.json()
            self.configure(**{k: v for k, v in changes.items() if k in allowed})
            return web.json_response(self.config())
        if what == "config":
            return web.json_response(self.config())
        return web.json_response({"error": f"unknown control path {what!r}"}, status=404)

    # -- bodies -----------------------------------------------------------------------------

    async def _pace(self, n: int, ctx: Ctx | None = None) -> None:
        delay = 0.0
        if ctx is not None and ctx.pacer is not None and n > 0:
            delay = ctx.pacer.reserve(n)
        if self._pacer is not None and n > 0:
            delay = max(delay, self._pacer.reserve(n))
        if delay > 0:
            await asyncio.sleep(delay)

    async def _body_chunks(self, ctx: Ctx, trailers: dict[str, str]) -> AsyncIterator[bytes]:
        h, stream = ctx.request.headers, ctx.request.content
        chunked = "aws-chunked" in h.get("Content-Encoding", "") or h.get(
            "x-amz-content-sha256", ""
        ).startswith("STREAMING-")
        if not chunked:
            while data := await stream.read(CHUNK):
                await self._pace(len(data), ctx)
                yield data
            return
        while True:  # <hex size>[;chunk-signature=...]\r\n<data>\r\n ... 0\r\n<trailers>\r\n
            line = await stream.readline()
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError as exc:
                raise S3Error(400, "IncompleteBody", "malformed aws-chunked encoding") from exc
            if size == 0:
                break
            data = await stream.readexactly(size)
            await self._pace(size, ctx)
            yield data
            await stream.readexactly(2)
        while (line := await stream.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            trailers[name.strip().lower()] = value.strip()

    async def _read_body(self, ctx: Ctx) -> Blob:
        h = ctx.request.headers
        declared = {_algo(k): v for k, v in h.items() if _is_checksum(k)}
        wanted = [*declared, h.get("x-amz-sdk-checksum-algorithm", "").lower()]
        wanted += [_algo(t) for t in h.get("x-amz-trailer", "").split(",")]
        hashers = _Hashers(a for a in wanted if a in _Hashers.ALGOS)
        trailers: dict[str, str] = {}
        pieces: list[bytes] = []
        size = 0
        async for data in self._body_chunks(ctx, trailers):
            size += len(data)
            hashers.update(data)
            if self.store_bodies:
                pieces.append(data)
        ctx.bytes_in = size
        expected_len = h.get("x-amz-decoded-content-length")
        if expected_len is not None and int(expected_len) != size:
            raise S3Error(400, "IncompleteBody", "body shorter than x-amz-decoded-content-length")
        md5 = hashers.md5.digest()
        if "Content-MD5" in h:
            try:
                sent = base64.b64decode(h["Content-MD5"], validate=True)
            except ValueError as exc:
                raise S3Error(400, "InvalidDigest", "The Content-MD5 is not valid.") from exc
            if sent != md5:
                raise S3Error(400, "BadDigest", "The Content-MD5 you specified did not match.")
        computed = hashers.values()
        declared.update({_algo(k): v for k, v in trailers.items() if _is_checksum(k)})
        checks = {a: v for a, v in declared.items() if a in computed}
        for algo, value in checks.items():
            if computed[algo] != value:
                raise S3Error(
                    400,
                    "BadDigest",
                    f"The {algo.upper()} you specified did not match the calculated checksum.",
                )
        return Blob(size, md5, b"".join(pieces) if self.store_bodies else None, checksums=checks)

    # -- buckets ----------------------------------------------------------------------------

    async def _op_ListBuckets(self, ctx: Ctx) -> web.Response:
        items = "".join(
            "<Bucket>" + _el("Name", b.name) + _el("CreationDate", _iso(b.created)) + "</Bucket>"
            for b in sorted(self.buckets.values(), key=lambda b: b.name)
        )
        owner = "<Owner><ID>emulator</ID><DisplayName>emulator</DisplayName></Owner>"
        return _xml_response(_xml("ListAllMyBucketsResult", f"{owner}<Buckets>{items}</Buckets>"))

    async def _op_HeadBucket(self, ctx: Ctx) -> web.Response:
        return web.Response(headers={"x-amz-bucket-region": REGION})

    async def _op_GetBucketLocation(self, ctx: Ctx) -> web.Response:
        return _xml_response(_xml("LocationConstraint", ""))

    async def _op_CreateBucket(self, ctx: Ctx) -> web.Response:
        await ctx.request.read()
        name = ctx.bucket
        if name in self.buckets:
            raise S3Error(409, "BucketAlreadyOwnedByYou", "You already own this bucket.")
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", name):
            raise S3Error(400, "InvalidBucketName", "The specified bucket is not valid.")
        self.buckets[name] = Bucket(name)
        return web.Response(headers={"Location": f"/{name}"})

    async def _op_DeleteBucket(self, ctx: Ctx) -> web.Response:
        b = self.buckets[ctx.bucket]
        if b.objects or any(u.bucket == b.name for u in self.uploads.values()):
            raise S3Error(409, "BucketNotEmpty", "The bucket you tried to delete is not empty.")
        del self.buckets[ctx.bucket]
        return web.Response(status=204)

    # -- objects ----------------------------------------------------------------------------

    def _get(self, ctx: Ctx) -> StoredObject:
        obj = self.buckets[ctx.bucket].objects.get(ctx.key)
        if obj is None:
            raise S3Error(404, "NoSuchKey", "The specified key does not exist.")
        return obj

    async def _op_PutObject(self, ctx: Ctx) -> web.Response:
        meta = _meta_from(ctx.request)
        blob = await self._read_body(ctx)
        self.buckets[ctx.bucket].put(ctx.key, StoredObject(blob, blob.md5_hex, meta))
        headers = {"ETag": _quote(blob.md5_hex)}
        headers.update({f"x-amz-checksum-{a}": v for a, v in blob.checksums.items()})
        return web.Response(headers=headers)

    async def _op_CopyObject(self, ctx: Ctx) -> web.Response:
        source = urllib.parse.unquote(ctx.request.headers["x-amz-copy-source"].split("?")[0])
        src_bucket, _, src_key = source.lstrip("/").partition("/")
        if src_bucket not in self.buckets:
            raise _no_bucket(src_bucket)
        src = self.buckets[src_bucket].objects.get(src_key)
        if src is None:
            raise S3Error(404, "NoSuchKey", "The specified key does not exist.")
        replace = ctx.request.headers.get("x-amz-metadata-directive", "COPY") == "REPLACE"
        meta = _meta_from(ctx.request) if replace else src.meta
        old = src.blob
        # A copy is a single-part object: MD5 of the body when we have it, else keep the ETag.
        etag = hashlib.md5(old.body).hexdigest() if old.body is not None else src.etag
        blob = Blob(old.size, old.md5, old.body, checksums=dict(old.checksums))
        self.buckets[ctx.bucket].put(ctx.key, StoredObject(blob, etag, meta))
        body = _el("LastModified", _iso(blob.modified)) + _el("ETag", _quote(etag))
        return _xml_response(_xml("CopyObjectResult", body))

    async def _op_HeadObject(self, ctx: Ctx) -> web.StreamResponse:
        return await self._op_GetObject(ctx)

    async def _op_GetObject(self, ctx: Ctx) -> web.StreamResponse:
        obj = self._get(ctx)
        req = ctx.request
        _check_conditions(req.headers, obj)
        size, start, end, status = obj.blob.size, 0, obj.blob.size - 1, 200
        headers = _object_headers(obj)
        if "partNumber" in ctx.query:
            start, end = _part_range(obj, ctx.query["partNumber"])
            status = 206 if obj.part_sizes else 200
            if obj.part_sizes:
                headers["x-amz-mp-parts-count"] = str(len(obj.part_sizes))
        elif (rng := _parse_range(req.headers.get("Range"), size)) is not None:
            start, end, status = *rng, 206
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = max(0, end - start + 1)
        headers["Content-Length"] = str(length)
        if req.method == "HEAD":
            return web.Response(status=status, headers=headers)
        resp = web.StreamResponse(status=status, headers=headers)
        await resp.prepare(req)
        body = obj.blob.body
        zeros = bytes(min(CHUNK, length)) if body is None else b""
        pos = start
        while pos <= end:
            n = min(CHUNK, end + 1 - pos)
            await self._pace(n, ctx)
            await resp.write(body[pos : pos + n] if body is not None else zeros[:n])
            ctx.bytes_out += n
            pos += n
        await resp.write_eof()
        return resp

    async def _op_DeleteObject(self, ctx: Ctx) -> web.Response:
        self.buckets[ctx.bucket].delete(ctx.key)
        return web.Response(status=204)

    async def _op_DeleteObjects(self, ctx: Ctx) -> web.Response:
        raw = await ctx.request.read()
        ctx.bytes_in = len(raw)
        root = _xml_children(raw)
        quiet = (root.findtext("Quiet") or "").lower() == "true"
        b = self.buckets[ctx.bucket]
        out = []
        for item in root.findall("Object"):
            key = item.findtext("Key") or ""
            b.delete(key)
            if not quiet:
                out.append("<Deleted>" + _el("Key", key) + "</Deleted>")
        return _xml_response(_xml("DeleteResult", "".join(out)))

    # -- listing ----------------------------------------------------------------------------

    def _list(
        self, b: Bucket, prefix: str, delimiter: str, marker: str, max_keys: int
    ) -> tuple[list[tuple[str, StoredObject | None]], bool]:
        keys = b.keys
        i = bisect.bisect_left(keys, prefix)
        skip = None
        if marker:
            i = max(i, bisect.bisect_right(keys, marker))
            rest = marker[len(prefix) :] if marker.startswith(prefix) else ""
            if delimiter and (j := rest.find(delimiter)) >= 0:
                skip = prefix + rest[: j + len(delimiter)]
        out: list[tuple[str, StoredObject | None]] = []
        while i < len(keys) and keys[i].startswith(prefix):
            key = keys[i]
            i += 1
            if skip is not None and key.startswith(skip):
                continue
            name, obj = key, b.objects.get(key)
            if delimiter and (j := key.find(delimiter, len(prefix))) >= 0:
                name, obj = key[: j + len(delimiter)], None
                skip = name
            if len(out) >= max_keys:
                return out, True
            out.append((name, obj))
        return out, False

    async def _op_ListObjectsV2(self, ctx: Ctx) -> web.Response:
        return self._listing(ctx, v2=True)

    async def _op_ListObjects(self, ctx: Ctx) -> web.Response:
        return self._listing(ctx, v2=False)

    def _listing(self, ctx: Ctx, *, v2: bool) -> web.Response:
        q = ctx.query
        prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
        max_keys = _int_param(q, "max-keys", 1000, 0, 1000)
        token = q.get("continuation-token")
        if v2 and token is not None:
            try:
                marker = base64.urlsafe_b64decode(token.encode()).decode()
            except ValueError as exc:
                raise S3Error(400, "InvalidArgument", "The continuation token is invalid") from exc
        else:
            marker = q.get("start-after", "") if v2 else q.get("marker", "")
        entries, truncated = self._list(
            self.buckets[ctx.bucket], prefix, delimiter, marker, max_keys
        )
        enc = (lambda s: urllib.parse.quote(s, safe="/")) if "encoding-type" in q else str
        parts = [_el("Name", ctx.bucket), _el("Prefix", enc(prefix))]
        if v2:
            parts.append(_el("KeyCount", len(entries)))
            if token is not None:
                parts.append(_el("ContinuationToken", token))
            if "start-after" in q:
                parts.append(_el("StartAfter", enc(q["start-after"])))
            if truncated:
                nxt = base64.urlsafe_b64encode(entries[-1][0].encode()).decode()
                parts.append(_el("NextContinuationToken", nxt))
        else:
            parts.append(_el("Marker", enc(marker)))
            if truncated:
                parts.append(_el("NextMarker", enc(entries[-1][0])))
        parts += [_el("MaxKeys", max_keys), _el("IsTruncated", truncated)]
        if delimiter:
            parts.append(_el("Delimiter", enc(delimiter)))
        if "encoding-type" in q:
            parts.append(_el("EncodingType", "url"))
        for name, obj in entries:
            if obj is None:
                parts.append("<CommonPrefixes>" + _el("Prefix", enc(name)) + "</CommonPrefixes>")
            else:
                parts.append(
                    "<Contents>"
                    + _el("Key", enc(name))
                    + _el("LastModified", _iso(obj.blob.modified))
                    + _el("ETag", _quote(obj.etag))
                    + _el("Size", obj.blob.size)
                    + _el("StorageClass", "STANDARD")
                    + "</Contents>"
                )
        return _xml_response(_xml("ListBucketResult", "".join(parts)))

    # -- multipart --------------------------------------------------------------------------

    def _upload(self, ctx: Ctx) -> Upload:
        upload = self.uploads.get(ctx.query.get("uploadId", ""))
        if upload is None or (upload.bucket, upload.key) != (ctx.bucket, ctx.key):
            raise S3Error(404, "NoSuchUpload", "The specified upload does not exist.")
        return upload

    async def _op_CreateMultipartUpload(self, ctx: Ctx) -> web.Response:
        upload_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.uploads[upload_id] = Upload(upload_id, ctx.bucket, ctx.key, _meta_from(ctx.request))
        body = _el("Bucket", ctx.bucket) + _el("Key", ctx.key) + _el("UploadId", upload_id)
        return _xml_response(_xml("InitiateMultipartUploadResult", body))

    async def _op_UploadPart(self, ctx: Ctx) -> web.Response:
        upload = self._upload(ctx)
        number = _int_param(ctx.query, "partNumber", 0, 1, 10000)
        blob = await self._read_body(ctx)
        upload.parts[number] = blob
        headers = {"ETag": _quote(blob.md5_hex)}
        headers.update({f"x-amz-checksum-{a}": v for a, v in blob.checksums.items()})
        return web.Response(headers=headers)

    async def _op_CompleteMultipartUpload(self, ctx: Ctx) -> web.Response:
        upload = self._upload(ctx)
        raw = await ctx.request.read()
        ctx.bytes_in = len(raw)
        listed = []
        for el in _xml_children(raw).findall("Part"):
            try:
                listed.append((int(el.findtext("PartNumber") or ""), el.findtext("ETag") or ""))
            except ValueError as exc:
                raise S3Error(400, "MalformedXML", "bad PartNumber") from exc
        if not listed:
            raise S3Error(400, "MalformedXML", "The XML you provided was not well-formed")
        numbers = [n for n, _ in listed]
        if numbers != sorted(set(numbers)):
            raise S3Error(400, "InvalidPartOrder", "The list of parts was not in ascending order.")
        blobs = []
        for number, etag in listed:
            blob = upload.parts.get(number)
            if blob is None or etag.strip('"') != blob.md5_hex:
                raise S3Error(
                    400, "InvalidPart", f"Part {number} was not found or its ETag differs."
                )
            blobs.append(blob)
        if any(b.size < self.min_part_size for b in blobs[:-1]):
            raise S3Error(400, "EntityTooSmall", "Your proposed upload is smaller than allowed.")
        etag = hashlib.md5(b"".join(b.md5 for b in blobs)).hexdigest() + f"-{len(blobs)}"
        body = b"".join(b.body or b"" for b in blobs) if self.store_bodies else None
        whole = hashlib.md5(body).digest() if body is not None else b""
        blob = Blob(sum(b.size for b in blobs), whole, body)
        obj = StoredObject(blob, etag, upload.meta, [b.size for b in blobs])
        self.buckets[ctx.bucket].put(ctx.key, obj)
        del self.uploads[upload.upload_id]
        result = (
            _el("Location", f"/{ctx.bucket}/{ctx.key}")
            + _el("Bucket", ctx.bucket)
            + _el("Key", ctx.key)
            + _el("ETag", _quote(etag))
        )
        return _xml_response(_xml("CompleteMultipartUploadResult", result))

    async def _op_AbortMultipartUpload(self, ctx: Ctx) -> web.Response:
        del self.uploads[self._upload(ctx).upload_id]
        return web.Response(status=204)

    async def _op_ListParts(self, ctx: Ctx) -> web.Response:
        upload = self._upload(ctx)
        marker = _int_param(ctx.query, "part-number-marker", 0, 0, 10000)
        limit = _int_param(ctx.query, "max-parts", 1000, 0, 1000)
        numbers = [n for n in sorted(upload.parts) if n > marker]
        page, truncated = numbers[:limit], len(numbers) > limit
        body = [_el("Bucket", ctx.bucket), _el("Key", ctx.key), _el("UploadId", upload.upload_id)]
        body += [_el("PartNumberMarker", marker), _el("MaxParts", limit)]
        body += [_el("IsTruncated", truncated)]
        if page:
            body.append(_el("NextPartNumberMarker", page[-1]))
        for n in page:
            p = upload.parts[n]
            body.append(
                "<Part>"
                + _el("PartNumber", n)
                + _el("LastModified", _iso(p.modified))
                + _el("ETag", _quote(p.md5_hex))
                + _el("Size", p.size)
                + "</Part>"
            )
        return _xml_response(_xml("ListPartsResult", "".join(body)))

    async def _op_ListMultipartUploads(self, ctx: Ctx) -> web.Response:
        q = ctx.query
        prefix, key_marker = q.get("prefix", ""), q.get("key-marker", "")
        id_marker = q.get("upload-id-marker", "")
        limit = _int_param(q, "max-uploads", 1000, 0, 1000)
        ups = sorted(
            (u for u in self.uploads.values() if u.bucket == ctx.bucket),
            key=lambda u: (u.key, u.initiated, u.upload_id),
        )
        after = [i for i, u in enumerate(ups) if (u.key, u.upload_id) == (key_marker, id_marker)]
        if after:  # the page after that upload (same key: in the order they were initiated)
            ups = ups[after[0] + 1 :]
        elif key_marker:
            ups = [u for u in ups if u.key > key_marker]
        ups = [u for u in ups if u.key.startswith(prefix)]
        page, truncated = ups[:limit], len(ups) > limit
        enc = (lambda s: urllib.parse.quote(s, safe="/")) if "encoding-type" in q else str
        body = [_el("Bucket", ctx.bucket), _el("KeyMarker", enc(key_marker))]
        body += [_el("UploadIdMarker", id_marker), _el("Prefix", enc(prefix))]
        if truncated:
            body += [_el("NextKeyMarker", enc(page[-1].key))]
            body += [_el("NextUploadIdMarker", page[-1].upload_id)]
        body += [_el("MaxUploads", limit), _el("IsTruncated", truncated)]
        if "encoding-type" in q:
            body.append(_el("EncodingType", "url"))
        owner = "<ID>emulator</ID><DisplayName>emulator</DisplayName>"
        for u in page:
            body.append(
                "<Upload>"
                + _el("Key", enc(u.key))
                + _el("UploadId", u.upload_id)
                + f"<Initiator>{owner}</Initiator><Owner>{owner}</Owner>"
                + _el("StorageClass", "STANDARD")
                + _el("Initiated", _iso(u.initiated))
                + "</Upload>"
            )
        return _xml_response(_xml("ListMultipartUploadsResult", "".join(body)))


# -- helpers for object requests ------------------------------------------------------------


def _is_checksum(name: str) -> bool:
    name = name.lower()
    return name.startswith("x-amz-checksum-") and name not in (
        "x-amz-checksum-type",
        "x-amz-checksum-algorithm",
        "x-amz-checksum-mode",
    )


def _algo(header: str) -> str:
    return header.strip().lower().removeprefix("x-amz-checksum-")


def _xml_response(body: bytes, status: int = 200) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/xml")


def _int_param(q: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
    if name not in q:
        return default
    try:
        value = int(q[name])
    except ValueError:
        value = lo - 1
    if value < lo:
        raise S3Error(400, "InvalidArgument", f"{name} must be an integer >= {lo}")
    return min(value, hi)


def _meta_from(request: web.Request) -> Meta:
    h = request.headers
    headers = {n: h[n] for n in SYSTEM_HEADERS if n in h}
    if "content-encoding" in headers:  # aws-chunked is transport, not the object's encoding
        codings = [c.strip() for c in headers["content-encoding"].split(",")]
        kept = [c for c in codings if c and c != "aws-chunked"]
        if kept:
            headers["content-encoding"] = ", ".join(kept)
        else:
            del headers["content-encoding"]
    user = {k[len("x-amz-meta-") :].lower(): v for k, v in h.items() if _is_meta(k)}
    return Meta(h.get("Content-Type", "binary/octet-stream"), user, headers)


def _is_meta(name: str) -> bool:
    return name.lower().startswith("x-amz-meta-")


def _object_headers(obj: StoredObject) -> dict[str, str]:
    headers = {
        "ETag": _quote(obj.etag),
        "Last-Modified": _http_date(obj.blob.modified),
        "Content-Type": obj.meta.content_type,
        "Accept-Ranges": "bytes",
        **obj.meta.headers,
    }
    headers.update({f"x-amz-meta-{k}": v for k, v in obj.meta.user.items()})
    if obj.blob.body is None:
        headers["x-emulator-body"] = "discarded"
    return headers


def _parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    m = _RANGE.fullmatch(value.strip()) if value else None
    if m is None or m.group(1) == m.group(2) == "":
        return None
    first, last = m.group(1), m.group(2)
    if first == "":
        start, end = max(0, size - int(last)), size - 1
        if int(last) == 0:
            raise S3Error(416, "InvalidRange", "The requested range is not satisfiable")
    else:
        start = int(first)
        end = min(size - 1, int(last)) if last else size - 1
        if last and int(last) < start:
            return None
    if start >= size:
        raise S3Error(
            416,
            "InvalidRange",
            "The requested range is not satisfiable",
            **{"Content-Range": f"bytes */{size}"},
        )
    return start, end


def _part_range(obj: StoredObject, value: str) -> tuple[int, int]:
    try:
        number = int(value)
    except ValueError:
        number = 0
    sizes = obj.part_sizes or [obj.blob.size]
    if not 1 <= number <= len(sizes):
        raise S3Error(416, "InvalidPartNumber", "The requested partnumber is not satisfiable")
    start = sum(sizes[: number - 1])
    return start, start + sizes[number - 1] - 1


def _check_conditions(h: Any, obj: StoredObject) -> None:
    etag, modified = obj.etag, int(obj.blob.modified)

    def matches(value: str) -> bool:
        return any(t.strip().strip('"') in ("*", etag) for t in value.split(","))

    def when(name: str) -> float | None:
        with contextlib.suppress(TypeError, ValueError):
            return email.utils.parsedate_to_datetime(h[name]).timestamp()
        return None

    if "If-Match" in h:
        if not matches(h["If-Match"]):
            raise S3Error(412, "PreconditionFailed", "At least one precondition failed")
    elif "If-Unmodified-Since" in h and (t := when("If-Unmodified-Since")) and modified > t:
        raise S3Error(412, "PreconditionFailed", "At least one precondition failed")
    if "If-None-Match" in h:
        if matches(h["If-None-Match"]):
            raise S3Error(304, "NotModified", "Not Modified", ETag=_quote(etag))
    elif "If-Modified-Since" in h and (t := when("If-Modified-Since")) and modified <= t:
        raise S3Error(304, "NotModified", "Not Modified", ETag=_quote(etag))


# -- running it -----------------------------------------------------------------------------


class EmulatorThread:
    """An ``Emulator`` on its own event loop in a daemon thread (for synchronous code)."""

    def __init__(self, **opts: Any) -> None:
        self._opts = opts
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._emulator: Emulator | None = None

    def start(self) -> EmulatorThread:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                self._emulator = Emulator(**self._opts)
                loop.run_until_complete(self._emulator.start())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._emulator.stop())
            loop.close()

        self._thread = threading.Thread(target=run, name="s3-emulator", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop = self._thread = None

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the emulator's loop (thread-safe access to its state)."""
        assert self._loop is not None

        async def wrapper() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(timeout=10)

    @property
    def emulator(self) -> Emulator:
        assert self._emulator is not None, "not started"
        return self._emulator

    @property
    def port(self) -> int:
        return self.emulator.port

    @property
    def url(self) -> str:
        return self.emulator.url

    @property
    def log(self) -> list[dict[str, Any]]:
        return list(self.call(lambda: list(self.emulator.log)))

    def stats(self) -> dict[str, Any]:
        return dict(self.call(self.emulator.stats))

    def reset_log(self) -> None:
        self.call(self.emulator.reset_log)

    def __enter__(self) -> EmulatorThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_SIZE = re.compile(r"(?i)\s*([\d.]+)\s*([kmgt]?)(i?)b?(?:/s)?\s*")


def parse_size(text: str) -> float:
    """``10MB`` = 10e6, ``8MiB`` = 8*2**20, ``1.5g``, or a plain number."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    power = " kmgt".index(m.group(2).lower() or " ")
    scale: int = (1024 if m.group(3) else 1000) ** power
    return float(m.group(1)) * scale


def _pairs(text: str) -> list[tuple[float, float]]:
    """``20:2,40:0.5`` -> [(20.0, 2.0), (40.0, 0.5)]."""
    try:
        return [_span(item) for item in text.split(",") if item]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not T:FACTOR pairs: {text!r}") from exc


def _span(text: str) -> tuple[float, float]:
    """``5:20`` -> (5.0, 20.0)."""
    first, _, second = text.partition(":")
    return float(first), float(second)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = a free port (printed)")
    p.add_argument("--latency-ms", type=float, default=35.0, help="added to every request")
    p.add_argument("--bandwidth", type=parse_size, default=0.0, help="bytes/s, 0 = unlimited")
    p.add_argument(
        "--request-bandwidth",
        type=parse_size,
        default=0.0,
        help="bytes/s of each request's body (one connection), 0 = unlimited",
    )
    p.add_argument("--prefix-rate", type=float, default=0.0, help="req/s per prefix, 0 = off")
    p.add_argument(
        "--prefix-depth", type=int, default=1, help="key segments of a partition (1: ckpt/)"
    )
    p.add_argument("--prefix-burst", type=float, default=None, help="default: 1 s worth")
    p.add_argument(
        "--limit-schedule",
        type=_pairs,
        default=(),
        help="T:FACTOR,...: the limit times FACTOR from T s after the first request on",
    )
    p.add_argument(
        "--storm", type=_span, default=None, help="START:END s after the first request: all 503"
    )
    p.add_argument(
        "--split-after", type=float, default=None, help="s of sustained load before a split"
    )
    p.add_argument("--retry-after", type=float, default=None, help="Retry-After on SlowDown")
    p.add_argument("--min-part-size", type=parse_size, default=5 * MIB)
    p.add_argument("--store-bodies", dest="store_bodies", action="store_true", default=True)
    p.add_argument(
        "--discard-bodies",
        dest="store_bodies",
        action="store_false",
        help="keep size+MD5 only; GET returns zeros of the right length",
    )
    p.add_argument("--buckets", default="", help="comma-separated buckets to create")
    p.add_argument("--log", default=None, help="also append the request log here (JSON lines)")
    args = p.parse_args(argv)

    async def serve() -> None:
        emu = Emulator(
            host=args.host,
            port=args.port,
            latency_ms=args.latency_ms,
            bandwidth=args.bandwidth,
            request_bandwidth=args.request_bandwidth,
            prefix_rate=args.prefix_rate,
            prefix_depth=args.prefix_depth,
            prefix_burst=args.prefix_burst,
            limit_schedule=args.limit_schedule,
            storm=args.storm,
            split_after=args.split_after,
            store_bodies=args.store_bodies,
            buckets=[b for b in args.buckets.split(",") if b],
            log_path=args.log,
            retry_after=args.retry_after,
            min_part_size=int(args.min_part_size),
        )
        await emu.start()
        print(f"S3 emulator listening on {emu.url} {json.dumps(emu.config())}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await emu.stop()

    try:
        import uvloop

        uvloop.run(serve())
    except ImportError:  # pragma: no cover
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
