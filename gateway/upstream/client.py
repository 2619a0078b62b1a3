"""Upstream: the seam to the real bucket, and its aiobotocore implementation.

The SDK's own retries are off: the flusher owns backoff (one policy, no double retries).
Request checksums are only computed when required: the flusher sends Content-MD5 it already
has from ingest (and one stored x-amz-checksum), so botocore never re-reads a body to hash it.

Payloads are not hashed for signing (``x-amz-content-sha256: UNSIGNED-PAYLOAD``), over
https and over http alike. botocore otherwise reads and SHA-256s every body it sends over
http on the event loop before sending it (40-117 ms per 64 MiB, during which no client
request is served). Over https this is what botocore does anyway for a PutObject/UploadPart
carrying Content-MD5, and TLS protects the request. Over http, the one a test rig or a
trusted-network store uses, the body is still covered end to end: Content-MD5 is a signed
header (an intermediary can change neither it nor, undetected, the body S3 checks against
it), and the flusher compares the ETag the upstream returns with the one it expects (a
completion's part list included). What is given up on http is the signature over small
XML bodies such as CompleteMultipartUpload's, whose outcome the ETag check still catches.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, TypeVar

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.credentials import AioCredentials
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError
from botocore.httpsession import get_cert_path

from gateway import __version__
from gateway.errors import NoSuchBucket, NoSuchKey, S3Error
from gateway.metrics import UPSTREAM_REQUESTS
from gateway.models import (
    UPSTREAM_HEADERS,
    BucketInfo,
    ListEntry,
    ObjectAttributes,
    ObjectMeta,
    PartAttributes,
)
from gateway.upstream.classify import ConditionFailed, FlushError, for_client, for_flush
from gateway.upstream.direct import DirectPut, DirectRefused

T = TypeVar("T")
log = logging.getLogger(__name__)
# Bodies up to this go past botocore's pipeline (direct.py): there its CPU is most of the cost.
_DIRECT_PUT_MAX_BYTES = 1 << 20
_STREAM_PIECE_BYTES = 1 << 20
# Stored system headers and the put_object parameter that sends each upstream.
_HEADER_PARAMS = {
    "content-encoding": "ContentEncoding",
    "content-disposition": "ContentDisposition",
    "content-language": "ContentLanguage",
    "cache-control": "CacheControl",
    "expires": "Expires",
}
# Conditional request headers and the get_object/head_object parameter for each.
_CONDITION_PARAMS = {
    "If-Match": "IfMatch",
    "If-None-Match": "IfNoneMatch",
    "If-Modified-Since": "IfModifiedSince",
    "If-Unmodified-Since": "IfUnmodifiedSince",
}
_TOTAL_SIZE = re.compile(r"bytes \d+-\d+/(\d+)")
# Stored headers sent as they are, not through a botocore parameter: S3 stores any Expires
# string (an unparseable one too, which it returns verbatim), while botocore's Expires
# parameter is a timestamp that refuses such a value and reformats a valid one.
_RAW_HEADERS: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("upstream_raw", default=())
# The object's encryption, storage class and tags (``UPSTREAM_HEADERS``) go the same way,
# as the client sent them (S3 checks them; ingest checked them as S3 does).
_RAW_HEADER_NAMES = {"expires": "Expires", **{name: name for name in UPSTREAM_HEADERS}}
# The (bucket, key) of the PutObject the current task sends through botocore (_learn_target).
_PUT_KEY: ContextVar[tuple[str, str] | None] = ContextVar("upstream_put", default=None)
# Characters XML 1.0 cannot carry, even as references.
_XML_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@dataclass(slots=True)
class UpstreamObject:
    """A streamed upstream GET: ``chunks()`` must be consumed or ``close()`` called.

    ``meta.size_bytes`` is the whole object's size; ``content_range`` is set when the
    upstream answered 206 (a range or a part), ``parts_count`` when it sent
    ``x-amz-mp-parts-count``.
    """

    meta: ObjectMeta
    _body: Any
    content_range: str | None = None
    parts_count: int | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body in pieces; a connection that fails mid-body raises an ``S3Error``
        (ServiceUnavailable), like the request itself would have."""
        try:
            while True:
                try:
                    piece = await self._body.read(_STREAM_PIECE_BYTES)
                except Exception as exc:  # the transport's errors, classified in one place
                    raise for_client(exc) from exc
                if not piece:
                    return
                yield piece
        finally:
            self.close()

    def close(self) -> None:
        self._body.close()


@dataclass(frozen=True, slots=True)
class UpstreamHead:
    """An upstream HEAD of one part: the object's metadata, the part's bytes, the count."""

    meta: ObjectMeta
    content_range: str | None
    parts_count: int | None


