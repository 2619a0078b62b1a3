"""DeleteObjects (POST /bucket?delete): verify and parse the XML body, one service call,
render ``DeleteResult``."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from typing import Any

import xmltodict
from aiohttp import web

from gateway.checksums import CHECKSUM_ALGORITHMS, b64, new_hasher
from gateway.core.deletes import MAX_KEYS_PER_REQUEST, DeleteEntry, DeleteOutcome
from gateway.errors import (
    BadDigest,
    InvalidDigest,
    InvalidRequest,
    MalformedXML,
    S3NotImplemented,
)
from gateway.s3 import operations as ops
from gateway.s3 import xml
from gateway.s3.auth import AuthContext
from gateway.s3.body import read_document
from gateway.s3.dispatch import S3Services, handles
from gateway.s3.metadata import refuse_unsupported

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


@handles(ops.DeleteObjects)
async def delete_objects(
    request: web.Request, op: ops.DeleteObjects, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    svc.check_writable()
    raw, trailers = await read_document(request, auth, svc.max_xml_body_bytes)
    verify_body(raw, request.headers, trailers)
    quiet, entries = parse_delete(raw)
    outcomes = await svc.deletes.delete_objects(op.bucket, entries)
    return web.Response(body=render_result(outcomes, quiet), content_type="application/xml")


def verify_body(raw: bytes, headers: Mapping[str, str], trailers: Mapping[str, str]) -> None:
    """S3 requires an integrity check on DeleteObjects: Content-MD5 or an x-amz-checksum-*
    (header or aws-chunked trailer; botocore sends CRC32). Every one given must match."""
    expected: dict[str, str] = {
        a: headers[f"x-amz-checksum-{a}"]
        for a in CHECKSUM_ALGORITHMS
        if f"x-amz-checksum-{a}" in headers
    }
    trailer = headers.get("x-amz-trailer", "").strip().lower()
    if trailer.startswith("x-amz-checksum-") and trailer in trailers:
        expected[trailer[15:]] = trailers[trailer]
    content_md5 = headers.get("Content-MD5")
    if content_md5 is None and not expected:
        raise InvalidRequest(
            "Missing required header for this request: Content-MD5 OR x-amz-checksum-*"
        )
    if content_md5 is not None:
        try:
            digest = base64.b64decode(content_md5, validate=True)
        except binascii.Error as exc:
            raise InvalidDigest() from exc
        if len(digest) != 16:
            raise InvalidDigest()
        if digest != hashlib.md5(raw).digest():
            raise BadDigest()
    for algorithm, value in expected.items():
        try:
            hasher = new_hasher(algorithm)
        except ValueError as exc:
            raise S3NotImplemented(f"Checksum algorithm {algorithm} is not supported yet.") from exc
        hasher.update(raw)
        if b64(hasher.digest()) != value:
            raise BadDigest(
                f"The {algorithm.upper()} you specified did not match the calculated checksum."
            )


def parse_delete(raw: bytes) -> tuple[bool, list[DeleteEntry]]:
    """(quiet, entries) of a ``<Delete>`` document, in request order. Whitespace inside a
    ``<Key>`` is part of the key, so it is kept."""
    try:
        doc: Any = xmltodict.parse(
            raw, force_list=("Object",), disable_entities=True, strip_whitespace=False
        )
    except Exception as exc:  # expat raises several unrelated types
        raise MalformedXML() from exc
    root = doc.get("Delete") if isinstance(doc, dict) else None
    if not isinstance(root, dict):
        raise MalformedXML()
    quiet_text = root.get("Quiet")
    quiet = isinstance(quiet_text, str) and quiet_text.strip().lower() == "true"
    objects = root.get("Object") or []
    if not objects or len(objects) > MAX_KEYS_PER_REQUEST:
        raise MalformedXML()
    entries = []
    for obj in objects:
        if not isinstance(obj, dict):
            raise MalformedXML()
        key, version, etag = obj.get("Key"), obj.get("VersionId"), obj.get("ETag")
        if not isinstance(key, str) or not all(
            v is None or isinstance(v, str) for v in (version, etag)
        ):
            raise MalformedXML()
        refuse_unsupported(obj, ("LastModifiedTime", "Size"))  # directory buckets' conditions
        entries.append(DeleteEntry(key, version, None if etag is None else etag.strip()))
    return quiet, entries


def render_result(outcomes: list[DeleteOutcome], quiet: bool) -> bytes:
    """``DeleteResult``: a ``Deleted`` per deleted key (none in quiet mode), an ``Error`` per
    key that could not be deleted."""
    deleted: list[dict[str, str]] = []
    errors: list[dict[str, str]] = []
    for outcome in outcomes:
        entry = outcome.entry
        item = {"Key": xml.xml_safe(entry.key)}
        if entry.version_id is not None:
            item["VersionId"] = xml.xml_safe(entry.version_id)
        if outcome.error is None:
            if not quiet:
                deleted.append(item)
        else:
            item.update(Code=outcome.error.code, Message=xml.xml_safe(outcome.error.message))
            errors.append(item)
    return xml.document("DeleteResult", {"Deleted": deleted, "Error": errors})
