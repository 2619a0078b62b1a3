"""GET/HEAD semantics beyond the happy path, through real boto3 against the gateway process
(moto upstream): ranges inside and across the part files of multipart objects, partNumber,
304/412 and their headers, conditional writes, response-header overrides, the round trip of
stored system headers, checksums on ranged reads, and boto3's ranged download_file."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from harness import (
    crc32_b64,
    error_code,
    error_status,
    object_url,
    payload,
    quoted_md5,
    read_body,
    sign_request,
)

MiB = 1 << 20
PART = 5 * MiB
# Three parts: two full 5 MiB parts and a short last one.
MP_SIZES = (PART, PART, 1234)
MP_BODY = payload(sum(MP_SIZES), seed="get-semantics-multipart")


def _status(resp: dict[str, Any]) -> int:
    return int(resp["ResponseMetadata"]["HTTPStatusCode"])


def _headers(resp: dict[str, Any]) -> dict[str, str]:
    headers: dict[str, str] = resp["ResponseMetadata"]["HTTPHeaders"]
    return headers


def _put_multipart(s3: Any, bucket: str, key: str, **create: Any) -> str:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, **create)["UploadId"]
    parts, offset = [], 0
    for number, size in enumerate(MP_SIZES, 1):
        chunk = MP_BODY[offset : offset + size]
        offset += size
        etag = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk
        )["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    etag: str = done["ETag"]
    assert etag.endswith(f'-{len(MP_SIZES)}"')
    return etag


def _raw(gateway: Any, method: str, bucket: str, key: str, **headers: str) -> Any:
    """A signed request over http.client, returning (status, [(name, value)], body) with
    header names exactly as the gateway spelled them."""
    url = object_url(gateway.endpoint, bucket, key)
    signed = sign_request(method, url, headers=dict(headers))
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    try:
        conn.request(method, parts.path, headers=signed.headers)
        resp = conn.getresponse()
        return resp.status, resp.getheaders(), resp.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- multipart


@pytest.fixture
def multipart(gateway: Any, s3: Any, bucket: str) -> Any:
    """A pending 3-part object (the flusher is paused until the test ends)."""
    gateway.pause_flush()
    try:
        etag = _put_multipart(s3, bucket, "mp.bin")
        yield bucket, "mp.bin", etag
    finally:
        gateway.resume_flush()


# (header, start, end) across the part boundaries at 5 MiB and 10 MiB.
MP_RANGES = [
    (f"bytes={PART - 10}-{PART + 9}", PART - 10, PART + 9),  # across the 1|2 boundary
    (f"bytes={PART}-{PART}", PART, PART),  # first byte of part 2
    (f"bytes={PART - 1}-{PART - 1}", PART - 1, PART - 1),  # last byte of part 1
    (f"bytes=100-{2 * PART + 50}", 100, 2 * PART + 50),  # spans all three files
    (f"bytes={2 * PART - 3}-", 2 * PART - 3, len(MP_BODY) - 1),  # into the short last part
    ("bytes=-2000", len(MP_BODY) - 2000, len(MP_BODY) - 1),  # suffix across 2|3
    (f"bytes={PART + 7}-{PART + 7000}", PART + 7, PART + 7000),  # inside part 2
]


@pytest.mark.parametrize(("header", "start", "end"), MP_RANGES)
def test_get_semantics_multipart_ranges_pending(
    s3: Any, multipart: Any, header: str, start: int, end: int
) -> None:
    bucket, key, etag = multipart
    resp = s3.get_object(Bucket=bucket, Key=key, Range=header)
    assert _status(resp) == 206
    assert resp["ContentRange"] == f"bytes {start}-{end}/{len(MP_BODY)}"
    assert resp["ContentLength"] == end - start + 1
    assert resp["ETag"] == etag
    assert read_body(resp) == MP_BODY[start : end + 1]


def test_get_semantics_multipart_ranges_flushed(gateway: Any, s3: Any, bucket: str) -> None:
    etag = _put_multipart(s3, bucket, "mp-flushed.bin")
    gateway.drained(bucket=bucket)
    for header, start, end in MP_RANGES:
        resp = s3.get_object(Bucket=bucket, Key="mp-flushed.bin", Range=header)
        assert resp["ContentRange"] == f"bytes {start}-{end}/{len(MP_BODY)}", header
        assert read_body(resp) == MP_BODY[start : end + 1], header
        assert resp["ETag"] == etag


def test_get_semantics_multipart_part_number(s3: Any, multipart: Any) -> None:
    bucket, key, etag = multipart
    offset = 0
    for number, size in enumerate(MP_SIZES, 1):
        resp = s3.get_object(Bucket=bucket, Key=key, PartNumber=number)
        assert _status(resp) == 206
        assert resp["PartsCount"] == len(MP_SIZES)
        assert resp["ContentLength"] == size
        assert resp["ContentRange"] == f"bytes {offset}-{offset + size - 1}/{len(MP_BODY)}"
        assert resp["ETag"] == etag  # the object's ETag, not the part's
        assert read_body(resp) == MP_BODY[offset : offset + size]
        head = s3.head_object(Bucket=bucket, Key=key, PartNumber=number)
        assert _status(head) == 206
        assert head["PartsCount"] == len(MP_SIZES)
        assert head["ContentLength"] == size
        assert head["ContentRange"] == resp["ContentRange"]
        offset += size

    # Without partNumber S3 does not report the parts count.
    plain = s3.head_object(Bucket=bucket, Key=key)
    assert _status(plain) == 200
    assert "PartsCount" not in plain
    assert plain["ContentLength"] == len(MP_BODY)

    for call in (s3.get_object, s3.head_object):
        with pytest.raises(ClientError) as exc:
            call(Bucket=bucket, Key=key, PartNumber=len(MP_SIZES) + 1)
        assert error_status(exc.value) == 416
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=key, PartNumber=4)
    assert error_code(exc.value) == "InvalidPartNumber"


def test_get_semantics_download_file_ranged(
    gateway: Any, s3: Any, upstream: Any, bucket: str, tmp_path: Path
) -> None:
    """boto3's download_file splits the object into ranged GETs (with If-Match): the file it
    assembles must be byte-identical, for a local multipart object and an upstream-only one."""
    _put_multipart(s3, bucket, "dl/mp.bin")
    remote_body = payload(3 * MiB + 333, seed="download-upstream-only")
    upstream.put_object(Bucket=bucket, Key="dl/remote.bin", Body=remote_body)
    config = TransferConfig(
        multipart_threshold=1 * MiB, multipart_chunksize=1 * MiB, max_concurrency=4
    )
    for key, body in (("dl/mp.bin", MP_BODY), ("dl/remote.bin", remote_body)):
        target = tmp_path / key.replace("/", "_")
        s3.download_file(bucket, key, str(target), Config=config)
        got = hashlib.sha256(target.read_bytes()).hexdigest()
        assert got == hashlib.sha256(body).hexdigest(), key


# --------------------------------------------------------------------------- single part


SMALL = payload(1000, seed="get-semantics-small")


@pytest.fixture
def small(s3: Any, bucket: str) -> tuple[str, str]:
    s3.put_object(Bucket=bucket, Key="small.bin", Body=SMALL)
    return bucket, "small.bin"


def test_get_semantics_ignored_ranges(s3: Any, small: tuple[str, str]) -> None:
    """S3 serves the whole object (200) for ranges it does not use."""
    bucket, key = small
    for header in ("bytes=0-1,5-6", "bytes=9-2", "bytes=abc", "items=0-9", "bytes=--5"):
        resp = s3.get_object(Bucket=bucket, Key=key, Range=header)
        assert _status(resp) == 200, header
        assert "ContentRange" not in resp, header
        assert read_body(resp) == SMALL, header


def test_get_semantics_unsatisfiable_range_headers(gateway: Any, s3: Any, small: Any) -> None:
    bucket, key = small
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=key, Range="bytes=1000-")
    assert (error_status(exc.value), error_code(exc.value)) == (416, "InvalidRange")
    assert _headers(exc.value.response)["content-range"] == f"bytes */{len(SMALL)}"
    assert exc.value.response["Error"]["ActualObjectSize"] == str(len(SMALL))


def test_get_semantics_empty_object(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="empty", Range="bytes=0-")
    assert (error_status(exc.value), error_code(exc.value)) == (416, "InvalidRange")
    assert _headers(exc.value.response)["content-range"] == "bytes */0"
    # A tail read of an empty object is the empty object (S3 answers 200).
    resp = s3.get_object(Bucket=bucket, Key="empty", Range="bytes=-100")
    assert _status(resp) == 200
    assert read_body(resp) == b""


def test_get_semantics_single_part_number(s3: Any, small: tuple[str, str]) -> None:
    bucket, key = small
    resp = s3.get_object(Bucket=bucket, Key=key, PartNumber=1)
    assert _status(resp) == 206
    assert resp["ContentRange"] == f"bytes 0-{len(SMALL) - 1}/{len(SMALL)}"
    assert "PartsCount" not in resp
    assert read_body(resp) == SMALL
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key=key, PartNumber=2)
    assert error_status(exc.value) == 416
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=key, PartNumber=2)
    assert error_code(exc.value) == "InvalidPartNumber"


def test_get_semantics_bad_part_number(gateway: Any, s3: Any, small: tuple[str, str]) -> None:
    bucket, key = small
    for bad in ("0", "10001", "x"):
        url = object_url(gateway.endpoint, bucket, key) + f"?partNumber={bad}"
        signed = sign_request("GET", url)
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        conn.request("GET", f"{parts.path}?{parts.query}", headers=signed.headers)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        assert resp.status == 400, bad
        assert b"<Code>InvalidArgument</Code>" in body
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=key, PartNumber=1, Range="bytes=0-1")
    assert (error_status(exc.value), error_code(exc.value)) == (400, "InvalidRequest")


def test_get_semantics_upstream_only(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    body = payload(4000, seed="upstream-only-range")
    upstream.put_object(Bucket=bucket, Key="remote", Body=body)
    resp = s3.get_object(Bucket=bucket, Key="remote", Range="bytes=1000-1999")
    assert _status(resp) == 206
    assert resp["ContentRange"] == "bytes 1000-1999/4000"
    assert read_body(resp) == body[1000:2000]
    whole = s3.get_object(Bucket=bucket, Key="remote", Range="bytes=0-1,5-6")
    assert _status(whole) == 200
    assert read_body(whole) == body
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="remote", Range="bytes=4000-")
    assert error_status(exc.value) == 416
    assert _headers(exc.value.response)["content-range"] == "bytes */4000"
    part = s3.get_object(Bucket=bucket, Key="remote", PartNumber=1)
    assert _status(part) == 206
    assert read_body(part) == body
    head = s3.head_object(Bucket=bucket, Key="remote", PartNumber=1)
    assert head["ContentLength"] == 4000
    # If-Match with a range, as AWS CLI / s3fs / s3torchconnector send it.
    etag = quoted_md5(body)
    ranged = s3.get_object(Bucket=bucket, Key="remote", Range="bytes=-10", IfMatch=etag)
    assert read_body(ranged) == body[-10:]
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="remote", Range="bytes=-10", IfMatch='"00"')
    assert error_status(exc.value) == 412


# --------------------------------------------------------------------------- conditionals


def test_get_semantics_if_match_with_range(gateway: Any, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="c", Body=SMALL)
    etag = quoted_md5(SMALL)
    for state in ("pending", "flushed"):
        if state == "flushed":
            gateway.drained(bucket=bucket)
        resp = s3.get_object(Bucket=bucket, Key="c", Range="bytes=10-19", IfMatch=etag)
        assert _status(resp) == 206
        assert read_body(resp) == SMALL[10:20]
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=bucket, Key="c", Range="bytes=10-19", IfMatch='"ab"')
        assert (error_status(exc.value), error_code(exc.value)) == (412, "PreconditionFailed")
        # Preconditions are evaluated before the range: 412, not 416.
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=bucket, Key="c", Range="bytes=5000-", IfMatch='"ab"')
        assert error_status(exc.value) == 412
        # A version changed under a reader: its If-Match no longer holds.
    s3.put_object(Bucket=bucket, Key="c", Body=b"new version")
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="c", Range="bytes=0-3", IfMatch=etag)
    assert error_status(exc.value) == 412


@pytest.mark.parametrize("where", ["local", "upstream-only"])
def test_get_semantics_not_modified_headers(
    gateway: Any, s3: Any, upstream: Any, bucket: str, where: str
) -> None:
    """A 304 has no body but carries the validators (ETag, Last-Modified)."""
    client = s3 if where == "local" else upstream
    client.put_object(Bucket=bucket, Key="nm", Body=SMALL)
    etag = quoted_md5(SMALL)
    for method in ("GET", "HEAD"):
        status, headers, body = _raw(gateway, method, bucket, "nm", **{"If-None-Match": etag})
        names = dict(headers)
        assert status == 304, method
        assert body == b""
        assert names["ETag"] == etag
        assert "Last-Modified" in names
        assert "x-amz-checksum-crc32" not in names


# --------------------------------------------------------------------------- conditional writes


def test_get_semantics_put_if_none_match(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    first = s3.put_object(Bucket=bucket, Key="once", Body=b"first", IfNoneMatch="*")
    assert first["ETag"] == quoted_md5(b"first")
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="once", Body=b"second", IfNoneMatch="*")
    assert (error_status(exc.value), error_code(exc.value)) == (412, "PreconditionFailed")
    assert read_body(s3.get_object(Bucket=bucket, Key="once")) == b"first"

    # Still refused once the first version is durable upstream ...
    gateway.drained(bucket=bucket)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="once", Body=b"third", IfNoneMatch="*")
    assert error_status(exc.value) == 412
    # ... and for a key that only the upstream has.
    upstream.put_object(Bucket=bucket, Key="remote-once", Body=b"r")
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="remote-once", Body=b"x", IfNoneMatch="*")
    assert error_status(exc.value) == 412

    # A deleted key is a missing key (the tombstone may still be pending).
    with gateway.flush_paused():
        s3.delete_object(Bucket=bucket, Key="once")
        again = s3.put_object(Bucket=bucket, Key="once", Body=b"recreated", IfNoneMatch="*")
        assert again["ETag"] == quoted_md5(b"recreated")
    gateway.drained(bucket=bucket)
    got = upstream.get_object(Bucket=bucket, Key="once")
    assert read_body(got) == b"recreated"

    # S3 implements If-None-Match on writes only for "*".
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="fresh", Body=b"x", IfNoneMatch=quoted_md5(b"x"))
    assert error_status(exc.value) == 501


def test_get_semantics_put_if_none_match_races(gateway: Any, s3: Any, bucket: str) -> None:
    """Concurrent create-only PUTs of one key: exactly one wins (checked at commit)."""
    outcomes: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def attempt(i: int) -> None:
        client = gateway.client()
        start.wait()
        try:
            client.put_object(
                Bucket=bucket, Key="race", Body=f"writer {i}".encode(), IfNoneMatch="*"
            )
            status = 200
        except ClientError as exc:
            status = error_status(exc)
        with lock:
            outcomes.append(status)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == [200] + [412] * 7
    winner = read_body(s3.get_object(Bucket=bucket, Key="race"))
    assert winner.startswith(b"writer ")


def test_get_semantics_put_if_match(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    v1 = s3.put_object(Bucket=bucket, Key="cas", Body=b"v1")["ETag"]
    v2 = s3.put_object(Bucket=bucket, Key="cas", Body=b"v2", IfMatch=v1)["ETag"]
    assert v2 == quoted_md5(b"v2")
    with pytest.raises(ClientError) as exc:  # v1 is stale now
        s3.put_object(Bucket=bucket, Key="cas", Body=b"v3", IfMatch=v1)
    assert (error_status(exc.value), error_code(exc.value)) == (412, "PreconditionFailed")
    assert read_body(s3.get_object(Bucket=bucket, Key="cas")) == b"v2"

    # S3: If-Match on a key that does not exist is 404 NoSuchKey.
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="nothing-here", Body=b"x", IfMatch=v1)
    assert (error_status(exc.value), error_code(exc.value)) == (404, "NoSuchKey")
    s3.delete_object(Bucket=bucket, Key="cas")
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="cas", Body=b"x", IfMatch=v2)
    assert error_status(exc.value) == 404

    # Against an upstream-only object: its ETag decides.
    remote = upstream.put_object(Bucket=bucket, Key="remote-cas", Body=b"r1")["ETag"]
    s3.put_object(Bucket=bucket, Key="remote-cas", Body=b"r2", IfMatch=remote)
    assert read_body(s3.get_object(Bucket=bucket, Key="remote-cas")) == b"r2"


# --------------------------------------------------------------------------- headers


# "compress", not "gzip": see test_get_semantics_gzip_body_stored_verbatim.
STORED = {
    "ContentType": "text/csv; charset=utf-8",
    "ContentEncoding": "compress",
    "ContentDisposition": 'attachment; filename="report 1.csv"',
    "ContentLanguage": "de-CH",
    "CacheControl": "max-age=3600, must-revalidate",
    "Metadata": {"owner": "Team-A", "shard-id": "0007"},
}
EXPIRES = "Thu, 01 Dec 2044 16:00:00 GMT"
RAW_NAMES = {
    "Content-Type": STORED["ContentType"],
    "Content-Encoding": "compress",
    "Content-Disposition": STORED["ContentDisposition"],
    "Content-Language": "de-CH",
    "Cache-Control": STORED["CacheControl"],
    "Expires": EXPIRES,
    "x-amz-meta-owner": "Team-A",
    "x-amz-meta-shard-id": "0007",
}


def _put_with_headers(s3: Any, bucket: str, key: str) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=SMALL, Expires=EXPIRES, **STORED)


@pytest.mark.parametrize("state", ["pending", "flushed", "multipart"])
def test_get_semantics_stored_headers_round_trip(
    gateway: Any, s3: Any, bucket: str, state: str
) -> None:
    if state == "multipart":
        _put_multipart(s3, bucket, "h", Expires=EXPIRES, **STORED)
    else:
        _put_with_headers(s3, bucket, "h")
    if state == "flushed":
        gateway.drained(bucket=bucket)
    for method in ("GET", "HEAD"):
        status, headers, _ = _raw(gateway, method, bucket, "h")
        assert status == 200
        got = dict(headers)
        for name, value in RAW_NAMES.items():
            assert got.get(name) == value, (method, name, got)
    head = s3.head_object(Bucket=bucket, Key="h")
    assert head["Metadata"] == STORED["Metadata"]
    assert head["CacheControl"] == STORED["CacheControl"]
    assert head["ContentDisposition"] == STORED["ContentDisposition"]


def test_get_semantics_stored_headers_upstream_only(
    gateway: Any, upstream: Any, bucket: str
) -> None:
    upstream.put_object(Bucket=bucket, Key="uh", Body=SMALL, Expires=EXPIRES, **STORED)
    status, headers, _ = _raw(gateway, "GET", bucket, "uh")
    assert status == 200
    got = {k.lower(): v for k, v in headers}
    for name, value in RAW_NAMES.items():
        assert got.get(name.lower()) == value, name


def test_get_semantics_gzip_body_stored_verbatim(s3: Any, bucket: str) -> None:
    """Content-Encoding describes the stored object; S3 never decodes a PUT body."""
    compressed = gzip.compress(SMALL)
    put = s3.put_object(Bucket=bucket, Key="gz", Body=compressed, ContentEncoding="gzip")
    assert put["ETag"] == quoted_md5(compressed)
    got = s3.get_object(Bucket=bucket, Key="gz")
    assert got["ContentEncoding"] == "gzip"
    assert read_body(got) == compressed


def test_get_semantics_response_overrides(gateway: Any, s3: Any, bucket: str) -> None:
    _put_with_headers(s3, bucket, "ov")
    overrides = {
        "ResponseContentType": "application/x-override",
        "ResponseContentLanguage": "fr",
        "ResponseExpires": "Fri, 02 Jan 2037 00:00:00 GMT",
        "ResponseCacheControl": "no-store",
        "ResponseContentDisposition": "inline",
        "ResponseContentEncoding": "identity",
    }
    for call in (s3.get_object, s3.head_object):
        resp = call(Bucket=bucket, Key="ov", **overrides)
        headers = _headers(resp)
        assert resp["ContentType"] == "application/x-override"
        assert resp["ContentLanguage"] == "fr"
        assert headers["expires"] == "Fri, 02 Jan 2037 00:00:00 GMT"
        assert resp["CacheControl"] == "no-store"
        assert resp["ContentDisposition"] == "inline"
        assert resp["ContentEncoding"] == "identity"
    # Overrides change the response only, never the stored object.
    assert s3.head_object(Bucket=bucket, Key="ov")["ContentType"] == STORED["ContentType"]


def test_get_semantics_no_checksum_on_partial(s3: Any, bucket: str) -> None:
    """A full-object checksum on a 206 would make boto3 fail its validation."""
    s3.put_object(Bucket=bucket, Key="ck", Body=SMALL, ChecksumAlgorithm="CRC32")
    full = s3.get_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED")
    assert full["ChecksumCRC32"] == crc32_b64(SMALL)
    assert read_body(full) == SMALL
    part = s3.get_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED", Range="bytes=1-100")
    assert _status(part) == 206
    assert not [h for h in _headers(part) if h.startswith("x-amz-checksum-")]
    assert read_body(part) == SMALL[1:101]
    by_part = s3.get_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED", PartNumber=1)
    assert not [h for h in _headers(by_part) if h.startswith("x-amz-checksum-")]
    assert read_body(by_part) == SMALL
    head = s3.head_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED", Range="bytes=0-9")
    assert not [h for h in _headers(head) if h.startswith("x-amz-checksum-")]


def _complete(s3: Any, bucket: str, key: str, **cond: str) -> dict[str, Any]:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"p")[
        "ETag"
    ]
    result: dict[str, Any] = s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
        **cond,
    )
    return result


def test_get_semantics_complete_conditional(s3: Any, upstream: Any, bucket: str) -> None:
    first = _complete(s3, bucket, "mpc", IfNoneMatch="*")["ETag"]
    with pytest.raises(ClientError) as exc:
        _complete(s3, bucket, "mpc", IfNoneMatch="*")
    assert (error_status(exc.value), error_code(exc.value)) == (412, "PreconditionFailed")
    second = _complete(s3, bucket, "mpc", IfMatch=first)["ETag"]
    assert second == first  # same single part, same multipart ETag
    with pytest.raises(ClientError) as exc:
        _complete(s3, bucket, "mpc", IfMatch='"0123"')
    assert error_status(exc.value) == 412
    with pytest.raises(ClientError) as exc:
        _complete(s3, bucket, "mpc-missing", IfMatch=first)
    assert (error_status(exc.value), error_code(exc.value)) == (404, "NoSuchKey")
    upstream.put_object(Bucket=bucket, Key="mpc-remote", Body=b"r")
    with pytest.raises(ClientError) as exc:
        _complete(s3, bucket, "mpc-remote", IfNoneMatch="*")
    assert error_status(exc.value) == 412
