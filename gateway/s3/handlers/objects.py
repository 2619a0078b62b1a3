"""PutObject, GetObject, HeadObject, DeleteObject: parse headers, call ObjectService, render."""

from __future__ import annotations

import email.utils
import logging
import re
from collections.abc import Mapping

from aiohttp import web

from gateway.checksums import CHECKSUM_ALGORITHMS, checksum_type
from gateway.core.conditions import Preconditions
from gateway.core.objects import ObjectHead, ReadOptions
from gateway.core.ranges import parse_range
from gateway.errors import (
    InvalidArgument,
    InvalidRange,
    InvalidRequest,
    S3NotImplemented,
)
from gateway.models import PutRequest
from gateway.s3 import operations as ops
from gateway.s3.auth import AuthContext
from gateway.s3.body import request_body
from gateway.s3.dispatch import S3Services, handles
from gateway.s3.metadata import (
    content_type,
    refuse_unsupported,
    stored_headers,
    tag_count,
    user_metadata,
)
from gateway.s3.metrics import note_ingested
from gateway.s3.middleware import render_error
from gateway.s3.streaming import send_body

log = logging.getLogger(__name__)

# How each stored header is spelled in responses (HTTP names are case-insensitive, but
# clients and tests compare what S3 sends).
_HEADER_NAMES = {
    "content-encoding": "Content-Encoding",
    "content-disposition": "Content-Disposition",
    "content-language": "Content-Language",
    "cache-control": "Cache-Control",
    "expires": "Expires",
}
# GetObject/HeadObject query parameters that override a response header (signed requests).
_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}
_MAX_PART_NUMBER = 10_000
_SUPPORTED_CHECKSUMS = frozenset(CHECKSUM_ALGORITHMS)
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def checksum_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``x-amz-checksum-<algorithm>`` values the client sent, by algorithm."""
    return {
        a: headers[f"x-amz-checksum-{a}"]
        for a in CHECKSUM_ALGORITHMS
        if f"x-amz-checksum-{a}" in headers
    }


def put_request(op: ops.PutObject, headers: Mapping[str, str], length: int | None) -> PutRequest:
    """Everything PutObject's headers ask us to store and to verify."""
    meta = user_metadata(headers)
    stored = stored_headers(headers)
    checksums = checksum_headers(headers)
    trailer = _trailer_checksum(headers.get("x-amz-trailer"))
    for algorithm in [*checksums, *([trailer] if trailer else [])]:
        if algorithm not in _SUPPORTED_CHECKSUMS:
            raise S3NotImplemented(f"Checksum algorithm {algorithm} is not supported yet.")
    sha = headers.get("x-amz-content-sha256", "")
    return PutRequest(
        bucket=op.bucket,
        key=op.key,
        content_type=content_type(headers),
        user_metadata=meta,
        headers=stored,
        content_length=length,
        content_md5=headers.get("Content-MD5"),
        payload_sha256=sha if _HEX64.fullmatch(sha) else None,
        checksums=checksums,
        trailer_checksum=trailer,
    )


def _trailer_checksum(value: str | None) -> str | None:
    if not value:
        return None
    name = value.strip().lower()
    if not name.startswith("x-amz-checksum-") or name[15:] not in CHECKSUM_ALGORITHMS:
        raise InvalidRequest(f"Unsupported trailer {value!r}.")
    return name[15:]


def read_options(query: Mapping[str, str], headers: Mapping[str, str]) -> ReadOptions:
    """Range or partNumber, and the four read preconditions, of a GET/HEAD."""
    range_value = headers.get("Range")
    part = query.get("partNumber")
    part_number = None
    if part is not None:
        if range_value:
            raise InvalidRequest("Cannot specify both Range header and partNumber query parameter")
        if not part.isdigit() or not 1 <= int(part) <= _MAX_PART_NUMBER:
            raise InvalidArgument(
                "Part number must be an integer between 1 and 10000, inclusive",
                ArgumentName="partNumber",
                ArgumentValue=part,
            )
        part_number = int(part)
    cond = Preconditions(
        if_match=headers.get("If-Match"),
        if_none_match=headers.get("If-None-Match"),
        if_modified_since=headers.get("If-Modified-Since"),
        if_unmodified_since=headers.get("If-Unmodified-Since"),
    )
    return ReadOptions(parse_range(range_value), part_number, cond)


def write_preconditions(headers: Mapping[str, str]) -> Preconditions:
    """PutObject / CompleteMultipartUpload conditions. S3 accepts ``If-None-Match: *`` or
    ``If-Match: <etag>``, not both, and answers anything else with 501 NotImplemented."""
    if_match, if_none_match = headers.get("If-Match"), headers.get("If-None-Match")
    if if_none_match is not None and if_none_match.strip() != "*":
        raise S3NotImplemented(
            "A header you provided implies functionality that is not implemented",
            Header="If-None-Match",
        )
    if if_match is not None and if_none_match is not None:
        raise S3NotImplemented(
            "A header you provided implies functionality that is not implemented",
            Header="If-Match",
        )
    return Preconditions(if_match=if_match, if_none_match=if_none_match)


def stored_response_headers(stored: Mapping[str, str]) -> dict[str, str]:
    """The stored headers as S3 answers them on GET/HEAD: tags as their count
    (``x-amz-tagging-count``), no storage class when STANDARD."""
    out = {}
    for name, value in stored.items():
        if name == "x-amz-tagging":
            if count := tag_count(value):
                out["x-amz-tagging-count"] = str(count)
        elif name == "x-amz-storage-class" and value == "STANDARD":
            continue
        else:
            out[_HEADER_NAMES.get(name, name)] = value
    return out


