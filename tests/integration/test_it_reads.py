"""GetObject/HeadObject details: Range and conditional requests, on pending objects, flushed
objects and upstream-only objects (read-through) alike."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_code, error_status, payload, quoted_md5, read_body

SIZE = 10_000
BODY = payload(SIZE, seed="ranges")

# Where the object lives when it is read: (name, setup(gateway, s3, upstream, bucket, key)).
Placement = Callable[[Any, Any, Any, str, str], None]


def _pending(gateway: Any, s3: Any, upstream: Any, bucket: str, key: str) -> None:
    gateway.pause_flush()
    s3.put_object(Bucket=bucket, Key=key, Body=BODY)


def _flushed(gateway: Any, s3: Any, upstream: Any, bucket: str, key: str) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=BODY)
    gateway.drained(bucket=bucket)


def _upstream_only(gateway: Any, s3: Any, upstream: Any, bucket: str, key: str) -> None:
    upstream.put_object(Bucket=bucket, Key=key, Body=BODY)


PLACEMENTS = [
    pytest.param(_pending, id="pending"),
    pytest.param(_flushed, id="flushed"),
    pytest.param(_upstream_only, id="upstream-only"),
]


@pytest.fixture(params=PLACEMENTS)
def placed(request: Any, gateway: Any, s3: Any, upstream: Any, bucket: str) -> Any:
    request.param(gateway, s3, upstream, bucket, "obj")
    try:
        yield bucket, "obj"
    finally:
        gateway.resume_flush()


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [
        ("bytes=0-9", 0, 9),
        ("bytes=100-199", 100, 199),
        ("bytes=9990-", 9990, SIZE - 1),
        ("bytes=-25", SIZE - 25, SIZE - 1),
        ("bytes=5000-99999", 5000, SIZE - 1),
        ("bytes=0-0", 0, 0),
        (f"bytes={SIZE - 1}-{SIZE - 1}", SIZE - 1, SIZE - 1),
    ],
)
def test_range_get(s3: Any, placed: Any, header: str, start: int, end: int) -> None:
    bucket, key = placed
    resp = s3.get_object(Bucket=bucket, Key=key, Range=header)
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert read_body(resp) == BODY[start : end + 1]
    assert resp["ContentLength"] == end - start + 1
    assert resp["ContentRange"] == f"bytes {start}-{end}/{SIZE}"
    assert resp["ETag"] == quoted_md5(BODY)


def test_range_not_satisfiable(s3: Any, placed: Any) -> None:
    bucket, key = placed
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={SIZE}-")
    assert error_code(exc.value) == "InvalidRange"
    assert error_status(exc.value) == 416


def test_full_get_advertises_ranges(s3: Any, placed: Any) -> None:
    bucket, key = placed
    resp = s3.get_object(Bucket=bucket, Key=key)
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert resp["AcceptRanges"] == "bytes"
    assert read_body(resp) == BODY


def test_conditional_get(s3: Any, placed: Any) -> None:
    bucket, key = placed
    etag = quoted_md5(BODY)
    # Matching If-Match / non-matching If-None-Match: served.
    assert read_body(s3.get_object(Bucket=bucket, Key=key, IfMatch=etag)) == BODY
    assert read_body(s3.get_object(Bucket=bucket, Key=key, IfNoneMatch='"0000"')) == BODY

    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=key, IfNoneMatch=etag)
    assert error_status(exc.value) == 304

    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=key, IfMatch='"0123456789abcdef0123456789abcdef"')
    assert error_code(exc.value) == "PreconditionFailed"
    assert error_status(exc.value) == 412

    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key=key, IfNoneMatch=etag)
    assert error_status(exc.value) == 304

    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key=key, IfMatch='"ffff"')
    assert error_status(exc.value) == 412


def test_conditional_dates(s3: Any, placed: Any) -> None:
    bucket, key = placed
    now = datetime.datetime.now(datetime.UTC)
    future = now + datetime.timedelta(days=1)
    past = now - datetime.timedelta(days=1)
    assert read_body(s3.get_object(Bucket=bucket, Key=key, IfModifiedSince=past)) == BODY
    assert read_body(s3.get_object(Bucket=bucket, Key=key, IfUnmodifiedSince=future)) == BODY
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=key, IfModifiedSince=future)
    assert error_status(exc.value) == 304
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=key, IfUnmodifiedSince=past)
    assert error_code(exc.value) == "PreconditionFailed"


def test_last_modified_consistent(s3: Any, bucket: str) -> None:
    """LastModified is the time of the acknowledged PUT; HEAD, GET and LIST agree on it (LIST
    to the second, as HTTP dates carry no fraction)."""
    s3.put_object(Bucket=bucket, Key="lm", Body=b"x")
    head = s3.head_object(Bucket=bucket, Key="lm")["LastModified"]
    now = datetime.datetime.now(datetime.UTC)
    assert abs((now - head).total_seconds()) < 60
    assert s3.get_object(Bucket=bucket, Key="lm")["LastModified"] == head
    listed = s3.list_objects_v2(Bucket=bucket)["Contents"][0]["LastModified"]
    assert listed.replace(microsecond=0) == head
