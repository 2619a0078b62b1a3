"""Subresource requests on an object path never act on the object: every S3 subresource the
gateway does not implement answers S3's error (501 NotImplemented, or 405 for a method the
subresource does not take) and the object, locally and upstream, is untouched."""

from __future__ import annotations

from typing import Any

import pytest
from harness import parse_s3_error, read_body
from s3raw import signed_raw

BODY = b"the original object"
WRITE_SUBRESOURCES = [
    "lifecycle",
    "policy",
    "cors",
    "website",
    "versioning",
    "notification",
    "logging",
    "replication",
    "encryption",
    "tagging",
    "acl",
    "retention",
    "legal-hold",
    "object-lock",
    "accelerate",
    "requestPayment",
    "ownershipControls",
    "publicAccessBlock",
    "renameObject",
    "annotation",
]


@pytest.fixture
def seeded(gateway: Any, s3: Any, bucket: str) -> str:
    s3.put_object(Bucket=bucket, Key="k", Body=BODY)
    return bucket


@pytest.mark.parametrize("sub", WRITE_SUBRESOURCES)
def test_subresource_put_on_object_path_never_overwrites(
    gateway: Any, s3: Any, upstream: Any, seeded: str, sub: str
) -> None:
    resp = signed_raw(gateway, "PUT", f"/{seeded}/k?{sub}", b"<x/>")
    assert resp.status == 501, resp.body
    assert parse_s3_error(resp.body)["Code"] == "NotImplemented"
    assert resp.header("x-amz-request-id")
    assert read_body(s3.get_object(Bucket=seeded, Key="k")) == BODY


@pytest.mark.parametrize("sub", ["lifecycle", "policy", "cors", "website", "tagging", "encryption"])
def test_subresource_delete_on_object_path_never_deletes(
    gateway: Any, s3: Any, upstream: Any, seeded: str, sub: str
) -> None:
    resp = signed_raw(gateway, "DELETE", f"/{seeded}/k?{sub}")
    assert resp.status == 501, resp.body
    assert parse_s3_error(resp.body)["Code"] == "NotImplemented"
    assert read_body(s3.get_object(Bucket=seeded, Key="k")) == BODY


@pytest.mark.parametrize(
    ("method", "query", "status", "code"),
    [
        ("GET", "acl", 501, "NotImplemented"),
        ("GET", "torrent", 501, "NotImplemented"),
        ("GET", "versions", 501, "NotImplemented"),
        ("POST", "restore", 501, "NotImplemented"),
        ("POST", "select&select-type=2", 501, "NotImplemented"),
        ("HEAD", "location", 405, ""),
        ("DELETE", "attributes", 405, "MethodNotAllowed"),
        ("PUT", "uploads", 405, "MethodNotAllowed"),
    ],
)
def test_subresource_other_methods_touch_nothing(
    gateway: Any, s3: Any, seeded: str, method: str, query: str, status: int, code: str
) -> None:
    resp = signed_raw(gateway, method, f"/{seeded}/k?{query}", b"<x/>" if method != "HEAD" else b"")
    assert resp.status == status, resp.body
    if code:
        assert parse_s3_error(resp.body)["Code"] == code
    assert read_body(s3.get_object(Bucket=seeded, Key="k")) == BODY


def test_subresource_writes_never_reach_the_upstream(
    gateway: Any, s3: Any, upstream: Any, seeded: str
) -> None:
    for sub in WRITE_SUBRESOURCES:
        signed_raw(gateway, "PUT", f"/{seeded}/k?{sub}", b"<x/>")
        signed_raw(gateway, "DELETE", f"/{seeded}/k?{sub}")
    assert gateway.drained(bucket=seeded)["drained"] is True
    assert read_body(upstream.get_object(Bucket=seeded, Key="k")) == BODY


def test_subresource_location_at_a_key_is_the_buckets(gateway: Any, seeded: str) -> None:
    # S3 routes a bucket subresource at a key path to the bucket's operation.
    resp = signed_raw(gateway, "GET", f"/{seeded}/k?location")
    assert resp.status == 200
    assert b"<LocationConstraint" in resp.body
