"""Bucket operations: ListBuckets, HeadBucket, and CreateBucket/DeleteBucket passed upstream."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_code, error_status, unique_bucket_name


def _upstream_has(upstream: Any, name: str) -> bool:
    return name in [b["Name"] for b in upstream.list_buckets()["Buckets"]]


def test_list_buckets_shows_upstream_buckets(s3: Any, bucket: str) -> None:
    resp = s3.list_buckets()
    names = [b["Name"] for b in resp["Buckets"]]
    assert bucket in names
    for entry in resp["Buckets"]:
        assert "CreationDate" in entry


def test_head_bucket(s3: Any, bucket: str) -> None:
    resp = s3.head_bucket(Bucket=bucket)
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_head_missing_bucket(s3: Any) -> None:
    with pytest.raises(ClientError) as exc:
        s3.head_bucket(Bucket=unique_bucket_name("missing"))
    assert error_code(exc.value) == "404"
    assert error_status(exc.value) == 404


def test_create_and_delete_bucket_reach_upstream(gateway: Any, s3: Any, upstream: Any) -> None:
    name = unique_bucket_name("created")
    s3.create_bucket(Bucket=name)
    assert _upstream_has(upstream, name)
    upstream.head_bucket(Bucket=name)
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket=name)

    s3.put_object(Bucket=name, Key="k", Body=b"v")
    s3.delete_object(Bucket=name, Key="k")
    gateway.drained(bucket=name)

    s3.delete_bucket(Bucket=name)
    assert not _upstream_has(upstream, name)
    with pytest.raises(ClientError) as exc:
        s3.head_bucket(Bucket=name)
    assert error_status(exc.value) == 404
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=name, Key="k", Body=b"v")
    assert error_code(exc.value) == "NoSuchBucket"


def test_created_bucket_is_usable_at_once(gateway: Any, s3: Any, upstream: Any) -> None:
    name = unique_bucket_name("usable")
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="first", Body=b"hello")
    gateway.drained(bucket=name)
    assert upstream.get_object(Bucket=name, Key="first")["Body"].read() == b"hello"


def test_delete_missing_bucket(s3: Any) -> None:
    with pytest.raises(ClientError) as exc:
        s3.delete_bucket(Bucket=unique_bucket_name("gone"))
    assert error_code(exc.value) == "NoSuchBucket"
    assert error_status(exc.value) == 404


def test_delete_bucket_with_pending_objects_is_refused(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="pending", Body=b"not flushed yet")
        with pytest.raises(ClientError) as exc:
            s3.delete_bucket(Bucket=bucket)
        assert error_code(exc.value) == "BucketNotEmpty"
        assert error_status(exc.value) == 409
        assert _upstream_has(upstream, bucket)
    gateway.drained(bucket=bucket)
    assert upstream.get_object(Bucket=bucket, Key="pending")["Body"].read() == b"not flushed yet"


def test_delete_nonempty_upstream_bucket_is_refused(s3: Any, upstream: Any, bucket: str) -> None:
    upstream.put_object(Bucket=bucket, Key="upstream-object", Body=b"x")
    with pytest.raises(ClientError) as exc:
        s3.delete_bucket(Bucket=bucket)
    assert error_code(exc.value) == "BucketNotEmpty"
    assert error_status(exc.value) == 409
    assert _upstream_has(upstream, bucket)


def test_delete_bucket_emptied_through_gateway(gateway: Any, s3: Any, upstream: Any) -> None:
    """Put then delete without waiting for the flush: the bucket looks empty to the client, so
    DeleteBucket succeeds as in S3 (the gateway may ask the SDK to retry with SlowDown while
    the delete is still being flushed; the SDK's own retries absorb that)."""
    name = unique_bucket_name("emptied")
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="k", Body=b"v")
    s3.delete_object(Bucket=name, Key="k")
    assert s3.list_objects_v2(Bucket=name)["KeyCount"] == 0
    patient = gateway.client(retries=10)
    patient.delete_bucket(Bucket=name)
    assert not _upstream_has(upstream, name)