@dataclass(frozen=True, slots=True)
class PartSource:
    """One part to upload: an open body file, its size and MD5 (hex)."""

    body: BinaryIO
    size_bytes: int
    md5_hex: str


# Called with (upload_id, bucket, key, done): done=False once the upstream upload exists
# (before any part is sent), done=True once it is completed or aborted.
UploadTracker = Callable[[str, str, str, bool], Awaitable[None]]


class RequestRunner(Protocol):
    """Sends one request of a multipart upload (a part, the completion): the caller's hook
    for pacing (tokens) and for retrying that request alone on a throttle or a transient
    error, so one 503 does not restart an upload of thousands of parts. ``send`` raises
    only ``FlushError`` and may be called again (the part body is rewound each time)."""

    def __call__(self, size_bytes: int, send: Callable[[], Awaitable[T]]) -> Awaitable[T]: ...


async def _send_once(size_bytes: int, send: Callable[[], Awaitable[T]]) -> T:
    return await send()


class Upstream(Protocol):
    """The real bucket.

    Write calls (``put_object``, ``delete_object``) MUST raise only ``FlushError`` subclasses
    (Throttled, Retryable, Fatal). Read and bucket calls MUST raise only ``S3Error`` (the
    upstream's code passed through, or ServiceUnavailable when it cannot be reached).
    """

    async def put_object(
        self, meta: ObjectMeta, body: BinaryIO, condition: Condition | None = None
    ) -> str:
        """PutObject; with a ``condition`` (``unchanged_since``), ConditionFailed when the
        key is no longer as it was."""
        ...

    async def put_multipart(
        self,
        meta: ObjectMeta,
        parts: Sequence[PartSource],
        track: UploadTracker | None = None,
        run: RequestRunner | None = None,
        condition: Condition | None = None,
    ) -> str:
        """Multipart upload; a ``condition`` guards its CompleteMultipartUpload."""
        ...

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> bool: ...

    # The steps of ``put_multipart``, for a caller that uploads parts as they arrive (the
    # flusher's early multipart uploads): FlushError only, like the other write calls.
    async def create_multipart(self, meta: ObjectMeta) -> str:
        """CreateMultipartUpload with ``meta``'s stored headers; returns the upload id."""
        ...

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_number: int, part: PartSource
    ) -> str:
        """UploadPart (with Content-MD5); returns the part's ETag, unquoted."""
        ...

    async def complete_multipart(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: Sequence[tuple[int, str]],
        condition: Condition | None = None,
    ) -> str:
        """CompleteMultipartUpload of (part number, ETag) in order; returns the ETag."""
        ...

    async def list_open_uploads(self, bucket: str, key: str) -> list[tuple[str, float]]:
        """(upload id, initiated wall seconds) of the upstream's open multipart uploads of
        exactly ``key``. Raises a FlushError when the upstream cannot be asked."""
        ...

    async def delete_object(
        self, bucket: str, key: str, condition: Condition | None = None
    ) -> None: ...

    async def head_object(self, bucket: str, key: str) -> ObjectMeta: ...

    async def head_part(self, bucket: str, key: str, part_number: int) -> UpstreamHead:
        """HEAD ``?partNumber=``: the whole object's metadata plus the part's Content-Range."""
        ...

    async def get_object(
        self,
        bucket: str,
        key: str,
        *,
        range_header: str | None = None,
        part_number: int | None = None,
        preconditions: Mapping[str, str] | None = None,
    ) -> UpstreamObject:
        """GET, optionally ranged (``Range`` value) or one part, with conditional headers
        (``If-Match`` ...) that the upstream evaluates (NotModified / PreconditionFailed)."""
        ...

    async def list_page(
        self, bucket: str, prefix: str, delimiter: str, start_after: str, max_keys: int
    ) -> tuple[list[ListEntry], bool]: ...

    async def get_object_attributes(
        self, bucket: str, key: str, *, max_parts: int, part_number_marker: int
    ) -> ObjectAttributes:
        """GetObjectAttributes of an upstream object (every attribute; parts paged)."""
        ...

    async def head_bucket(self, bucket: str) -> None: ...

    async def list_buckets(self) -> list[BucketInfo]: ...

    async def create_bucket(self, bucket: str, location: str | None) -> None: ...

    async def delete_bucket(self, bucket: str) -> None: ...


