"""Routing is a pure parse: a table of requests and the Operation each must become."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidURI, MethodNotAllowed
from gateway.s3 import operations as ops
from gateway.s3.routing import parse_operation, split_host

CASES = [
    # method, host, raw path, query, headers, expected
    ("GET", "127.0.0.1:9000", "/", {}, {}, ops.ListBuckets()),
    ("GET", "h", "/b1", {}, {}, ops.ListObjects("b1")),
    ("GET", "h", "/b1/", {"list-type": "2"}, {}, ops.ListObjectsV2("b1")),
    ("GET", "h", "/b1", {"location": ""}, {}, ops.GetBucketLocation("b1")),
    ("HEAD", "h", "/b1", {}, {}, ops.HeadBucket("b1")),
    ("PUT", "h", "/b1", {}, {}, ops.CreateBucket("b1")),
    ("DELETE", "h", "/b1", {}, {}, ops.DeleteBucket("b1")),
    ("PUT", "h", "/b1/a/b.pt", {}, {}, ops.PutObject("b1", "a/b.pt")),
    ("GET", "h", "/b1/a%20b%2Bc", {}, {}, ops.GetObject("b1", "a b+c")),
    ("HEAD", "h", "/b1/dir//x", {}, {}, ops.HeadObject("b1", "dir//x")),
    ("DELETE", "h", "/b1/%E2%82%AC", {}, {}, ops.DeleteObject("b1", "\u20ac")),
    ("GET", "h", "/b1/a/../b", {}, {}, ops.GetObject("b1", "a/../b")),
    ("GET", "h", "/b1/k", {"versionId": "null"}, {}, ops.GetObject("b1", "k")),
    ("GET", "h", "/b1/k", {"versionId": "3"}, {}, ops.Unsupported("versioned object access")),
    ("GET", "h", "/b1/k", {"tagging": ""}, {}, ops.Unsupported("GET ?tagging")),
    ("GET", "h", "/b1", {"policy": ""}, {}, ops.Unsupported("GET ?policy")),
    ("PUT", "h", "/b1/k", {}, {"x-amz-copy-source": "/b1/j"}, ops.CopyObject("b1", "k", "/b1/j")),
    ("POST", "h", "/b1", {"delete": ""}, {}, ops.DeleteObjects("b1")),
    ("POST", "h", "/b1/k", {"uploads": ""}, {}, ops.CreateMultipartUpload("b1", "k")),
    (
        "PUT",
        "h",
        "/b1/k",
        {"uploadId": "u", "partNumber": "3"},
        {},
        ops.UploadPart("b1", "k", "u", "3"),
    ),
    (
        "PUT",
        "h",
        "/b1/k",
        {"uploadId": "u", "partNumber": "3"},
        {"x-amz-copy-source": "/b/x"},
        ops.UploadPartCopy("b1", "k", "u", "3", "/b/x"),
    ),
    ("POST", "h", "/b1/k", {"uploadId": "u"}, {}, ops.CompleteMultipartUpload("b1", "k", "u")),
    ("DELETE", "h", "/b1/k", {"uploadId": "u"}, {}, ops.AbortMultipartUpload("b1", "k", "u")),
    ("GET", "h", "/b1/k", {"uploadId": "u", "max-parts": "2"}, {}, ops.ListParts("b1", "k", "u")),
    ("GET", "h", "/b1", {"uploads": ""}, {}, ops.ListMultipartUploads("b1")),
    # virtual-hosted style with --domain s3.test
    ("GET", "b1.s3.test:9000", "/", {"list-type": "2"}, {}, ops.ListObjectsV2("b1")),
    ("PUT", "b1.s3.test", "/k/x", {}, {}, ops.PutObject("b1", "k/x")),
    ("GET", "s3.test:9000", "/b1/k", {}, {}, ops.GetObject("b1", "k")),
]


@pytest.mark.parametrize(("method", "host", "path", "query", "headers", "expected"), CASES)
def test_routing_table(
    method: str,
    host: str,
    path: str,
    query: dict[str, str],
    headers: dict[str, str],
    expected: ops.Operation,
) -> None:
    assert parse_operation(method, host, path, query, headers, domain="s3.test") == expected


@pytest.mark.parametrize(("method", "path"), [("POST", "/"), ("PATCH", "/b1/k"), ("POST", "/b1")])
def test_routing_method_not_allowed(method: str, path: str) -> None:
    with pytest.raises(MethodNotAllowed):
        parse_operation(method, "h", path, {}, {})


def test_routing_rejects_invalid_utf8_path() -> None:
    # S3 answers escapes that do not decode as UTF-8 with 400 InvalidURI.
    with pytest.raises(InvalidURI):
        parse_operation("GET", "h", "/b1/%ff", {}, {})


def test_routing_virtual_host_needs_domain() -> None:
    assert split_host("b1.s3.test:9000", None) is None
    assert split_host("b1.s3.test:9000", "s3.test") == "b1"
    assert split_host("s3.test", "s3.test") is None
