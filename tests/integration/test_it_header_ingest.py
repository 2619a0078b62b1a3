"""Rule (a): nothing is acknowledged that the upstream cannot accept.

Every header the gateway stores and later sends upstream (user metadata, Content-Type,
Content-Encoding/Disposition/Language, Cache-Control, Expires) arrives as raw octets over a
real socket; each request is either refused with S3's error (nothing stored) or acknowledged,
then flushed to the moto upstream (drain answers drained), where the object carries the
metadata as S3 would store it. Covered for PutObject, CreateMultipartUpload and CopyObject
with ``x-amz-metadata-directive: REPLACE``.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_status, parse_s3_error
from s3raw import signed_raw

# octets sent -> what S3 stores and answers (ISO-8859-1 reading, RFC 2047 when not ASCII)
CAFE_UTF8 = ("café".encode(), "=?UTF-8?B?Y2Fmw4PCqQ==?=")
CAFE_LATIN1 = (b"caf\xe9", "=?UTF-8?B?Y2Fmw6k=?=")
GARBAGE_EXPIRES = "not a date, really"


def _put(gw: Any, bucket: str, key: str, raw: dict[str, bytes]) -> Any:
    return signed_raw(gw, "PUT", f"/{bucket}/{urllib.parse.quote(key)}", b"body", raw_headers=raw)


def _multipart(gw: Any, bucket: str, key: str, raw: dict[str, bytes]) -> Any:
    path = f"/{bucket}/{urllib.parse.quote(key)}"
    created = signed_raw(gw, "POST", path + "?uploads", raw_headers=raw)
    if created.status != 200:
        return created
    upload_id = re.search(rb"<UploadId>([^<]+)</UploadId>", created.body)
    assert upload_id is not None
    uid = upload_id.group(1).decode()
    part = signed_raw(gw, "PUT", f"{path}?partNumber=1&uploadId={uid}", b"body")
    assert part.status == 200, part.body
    done = (
        "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>"
        f"<ETag>{part.header('etag')}</ETag></Part></CompleteMultipartUpload>"
    ).encode()
    return signed_raw(gw, "POST", f"{path}?uploadId={uid}", done)


def _copy(gw: Any, bucket: str, key: str, raw: dict[str, bytes]) -> Any:
    source = signed_raw(gw, "PUT", f"/{bucket}/copy-source", b"body")
    assert source.status == 200
    headers = {"x-amz-copy-source": f"/{bucket}/copy-source", "x-amz-metadata-directive": "REPLACE"}
    return signed_raw(
        gw, "PUT", f"/{bucket}/{urllib.parse.quote(key)}", headers=headers, raw_headers=raw
    )


WRITES: dict[str, Callable[[Any, str, str, dict[str, bytes]], Any]] = {
    "put": _put,
    "multipart": _multipart,
    "copy-replace": _copy,
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_header_ingest_non_ascii_and_garbage_values_reach_the_upstream(
    gateway: Any, s3: Any, upstream: Any, bucket: str, write: str
) -> None:
    raw = {
        "x-amz-meta-utf8": CAFE_UTF8[0],
        "x-amz-meta-latin1": CAFE_LATIN1[0],
        "x-amz-meta-plain": b"=?UTF-8?B?kept as sent?=",
        "Expires": GARBAGE_EXPIRES.encode(),
        "Content-Disposition": b'attachment; filename="caf\xc3\xa9.txt"',
        "Content-Type": b"text/plain; charset=caf\xe9",
        "Content-Language": b"fr",
        "Cache-Control": b"max-age=60",
        "Content-Encoding": b"deflate, gzip",
    }
    resp = WRITES[write](gateway, bucket, "obj", raw)
    assert resp.status == 200, resp.body
    expected_meta = {
        "utf8": CAFE_UTF8[1],
        "latin1": CAFE_LATIN1[1],
        "plain": "=?UTF-8?B?kept as sent?=",
    }
    disposition = "=?UTF-8?B?YXR0YWNobWVudDsgZmlsZW5hbWU9ImNhZsODwqkudHh0Ig==?="
    content_type = "=?UTF-8?B?dGV4dC9wbGFpbjsgY2hhcnNldD1jYWbDqQ==?="

    def check(head: dict[str, Any]) -> None:
        assert head["Metadata"] == expected_meta
        assert head["ExpiresString"] == GARBAGE_EXPIRES
        assert head["ContentDisposition"] == disposition
        assert head["ContentType"] == content_type
        assert head["ContentLanguage"] == "fr"
        assert head["CacheControl"] == "max-age=60"
        assert head["ContentEncoding"] == "deflate, gzip"

    check(s3.head_object(Bucket=bucket, Key="obj"))
    assert gateway.drained(bucket=bucket)["drained"] is True
    assert gateway.object_state(bucket, "obj")["state"] == "durable"
    check(upstream.head_object(Bucket=bucket, Key="obj"))
    assert upstream.get_object(Bucket=bucket, Key="obj")["Body"].read() == b"body"


@pytest.mark.parametrize("write", sorted(WRITES))
def test_header_ingest_oversized_metadata_is_refused_and_nothing_stored(
    gateway: Any, s3: Any, bucket: str, write: str
) -> None:
    # 2 KB counted as S3 counts: the UTF-8 of what is stored (each é octet is 2 bytes).
    raw = {"x-amz-meta-big": b"\xe9" * 1030}
    resp = WRITES[write](gateway, bucket, "too-big", raw)
    assert resp.status == 400
    assert parse_s3_error(resp.body)["Code"] == "MetadataTooLarge"
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="too-big")
    assert error_status(exc.value) == 404
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_header_ingest_header_name_outside_http_tokens_is_refused(
    gateway: Any, s3: Any, bucket: str
) -> None:
    name: Any = "x-amz-meta-café".encode()  # http.client sends a bytes name as it is
    resp = _put(gateway, bucket, "bad-name", {name: b"v"})
    assert resp.status == 400
    assert parse_s3_error(resp.body)["Code"] == "BadRequest"
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="bad-name")
    assert error_status(exc.value) == 404
