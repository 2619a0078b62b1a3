"""Routing is a pure parse: a table of requests and the Operation each must become."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidURI, MethodNotAllowed
from gateway.s3 import operations as ops
from gateway.s3.routing import (
    BUCKET_SUBRESOURCES,
    OBJECT_SUBRESOURCES,
    parse_operation,
    split_host,
)

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
    ("GET", "h", "/b1/k", {"attributes": ""}, {}, ops.GetObjectAttributes("b1", "k")),
    # A bucket subresource at a key path is the bucket's operation (S3 ignores the key):
    # never a write, read or delete of the object.
    ("PUT", "h", "/b1/k", {"lifecycle": ""}, {}, ops.Unsupported("PUT ?lifecycle")),
    ("DELETE", "h", "/b1/k", {"lifecycle": ""}, {}, ops.Unsupported("DELETE ?lifecycle")),
    ("GET", "h", "/b1/k", {"policy": ""}, {}, ops.Unsupported("GET ?policy")),
    ("PUT", "h", "/b1/k", {"versioning": ""}, {}, ops.Unsupported("PUT ?versioning")),
    ("GET", "h", "/b1/k", {"location": ""}, {}, ops.GetBucketLocation("b1")),
    ("GET", "h", "/b1/k", {"uploads": ""}, {}, ops.ListMultipartUploads("b1")),
    ("POST", "h", "/b1/k", {"delete": ""}, {}, ops.DeleteObjects("b1")),
    # Object subresources the gateway does not implement.
    ("PUT", "h", "/b1/k", {"acl": ""}, {}, ops.Unsupported("PUT ?acl")),
    ("PUT", "h", "/b1/k", {"encryption": ""}, {}, ops.Unsupported("PUT ?encryption")),
    ("DELETE", "h", "/b1/k", {"tagging": ""}, {}, ops.Unsupported("DELETE ?tagging")),
    ("POST", "h", "/b1/k", {"restore": ""}, {}, ops.Unsupported("POST ?restore")),
    ("POST", "h", "/b1/k", {"select": "", "select-type": "2"}, {}, ops.Unsupported("POST ?select")),
    ("PUT", "h", "/b1/k", {"retention": ""}, {}, ops.Unsupported("PUT ?retention")),
    ("PUT", "h", "/b1/k", {"legal-hold": ""}, {}, ops.Unsupported("PUT ?legal-hold")),
    ("PUT", "h", "/b1/k", {"renameObject": ""}, {}, ops.Unsupported("PUT ?renameObject")),
    ("GET", "h", "/b1/k", {"torrent": ""}, {}, ops.Unsupported("GET ?torrent")),
    # A copy source does not turn a subresource request into CopyObject.
    (
        "PUT",
        "h",
        "/b1/k",
        {"tagging": ""},
        {"x-amz-copy-source": "/b1/j"},
        ops.Unsupported("PUT ?tagging"),
    ),
    # Unknown query parameters are ignored, as S3 does.
    ("PUT", "h", "/b1/k", {"foo": "bar"}, {}, ops.PutObject("b1", "k")),
    # Object-only subresources at a bucket path touch nothing.
    ("PUT", "h", "/b1", {"retention": ""}, {}, ops.Unsupported("PUT ?retention on a bucket")),
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


@pytest.mark.parametrize(
    ("method", "path", "query"),
    [
        ("POST", "/", {}),
        ("PATCH", "/b1/k", {}),
        ("POST", "/b1", {}),
        # A subresource that does not take the method: S3 answers 405.
        ("HEAD", "/b1/k", {"location": ""}),
        ("HEAD", "/b1/k", {"acl": ""}),
        ("PUT", "/b1/k", {"uploads": ""}),
        ("DELETE", "/b1/k", {"attributes": ""}),
        ("PUT", "/b1", {"location": ""}),
        ("DELETE", "/b1", {"versioning": ""}),
        ("HEAD", "/b1/k", {"uploadId": "u"}),
    ],
)
def test_routing_method_not_allowed(method: str, path: str, query: dict[str, str]) -> None:
    with pytest.raises(MethodNotAllowed):
        parse_operation(method, "h", path, query, {})


def _model_subresources() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(bucket, object) subresource -> methods, from botocore's S3 service model."""
    import botocore.loaders

    model = botocore.loaders.Loader().load_service_model("s3", "service-2")
    found: tuple[dict[str, set[str]], dict[str, set[str]]] = ({}, {})
    for operation in model["operations"].values():
        path, _, query = operation["http"]["requestUri"].partition("?")
        table = found[1] if "{Key+}" in path else found[0]
        for item in filter(None, query.split("&")):
            name = item.partition("=")[0]
            if name not in ("list-type", "select-type", "x-id"):
                table.setdefault(name, set()).add(operation["http"]["method"])
    return found


def test_routing_subresources_are_the_s3_api_models() -> None:
    """Every subresource of S3's API (botocore's model) is routed, with its methods: none
    falls through to an object read, write or delete."""
    bucket, obj = _model_subresources()
    assert {k: set(v) for k, v in BUCKET_SUBRESOURCES.items()} == bucket
    assert {k: set(v) for k, v in OBJECT_SUBRESOURCES.items()} == obj


@pytest.mark.parametrize("name", sorted(set(BUCKET_SUBRESOURCES) | set(OBJECT_SUBRESOURCES)))
@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "POST", "DELETE"])
def test_routing_no_subresource_reaches_an_object_operation(method: str, name: str) -> None:
    try:
        op = parse_operation(method, "h", "/b1/k", {name: ""}, {"x-amz-copy-source": "/b1/j"})
    except MethodNotAllowed:
        return
    implemented = (
        ops.Unsupported,
        ops.GetBucketLocation,
        ops.ListMultipartUploads,
        ops.DeleteObjects,
        ops.CreateMultipartUpload,
        ops.GetObjectAttributes,
    )
    assert isinstance(op, implemented), op


@pytest.mark.parametrize("path", ["/b1/caf\udce9", "/b1/%C3%A9\udcff"])
def test_routing_refuses_keys_s3_cannot_hold(path: str) -> None:
    with pytest.raises(InvalidURI):
        parse_operation("PUT", "h", path, {}, {})


def test_routing_rejects_invalid_utf8_path() -> None:
    # S3 answers escapes that do not decode as UTF-8 with 400 InvalidURI.
    with pytest.raises(InvalidURI):
        parse_operation("GET", "h", "/b1/%ff", {}, {})


def test_routing_virtual_host_needs_domain() -> None:
    assert split_host("b1.s3.test:9000", None) is None
    assert split_host("b1.s3.test:9000", "s3.test") == "b1"
    assert split_host("s3.test", "s3.test") is None
