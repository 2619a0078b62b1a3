"""Bucket-level operations: ListBuckets, Create/Delete/HeadBucket, GetBucketLocation,
ListObjects (v1) and ListObjectsV2."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import xmltodict
from aiohttp import web

from gateway.core.ingest import MAX_KEY_BYTES
from gateway.core.listing import resume_after
from gateway.errors import InvalidArgument, MalformedXML
from gateway.s3 import operations as ops
from gateway.s3 import xml
from gateway.s3.auth import AuthContext
from gateway.s3.body import read_document
from gateway.s3.dispatch import S3Services, handles

_MAX_KEYS = 1000
_MAX_CREATE_BODY_BYTES = 64 * 1024
# base64 of the longest key (1024 UTF-8 bytes), padding included.
_MAX_TOKEN_CHARS = 4 * ((MAX_KEY_BYTES + 2) // 3)


def _xml_response(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/xml")


@handles(ops.ListBuckets)
async def list_buckets(
    request: web.Request, op: ops.ListBuckets, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    return _xml_response(xml.list_buckets(await svc.buckets.list_buckets()))


@handles(ops.HeadBucket)
async def head_bucket(
    request: web.Request, op: ops.HeadBucket, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    await svc.buckets.head_bucket(op.bucket)
    return web.Response(status=200, headers={"x-amz-bucket-region": svc.region})


@handles(ops.GetBucketLocation)
async def get_bucket_location(
    request: web.Request, op: ops.GetBucketLocation, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    await svc.buckets.head_bucket(op.bucket)
    return _xml_response(xml.location(svc.region))


@handles(ops.CreateBucket)
async def create_bucket(
    request: web.Request, op: ops.CreateBucket, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    raw, _ = await read_document(request, auth, min(_MAX_CREATE_BODY_BYTES, svc.max_xml_body_bytes))
    location = _location_constraint(raw)
    await svc.buckets.create_bucket(op.bucket, location)
    return web.Response(status=200, headers={"Location": f"/{op.bucket}"})


def _location_constraint(raw: bytes) -> str | None:
    if not raw.strip():
        return None
    try:
        doc: Any = xmltodict.parse(raw, process_namespaces=False, disable_entities=True)
    except Exception as exc:  # expat's errors are not one class
        raise MalformedXML() from exc
    root = doc.get("CreateBucketConfiguration") if isinstance(doc, dict) else None
    if not isinstance(root, dict):
        raise MalformedXML()
    value = root.get("LocationConstraint")
    return value if isinstance(value, str) and value else None


@handles(ops.DeleteBucket)
async def delete_bucket(
    request: web.Request, op: ops.DeleteBucket, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    await svc.buckets.delete_bucket(op.bucket)
    return web.Response(status=204)


def _max_keys(value: str | None) -> int:
    if value is None:
        return _MAX_KEYS
    if not value.isdigit():
        raise InvalidArgument(
            "Provided max-keys not an integer or within integer range", ArgumentName="max-keys"
        )
    return min(int(value), _MAX_KEYS)


def _encoding_type(value: str | None) -> str | None:
    if value is not None and value != "url":
        raise InvalidArgument(
            "Invalid Encoding Method specified in Request", ArgumentName="encoding-type"
        )
    return value


def _token(value: str) -> str:
    """The listing position a continuation token of ours holds (the last name returned:
    UTF-8, at most 1024 bytes, base64url). Anything else was not issued here and is S3's
    InvalidArgument; it never reaches the upstream."""
    incorrect = InvalidArgument(
        "The continuation token provided is incorrect", ArgumentName="continuation-token"
    )
    if not value.isascii() or len(value) > _MAX_TOKEN_CHARS:
        raise incorrect
    try:
        name = base64.b64decode(value, altchars=b"-_", validate=True).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise incorrect from exc
    if not name or len(name.encode("utf-8")) > MAX_KEY_BYTES:
        raise incorrect
    return name


@handles(ops.ListObjectsV2)
async def list_objects_v2(
    request: web.Request, op: ops.ListObjectsV2, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    q = request.query
    prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
    max_keys, enc_type = _max_keys(q.get("max-keys")), _encoding_type(q.get("encoding-type"))
    token, start_after = q.get("continuation-token"), q.get("start-after", "")
    # An empty token is no position (S3 lists from the start and echoes it).
    after = resume_after(_token(token), prefix, delimiter) if token else start_after
    page = await svc.listing.list_objects(
        op.bucket, prefix=prefix, delimiter=delimiter, after=after, max_keys=max_keys
    )
    enc = xml.encoder(enc_type)
    fetch_owner = q.get("fetch-owner", "").lower() == "true"
    keys, prefixes = xml.contents(page.entries, enc, with_owner=fetch_owner)
    body: dict[str, Any] = {
        "Name": op.bucket,
        "Prefix": enc(prefix),
        "KeyCount": str(len(page.entries)),
        "MaxKeys": str(max_keys),
        "IsTruncated": str(page.is_truncated).lower(),
    }
    if delimiter:
        body["Delimiter"] = enc(delimiter)
    if enc_type:
        body["EncodingType"] = enc_type
    if token is not None:
        body["ContinuationToken"] = token
    if start_after:
        body["StartAfter"] = enc(start_after)
    if page.is_truncated and page.last_name is not None:
        body["NextContinuationToken"] = base64.urlsafe_b64encode(page.last_name.encode()).decode(
            "ascii"
        )
    body["Contents"], body["CommonPrefixes"] = keys, prefixes
    return _xml_response(xml.document("ListBucketResult", body))


@handles(ops.ListObjects)
async def list_objects(
    request: web.Request, op: ops.ListObjects, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    q = request.query
    if "start-after" in q:
        raise InvalidArgument(
            "startAfter only supported in REST.GET.BUCKET with list-type=2",
            ArgumentName="start-after",
        )
    prefix, delimiter, marker = q.get("prefix", ""), q.get("delimiter", ""), q.get("marker", "")
    max_keys, enc_type = _max_keys(q.get("max-keys")), _encoding_type(q.get("encoding-type"))
    after = resume_after(marker, prefix, delimiter) if marker else ""
    page = await svc.listing.list_objects(
        op.bucket, prefix=prefix, delimiter=delimiter, after=after, max_keys=max_keys
    )
    enc = xml.encoder(enc_type)
    keys, prefixes = xml.contents(page.entries, enc, with_owner=True)
    body: dict[str, Any] = {
        "Name": op.bucket,
        "Prefix": enc(prefix),
        "Marker": enc(marker),
        "MaxKeys": str(max_keys),
        "IsTruncated": str(page.is_truncated).lower(),
    }
    if delimiter:
        body["Delimiter"] = enc(delimiter)
        if page.is_truncated and page.last_name is not None:
            body["NextMarker"] = enc(page.last_name)
    if enc_type:
        body["EncodingType"] = enc_type
    body["Contents"], body["CommonPrefixes"] = keys, prefixes
    return _xml_response(xml.document("ListBucketResult", body))