def count_upstream_request(
    event_name: str, response_dict: Mapping[str, Any] | None = None, **kwargs: Any
) -> None:
    """botocore ``response-received.s3.<Operation>`` handler (one event per HTTP attempt):
    counts the request by operation and HTTP status, ``error`` when no response came back
    (connection refused or reset, timeout)."""
    status = "error" if response_dict is None else str(response_dict.get("status_code"))
    UPSTREAM_REQUESTS.labels(event_name.rpartition(".")[2], status).inc()


# botocore credential providers whose keys are configured, not issued per node.
_STATIC_CREDENTIALS = frozenset({"explicit", "env", "shared-credentials-file", "config-file"})


# Codes of an upstream that answered but refused the gateway's own credentials.
_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidClientTokenId",
    }
)


@dataclass(frozen=True, slots=True)
class ProbeProblem:
    """Why the upstream did not answer a probe: ``reason`` in a few words;
    ``is_credentials`` when it answered but refused the gateway's credentials."""

    reason: str
    is_credentials: bool = False


class NoUpstreamCredentials(RuntimeError):
    """The standard AWS chain found no credentials for the upstream (``start()``)."""

    def __init__(self) -> None:
        super().__init__(
            "no upstream credentials found (searched: environment, AWS profile, container "
            "and instance role): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            "AWS_PROFILE (a profile in ~/.aws/credentials or ~/.aws/config), or give the "
            "node an instance role or IRSA (AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE); "
            "these are the gateway's own credentials for the bucket, not the clients' "
            "--access-key/--secret-key"
        )


