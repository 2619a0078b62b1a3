"""PUT/GET/HEAD/DELETE roundtrips through the gateway, with real boto3 over a socket."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    error_code,
    error_status,
    flush_state,
    payload,
    quoted_md5,
    read_body,
    unique_bucket_name,
)

WEIRD_KEYS = [
    "with space.txt",
    "  leading and trailing spaces  ",
    "unicode/ünïcødé/日本語のキー.bin",
    "emoji-🚀-key",
    "percent%20literal%25and%",
    "plus+sign+key",
    "dir//x",
    "double//slash//in//middle/",
    "trailing-slash/",
    "query?chars&and=equals#hash",
    "semi;colon:colon,comma",
    "tilde~and'quote\"",
    "xml<special>&amp;chars",
    "brackets[]{}()!*$@^`|",
    "backslash\\key",
    "/leading-slash",
]


def _assert_get(s3: Any, bucket: str, key: str, body: bytes) -> dict[str, Any]:
    resp = s3.get_object(Bucket=bucket, Key=key)
    assert read_body(resp) == body
    assert resp["ETag"] == quoted_md5(body)
    assert resp["ContentLength"] == len(body)
    return resp


def test_put_get_head_delete(s3: Any, bucket: str) -> None:
    body = payload(256 * 1024 + 17, seed="roundtrip")
    put = s3.put_object(Bucket=bucket, Key="a/b/obj.bin", Body=body)
    assert put["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert put["ETag"] == quoted_md5(body)

    _assert_get(s3, bucket, "a/b/obj.bin", body)

    head = s3.head_object(Bucket=bucket, Key="a/b/obj.bin")
    assert head["ETag"] == quoted_md5(body)
    assert head["ContentLength"] == len(body)
    assert "LastModified" in head

    deleted = s3.delete_object(Bucket=bucket, Key="a/b/obj.bin")
    assert deleted["ResponseMetadata"]["HTTPStatusCode"] == 204

    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="a/b/obj.bin")
    assert error_code(exc.value) == "NoSuchKey"
    assert error_status(exc.value) == 404

    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="a/b/obj.bin")
    assert error_code(exc.value) == "404"
    assert error_status(exc.value) == 404


def test_overwrite_returns_newest(s3: Any, bucket: str) -> None:
    first, second = payload(1000, seed=1), payload(3333, seed=2)
    s3.put_object(Bucket=bucket, Key="k", Body=first)
    put = s3.put_object(Bucket=bucket, Key="k", Body=second)
    assert put["ETag"] == quoted_md5(second)
    _assert_get(s3, bucket, "k", second)
    assert s3.head_object(Bucket=bucket, Key="k")["ContentLength"] == len(second)


def test_zero_byte_object(s3: Any, bucket: str) -> None:
    put = s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    assert put["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"'
    resp = _assert_get(s3, bucket, "empty", b"")
    assert resp["ContentLength"] == 0
    head = s3.head_object(Bucket=bucket, Key="empty")
    assert head["ContentLength"] == 0
    assert head["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"'


def test_delete_missing_key_is_204(s3: Any, bucket: str) -> None:
    resp = s3.delete_object(Bucket=bucket, Key="never-existed")
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_user_metadata_and_content_type(s3: Any, bucket: str) -> None:
    body = b'{"hello": "world"}'
    meta = {"alpha": "one", "with-dash": "Value With Spaces", "num": "42"}
    s3.put_object(
        Bucket=bucket,
        Key="meta.json",
        Body=body,
        Metadata=meta,
        ContentType="application/json; charset=utf-8",
    )
    head = s3.head_object(Bucket=bucket, Key="meta.json")
    assert head["Metadata"] == meta
    assert head["ContentType"] == "application/json; charset=utf-8"
    got = _assert_get(s3, bucket, "meta.json", body)
    assert got["Metadata"] == meta
    assert got["ContentType"] == "application/json; charset=utf-8"


def test_metadata_replaced_by_overwrite(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="m", Body=b"1", Metadata={"old": "x"}, ContentType="text/a")
    s3.put_object(Bucket=bucket, Key="m", Body=b"2", Metadata={"new": "y"}, ContentType="text/b")
    head = s3.head_object(Bucket=bucket, Key="m")
    assert head["Metadata"] == {"new": "y"}
    assert head["ContentType"] == "text/b"


@pytest.mark.parametrize("key", WEIRD_KEYS)
def test_weird_keys_roundtrip(s3: Any, bucket: str, key: str) -> None:
    body = payload(777, seed=key)
    put = s3.put_object(Bucket=bucket, Key=key, Body=body)
    assert put["ETag"] == quoted_md5(body)
    _assert_get(s3, bucket, key, body)
    assert s3.head_object(Bucket=bucket, Key=key)["ETag"] == quoted_md5(body)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=key)
    assert [o["Key"] for o in listed.get("Contents", [])] == [key]
    s3.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=key)
    assert error_code(exc.value) == "NoSuchKey"


def test_weird_keys_are_distinct(s3: Any, bucket: str) -> None:
    """Keys that differ only in encoding-sensitive characters are different objects."""
    keys = ["dir/x", "dir//x", "a b", "a+b", "a%20b", "a%2Bb", "ü", "u\u0308"]
    for i, key in enumerate(keys):
        s3.put_object(Bucket=bucket, Key=key, Body=f"body-{i}".encode())
    for i, key in enumerate(keys):
        assert read_body(s3.get_object(Bucket=bucket, Key=key)) == f"body-{i}".encode()
    listed = s3.list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listed["Contents"]] == sorted(keys, key=lambda k: k.encode())


def test_max_length_key(s3: Any, bucket: str) -> None:
    key = "k/" + "x" * 1022
    assert len(key.encode()) == 1024
    body = b"longest key"
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    _assert_get(s3, bucket, key, body)


def test_max_length_multibyte_key(s3: Any, bucket: str) -> None:
    key = "é" * 512  # 1024 bytes of UTF-8
    assert len(key.encode()) == 1024
    s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    _assert_get(s3, bucket, key, b"x")


def test_key_too_long(s3: Any, bucket: str) -> None:
    key = "x" * 1025
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key=key, Body=b"too long")
    assert error_code(exc.value) == "KeyTooLongError"
    assert error_status(exc.value) == 400
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="x" * 1024)
    assert error_code(exc.value) == "NoSuchKey"


def test_key_too_long_multibyte(s3: Any, bucket: str) -> None:
    key = "é" * 512 + "x"  # 1025 bytes
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key=key, Body=b"too long")
    assert error_code(exc.value) == "KeyTooLongError"


def test_get_missing_key(s3: Any, bucket: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="missing/key")
    assert error_code(exc.value) == "NoSuchKey"
    assert error_status(exc.value) == 404


def test_missing_bucket(s3: Any) -> None:
    name = unique_bucket_name("nobucket")
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=name, Key="k")
    assert error_code(exc.value) == "NoSuchBucket"
    assert error_status(exc.value) == 404

    with pytest.raises(ClientError) as exc:
        s3.list_objects_v2(Bucket=name)
    assert error_code(exc.value) == "NoSuchBucket"
    assert error_status(exc.value) == 404

    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=name, Key="k")
    assert error_status(exc.value) == 404


def test_put_into_missing_bucket(s3: Any, upstream: Any) -> None:
    name = unique_bucket_name("nobucket")
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=name, Key="k", Body=b"data")
    assert error_code(exc.value) == "NoSuchBucket"
    assert error_status(exc.value) == 404
    # It was not created as a side effect.
    with pytest.raises(ClientError):
        upstream.head_bucket(Bucket=name)


def test_flush_state_header(gateway: Any, s3: Any, bucket: str, upstream: Any) -> None:
    body = payload(4096, seed="state")
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="state/obj", Body=body)
        head = s3.head_object(Bucket=bucket, Key="state/obj")
        assert flush_state(head) == "pending"
        got = s3.get_object(Bucket=bucket, Key="state/obj")
        assert read_body(got) == body
        assert flush_state(got) == "pending"
        # Paused means paused: the upstream has not seen it.
        with pytest.raises(ClientError):
            upstream.head_object(Bucket=bucket, Key="state/obj")
        status = gateway.status()
        assert status["flush_state"] == "paused"
        assert status["pending_objects"] >= 1
        assert status["pending_bytes"] >= len(body)
    drained = gateway.drained(bucket=bucket)
    assert drained["pending_objects"] == 0
    head = s3.head_object(Bucket=bucket, Key="state/obj")
    assert flush_state(head) == "durable"
    got = s3.get_object(Bucket=bucket, Key="state/obj")
    assert read_body(got) == body
    assert flush_state(got) == "durable"
    assert gateway.status()["flush_state"] == "running"


def test_get_after_flush_still_correct(gateway: Any, s3: Any, bucket: str) -> None:
    body = payload(100_000, seed="after-flush")
    s3.put_object(
        Bucket=bucket, Key="f", Body=body, Metadata={"k": "v"}, ContentType="application/x-f"
    )
    gateway.drained(bucket=bucket)
    got = _assert_get(s3, bucket, "f", body)
    assert got["Metadata"] == {"k": "v"}
    assert got["ContentType"] == "application/x-f"


def test_weird_keys_flush_to_the_same_upstream_keys(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    """Key encoding survives the flush: the upstream holds exactly the client's keys."""
    bodies = {key: payload(100 + i, seed=key) for i, key in enumerate(WEIRD_KEYS)}
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    gateway.drained(bucket=bucket)
    listed = upstream.list_objects_v2(Bucket=bucket)
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(bodies)
    for key, body in bodies.items():
        got = upstream.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body, key
        assert got["ETag"] == quoted_md5(body), key
    # And deletes of those keys reach the same upstream keys.
    for key in WEIRD_KEYS[::2]:
        s3.delete_object(Bucket=bucket, Key=key)
    gateway.drained(bucket=bucket)
    listed = upstream.list_objects_v2(Bucket=bucket)
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(WEIRD_KEYS[1::2])


def test_weird_upstream_only_keys_read_through(s3: Any, upstream: Any, bucket: str) -> None:
    """Keys that exist only upstream are fetched with the right encoding (read-through)."""
    bodies = {key: payload(50 + i, seed=f"up-{key}") for i, key in enumerate(WEIRD_KEYS)}
    for key, body in bodies.items():
        upstream.put_object(Bucket=bucket, Key=key, Body=body)
    for key, body in bodies.items():
        got = s3.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body, key
        assert got["ETag"] == quoted_md5(body), key
        assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(body), key
    listed = s3.list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listed["Contents"]] == sorted(bodies, key=lambda k: k.encode())
