"""Object cases of ceph/s3-tests (test_s3.py: test_object_*), rewritten against the gateway
with the moto upstream: the same requests through boto3 (hooks where s3-tests uses them),
the same codes and values asserted. Each test names the s3-tests case it mirrors."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_code, error_status, read_body


def _meta_roundtrip(s3: Any, bucket: str, value: str) -> str:
    s3.put_object(Bucket=bucket, Key="foo", Body=b"bar", Metadata={"meta1": value})
    got: str = s3.get_object(Bucket=bucket, Key="foo")["Metadata"]["meta1"]
    return got


def test_object_set_get_metadata_none_to_good(s3: Any, bucket: str) -> None:
    assert _meta_roundtrip(s3, bucket, "mymeta") == "mymeta"


def test_object_set_get_metadata_none_to_empty(s3: Any, bucket: str) -> None:
    assert _meta_roundtrip(s3, bucket, "") == ""


def test_object_set_get_metadata_overwrite_to_empty(s3: Any, bucket: str) -> None:
    assert _meta_roundtrip(s3, bucket, "oldmeta") == "oldmeta"
    assert _meta_roundtrip(s3, bucket, "") == ""


def test_object_set_get_unicode_metadata(s3: Any, bucket: str) -> None:
    """s3-tests sends 'Hello World\\xe9' through a hook (botocore refuses it as a parameter;
    it goes out as UTF-8). The gateway answers what S3 stores for it: the value's octets read
    as ISO-8859-1, RFC 2047 encoded (README, Decisions)."""

    def set_unicode_metadata(**kwargs: Any) -> None:
        kwargs["params"]["headers"]["x-amz-meta-meta1"] = "Hello World\xe9"

    s3.meta.events.register("before-call.s3.PutObject", set_unicode_metadata)
    try:
        s3.put_object(Bucket=bucket, Key="foo", Body=b"bar")
    finally:
        s3.meta.events.unregister("before-call.s3.PutObject", set_unicode_metadata)
    got = s3.get_object(Bucket=bucket, Key="foo")["Metadata"]["meta1"]
    assert got == "=?UTF-8?B?SGVsbG8gV29ybGTDg8Kp?="


def test_object_metadata_replaced_on_put(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="foo", Body=b"bar", Metadata={"meta1": "bar"})
    s3.put_object(Bucket=bucket, Key="foo", Body=b"bar")
    assert s3.get_object(Bucket=bucket, Key="foo")["Metadata"] == {}


def test_object_write_cache_control(s3: Any, bucket: str) -> None:
    cache_control = "public, max-age=14400"
    s3.put_object(Bucket=bucket, Key="foo", Body=b"bar", CacheControl=cache_control)
    head = s3.head_object(Bucket=bucket, Key="foo")
    assert head["ResponseMetadata"]["HTTPHeaders"]["cache-control"] == cache_control


def test_object_write_expires(s3: Any, bucket: str) -> None:
    expires = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(
        seconds=6000
    )
    s3.put_object(Bucket=bucket, Key="foo", Body=b"bar", Expires=expires)
    head = s3.head_object(Bucket=bucket, Key="foo")
    assert head["ExpiresString"] == expires.strftime("%a, %d %b %Y %H:%M:%S GMT")


def test_object_content_encoding_aws_chunked(s3: Any, bucket: str) -> None:
    """Content-Encoding is stored as sent less aws-chunked, also on a plain (non-streaming)
    body that names aws-chunked."""
    for sent, stored in (
        ("gzip", "gzip"),
        ("deflate, gzip", "deflate, gzip"),
        ("gzip, aws-chunked", "gzip"),
        ("aws-chunked, gzip", "gzip"),
        ("aws-chunked", None),
        ("aws-chunked, aws-chunked", None),
    ):
        s3.put_object(Bucket=bucket, Key="encoding", ContentEncoding=sent)
        head = s3.head_object(Bucket=bucket, Key="encoding")
        assert head.get("ContentEncoding") == stored, sent


def test_object_write_check_etag(s3: Any, bucket: str) -> None:
    resp = s3.put_object(Bucket=bucket, Key="foo", Body=b"bar")
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert resp["ETag"] == '"37b51d194a7513e45b56f6524f2d51f2"'


def test_object_read_not_exist(s3: Any, bucket: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="bar")
    assert error_status(exc.value) == 404
    assert error_code(exc.value) == "NoSuchKey"


def test_object_requestid_matches_header_on_error(s3: Any, bucket: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="bar")
    meta = exc.value.response["ResponseMetadata"]
    assert meta["RequestId"] == meta["HTTPHeaders"]["x-amz-request-id"]


def test_object_head_zero_bytes(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="foo", Body=b"")
    assert s3.head_object(Bucket=bucket, Key="foo")["ContentLength"] == 0


def test_object_write_to_nonexist_bucket(s3: Any) -> None:
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket="whatchutalkinboutwillis", Key="foo", Body=b"foo")
    assert error_status(exc.value) == 404
    assert error_code(exc.value) == "NoSuchBucket"


def test_object_write_read_update_read_delete(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="foo", Body=b"bar")
    assert read_body(s3.get_object(Bucket=bucket, Key="foo")) == b"bar"
    s3.put_object(Bucket=bucket, Key="foo", Body=b"soup")
    assert read_body(s3.get_object(Bucket=bucket, Key="foo")) == b"soup"
    s3.delete_object(Bucket=bucket, Key="foo")
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="foo")


def test_object_copy_zero_size(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="foo123bar", Body=b"")
    s3.copy({"Bucket": bucket, "Key": "foo123bar"}, bucket, "bar321foo")
    assert s3.get_object(Bucket=bucket, Key="bar321foo")["ContentLength"] == 0


def test_object_copy_verify_contenttype(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="foo123bar", Body=b"foo", ContentType="text/bla")
    s3.copy_object(Bucket=bucket, Key="bar321foo", CopySource=f"{bucket}/foo123bar")
    assert s3.get_object(Bucket=bucket, Key="bar321foo")["ContentType"] == "text/bla"


def test_object_copy_to_itself(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="foo123bar", Body=b"foo")
    with pytest.raises(ClientError) as exc:
        s3.copy_object(Bucket=bucket, Key="foo123bar", CopySource=f"{bucket}/foo123bar")
    assert error_status(exc.value) == 400
    assert error_code(exc.value) == "InvalidRequest"


def test_object_copy_to_itself_with_metadata(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="foo123bar", Body=b"foo")
    s3.copy_object(
        Bucket=bucket,
        Key="foo123bar",
        CopySource=f"{bucket}/foo123bar",
        Metadata={"foo": "bar"},
        MetadataDirective="REPLACE",
    )
    assert s3.get_object(Bucket=bucket, Key="foo123bar")["Metadata"] == {"foo": "bar"}


def test_object_copy_retaining_metadata(s3: Any, bucket: str) -> None:
    for size in (3, 1024 * 1024):
        body = b"A" * size
        s3.put_object(
            Bucket=bucket,
            Key="foo123bar",
            Body=body,
            Metadata={"key1": "value1", "key2": "value2"},
            ContentType="audio/ogg",
        )
        s3.copy_object(Bucket=bucket, Key="bar321foo", CopySource=f"{bucket}/foo123bar")
        got = s3.get_object(Bucket=bucket, Key="bar321foo")
        assert got["ContentType"] == "audio/ogg"
        assert got["Metadata"] == {"key1": "value1", "key2": "value2"}
        assert got["ContentLength"] == size


def test_object_copy_replacing_metadata(s3: Any, bucket: str) -> None:
    for size in (3, 1024 * 1024):
        s3.put_object(
            Bucket=bucket,
            Key="foo123bar",
            Body=b"A" * size,
            Metadata={"key1": "value1", "key2": "value2"},
            ContentType="audio/ogg",
        )
        metadata = {"key3": "value3", "key2": "value2"}
        s3.copy_object(
            Bucket=bucket,
            Key="bar321foo",
            CopySource=f"{bucket}/foo123bar",
            Metadata=metadata,
            MetadataDirective="REPLACE",
            ContentType="audio/mpeg",
        )
        got = s3.get_object(Bucket=bucket, Key="bar321foo")
        assert got["ContentType"] == "audio/mpeg"
        assert got["Metadata"] == metadata
        assert got["ContentLength"] == size


def test_object_copy_key_not_found(s3: Any, bucket: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.copy_object(Bucket=bucket, Key="bar321foo", CopySource=f"{bucket}/foo123bar")
    assert error_status(exc.value) == 404
    assert error_code(exc.value) == "NoSuchKey"


def test_object_metadata_reaches_the_upstream_as_s3_keeps_it(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    """Beyond s3-tests: what these cases stored is flushed, and the upstream holds it."""
    s3.put_object(
        Bucket=bucket,
        Key="foo",
        Body=b"bar",
        Metadata={"meta1": "x"},
        CacheControl="no-cache",
        ContentEncoding="deflate, gzip",
    )
    gateway.drained(bucket=bucket)
    head = upstream.head_object(Bucket=bucket, Key="foo")
    assert head["Metadata"] == {"meta1": "x"}
    assert head["CacheControl"] == "no-cache"
    assert head["ContentEncoding"] == "deflate, gzip"