class AiobotocoreUpstream:
    """Upstream over aiobotocore. ``start()`` inside the event loop, ``close()`` at shutdown.

    ``start()`` resolves the upstream credentials first, from the standard AWS chain (the
    session keeps what it found, so the client signs with exactly that), and raises
    ``NoUpstreamCredentials`` when there are none: a gateway that cannot sign a single
    upload must not start acknowledging writes. ``probe()`` asks the upstream once, with a
    short deadline, whether it answers.
    """

    def __init__(
        self,
        *,
        endpoint_url: str | None,
        region: str,
        addressing_style: str = "auto",
        max_connections: int = 64,
        part_concurrency: int = 4,
        access_key: str | None = None,
        secret_key: str | None = None,
        direct_put_max_bytes: int = _DIRECT_PUT_MAX_BYTES,
    ) -> None:
        self._endpoint_url = endpoint_url
        self._max_connections = max_connections
        self._direct_put_max_bytes = direct_put_max_bytes
        self._direct: DirectPut | None = None
        self._part_concurrency = part_concurrency
        self._region = region
        self._config = AioConfig(
            retries={"total_max_attempts": 1},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            max_pool_connections=max_connections,
            # UNSIGNED-PAYLOAD, https or not: see the module docstring.
            s3={"addressing_style": addressing_style, "payload_signing_enabled": False},
            connect_timeout=10,
            read_timeout=120,
        )
        # Explicit keys only for the embedded demo upstream; otherwise the standard chain.
        self._keys = (access_key, secret_key)
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._session: Any = None

    async def start(self) -> None:
        session = self._session = get_session()
        kwargs: dict[str, Any] = {}
        if self._keys[0] is not None:
            kwargs = {"aws_access_key_id": self._keys[0], "aws_secret_access_key": self._keys[1]}
            credentials = AioCredentials(self._keys[0], self._keys[1] or "")
        else:
            # The chain the client itself resolves (the session caches the result); an
            # instance role or IRSA resolves here without a request to STS.
            credentials = await session.get_credentials()
            if credentials is None:
                raise NoUpstreamCredentials()
        self._client = await self._stack.enter_async_context(
            session.create_client(
                "s3",
                endpoint_url=self._endpoint_url,
                region_name=self._region,
                config=self._config.merge(AioConfig(user_agent=_user_agent(session))),
                **kwargs,
            )
        )
        self._client.meta.events.register("response-received.s3", count_upstream_request)
        for operation in ("PutObject", "CreateMultipartUpload"):
            self._client.meta.events.register(f"before-call.s3.{operation}", _add_raw_headers)
        if self._direct_put_max_bytes > 0:
            self._direct = self._direct_put(session, credentials)
            self._stack.push_async_callback(self._direct.close)

    def _direct_put(self, session: Any, credentials: Any) -> DirectPut:
        """Small PutObjects past botocore's pipeline (``direct.py``), with the client's
        credentials (frozen for each request: refreshed as the client's are), User-Agent,
        pool size, timeouts and CA bundle."""
        self._client.meta.events.register("before-sign.s3.PutObject", self._learn_target)
        return DirectPut(
            credentials.get_frozen_credentials,
            user_agent=_user_agent(session),
            max_connections=self._max_connections,
            connect_timeout_s=float(self._config.connect_timeout),
            read_timeout_s=float(self._config.read_timeout),
            ca_bundle=get_cert_path(session.get_config_variable("ca_bundle") or True),
        )

    def _learn_target(
        self, request: Any, region_name: str, signature_version: str, **kwargs: Any
    ) -> None:
        """botocore ``before-sign`` hook of PutObject: tells ``DirectPut`` where the bucket's
        keys go (the URL and region botocore signs for: a region redirect's retry too)."""
        put = _PUT_KEY.get()
        if self._direct is None or put is None:
            return
        signing = request.context.get("signing", {})
        if signing.get("request_credentials") or signing.get("identity_cache") is not None:
            signature_version = "s3express"  # per-bucket session credentials: botocore's
        region = signing.get("region") or region_name
        self._direct.learn(*put, request.url, region, signature_version)

    async def close(self) -> None:
        await self._stack.aclose()

    async def shared_secret_key(self) -> str | None:
        """The upstream secret key when it is the same on every node that has it (explicit,
        environment, shared credentials or config file): the fleet's default secret is
        derived from it. None for credentials that differ per node or rotate (instance
        roles, web identity, SSO) or when there are none. Call after ``start``."""
        if self._keys[1] is not None:
            return self._keys[1]
        creds = await self._session.get_credentials()
        if creds is None or getattr(creds, "method", None) not in _STATIC_CREDENTIALS:
            return None
        frozen = await creds.get_frozen_credentials()
        return str(frozen.secret_key)

    async def probe(self, timeout_s: float) -> ProbeProblem | None:
        """Send one ListBuckets and wait at most ``timeout_s`` for it. None when the upstream
        answered (any S3 answer: AccessDenied too, the endpoint is there and understood the
        request), else why not: no answer in time, the connection refused, the credentials
        refused. Never raises (a start only warns: an outage must not stop a node from
        acknowledging writes)."""
        try:
            await asyncio.wait_for(self._client.list_buckets(), timeout_s)
        except TimeoutError:
            return ProbeProblem(f"no answer within {timeout_s:g} s")
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            if code in _CREDENTIAL_CODES:
                detail = " ".join(str(err.get("Message", "")).split())
                return ProbeProblem(
                    f"it refused the gateway's credentials ({code}: {detail})", True
                )
        except (BotoCoreError, aiohttp.ClientError, OSError) as exc:
            return ProbeProblem(" ".join(str(exc).split()) or type(exc).__name__)
        return None

    # -- writes (flush) --------------------------------------------------------------------

    async def put_object(
        self, meta: ObjectMeta, body: BinaryIO, condition: Condition | None = None
    ) -> str:
        direct = self._direct
        if (
            direct is not None
            and meta.size_bytes <= self._direct_put_max_bytes
            and direct.takes(meta.bucket)
            and _ascii_metadata(meta)
        ):
            try:
                return await direct.put_object(
                    meta.bucket, meta.key, body, meta.size_bytes, _put_headers(meta, condition)
                )
            except DirectRefused as refused:
                log.warning(
                    "bucket %s: small PutObjects go through botocore from now on (%s)",
                    meta.bucket,
                    refused,
                )
                direct.refused.add(meta.bucket)
                body.seek(0)
            except Exception as exc:  # classified as botocore's own failures are
                raise _conditional(exc, condition) from exc
        raw = _RAW_HEADERS.set(_raw_headers(meta))
        put = _PUT_KEY.set((meta.bucket, meta.key))
        try:
            resp = await self._client.put_object(
                Body=body,
                ContentLength=meta.size_bytes,
                ContentMD5=_b64_md5(meta.etag),
                **_checksum_params(meta),
                **_object_params(meta),
                **(condition or {}),
            )
        except Exception as exc:  # classified: the flusher decides what it means
            raise _conditional(exc, condition) from exc
        finally:
            _RAW_HEADERS.reset(raw)
            _PUT_KEY.reset(put)
        return str(resp.get("ETag", "")).strip('"')

    async def put_multipart(
        self,
        meta: ObjectMeta,
        parts: Sequence[PartSource],
        track: UploadTracker | None = None,
        run: RequestRunner | None = None,
        condition: Condition | None = None,
    ) -> str:
        """Upload as multipart with exactly these part boundaries (so the ETag matches);
        parts go in parallel, each request through ``run``. A failure that ``run`` gives up
        on aborts the upstream upload: nothing accrues cost. ``track`` records the upload
        while it is open, so a crash cannot abandon it."""
        bucket, key = meta.bucket, meta.key
        runner: RequestRunner = run or _send_once
        upload_id = await self.create_multipart(meta)
        try:
            if track is not None:
                await track(upload_id, bucket, key, False)
            limit = asyncio.Semaphore(self._part_concurrency)

            async def send(number: int, part: PartSource) -> tuple[int, str]:
                async with limit:
                    etag = await runner(
                        part.size_bytes,
                        lambda: self.upload_part(bucket, key, upload_id, number, part),
                    )
                return number, etag

            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(send(i, p)) for i, p in enumerate(parts, 1)]
            done = [t.result() for t in tasks]
            etag = await runner(
                0, lambda: self.complete_multipart(bucket, key, upload_id, done, condition)
            )
        except BaseException as exc:
            aborted = await asyncio.shield(self.abort_multipart(bucket, key, upload_id))
            if aborted and track is not None:
                await asyncio.shield(track(upload_id, bucket, key, True))
            if isinstance(exc, BaseExceptionGroup):
                exc = exc.exceptions[0]
            if isinstance(exc, FlushError):
                raise exc from None
            if isinstance(exc, Exception):
                raise for_flush(exc) from exc
            raise
        if track is not None:
            await track(upload_id, bucket, key, True)
        return etag

    async def create_multipart(self, meta: ObjectMeta) -> str:
        raw = _RAW_HEADERS.set(_raw_headers(meta))
        try:
            created = await self._client.create_multipart_upload(**_object_params(meta))
        except Exception as exc:
            raise for_flush(exc) from exc
        finally:
            _RAW_HEADERS.reset(raw)
        return str(created["UploadId"])

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_number: int, part: PartSource
    ) -> str:
        part.body.seek(0)
        resp = await _flush_call(
            self._client.upload_part(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=part_number,
                Body=part.body,
                ContentLength=part.size_bytes,
                ContentMD5=_b64_md5(part.md5_hex),
            )
        )
        return str(resp.get("ETag", "")).strip('"')

    async def complete_multipart(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: Sequence[tuple[int, str]],
        condition: Condition | None = None,
    ) -> str:
        done = {"Parts": [{"PartNumber": n, "ETag": f'"{e}"'} for n, e in parts]}
        try:
            resp = await self._client.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload=done,
                **(condition or {}),
            )
        except Exception as exc:
            raise _conditional(exc, condition) from exc
        return str(resp.get("ETag", "")).strip('"')

    async def list_open_uploads(self, bucket: str, key: str) -> list[tuple[str, float]]:
        found: list[tuple[str, float]] = []
        params: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
        try:
            while True:
                page = await self._client.list_multipart_uploads(**params)
                found += [
                    (str(u["UploadId"]), u["Initiated"].timestamp())
                    for u in page.get("Uploads", [])
                    if u.get("Key") == key
                ]
                if not page.get("IsTruncated"):
                    return found
                params["KeyMarker"] = page.get("NextKeyMarker", "")
                params["UploadIdMarker"] = page.get("NextUploadIdMarker", "")
        except Exception as exc:
            raise for_flush(exc) from exc

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> bool:
        """Abort an upstream multipart upload. True when it is gone (also if it already
        was: NoSuchUpload); False if the upstream could not be asked (try again later)."""
        try:
            await self._client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception as exc:  # best effort; the failure that led here is what matters
            if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == (
                "NoSuchUpload"
            ):
                return True
            log.warning(
                "could not abort upstream upload %s of %s/%s: %s", upload_id, bucket, key, exc
            )
            return False
        return True

    async def delete_object(
        self, bucket: str, key: str, condition: Condition | None = None
    ) -> None:
        try:
            await self._client.delete_object(Bucket=bucket, Key=key, **(condition or {}))
        except Exception as exc:
            raise _conditional(exc, condition) from exc

    # -- reads (read-through) --------------------------------------------------------------

    async def head_object(self, bucket: str, key: str) -> ObjectMeta:
        resp = await self._call(lambda: self._client.head_object(Bucket=bucket, Key=key))
        return _meta(bucket, key, resp)

    async def head_part(self, bucket: str, key: str, part_number: int) -> UpstreamHead:
        resp = await self._call(
            lambda: self._client.head_object(Bucket=bucket, Key=key, PartNumber=part_number)
        )
        return UpstreamHead(_meta(bucket, key, resp), resp.get("ContentRange"), _parts(resp))

    async def get_object(
        self,
        bucket: str,
        key: str,
        *,
        range_header: str | None = None,
        part_number: int | None = None,
        preconditions: Mapping[str, str] | None = None,
    ) -> UpstreamObject:
        params: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if range_header:
            params["Range"] = range_header
        if part_number is not None:
            params["PartNumber"] = part_number
        params.update(_condition_params(preconditions or {}))
        resp = await self._call(lambda: self._client.get_object(**params))
        return UpstreamObject(
            _meta(bucket, key, resp), resp["Body"], resp.get("ContentRange"), _parts(resp)
        )

    async def list_page(
        self, bucket: str, prefix: str, delimiter: str, start_after: str, max_keys: int
    ) -> tuple[list[ListEntry], bool]:
        """One upstream page of entries after ``start_after``.

        A StartAfter holding characters XML cannot carry (control characters, legal in S3
        keys) is not sent as is: some S3 servers cannot echo it in their answer. The listing
        starts at its longest clean prefix instead (which sorts before it), follows the
        upstream's continuation tokens, and drops what sorts at or before ``start_after``."""
        params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": max_keys}
        if delimiter:
            params["Delimiter"] = delimiter
        unsafe = _XML_UNSAFE.search(start_after)
        clean = start_after[: unsafe.start()] if unsafe else start_after
        if clean:
            params["StartAfter"] = clean
        while True:
            resp = await self._call(lambda: self._client.list_objects_v2(**params))
            entries = [e for e in _list_entries(resp) if e.name > start_after]
            truncated = bool(resp.get("IsTruncated", False))
            token = resp.get("NextContinuationToken")
            if entries or not truncated or not unsafe or not token:
                return entries, truncated
            params.pop("StartAfter", None)
            params["ContinuationToken"] = token

    async def get_object_attributes(
        self, bucket: str, key: str, *, max_parts: int, part_number_marker: int
    ) -> ObjectAttributes:
        resp = await self._call(
            lambda: self._client.get_object_attributes(
                Bucket=bucket,
                Key=key,
                ObjectAttributes=list(_OBJECT_ATTRIBUTES),
                MaxParts=max_parts,
                PartNumberMarker=part_number_marker,
            )
        )
        return _attributes(resp, max_parts, part_number_marker)

    # -- buckets (passed through) ----------------------------------------------------------

    async def head_bucket(self, bucket: str) -> None:
        try:
            await self._call(lambda: self._client.head_bucket(Bucket=bucket))
        except S3Error as exc:
            if exc.status == 404:
                raise NoSuchBucket(BucketName=bucket) from exc
            raise

    async def list_buckets(self) -> list[BucketInfo]:
        resp = await self._call(lambda: self._client.list_buckets())
        return [
            BucketInfo(b["Name"], b["CreationDate"].timestamp()) for b in resp.get("Buckets", [])
        ]

    async def create_bucket(self, bucket: str, location: str | None) -> None:
        params: dict[str, Any] = {"Bucket": bucket}
        if location:
            params["CreateBucketConfiguration"] = {"LocationConstraint": location}
        await self._call(lambda: self._client.create_bucket(**params))

    # -- conditional writes: the fleet's claims (docs/fleet.md, "Node loss") -------------
    # FlushError only (ConditionFailed for a 412), like the other write calls.

    async def put_if_absent(self, bucket: str, key: str, body: bytes) -> bool:
        """PUT ``body`` with ``If-None-Match: *``: True when created, False when the key
        already existed (412)."""
        try:
            await self._client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
        except Exception as exc:
            error = for_flush(exc)
            if isinstance(error, ConditionFailed):
                return False
            raise error from exc
        return True

    async def put_if_match(self, bucket: str, key: str, body: bytes, etag: str) -> bool:
        """PUT ``body`` with ``If-Match: "<etag>"``: True when replaced, False when the key
        holds another version or none (412, or 404)."""
        condition = {"IfMatch": f'"{etag}"'}
        try:
            await self._client.put_object(Bucket=bucket, Key=key, Body=body, **condition)
        except Exception as exc:
            error = _conditional(exc, condition)
            if isinstance(error, ConditionFailed):
                return False
            raise error from exc
        return True

    async def get_small(self, bucket: str, key: str) -> bytes | None:
        """The whole body of a small object, or None when there is none."""
        try:
            resp = await self._client.get_object(Bucket=bucket, Key=key)
            async with resp["Body"] as stream:
                return bytes(await stream.read())
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise for_flush(exc) from exc
        except Exception as exc:
            raise for_flush(exc) from exc

    async def list_keys(self, bucket: str, prefix: str) -> list[str]:
        """Every key under ``prefix`` (all pages); FlushError when it cannot be listed."""
        keys: list[str] = []
        try:
            async for page in self._client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix
            ):
                keys += [str(o["Key"]) for o in page.get("Contents", [])]
        except Exception as exc:
            raise for_flush(exc) from exc
        return keys

    async def state_of(self, bucket: str, key: str) -> tuple[str, float] | None:
        """(ETag, Last-Modified wall seconds) of the key in the bucket, or None."""
        try:
            head = await self.head_object(bucket, key)
        except NoSuchKey:
            return None
        return head.etag, head.last_modified_s

    async def delete_bucket(self, bucket: str) -> None:
        await self._call(lambda: self._client.delete_bucket(Bucket=bucket))

    async def _call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        try:
            return await fn()
        except Exception as exc:  # translated for the S3 client in one place
            raise for_client(exc) from exc


