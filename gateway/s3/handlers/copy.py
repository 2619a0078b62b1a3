"""CopyObject and UploadPartCopy: parse the copy headers, call CopyService, render XML."""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import parse_qs, unquote

from aiohttp import web

from gateway.core.conditions import Preconditions
from gateway.core.copy import CopyObjectRequest, NewMetadata, UploadPartCopyRequest
from gateway.errors import InvalidArgument, S3NotImplemented
from gateway.s3 import operations as ops
from gateway.s3 import xml
from gateway.s3.auth import AuthContext
from gateway.s3.dispatch import S3Services, handles
from gateway.s3.handlers.objects import write_preconditions
from gateway.s3.metadata import (
    content_type,
    refuse_unsupported,
    stored_headers,
    upstream_headers,
    user_metadata,
)

_RANGE = re.compile(r"bytes=(\d{1,19})-(\d{1,19})")
# Headers that change an object's attributes other than metadata: with one of them a copy
# of an object onto itself is legal in S3 even under the COPY directive.
_ATTRIBUTE_HEADERS = (
    "x-amz-storage-class",
    "x-amz-server-side-encryption",
    "x-amz-website-redirect-location",
)


def parse_copy_source(value: str) -> tuple[str, str]:
    """(bucket, key) of ``x-amz-copy-source``: ``bucket/key`` or ``/bucket/key``, the key
    percent-encoded, optionally followed by ``?versionId=...`` (only ``null`` exists here)."""
    path, _, query = value.partition("?")
    if query:
        versions = parse_qs(query, keep_blank_values=True).get("versionId")
        if versions and versions[0] != "null":
            raise S3NotImplemented("Copying a specific object version is not implemented.")
    try:
        path = unquote(path, errors="strict")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(
            "Copy Source is not valid UTF-8.", ArgumentName="x-amz-copy-source"
        ) from exc
    bucket, _, key = path.removeprefix("/").partition("/")
    if not bucket or not key:
        raise InvalidArgument(
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
            ArgumentName="x-amz-copy-source",
            ArgumentValue=value,
        )
    return bucket, key


def copy_conditions(headers: Mapping[str, str]) -> Preconditions:
    prefix = "x-amz-copy-source-"
    return Preconditions(
        if_match=headers.get(prefix + "if-match"),
        if_none_match=headers.get(prefix + "if-none-match"),
        if_modified_since=headers.get(prefix + "if-modified-since"),
        if_unmodified_since=headers.get(prefix + "if-unmodified-since"),
    )


def new_metadata(headers: Mapping[str, str]) -> NewMetadata | None:
    """What ``x-amz-metadata-directive`` asks for: None (COPY, the default) or REPLACE's."""
    directive = headers.get("x-amz-metadata-directive", "COPY").strip().upper()
    if directive == "COPY":
        return None
    if directive != "REPLACE":
        raise InvalidArgument(
            "Unknown metadata directive.",
            ArgumentName="x-amz-metadata-directive",
            ArgumentValue=headers["x-amz-metadata-directive"],
        )
    return NewMetadata(
        content_type=content_type(headers),
        user_metadata=user_metadata(headers),
        headers=stored_headers(headers),
    )


def target_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The copy's own encryption, storage class and tags (``UPSTREAM_HEADERS``; S3 carries
    none of the source's but its tags)."""
    refuse_unsupported(headers)
    return upstream_headers(headers)


def tagging_replaced(headers: Mapping[str, str]) -> bool:
    """``x-amz-tagging-directive``: COPY (the default: the source's tags) or REPLACE (the
    request's ``x-amz-tagging``, or none)."""
    directive = headers.get("x-amz-tagging-directive", "COPY").strip().upper()
    if directive not in ("COPY", "REPLACE"):
        raise InvalidArgument(
            "Unknown tagging directive.",
            ArgumentName="x-amz-tagging-directive",
            ArgumentValue=headers["x-amz-tagging-directive"],
        )
    return directive == "REPLACE"


def copy_range(headers: Mapping[str, str]) -> tuple[int, int] | None:
    raw = headers.get("x-amz-copy-source-range")
    if raw is None:
        return None
    match = _RANGE.fullmatch(raw.strip())
    if match is None:
        raise InvalidArgument(
            "The x-amz-copy-source-range value must be of the form bytes=first-last where "
            "first and last are the zero-based offsets of the first and last bytes to copy",
            ArgumentName="x-amz-copy-source-range",
            ArgumentValue=raw,
        )
    return int(match[1]), int(match[2])


def _xml(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/xml")


@handles(ops.CopyObject)
async def copy_object(
    request: web.Request, op: ops.CopyObject, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    svc.check_writable()
    source_bucket, source_key = parse_copy_source(op.copy_source)
    headers = request.headers
    req = CopyObjectRequest(
        source_bucket=source_bucket,
        source_key=source_key,
        bucket=op.bucket,
        key=op.key,
        conditions=copy_conditions(headers),
        replace=new_metadata(headers),
        is_changing_attributes=any(h in headers for h in _ATTRIBUTE_HEADERS),
        destination=write_preconditions(headers),
        target_headers=target_headers(headers),
        is_tagging_replaced=tagging_replaced(headers),
    )
    meta = await svc.copy.copy_object(req)
    return _xml(
        xml.document(
            "CopyObjectResult",
            {"LastModified": xml.iso8601(meta.last_modified_s), "ETag": f'"{meta.etag}"'},
        )
    )


@handles(ops.UploadPartCopy)
async def upload_part_copy(
    request: web.Request, op: ops.UploadPartCopy, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    svc.check_writable()
    if not op.part_number.isdigit():
        raise InvalidArgument(
            "Part number must be an integer between 1 and 10000, inclusive",
            ArgumentName="partNumber",
        )
    source_bucket, source_key = parse_copy_source(op.copy_source)
    req = UploadPartCopyRequest(
        source_bucket=source_bucket,
        source_key=source_key,
        bucket=op.bucket,
        key=op.key,
        upload_id=op.upload_id,
        part_number=int(op.part_number),
        conditions=copy_conditions(request.headers),
        byte_range=copy_range(request.headers),
    )
    part = await svc.copy.upload_part_copy(req)
    return _xml(
        xml.document(
            "CopyPartResult",
            {"LastModified": xml.iso8601(part.last_modified_s), "ETag": f'"{part.etag}"'},
        )
    )
