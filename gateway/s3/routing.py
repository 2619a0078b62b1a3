"""Routing: a pure parse of (method, host, path, query, headers) into a typed Operation.

No I/O and no aiohttp: table-tested in tests/unit/s3/test_routing.py. Addressing is
path-style (``/bucket/key``) or, when a base ``domain`` is configured, virtual-hosted-style
(``bucket.domain/key``). The key is the rest of the path after the bucket, verbatim
(``//`` and ``..`` are ordinary key characters in S3).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

from gateway.errors import InvalidArgument, InvalidURI, MethodNotAllowed
from gateway.s3 import operations as ops

# Query parameters that select a different operation on the same resource (S3 "subresources").
_BUCKET_SUBRESOURCES = frozenset(
    {
        "accelerate",
        "acl",
        "analytics",
        "cors",
        "delete",
        "encryption",
        "intelligent-tiering",
        "inventory",
        "lifecycle",
        "location",
        "logging",
        "metrics",
        "notification",
        "object-lock",
        "ownershipControls",
        "policy",
        "policyStatus",
        "publicAccessBlock",
        "replication",
        "requestPayment",
        "tagging",
        "uploads",
        "versioning",
        "versions",
        "website",
        "session",
        "metadataTable",
        "metadataConfiguration",
    }
)
_OBJECT_SUBRESOURCES = frozenset(
    {
        "acl",
        "attributes",
        "legal-hold",
        "retention",
        "restore",
        "select",
        "tagging",
        "torrent",
        "uploadId",
        "uploads",
        "renameObject",
    }
)


def split_host(host: str, domain: str | None) -> str | None:
    """The bucket named by a virtual-hosted-style Host header, if any."""
    if not domain:
        return None
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.lower().rstrip(".")
    suffix = "." + domain.lower()
    if name.endswith(suffix) and len(name) > len(suffix):
        return name[: -len(suffix)]
    return None


def split_path(raw_path: str, host_bucket: str | None) -> tuple[str | None, str | None]:
    """(bucket, key) from the raw (percent-encoded) path; key None means a bucket request."""
    try:
        path = unquote(raw_path, errors="strict")
    except UnicodeDecodeError as exc:
        # S3 answers a path whose percent-escapes are not UTF-8 with InvalidURI.
        raise InvalidURI() from exc
    if not path.startswith("/"):
        raise InvalidArgument("Invalid path.")
    if host_bucket is not None:
        key = path[1:]
        return host_bucket, (key or None)
    rest = path[1:]
    if not rest:
        return None, None
    bucket, sep, key = rest.partition("/")
    return bucket, (key if sep and key else None)


def parse_operation(
    method: str,
    host: str,
    raw_path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    *,
    domain: str | None = None,
) -> ops.Operation:
    """Map a request to its Operation. Raises MethodNotAllowed for a method the resource
    does not have; returns ``Unsupported`` for real S3 operations that are not implemented."""
    bucket, key = split_path(raw_path, split_host(host, domain))
    method = method.upper()
    if bucket is None:
        if method == "GET":
            return ops.ListBuckets()
        raise MethodNotAllowed()
    if key is None:
        return _bucket_operation(method, bucket, query)
    return _object_operation(method, bucket, key, query, headers)


def _bucket_operation(method: str, bucket: str, query: Mapping[str, str]) -> ops.Operation:
    sub = sorted(q for q in query if q in _BUCKET_SUBRESOURCES)
    if sub:
        if method == "GET" and sub == ["location"]:
            return ops.GetBucketLocation(bucket)
        if method == "GET" and sub == ["uploads"]:
            return ops.ListMultipartUploads(bucket)
        if method == "POST" and sub == ["delete"]:
            return ops.DeleteObjects(bucket)
        return ops.Unsupported(f"{method} ?{sub[0]}")
    if method == "GET":
        return (
            ops.ListObjectsV2(bucket) if query.get("list-type") == "2" else ops.ListObjects(bucket)
        )
    table: dict[str, type[ops.BucketOperation]] = {
        "HEAD": ops.HeadBucket,
        "PUT": ops.CreateBucket,
        "DELETE": ops.DeleteBucket,
    }
    if method in table:
        return table[method](bucket)
    raise MethodNotAllowed()


def _object_operation(
    method: str, bucket: str, key: str, query: Mapping[str, str], headers: Mapping[str, str]
) -> ops.Operation:
    sub = sorted(q for q in query if q in _OBJECT_SUBRESOURCES)
    if sub in (["uploadId"], ["uploads"]):
        return _multipart_operation(method, bucket, key, query, headers)
    if sub:
        return ops.Unsupported(f"{method} ?{sub[0]}")
    version = query.get("versionId")
    if version is not None and version != "null":
        # An unversioned bucket only has the "null" version (rclone asks for it by name).
        return ops.Unsupported("versioned object access")
    if method == "PUT":
        if "x-amz-copy-source" in headers:
            return ops.CopyObject(bucket, key, headers["x-amz-copy-source"])
        return ops.PutObject(bucket, key)
    table: dict[str, type[ops.ObjectOperation]] = {
        "GET": ops.GetObject,
        "HEAD": ops.HeadObject,
        "DELETE": ops.DeleteObject,
    }
    if method in table:
        return table[method](bucket, key)
    if method == "POST":
        return ops.Unsupported("POST object")
    raise MethodNotAllowed()


def _multipart_operation(
    method: str, bucket: str, key: str, query: Mapping[str, str], headers: Mapping[str, str]
) -> ops.Operation:
    if "uploads" in query:
        if method == "POST":
            return ops.CreateMultipartUpload(bucket, key)
        raise MethodNotAllowed()
    upload_id = query["uploadId"]
    if method == "PUT" and "partNumber" in query:
        if "x-amz-copy-source" in headers:
            return ops.UploadPartCopy(
                bucket, key, upload_id, query["partNumber"], headers["x-amz-copy-source"]
            )
        return ops.UploadPart(bucket, key, upload_id, query["partNumber"])
    table: dict[
        str, type[ops.CompleteMultipartUpload | ops.AbortMultipartUpload | ops.ListParts]
    ] = {
        "POST": ops.CompleteMultipartUpload,
        "DELETE": ops.AbortMultipartUpload,
        "GET": ops.ListParts,
    }
    if method in table:
        return table[method](bucket, key, upload_id)
    raise MethodNotAllowed()