_OBJECT_ATTRIBUTES = ("ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize")


def _attributes(resp: Mapping[str, Any], max_parts: int, marker: int) -> ObjectAttributes:
    """An upstream GetObjectAttributes answer as ``ObjectAttributes``."""
    checksums = {
        name.removeprefix("Checksum").lower(): str(value)
        for name, value in resp.get("Checksum", {}).items()
        if name.startswith("Checksum") and name != "ChecksumType"
    }
    parts = resp.get("ObjectParts") or {}
    listed = tuple(
        PartAttributes(
            int(p["PartNumber"]),
            int(p.get("Size", 0)),
            next((str(v) for n, v in p.items() if n.startswith("Checksum")), None),
        )
        for p in parts.get("Parts", [])
    )
    modified = resp.get("LastModified")
    return ObjectAttributes(
        etag=str(resp.get("ETag", "")).strip('"'),
        size_bytes=int(resp.get("ObjectSize", 0)),
        last_modified_s=modified.timestamp() if modified is not None else 0.0,
        checksums=checksums,
        storage_class=str(resp.get("StorageClass") or "STANDARD"),
        parts_count=int(parts["TotalPartsCount"]) if "TotalPartsCount" in parts else None,
        parts=listed,
        part_number_marker=int(parts.get("PartNumberMarker", marker)),
        max_parts=int(parts.get("MaxParts", max_parts)),
        is_truncated=bool(parts.get("IsTruncated", False)),
    )


