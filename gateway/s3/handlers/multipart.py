"""Multipart upload handlers: parse, one MultipartService call, render S3 XML."""

from __future__ import annotations

from typing import Any

import xmltodict
from aiohttp import web

from gateway.checksums import CHECKSUM_ALGORITHMS, checksum_type
from gateway.core.multipart import CompletedPart
from gateway.errors import InvalidArgument, MalformedXML
from gateway.s3 import operations as ops
from gateway.s3 import xml
from gateway.s3.auth import AuthContext
from gateway.s3.body import read_document, request_body
from gateway.s3.dispatch import S3Services, handles
from gateway.s3.handlers.objects import checksum_headers, put_request, write_preconditions
from gateway.s3.metadata import content_type, stored_headers, user_metadata
from gateway.s3.metrics import note_ingested
from gateway.s3.xml import iso8601

_MAX_LISTED = 1000


def _xml(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/xml")


def _int_arg(request: web.Request, name: str, default: int, *, upper: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isdigit():
        raise InvalidArgument(
            f"Provided {name} not an integer or within integer range", ArgumentName=name
        )
    return min(int(raw), upper)


@handles(ops.CreateMultipartUpload)
async def create_multipart_upload(
    request: web.Request, op: ops.CreateMultipartUpload, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    svc.check_writable()
    headers = request.headers
    algorithm, kind = headers.get("x-amz-checksum-algorithm"), headers.get("x-amz-checksum-type")
    upload_id = await svc.multipart.create(
        op.bucket,
        op.key,
        content_type(headers),
        user_metadata(headers),
        stored_headers(headers),
        algorithm,
        kind,
    )
    response = _xml(
        xml.document(
            "InitiateMultipartUploadResult",
            {"Bucket": op.bucket, "Key": op.key, "UploadId": upload_id},
        )
    )
    if algorithm:
        response.headers["x-amz-checksum-algorithm"] = algorithm.upper()
        response.headers["x-amz-checksum-type"] = (
            kind or ("FULL_OBJECT" if algorithm.lower() == "crc64nvme" else "COMPOSITE")
        ).upper()
    return response


@handles(ops.UploadPart)
async def upload_part(
    request: web.Request, op: ops.UploadPart, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    svc.check_writable()
    if not op.part_number.isdigit():
        raise InvalidArgument(
            "Part number must be an integer between 1 and 10000, inclusive",
            ArgumentName="partNumber",
        )
    body, length = request_body(request, auth)
    req = put_request(ops.PutObject(op.bucket, op.key), request.headers, length)
    part = await svc.multipart.upload_part(req, op.upload_id, int(op.part_number), body)
    note_ingested(request, part.size_bytes)
    headers = {"ETag": f'"{part.etag}"'}
    headers.update({f"x-amz-checksum-{a}": v for a, v in part.checksums.items()})
    return web.Response(status=200, headers=headers)


@handles(ops.CompleteMultipartUpload)
async def complete_multipart_upload(
    request: web.Request, op: ops.CompleteMultipartUpload, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    svc.check_writable()
    cond = write_preconditions(request.headers)
    raw, _ = await read_document(request, auth, svc.max_xml_body_bytes)
    parts = parse_completed_parts(raw)
    # A repeat of a Complete that succeeded answers as the first did, before preconditions
    # (If-None-Match: * would now see the object that Complete made).
    meta = await svc.multipart.completed(op.bucket, op.key, op.upload_id)
    if meta is None:
        check = await svc.objects.write_guard(op.bucket, op.key, cond)
        meta = await svc.multipart.complete(
            op.bucket, op.key, op.upload_id, parts, checksum_headers(request.headers), check
        )
    body = {
        "Location": f"{request.scheme}://{request.host}/{op.bucket}/{op.key}",
        "Bucket": op.bucket,
        "Key": op.key,
        "ETag": f'"{meta.etag}"',
    }
    for algorithm, value in meta.checksums.items():
        body[f"Checksum{algorithm.upper()}"] = value
        body["ChecksumType"] = checksum_type(value)
    return _xml(xml.document("CompleteMultipartUploadResult", body))


def parse_completed_parts(raw: bytes) -> list[CompletedPart]:
    """The (PartNumber, ETag) list of a CompleteMultipartUpload body, in request order."""
    try:
        doc: Any = xmltodict.parse(raw, force_list=("Part",), disable_entities=True)
    except Exception as exc:  # expat raises several unrelated types
        raise MalformedXML() from exc
    root = doc.get("CompleteMultipartUpload") if isinstance(doc, dict) else None
    if not isinstance(root, dict):
        raise MalformedXML()
    out = []
    for part in root.get("Part") or []:
        if not isinstance(part, dict):
            raise MalformedXML()
        number, etag = part.get("PartNumber"), part.get("ETag")
        if not isinstance(number, str) or not number.strip().isdigit() or not isinstance(etag, str):
            raise MalformedXML()
        sums = {
            a: part[f"Checksum{a.upper()}"]
            for a in CHECKSUM_ALGORITHMS
            if isinstance(part.get(f"Checksum{a.upper()}"), str)
        }
        out.append(CompletedPart(int(number), etag, sums))
    return out


@handles(ops.AbortMultipartUpload)
async def abort_multipart_upload(
    request: web.Request, op: ops.AbortMultipartUpload, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    await svc.multipart.abort(op.bucket, op.key, op.upload_id)
    return web.Response(status=204)


@handles(ops.ListParts)
async def list_parts(
    request: web.Request, op: ops.ListParts, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    limit = _int_arg(request, "max-parts", _MAX_LISTED, upper=_MAX_LISTED)
    after = _int_arg(request, "part-number-marker", 0, upper=10_000)
    _, parts, truncated = await svc.multipart.list_parts(
        op.bucket, op.key, op.upload_id, after, limit
    )
    body: dict[str, Any] = {
        "Bucket": op.bucket,
        "Key": op.key,
        "UploadId": op.upload_id,
        "Initiator": xml.OWNER,
        "Owner": xml.OWNER,
        "StorageClass": "STANDARD",
        "PartNumberMarker": str(after),
        "MaxParts": str(limit),
        "IsTruncated": str(truncated).lower(),
    }
    if truncated and parts:
        body["NextPartNumberMarker"] = str(parts[-1].part_number)
    body["Part"] = [
        {
            "PartNumber": str(p.part_number),
            "LastModified": iso8601(p.last_modified_s),
            "ETag": f'"{p.etag}"',
            "Size": str(p.size_bytes),
        }
        for p in parts
    ]
    return _xml(xml.document("ListPartsResult", body))


@handles(ops.ListMultipartUploads)
async def list_multipart_uploads(
    request: web.Request, op: ops.ListMultipartUploads, svc: S3Services, auth: AuthContext
) -> web.StreamResponse:
    q = request.query
    prefix, key_marker, id_marker = (
        q.get("prefix", ""),
        q.get("key-marker", ""),
        q.get("upload-id-marker", ""),
    )
    limit = _int_arg(request, "max-uploads", _MAX_LISTED, upper=_MAX_LISTED)
    uploads, truncated = await svc.multipart.list_uploads(
        op.bucket, prefix, key_marker, id_marker, limit
    )
    body: dict[str, Any] = {
        "Bucket": op.bucket,
        "KeyMarker": key_marker,
        "UploadIdMarker": id_marker,
        "Prefix": prefix,
        "MaxUploads": str(limit),
        "IsTruncated": str(truncated).lower(),
    }
    if truncated and uploads:
        body["NextKeyMarker"] = uploads[-1].key
        body["NextUploadIdMarker"] = uploads[-1].upload_id
    body["Upload"] = [
        {
            "Key": u.key,
            "UploadId": u.upload_id,
            "Initiator": xml.OWNER,
            "Owner": xml.OWNER,
            "StorageClass": "STANDARD",
            "Initiated": iso8601(u.created_s),
        }
        for u in uploads
    ]
    return _xml(xml.document("ListMultipartUploadsResult", body))
