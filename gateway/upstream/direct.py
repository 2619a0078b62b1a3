"""PutObject of a small body, signed and sent without botocore's request pipeline.

A checkpoint drains as thousands of small objects a second at S3's scale, and botocore
spends ~0.55 ms of CPU on each PutObject before and after the wire (parameter validation,
endpoint rules, event hooks, the CRT signer's marshalling, response parsing): most of what
the flusher costs per small object. This sends the same request (the same URL, headers and
``UNSIGNED-PAYLOAD`` SigV4 signature that botocore would send; the tests compare them with
botocore's signer) with aiohttp, for ~0.1 ms.

It takes only the answers whose meaning is plain: 200 (the ETag), a failed condition
(412, 409), a throttle or a server error (429, 5xx), and a connection that failed; the
caller classifies them exactly as botocore's. Anything else (a redirect to the bucket's
region, a refused signature, a malformed request, an S3 Express bucket) raises
``DirectRefused``: the caller sends the request again through botocore, which knows every
case, and stops sending that bucket's objects here. Where a bucket's keys go (endpoint,
addressing style, signing region) is learnt from the first PutObject botocore sends to the
bucket (``learn``, from its ``before-sign`` event): until then the bucket's objects go
through botocore, and a bucket botocore does not sign with plain SigV4 for ``s3`` (S3
Express, SigV4a) never comes here.
"""

from __future__ import annotations

import logging
import ssl
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, BinaryIO, Protocol
from urllib.parse import quote, urlsplit

import aiohttp
import xmltodict
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload
from botocore.exceptions import ClientError
from yarl import URL

from gateway.metrics import UPSTREAM_REQUESTS
from gateway.sigv4 import (
    ALGORITHM,
    UNSIGNED_PAYLOAD,
    canonical_headers,
    hmac_hex,
    scope,
    signing_key,
    string_to_sign,
)

log = logging.getLogger(__name__)
_SIGNATURES = frozenset({"s3v4", "v4"})  # botocore's names of what sign_put computes
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Answers the caller classifies from the status and code alone, as botocore's ClientError.
_PLAIN_FAILURES = frozenset({409, 412, 429})


class Credentials(Protocol):
    access_key: str
    secret_key: str
    token: str | None


class DirectRefused(Exception):
    """The bucket answered something only botocore handles (or cannot be reached this
    way): send the request through botocore."""


@dataclass(frozen=True, slots=True)
class _Target:
    """Where one bucket's keys go: ``origin + path_prefix + quoted key``."""

    origin: str  # scheme://netloc
    host: str  # the Host header botocore signs
    path_prefix: str  # "/bucket/" (path style) or "/" (virtual host)
    region: str
    proxy: str | None = None  # from HTTP(S)_PROXY / NO_PROXY, as botocore reads them


class DirectPut:
    """Small PutObjects over a pool of ``max_connections``; ``close()`` at shutdown.

    ``credentials()`` gives the frozen credentials of the client's chain (refreshed by it);
    ``ca_bundle`` is the CA file botocore verifies https with (``AWS_CA_BUNDLE``, the
    config's ``ca_bundle``, else certifi's or botocore's own)."""

    def __init__(
        self,
        credentials: Callable[[], Awaitable[Credentials]],
        *,
        user_agent: str,
        max_connections: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        ca_bundle: str | None,
    ) -> None:
        self._credentials = credentials
        self._user_agent = user_agent
        self._targets: dict[str, _Target] = {}
        self.refused: set[str] = set()  # buckets whose requests go through botocore
        tls = ssl.create_default_context(cafile=ca_bundle)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, ssl=tls),
            timeout=aiohttp.ClientTimeout(sock_connect=connect_timeout_s, sock_read=read_timeout_s),
            # Proxies are looked up once per bucket (_Target.proxy): aiohttp's trust_env
            # scans the environment in a thread for every request (0.2 ms of CPU).
            skip_auto_headers=("Content-Type",),
        )

    async def close(self) -> None:
        await self._session.close()

    def takes(self, bucket: str) -> bool:
        """Whether ``bucket``'s small objects may come here: its URL learnt, never refused."""
        return bucket in self._targets and bucket not in self.refused

    def learn(self, bucket: str, key: str, url: str, region: str, signature: str) -> None:
        """botocore is about to sign a PutObject of ``key`` to ``url`` with ``signature``
        (its signature version) for ``region``: where the bucket's keys go, unless it is
        not signed as this module signs."""
        if bucket in self.refused:
            return
        try:
            if signature not in _SIGNATURES:
                raise ValueError(f"signed with {signature}")
            self._targets[bucket] = target_of(url, key, region)
        except ValueError as exc:
            log.info("bucket %s: small PutObjects stay with botocore (%s)", bucket, exc)
            self.refused.add(bucket)

    async def put_object(
        self, bucket: str, key: str, body: BinaryIO, size_bytes: int, headers: Mapping[str, str]
    ) -> str:
        """PUT the ``size_bytes`` of ``body`` (a seekable file, read from its start when the
        request is sent) with ``headers`` (lower-case names: content-md5, content-type,
        metadata, checksums, conditions); the ETag the bucket returned. Raises botocore's
        ``ClientError`` for the plain failures, aiohttp's errors for a failed connection,
        and ``DirectRefused`` for the rest."""
        target = self._targets[bucket]
        creds = await self._credentials()
        amz_date = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        path, signed = sign_put(target, key, size_bytes, headers, creds, amz_date)
        signed["user-agent"] = self._user_agent  # not signed, as botocore leaves it out
        try:
            async with self._session.put(
                URL(target.origin + path, encoded=True),
                data=_SentBody(body, size_bytes),
                headers=signed,
                proxy=target.proxy,
            ) as resp:
                payload = await resp.read()
        except Exception:
            UPSTREAM_REQUESTS.labels("PutObject", "error").inc()
            raise
        UPSTREAM_REQUESTS.labels("PutObject", str(resp.status)).inc()
        if resp.status == 200:
            return str(resp.headers.get("ETag", "")).strip('"')
        if resp.status in _PLAIN_FAILURES or resp.status >= 500:
            raise ClientError(_error_response(resp.status, resp.headers, payload), "PutObject")
        raise DirectRefused(f"HTTP {resp.status} {_error_code(payload)}".strip())


