"""Read-through: objects only in the upstream (never written here, or evicted) are served
from it, and a full GET keeps a verified copy in the local cache (a restarting job reading
its last checkpoint back)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from harness import (
    flush_state,
    http_request,
    payload,
    quoted_md5,
    read_body,
    upstream_client,
)

KiB = 1024
MiB = 1024 * KiB


def _local_state(gw: Any, bucket: str, key: str) -> str | None:
    resp = http_request("GET", f"{gw.admin}/admin/v1/objects/{bucket}/{key}", timeout=10)
    return resp.json()["state"] if resp.status == 200 else None


def _wait_cached(gw: Any, bucket: str, key: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _local_state(gw, bucket, key) == "durable":
            return
        time.sleep(0.05)
    raise AssertionError(f"{key} was not cached")


@pytest.fixture
def origin(moto_server: str) -> Any:
    return upstream_client(moto_server)


def test_readthrough_full_get_populates_cache(
    gateway_factory: Any, origin: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    body = payload(3 * MiB + 17, seed="ckpt")
    origin.put_object(
        Bucket=bucket,
        Key="ckpt/step100/shard0",
        Body=body,
        ContentType="application/x-ckpt",
        Metadata={"step": "100"},
    )
    assert _local_state(gw, bucket, "ckpt/step100/shard0") is None

    head = s3.head_object(Bucket=bucket, Key="ckpt/step100/shard0")
    assert head["ETag"] == quoted_md5(body) and head["ContentLength"] == len(body)
    assert head["Metadata"] == {"step": "100"}
    assert _local_state(gw, bucket, "ckpt/step100/shard0") is None  # HEAD caches nothing

    ranged = s3.get_object(Bucket=bucket, Key="ckpt/step100/shard0", Range="bytes=100-4195")
    assert read_body(ranged) == body[100:4196]
    assert ranged["ContentRange"] == f"bytes 100-4195/{len(body)}"
    assert _local_state(gw, bucket, "ckpt/step100/shard0") is None  # a range caches nothing

    first = s3.get_object(Bucket=bucket, Key="ckpt/step100/shard0")
    assert read_body(first) == body
    assert first["ETag"] == quoted_md5(body)
    assert first["ContentType"] == "application/x-ckpt"
    assert first["Metadata"] == {"step": "100"}
    _wait_cached(gw, bucket, "ckpt/step100/shard0")

    # Served locally now: the upstream copy is gone, the gateway still has the bytes.
    origin.delete_object(Bucket=bucket, Key="ckpt/step100/shard0")
    second = s3.get_object(Bucket=bucket, Key="ckpt/step100/shard0")
    assert read_body(second) == body
    assert second["ETag"] == quoted_md5(body)
    assert second["Metadata"] == {"step": "100"}
    assert flush_state(second) == "durable"
    tail = s3.get_object(Bucket=bucket, Key="ckpt/step100/shard0", Range="bytes=-10")
    assert read_body(tail) == body[-10:]
    assert gw.status()["cache_used_bytes"] == len(body)
    assert gw.status()["pending_objects"] == 0  # a cached copy is never flushed back


def test_readthrough_multipart_object_is_cached_part_by_part(
    gateway_factory: Any, origin: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    parts = [payload(5 * MiB, seed="p1"), payload(5 * MiB, seed="p2"), payload(MiB, seed="p3")]
    upload = origin.create_multipart_upload(Bucket=bucket, Key="mp/obj")
    etags = [
        origin.upload_part(
            Bucket=bucket, Key="mp/obj", UploadId=upload["UploadId"], PartNumber=n, Body=part
        )["ETag"]
        for n, part in enumerate(parts, 1)
    ]
    origin.complete_multipart_upload(
        Bucket=bucket,
        Key="mp/obj",
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    got = s3.get_object(Bucket=bucket, Key="mp/obj")
    assert read_body(got) == b"".join(parts)
    etag = got["ETag"]
    assert etag.endswith('-3"')
    # Each part's MD5 checked against the multipart ETag: kept, one body file per part.
    _wait_cached(gw, bucket, "mp/obj")
    assert len(gw.blob_files(bucket, "mp/obj")) == 3
    origin.delete_object(Bucket=bucket, Key="mp/obj")
    again = s3.get_object(Bucket=bucket, Key="mp/obj")
    assert read_body(again) == b"".join(parts) and again["ETag"] == etag
    ranged = s3.get_object(Bucket=bucket, Key="mp/obj", Range=f"bytes={5 * MiB - 3}-{5 * MiB + 2}")
    assert read_body(ranged) == b"".join(parts)[5 * MiB - 3 : 5 * MiB + 3]


def test_readthrough_local_write_during_get_wins(
    gateway_factory: Any, origin: Any, bucket: str
) -> None:
    """A PUT through the gateway after the upstream read is what later reads see."""
    gw = gateway_factory()
    s3 = gw.client()
    old = payload(256 * KiB, seed="old")
    origin.put_object(Bucket=bucket, Key="race/k", Body=old)
    stream = s3.get_object(Bucket=bucket, Key="race/k")["Body"]
    first = stream.read(1024)
    new = payload(64 * KiB, seed="new")
    s3.put_object(Bucket=bucket, Key="race/k", Body=new)
    assert first + stream.read() == old
    got = s3.get_object(Bucket=bucket, Key="race/k")
    assert read_body(got) == new and got["ETag"] == quoted_md5(new)
    gw.drained(bucket=bucket)
    got = s3.get_object(Bucket=bucket, Key="race/k")
    assert read_body(got) == new
