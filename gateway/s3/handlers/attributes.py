"""GetObjectAttributes: parse the attribute list and part paging, one service call, render.

``x-amz-object-attributes`` names what to return (ETag, Checksum, ObjectParts, StorageClass,
ObjectSize; botocore sends them comma-separated); ``x-amz-max-parts`` and
``x-amz-part-number-marker`` page ObjectParts. The ETag is unquoted in this document, as S3
returns it there.
"""

from __future__ import annotations

import email.utils
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web

from gateway.checksums import checksum_type
from gateway.errors import InvalidArgument, S3NotImplemented
from gateway.models import ObjectAttributes
from gateway.s3 import operations as ops
from gateway.s3 import xml
from gateway.s3.auth import AuthContext
from gateway.s3.dispatch import S3Services, handles

ATTRIBUTES = ("ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize")
_MAX_PARTS = 1000


def requested_attributes(values: Iterable[str]) -> set[str]:
    """The attribute names of the x-amz-object-attributes header(s); S3's InvalidArgument
    for none or an unknown one."""
    names = {n.strip() for value in values for n in value.split(",") if n.strip()}
    if not names or not names <= set(ATTRIBUTES):
        raise InvalidArgument(
            "Invalid attribute name specified.",
            ArgumentName="x-amz-object-attributes",
            ArgumentValue=",".join(sorted(names)),
        )
    return names


def _int_header(headers: Mapping[str, str], name: str, default: int, upper: int) -> int:
    raw = headers.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.strip().isdigit():
        raise InvalidArgument(
            f"Provided {name} not an integer or within integer range", ArgumentName=name
        )
    return min(int(raw), upper)


def attributes_document(attrs: ObjectAttributes, wanted: set[str]) -> bytes:
    """The GetObjectAttributesResponse holding the ``wanted`` attributes S3 would report."""
    body: dict[str, Any] = {}
    if "ETag" in wanted:
        body["ETag"] = attrs.etag
    if "Checksum" in wanted and attrs.checksums:
        checksum = {f"Checksum{a.upper()}": v for a, v in attrs.checksums.items()}
        checksum["ChecksumType"] = checksum_type(next(iter(attrs.checksums.values())))
        body["Checksum"] = checksum
    if "ObjectParts" in wanted and attrs.parts_count is not None:
        body["ObjectParts"] = _parts(attrs)
    if "StorageClass" in wanted:
        body["StorageClass"] = attrs.storage_class
    if "ObjectSize" in wanted:
        body["ObjectSize"] = str(attrs.size_bytes)
    return xml.document("GetObjectAttributesResponse", body)


def _parts(attrs: ObjectAttributes) -> dict[str, Any]:
    algorithm = next(iter(attrs.checksums), None)
    parts: dict[str, Any] = {
        "PartsCount": str(attrs.parts_count),
        "PartNumberMarker": str(attrs.part_number_marker),
        "MaxParts": str(attrs.max_parts),
        "IsTruncated": str(attrs.is_truncated).lower(),
    }
    if attrs.parts:
        parts["NextPartNumberMarker"] = str(attrs.parts[-1].part_number)
    listed = []
    for part in attrs.parts:
        item = {"PartNumber": str(part.part_number), "Size": str(part.size_bytes)}
        if part.checksum is not None and algorithm is not None:
            item[f"Checksum{algorithm.upper()}"] = part.checksum
        listed.append(item)
    parts["Part"] = listed
    return parts


@handles(ops.GetObjectAttributes)
async def get_object_attributes(
    request: web.Request, op: ops.GetObjectAttributes, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    wanted = requested_attributes(request.headers.getall("x-amz-object-attributes", ()))
    if request.query.get("versionId", "null") != "null":
        raise S3NotImplemented("Versioned object access is not implemented by this gateway.")
    max_parts = _int_header(request.headers, "x-amz-max-parts", _MAX_PARTS, _MAX_PARTS)
    marker = _int_header(request.headers, "x-amz-part-number-marker", 0, 10_000)
    attrs = await svc.attributes.get_object_attributes(
        op.bucket, op.key, max_parts=max_parts, part_number_marker=marker
    )
    headers = {"Last-Modified": email.utils.formatdate(attrs.last_modified_s, usegmt=True)}
    return web.Response(
        body=attributes_document(attrs, wanted), content_type="application/xml", headers=headers
    )