def _list_entries(resp: Mapping[str, Any]) -> list[ListEntry]:
    """Keys and common prefixes of a ListObjectsV2 answer, in name order."""
    entries = [
        ListEntry(
            name=o["Key"],
            size_bytes=int(o.get("Size", 0)),
            etag=str(o.get("ETag", "")).strip('"'),
            last_modified_s=o["LastModified"].timestamp(),
            storage_class=str(o.get("StorageClass") or "STANDARD"),
        )
        for o in resp.get("Contents", [])
    ]
    entries += [ListEntry(name=p["Prefix"], is_prefix=True) for p in resp.get("CommonPrefixes", [])]
    entries.sort(key=lambda e: e.name)
    return entries


def _object_params(meta: ObjectMeta) -> dict[str, Any]:
    params: dict[str, Any] = {
        "Bucket": meta.bucket,
        "Key": meta.key,
        "ContentType": meta.content_type,
        "Metadata": dict(meta.user_metadata),
    }
    params.update((_HEADER_PARAMS[name], value) for name, value in _param_headers(meta))
    return params


def _param_headers(meta: ObjectMeta) -> list[tuple[str, str]]:
    """The stored system headers sent through a botocore parameter (``_HEADER_PARAMS``;
    the raw ones, ``_raw_headers``, are not)."""
    return [
        (name, meta.headers[name])
        for name in _HEADER_PARAMS
        if name in meta.headers and name not in _RAW_HEADER_NAMES
    ]


