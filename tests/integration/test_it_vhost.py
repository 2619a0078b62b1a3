"""Virtual-hosted-style addressing: Host ``<bucket>.s3.test:<port>`` (gateway runs with
``--domain s3.test``); ``*.s3.test`` resolves to 127.0.0.1 inside the test process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    DOMAIN,
    error_code,
    list_all_keys,
    payload,
    quoted_md5,
    read_body,
    resolve_to_loopback,
)


@pytest.fixture
def vhost(gateway: Any) -> Iterator[tuple[Any, list[str]]]:
    """A virtual-hosted-style client, and the list of URLs it sent requests to."""
    with resolve_to_loopback(DOMAIN):
        client = gateway.vhost_client()
        urls: list[str] = []
        client.meta.events.register(
            "before-send.s3", lambda request, **kw: urls.append(request.url)
        )
        yield client, urls


def test_vhost_roundtrip(gateway: Any, vhost: Any, s3: Any, bucket: str) -> None:
    client, urls = vhost
    body = payload(50_000, seed="vhost")
    put = client.put_object(Bucket=bucket, Key="v/obj one+two", Body=body, Metadata={"m": "1"})
    assert put["ETag"] == quoted_md5(body)
    # The request really went to <bucket>.s3.test:<port>, with the bucket not in the path.
    assert urls[-1].startswith(f"http://{bucket}.{DOMAIN}:{gateway.port}/v/"), urls[-1]

    got = client.get_object(Bucket=bucket, Key="v/obj one+two")
    assert read_body(got) == body
    assert got["ETag"] == quoted_md5(body)
    assert got["Metadata"] == {"m": "1"}
    head = client.head_object(Bucket=bucket, Key="v/obj one+two")
    assert head["ContentLength"] == len(body)

    client.put_object(Bucket=bucket, Key="v/second", Body=b"2")
    client.put_object(Bucket=bucket, Key="top", Body=b"3")
    assert list_all_keys(client, bucket) == ["top", "v/obj one+two", "v/second"]
    assert list_all_keys(client, bucket, MaxKeys=1) == ["top", "v/obj one+two", "v/second"]
    resp = client.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in resp["CommonPrefixes"]] == ["v/"]
    assert urls[-1].startswith(f"http://{bucket}.{DOMAIN}:{gateway.port}/?"), urls[-1]

    # Same objects through path-style addressing.
    assert read_body(s3.get_object(Bucket=bucket, Key="v/obj one+two")) == body
    s3.put_object(Bucket=bucket, Key="from-path-style", Body=b"p")
    assert read_body(client.get_object(Bucket=bucket, Key="from-path-style")) == b"p"

    client.delete_object(Bucket=bucket, Key="v/second")
    with pytest.raises(ClientError) as exc:
        client.get_object(Bucket=bucket, Key="v/second")
    assert error_code(exc.value) == "NoSuchKey"
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="v/second")
    assert error_code(exc.value) == "NoSuchKey"


def test_vhost_flush_and_upstream(gateway: Any, vhost: Any, upstream: Any, bucket: str) -> None:
    client, _ = vhost
    body = payload(4321, seed="vh-flush")
    client.put_object(Bucket=bucket, Key="dir/file", Body=body)
    gateway.drained(bucket=bucket)
    got = upstream.get_object(Bucket=bucket, Key="dir/file")
    assert read_body(got) == body
    assert got["ETag"] == quoted_md5(body)


def test_vhost_list_buckets_and_head_bucket(gateway: Any, vhost: Any, bucket: str) -> None:
    client, urls = vhost
    names = [b["Name"] for b in client.list_buckets()["Buckets"]]
    assert bucket in names
    assert urls[-1].startswith(f"http://{DOMAIN}:{gateway.port}/"), urls[-1]
    client.head_bucket(Bucket=bucket)
    assert urls[-1].startswith(f"http://{bucket}.{DOMAIN}:{gateway.port}"), urls[-1]


def test_vhost_missing_bucket(vhost: Any) -> None:
    client, _ = vhost
    with pytest.raises(ClientError) as exc:
        client.get_object(Bucket="no-such-bucket-vhost-test", Key="k")
    assert error_code(exc.value) == "NoSuchBucket"


def test_vhost_key_that_looks_like_a_bucket(vhost: Any, bucket: str) -> None:
    """Under virtual hosting the whole path is the key, even if it starts with a bucket name."""
    client, _ = vhost
    key = f"{bucket}/nested/key"
    client.put_object(Bucket=bucket, Key=key, Body=b"nested")
    assert read_body(client.get_object(Bucket=bucket, Key=key)) == b"nested"
    assert list_all_keys(client, bucket) == [key]