def delete_preconditions(headers: Mapping[str, str]) -> Preconditions | None:
    """DeleteObject's condition: ``If-Match`` (an ETag, or ``*``), as S3's general purpose
    buckets take it since 2025-09; None without one. The directory buckets' size and
    modification-time conditions are not implemented (501)."""
    refuse_unsupported(headers, ("x-amz-if-match-size", "x-amz-if-match-last-modified-time"))
    if_match = headers.get("If-Match")
    return None if if_match is None else Preconditions(if_match=if_match)


def object_headers(
    head: ObjectHead, *, with_checksums: bool, overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Response headers of a GET/HEAD. Checksums describe the whole object: never on a 206
    (boto3 would validate them against the partial body); never on a 304."""
    meta = head.meta
    out = {
        "ETag": f'"{meta.etag}"',
        "Last-Modified": email.utils.formatdate(meta.last_modified_s, usegmt=True),
    }
    if head.is_not_modified:
        return out
    out["Content-Type"] = meta.content_type
    out["Accept-Ranges"] = "bytes"
    out["x-gateway-flush-state"] = head.state.value
    if head.held_by is not None:  # a commit marker the fleet holds (docs/fleet.md)
        out["x-gateway-flush-state"] = "held"
        out["x-gateway-held-by"] = _printable(head.held_by)
    if head.replicas is not None:  # acknowledged with fewer replicas (degrade)
        out["x-gateway-replicas"] = head.replicas
    if head.node is not None:  # served by the fleet member that holds it unflushed
        out["x-gateway-node"] = _printable(head.node)
    out.update(stored_response_headers(meta.headers))
    out.update({f"x-amz-meta-{k}": v for k, v in meta.user_metadata.items()})
    if head.byte_range is not None:
        out["Content-Range"] = head.byte_range.content_range
    elif with_checksums:
        out.update(_checksum_headers(meta.checksums))
    if head.parts_count is not None:
        out["x-amz-mp-parts-count"] = str(head.parts_count)
    for param, header in _OVERRIDES.items():
        if param in (overrides or {}):
            out[header] = (overrides or {})[param]
    return out


def _printable(text: str) -> str:
    """A header value from free text (node names, error messages): printable ASCII only."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:1000]


def _checksum_headers(checksums: Mapping[str, str]) -> dict[str, str]:
    """``x-amz-checksum-<algorithm>`` values and their ``x-amz-checksum-type``."""
    out = {f"x-amz-checksum-{a}": v for a, v in checksums.items()}
    for value in checksums.values():
        out["x-amz-checksum-type"] = checksum_type(value)
    return out


def _wants_checksums(request: web.Request) -> bool:
    return request.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"


def _status(head: ObjectHead) -> int:
    if head.is_not_modified:
        return 304
    return 206 if head.byte_range is not None else 200


def _content_length(head: ObjectHead) -> int:
    return head.byte_range.length if head.byte_range is not None else head.meta.size_bytes


def _unsatisfiable(request: web.Request, exc: InvalidRange) -> web.Response:
    """416 as S3 sends it: the error document plus ``Content-Range: bytes */<size>``."""
    log.info("%s %s -> 416 InvalidRange: %s", request.method, request.path, exc.message)
    response = render_error(request, exc)
    if "ActualObjectSize" in exc.fields:
        response.headers["Content-Range"] = f"bytes */{exc.fields['ActualObjectSize']}"
    return response


@handles(ops.PutObject)
async def put_object(
    request: web.Request, op: ops.PutObject, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    svc.check_writable()
    cond = write_preconditions(request.headers)
    body, length = request_body(request, auth)
    put = put_request(op, request.headers, length)
    meta = await svc.objects.put_object(put, body, cond)
    note_ingested(request, meta.size_bytes)
    headers = {"ETag": f'"{meta.etag}"', **_checksum_headers(meta.checksums)}
    return web.Response(status=200, headers=headers)


@handles(ops.GetObject)
async def get_object(
    request: web.Request, op: ops.GetObject, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    read = read_options(request.query, request.headers)
    try:
        body = await svc.objects.get_object(op.bucket, op.key, read)
    except InvalidRange as exc:
        return _unsatisfiable(request, exc)
    head, source = body.head, body.source
    headers = object_headers(
        head, with_checksums=_wants_checksums(request), overrides=request.query
    )
    response = web.StreamResponse(status=_status(head), headers=headers)
    if not head.is_not_modified:
        response.content_length = _content_length(head)
    try:
        await response.prepare(request)
        await send_body(request, response, source)
    except ConnectionError:
        _cut(request)
        raise  # a client abort: logged as such, with the bytes sent (middleware.s3_errors)
    except Exception:
        # The status line and Content-Length are gone: the only honest signal left is a
        # body cut short. Close the connection so the client sees it at once (a failed
        # digest check of a local body, an upstream dying mid-stream) instead of waiting.
        if response.prepared:
            _cut(request)
        raise
    finally:
        await source.aclose()
    await response.write_eof()
    return response


def _cut(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()


@handles(ops.HeadObject)
async def head_object(
    request: web.Request, op: ops.HeadObject, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    read = read_options(request.query, request.headers)
    try:
        head = await svc.objects.head_object(op.bucket, op.key, read)
    except InvalidRange as exc:
        return _unsatisfiable(request, exc)
    headers = object_headers(
        head, with_checksums=_wants_checksums(request), overrides=request.query
    )
    response = web.StreamResponse(status=_status(head), headers=headers)
    if not head.is_not_modified:
        response.content_length = _content_length(head)
    await response.prepare(request)
    await response.write_eof()
    return response


@handles(ops.DeleteObject)
async def delete_object(
    request: web.Request, op: ops.DeleteObject, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    svc.check_writable()
    await svc.objects.delete_object(op.bucket, op.key, delete_preconditions(request.headers))
    return web.Response(status=204)