def _raw_headers(meta: ObjectMeta) -> tuple[tuple[str, str], ...]:
    """The raw stored headers to send; an empty value (kept by a gateway that did not drop
    it at ingest) is not sent: stored upstream, it would break every boto3 GET of it."""
    return tuple(
        (h, meta.headers[n])
        for n, h in _RAW_HEADER_NAMES.items()
        if meta.headers.get(n, "").strip()
    )


def _add_raw_headers(params: dict[str, Any], **kwargs: Any) -> None:
    """botocore ``before-call`` hook (PutObject, CreateMultipartUpload): adds the stored
    headers the current task set in ``_RAW_HEADERS``, before the request is signed."""
    params["headers"].update(_RAW_HEADERS.get())


_CHECKSUM_PARAMS = {
    "crc64nvme": "ChecksumCRC64NVME",
    "crc32c": "ChecksumCRC32C",
    "crc32": "ChecksumCRC32",
    "sha256": "ChecksumSHA256",
    "sha1": "ChecksumSHA1",
}


def _user_agent(session: Any) -> str:
    """botocore's short User-Agent, fixed for the client's life. Without one botocore builds
    its full string again for every request (some 35 sanitized components): 13 % of the CPU
    of a small PutObject here (0.78 -> 0.67 ms), for telemetry nobody reads."""
    return f"{session.user_agent()} s3-write-back-gateway/{__version__}"