class _SentBody(Payload):
    """A small body read from its file only as the request is sent, once the connection
    is up (what is read of a flusher's body counts as progress: a refused connection must
    not look like bytes moving), and from the start each time (aiohttp sends a request
    again over a fresh connection when a kept-alive one turns out closed)."""

    def __init__(self, body: BinaryIO, size_bytes: int) -> None:
        super().__init__(body, content_type=None)
        self._size = size_bytes

    async def write(self, writer: AbstractStreamWriter) -> None:
        self._value.seek(0)
        await writer.write(self._value.read(self._size))

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        raise TypeError("a request body, sent as bytes")


def sign_put(
    target: _Target,
    key: str,
    size_bytes: int,
    headers: Mapping[str, str],
    creds: Credentials,
    amz_date: str,
) -> tuple[str, dict[str, str]]:
    """The path of ``key`` and the headers of its PutObject signed at ``amz_date``
    (``yyyymmddThhmmssZ``): every header sent is signed, the body is not
    (``UNSIGNED-PAYLOAD``, as the client sends it: see ``client.py``)."""
    path = target.path_prefix + quote(key, safe="/~")
    signed = {
        **{name.lower(): value for name, value in headers.items()},
        "host": target.host,
        "content-length": str(size_bytes),
        "x-amz-content-sha256": UNSIGNED_PAYLOAD,
        "x-amz-date": amz_date,
    }
    if creds.token:
        signed["x-amz-security-token"] = creds.token
    names = sorted(signed)
    request_scope = scope(amz_date[:8], target.region, "s3")
    canonical_request = "\n".join(
        (
            "PUT",
            path,
            "",
            canonical_headers({n: (signed[n],) for n in names}, names),
            ";".join(names),
            UNSIGNED_PAYLOAD,
        )
    )
    signing = signing_key(creds.secret_key, amz_date[:8], target.region, "s3")
    signature = hmac_hex(signing, string_to_sign(amz_date, request_scope, canonical_request))
    signed["authorization"] = (
        f"{ALGORITHM} Credential={creds.access_key}/{request_scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return path, signed


def target_of(url: str, key: str, region: str) -> _Target:
    """Where a PutObject URL of ``key`` says the bucket's keys go. Raises ValueError for
    a URL that does not end in the key or carries a query."""
    parts = urlsplit(url)
    encoded_key = quote(key, safe="/~")
    if parts.query or not parts.path.endswith("/" + encoded_key):
        raise ValueError(f"not a plain object URL: {url}")
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return _Target(
        origin=f"{parts.scheme}://{parts.netloc}",
        host=host,
        path_prefix=parts.path[: len(parts.path) - len(encoded_key)],
        region=region,
        proxy=_env_proxy(parts.scheme, parts.hostname or ""),
    )


def _env_proxy(scheme: str, hostname: str) -> str | None:
    """The proxy the environment names for ``scheme`` unless NO_PROXY exempts the host."""
    proxy = urllib.request.getproxies_environment().get(scheme)
    if not proxy or urllib.request.proxy_bypass(hostname):
        return None
    return proxy


def _error_response(status: int, headers: Mapping[str, str], payload: bytes) -> dict[str, Any]:
    """What botocore's parser makes of an S3 error answer: code, message, status, headers."""
    error = _error_fields(payload)
    return {
        "Error": {
            "Code": str(error.get("Code") or status),
            "Message": str(error.get("Message") or ""),
        },
        "ResponseMetadata": {
            "HTTPStatusCode": status,
            "HTTPHeaders": {name.lower(): value for name, value in headers.items()},
        },
    }


def _error_code(payload: bytes) -> str:
    return str(_error_fields(payload).get("Code") or "")


def _error_fields(payload: bytes) -> dict[str, Any]:
    try:
        parsed = xmltodict.parse(payload) if payload.strip() else {}
    except Exception:  # a proxy's HTML page, a truncated body: the status says enough
        return {}
    error = parsed.get("Error") if isinstance(parsed, dict) else None
    return error if isinstance(error, dict) else {}
