"""PutObject, GetObject, HeadObject, DeleteObject: parse headers, call ObjectService, render."""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping

from aiohttp import web

from gateway.checksums import CHECKSUM_ALGORITHMS
from gateway.core.objects import ObjectHead
from gateway.errors import InvalidRequest, NotImplementedError_
from gateway.models import PutRequest
from gateway.s3 import operations as ops
from gateway.s3.auth import AuthContext
from gateway.s3.body import request_body
from gateway.s3.dispatch import S3Services, handles

# System metadata S3 stores with an object and returns on GET/HEAD.
STORED_HEADERS = (
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
)
_SUPPORTED_CHECKSUMS = frozenset({"crc32", "sha1", "sha256"})
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def user_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    """``x-amz-meta-*`` headers, names lower-cased as S3 stores them."""
    return {k[11:].lower(): v for k, v in headers.items() if k.lower().startswith("x-amz-meta-")}


def stored_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """System metadata kept with the object. aws-chunked is a transfer framing, not part of
    the object: ``gzip,aws-chunked`` is stored as ``gzip``."""
    stored = {name: headers[name] for name in STORED_HEADERS if name in headers}
    if "content-encoding" in stored:
        parts = stored.pop("content-encoding").split(",")
        kept = [e.strip() for e in parts if e.strip().lower() != "aws-chunked"]
        if kept:
            stored["content-encoding"] = ",".join(kept)
    return stored


def put_request(op: ops.PutObject, headers: Mapping[str, str], length: int | None) -> PutRequest:
    """Everything PutObject's headers ask us to store and to verify."""
    meta = user_metadata(headers)
    stored = stored_headers(headers)
    checksums = {
        a: headers[f"x-amz-checksum-{a}"]
        for a in CHECKSUM_ALGORITHMS
        if f"x-amz-checksum-{a}" in headers
    }
    trailer = _trailer_checksum(headers.get("x-amz-trailer"))
    for algorithm in [*checksums, *([trailer] if trailer else [])]:
        if algorithm not in _SUPPORTED_CHECKSUMS:
            raise NotImplementedError_(f"Checksum algorithm {algorithm} is not supported yet.")
    sha = headers.get("x-amz-content-sha256", "")
    return PutRequest(
        bucket=op.bucket,
        key=op.key,
        content_type=headers.get("Content-Type", "binary/octet-stream"),
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


def object_headers(head: ObjectHead, *, with_checksums: bool) -> dict[str, str]:
    meta = head.meta
    out = {
        "ETag": f'"{meta.etag}"',
        "Last-Modified": email.utils.formatdate(meta.last_modified_s, usegmt=True),
        "Content-Type": meta.content_type,
        "Accept-Ranges": "bytes",
        "x-gateway-flush-state": head.state.value,
    }
    out.update({name.title(): value for name, value in meta.headers.items()})
    out.update({f"x-amz-meta-{k}": v for k, v in meta.user_metadata.items()})
    if with_checksums:
        out.update({f"x-amz-checksum-{a}": v for a, v in meta.checksums.items()})
    return out


def _wants_checksums(request: web.Request) -> bool:
    return request.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"


@handles(ops.PutObject)
async def put_object(
    request: web.Request, op: ops.PutObject, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    svc.check_writable()
    body, length = request_body(request, auth)
    put = put_request(op, request.headers, length)
    meta = await svc.objects.put_object(put, body)
    headers = {"ETag": f'"{meta.etag}"'}
    headers.update({f"x-amz-checksum-{a}": v for a, v in meta.checksums.items()})
    return web.Response(status=200, headers=headers)


@handles(ops.GetObject)
async def get_object(
    request: web.Request, op: ops.GetObject, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    body = await svc.objects.get_object(op.bucket, op.key)
    chunks = body.chunks()
    response = web.StreamResponse(
        status=200, headers=object_headers(body.head, with_checksums=_wants_checksums(request))
    )
    response.content_length = body.head.meta.size_bytes
    try:
        await response.prepare(request)
        async for piece in chunks:
            await response.write(piece)
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
    await response.write_eof()
    return response


@handles(ops.HeadObject)
async def head_object(
    request: web.Request, op: ops.HeadObject, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    head = await svc.objects.head_object(op.bucket, op.key)
    response = web.StreamResponse(
        status=200, headers=object_headers(head, with_checksums=_wants_checksums(request))
    )
    response.content_length = head.meta.size_bytes
    await response.prepare(request)
    await response.write_eof()
    return response


@handles(ops.DeleteObject)
async def delete_object(
    request: web.Request, op: ops.DeleteObject, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    svc.check_writable()
    await svc.objects.delete_object(op.bucket, op.key)
    return web.Response(status=204)
