"""Integrity on ingest: aws-chunked bodies (unsigned with a CRC32 trailer, and signed chunks),
x-amz-checksum-* headers and Content-MD5. A bad body is refused and never becomes visible."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    aws_chunked_signed,
    aws_chunked_unsigned,
    content_md5,
    crc32_b64,
    error_code,
    error_status,
    object_url,
    parse_s3_error,
    payload,
    quoted_md5,
    read_body,
    send_signed,
    sign_request,
    signed_chunked_body_length,
    upstream_objects,
)

UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
SIGNED_STREAMING = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
BAD_DIGEST_CODES = ("BadDigest", "InvalidRequest")


def _unsigned_chunked_put(
    gateway: Any,
    bucket: str,
    key: str,
    data: bytes,
    *,
    trailer_crc: str | None = None,
    chunk_size: int = 64 * 1024,
) -> Any:
    crc = trailer_crc if trailer_crc is not None else crc32_b64(data)
    body = aws_chunked_unsigned(data, chunk_size, trailers={"x-amz-checksum-crc32": crc})
    req = sign_request(
        "PUT",
        object_url(gateway.endpoint, bucket, key),
        headers={
            "Content-Encoding": "aws-chunked",
            "x-amz-trailer": "x-amz-checksum-crc32",
            "x-amz-decoded-content-length": str(len(data)),
            "Content-Length": str(len(body)),
            "Content-Type": "application/octet-stream",
        },
        body=body,
        content_sha256=UNSIGNED_TRAILER,
    )
    return send_signed(req)


def _signed_chunked_put(
    gateway: Any,
    bucket: str,
    key: str,
    data: bytes,
    *,
    chunk_size: int = 64 * 1024,
    tamper_chunk: int | None = None,
) -> Any:
    length = signed_chunked_body_length(len(data), chunk_size)
    req = sign_request(
        "PUT",
        object_url(gateway.endpoint, bucket, key),
        headers={
            "Content-Encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(len(data)),
            "Content-Length": str(length),
        },
        content_sha256=SIGNED_STREAMING,
    )
    body = aws_chunked_signed(
        data,
        seed_signature=req.signature,
        timestamp=req.timestamp,
        chunk_size=chunk_size,
        tamper_chunk=tamper_chunk,
    )
    assert len(body) == length
    return send_signed(req, body=body)


@pytest.mark.parametrize(
    ("size", "chunk_size"),
    [(0, 64 * 1024), (1, 64 * 1024), (200_000, 64 * 1024), (1024 * 1024 + 5, 8192)],
)
def test_aws_chunked_unsigned_trailer(
    gateway: Any, s3: Any, bucket: str, size: int, chunk_size: int
) -> None:
    data = payload(size, seed=f"chunked-{size}")
    resp = _unsigned_chunked_put(gateway, bucket, "chunked/obj", data, chunk_size=chunk_size)
    assert resp.status == 200, resp.body
    assert resp.header("etag") == quoted_md5(data)
    got = s3.get_object(Bucket=bucket, Key="chunked/obj")
    assert read_body(got) == data
    assert got["ETag"] == quoted_md5(data)
    assert got["ContentLength"] == len(data)
    # The aws-chunked content coding is not part of the stored object.
    assert got.get("ContentEncoding") in (None, "")
    with_checksum = s3.get_object(Bucket=bucket, Key="chunked/obj", ChecksumMode="ENABLED")
    assert with_checksum.get("ChecksumCRC32") == crc32_b64(data)
    assert read_body(with_checksum) == data


def test_aws_chunked_bad_trailer_crc(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    data = payload(150_000, seed="bad-crc")
    wrong = crc32_b64(data + b"!")
    resp = _unsigned_chunked_put(gateway, bucket, "chunked/bad", data, trailer_crc=wrong)
    assert resp.status == 400, resp.body
    assert parse_s3_error(resp.body)["Code"] in BAD_DIGEST_CODES
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="chunked/bad")
    assert error_code(exc.value) == "NoSuchKey"
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    gateway.drained(bucket=bucket)
    assert upstream_objects(upstream, bucket) == {}


def test_aws_chunked_bad_trailer_keeps_previous_version(gateway: Any, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"version one")
    data = payload(70_000, seed="v2")
    resp = _unsigned_chunked_put(gateway, bucket, "k", data, trailer_crc=crc32_b64(b"other"))
    assert resp.status == 400
    got = s3.get_object(Bucket=bucket, Key="k")
    assert read_body(got) == b"version one"
    assert got["ETag"] == quoted_md5(b"version one")


def test_aws_chunked_flushes_plain_bytes(gateway: Any, upstream: Any, bucket: str) -> None:
    data = payload(300_000, seed="chunked-flush")
    assert _unsigned_chunked_put(gateway, bucket, "c/f", data).status == 200
    gateway.drained(bucket=bucket)
    got = upstream.get_object(Bucket=bucket, Key="c/f")
    assert read_body(got) == data
    assert got["ETag"] == quoted_md5(data)


def test_aws_chunked_truncated_body(gateway: Any, s3: Any, bucket: str) -> None:
    """A decoded length that disagrees with the chunks is refused, nothing stored."""
    data = payload(10_000, seed="trunc")
    body = aws_chunked_unsigned(data, 4096, trailers={"x-amz-checksum-crc32": crc32_b64(data)})
    req = sign_request(
        "PUT",
        object_url(gateway.endpoint, bucket, "trunc"),
        headers={
            "Content-Encoding": "aws-chunked",
            "x-amz-trailer": "x-amz-checksum-crc32",
            "x-amz-decoded-content-length": str(len(data) + 100),
            "Content-Length": str(len(body)),
        },
        body=body,
        content_sha256=UNSIGNED_TRAILER,
    )
    resp = send_signed(req)
    assert 400 <= resp.status < 500, resp.body
    assert parse_s3_error(resp.body)["Code"]
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="trunc")
    assert error_status(exc.value) == 404


@pytest.mark.parametrize("size", [0, 5000, 300_000])
def test_aws_chunked_signed_chunks(gateway: Any, s3: Any, bucket: str, size: int) -> None:
    data = payload(size, seed=f"signed-{size}")
    resp = _signed_chunked_put(gateway, bucket, "signed/obj", data)
    assert resp.status == 200, resp.body
    assert resp.header("etag") == quoted_md5(data)
    got = s3.get_object(Bucket=bucket, Key="signed/obj")
    assert read_body(got) == data
    assert got["ETag"] == quoted_md5(data)


def test_aws_chunked_bad_chunk_signature(gateway: Any, s3: Any, bucket: str) -> None:
    data = payload(200_000, seed="bad-sig")
    resp = _signed_chunked_put(gateway, bucket, "signed/bad", data, tamper_chunk=1)
    assert resp.status == 403, resp.body
    assert parse_s3_error(resp.body)["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="signed/bad")
    assert error_code(exc.value) == "NoSuchKey"


def test_boto3_default_put_sends_and_verifies_crc32(s3: Any, bucket: str) -> None:
    data = payload(123_456, seed="boto-crc")
    sent: dict[str, str] = {}

    def capture(request: Any, **_: Any) -> None:
        for k, v in request.headers.items():
            sent[k.lower()] = v.decode() if isinstance(v, bytes) else v

    s3.meta.events.register("before-send.s3.PutObject", capture)
    try:
        s3.put_object(Bucket=bucket, Key="boto/crc", Body=data)
    finally:
        s3.meta.events.unregister("before-send.s3.PutObject", capture)
    # What the test relies on: boto3 sent a checksum header with the plain body.
    assert sent.get("x-amz-checksum-crc32") == crc32_b64(data), sent
    got = s3.get_object(Bucket=bucket, Key="boto/crc", ChecksumMode="ENABLED")
    assert read_body(got) == data
    assert got.get("ChecksumCRC32") == crc32_b64(data)


def test_tampered_crc32_header(s3: Any, bucket: str) -> None:
    data = payload(40_000, seed="tampered")
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="boto/bad", Body=data, ChecksumCRC32=crc32_b64(b"x"))
    assert error_code(exc.value) in BAD_DIGEST_CODES
    assert error_status(exc.value) == 400
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="boto/bad")
    assert error_status(exc.value) == 404


def test_tampered_crc32_header_raw(gateway: Any, s3: Any, bucket: str) -> None:
    """The header is signed correctly but does not match the body."""
    data = b"plain body with a wrong checksum header"
    req = sign_request(
        "PUT",
        object_url(gateway.endpoint, bucket, "raw/bad"),
        headers={"x-amz-checksum-crc32": crc32_b64(data[:-1])},
        body=data,
    )
    resp = send_signed(req)
    assert resp.status == 400, resp.body
    assert parse_s3_error(resp.body)["Code"] in BAD_DIGEST_CODES
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="raw/bad")


@pytest.mark.parametrize(
    ("algorithm", "param", "digest"),
    [
        ("SHA256", "ChecksumSHA256", lambda d: base64.b64encode(hashlib.sha256(d).digest())),
        ("SHA1", "ChecksumSHA1", lambda d: base64.b64encode(hashlib.sha1(d).digest())),
    ],
)
def test_other_checksum_headers(
    s3: Any, bucket: str, algorithm: str, param: str, digest: Any
) -> None:
    data = payload(9999, seed=algorithm)
    good = digest(data).decode()
    s3.put_object(Bucket=bucket, Key=f"sum/{algorithm}", Body=data, **{param: good})
    got = s3.get_object(Bucket=bucket, Key=f"sum/{algorithm}", ChecksumMode="ENABLED")
    assert read_body(got) == data
    assert got.get(param) == good
    with pytest.raises(ClientError) as exc:
        s3.put_object(
            Bucket=bucket, Key=f"sum/{algorithm}-bad", Body=data, **{param: digest(b"").decode()}
        )
    assert error_code(exc.value) in BAD_DIGEST_CODES


def test_content_md5(s3: Any, bucket: str) -> None:
    data = payload(5000, seed="md5")
    s3.put_object(Bucket=bucket, Key="md5/good", Body=data, ContentMD5=content_md5(data))
    assert read_body(s3.get_object(Bucket=bucket, Key="md5/good")) == data

    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="md5/bad", Body=data, ContentMD5=content_md5(b"other"))
    assert error_code(exc.value) == "BadDigest"
    assert error_status(exc.value) == 400

    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="md5/invalid", Body=data, ContentMD5="not-an-md5")
    assert error_code(exc.value) == "InvalidDigest"
    assert error_status(exc.value) == 400

    for key in ("md5/bad", "md5/invalid"):
        with pytest.raises(ClientError):
            s3.head_object(Bucket=bucket, Key=key)