def _checksum_params(meta: ObjectMeta) -> dict[str, str]:
    """One stored full-object checksum (S3 takes one per request), so the upstream
    re-verifies the bytes end to end; Content-MD5 is sent as well."""
    for algorithm, param in _CHECKSUM_PARAMS.items():
        value = meta.checksums.get(algorithm)
        if value:
            return {param: value}
    return {}


def _put_headers(meta: ObjectMeta, condition: Condition | None) -> dict[str, str]:
    """The headers botocore's PutObject sends for ``meta`` (``_object_params``,
    ``_raw_headers``, ``_checksum_params``, ``condition``), lower case, for ``direct.py``."""
    headers = {"content-md5": _b64_md5(meta.etag), "content-type": meta.content_type}
    headers.update((f"x-amz-meta-{name}", value) for name, value in meta.user_metadata.items())
    headers.update(_param_headers(meta))
    headers.update((name.lower(), value) for name, value in _raw_headers(meta))
    for param, value in _checksum_params(meta).items():
        headers[f"x-amz-checksum-{param.removeprefix('Checksum').lower()}"] = value
    for param, value in (condition or {}).items():
        headers[_CONDITION_HEADERS[param]] = value
    return headers


_CONDITION_HEADERS = {param: header.lower() for header, param in _CONDITION_PARAMS.items()}


def _ascii_metadata(meta: ObjectMeta) -> bool:
    """botocore refuses user metadata that is not US-ASCII (S3's REST rule; ingest stores
    such values RFC 2047-encoded, so only an old or damaged row has one): such a row goes
    through botocore, to be refused exactly as it always was."""
    return all(k.isascii() and v.isascii() for k, v in meta.user_metadata.items())


Condition = dict[str, str]
"""Keyword arguments of a conditional write (IfMatch / IfNoneMatch), from ``unchanged_since``."""


def unchanged_since(etag: str | None) -> Condition:
    """The condition "the key is still as it was": ``If-Match`` its ETag, or
    ``If-None-Match: *`` when there was none."""
    return {"IfMatch": f'"{etag}"'} if etag is not None else {"IfNoneMatch": "*"}


def _conditional(exc: Exception, condition: Condition | None) -> FlushError:
    """``for_flush``, and a guarded write to a key that has gone since (404 to If-Match)
    is a failed condition too."""
    error = for_flush(exc)
    code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None
    if condition and "IfMatch" in condition and code in ("NoSuchKey", "404"):
        return ConditionFailed(str(error))
    return error


async def _flush_call(call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """Await an SDK write call; failures classified for the flusher (``FlushError``)."""
    try:
        return await call
    except Exception as exc:
        raise for_flush(exc) from exc


def _b64_md5(md5_hex: str) -> str:
    return base64.b64encode(bytes.fromhex(md5_hex)).decode("ascii")


def _meta(bucket: str, key: str, resp: dict[str, Any]) -> ObjectMeta:
    headers = {name: str(resp[param]) for name, param in _HEADER_PARAMS.items() if param in resp}
    if "Expires" in resp and not isinstance(resp["Expires"], str):
        headers["expires"] = resp["ResponseMetadata"]["HTTPHeaders"].get("expires", "")
    # A 206 carries the range's length; the object's size is in Content-Range.
    total = _TOTAL_SIZE.fullmatch(str(resp.get("ContentRange", "")))
    return ObjectMeta(
        bucket=bucket,
        key=key,
        size_bytes=int(total.group(1)) if total else int(resp.get("ContentLength", 0)),
        etag=str(resp.get("ETag", "")).strip('"'),
        last_modified_s=resp["LastModified"].timestamp(),
        content_type=str(resp.get("ContentType", "binary/octet-stream")),
        user_metadata=dict(resp.get("Metadata", {})),
        headers=headers,
    )


def _parts(resp: dict[str, Any]) -> int | None:
    count = resp.get("PartsCount")
    return None if count is None else int(count)


def _condition_params(preconditions: Mapping[str, str]) -> dict[str, Any]:
    """Conditional headers as botocore parameters. Dates botocore cannot take (S3 ignores
    unparseable dates anyway) are left out."""
    params: dict[str, Any] = {}
    for header, param in _CONDITION_PARAMS.items():
        value = preconditions.get(header)
        if value is None:
            continue
        if param.endswith("Since"):
            try:
                params[param] = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError, OverflowError):
                continue
        else:
            params[param] = value
    return params
