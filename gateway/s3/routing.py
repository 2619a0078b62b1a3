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

# S3's subresources: query parameters that select another operation on the same resource,
# with the methods each operation of the S3 API takes. Derived from the S3 API model
# (botocore's service-2.json: every operation's requestUri query), and kept equal to it by
# tests/unit/s3/test_routing.py, so a subresource the gateway does not implement can never
# fall through to PutObject / GetObject / DeleteObject.
_G, _P, _D, _POST = "GET", "PUT", "DELETE", "POST"
BUCKET_SUBRESOURCES: dict[str, frozenset[str]] = {
    name: frozenset(methods)
    for name, methods in {
        "abac": (_G, _P),
        "accelerate": (_G, _P),
        "acl": (_G, _P),
        "analytics": (_D, _G, _P),
        "cors": (_D, _G, _P),
        "delete": (_POST,),
        "encryption": (_D, _G, _P),
        "intelligent-tiering": (_D, _G, _P),
        "inventory": (_D, _G, _P),
        "lifecycle": (_D, _G, _P),
        "location": (_G,),
        "logging": (_G, _P),
        "metadataAnnotationTable": (_P,),
        "metadataConfiguration": (_D, _G, _POST),
        "metadataInventoryTable": (_P,),
        "metadataJournalTable": (_P,),
        "metadataTable": (_D, _G, _POST),
        "metrics": (_D, _G, _P),
        "notification": (_G, _P),
        "object-lock": (_G, _P),
        "ownershipControls": (_D, _G, _P),
        "policy": (_D, _G, _P),
        "policyStatus": (_G,),
        "publicAccessBlock": (_D, _G, _P),
        "replication": (_D, _G, _P),
        "requestPayment": (_G, _P),
        "session": (_G,),
        "tagging": (_D, _G, _P),
        "uploads": (_G,),
        "versioning": (_G, _P),
        "versions": (_G,),
        "website": (_D, _G, _P),
    }.items()
}
OBJECT_SUBRESOURCES: dict[str, frozenset[str]] = {
    name: frozenset(methods)
    for name, methods in {
        "acl": (_G, _P),
        "annotation": (_D, _G, _P),
        "attributes": (_G,),
        "encryption": (_P,),
        "legal-hold": (_G, _P),
        "renameObject": (_P,),
        "restore": (_POST,),
        "retention": (_G, _P),
        "select": (_POST,),
        "tagging": (_D, _G, _P),
        "torrent": (_G,),
        "uploads": (_POST,),
    }.items()
}
# The multipart operations on an upload name it with this query parameter.
_UPLOAD_ID = "uploadId"


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
    if not _is_utf8(path):
        # Raw path bytes that are not UTF-8 (aiohttp keeps them as surrogate escapes) name no
        # S3 key, and the upstream client could never send one: refused as S3 refuses
        # escapes that do not decode.
        raise InvalidURI()
    if host_bucket is not None:
        key = path[1:]
        return host_bucket, (key or None)
    rest = path[1:]
    if not rest:
        return None, None
    bucket, sep, key = rest.partition("/")
    return bucket, (key if sep and key else None)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    subs = sorted(q for q in query if q in BUCKET_SUBRESOURCES or q in OBJECT_SUBRESOURCES)
    if subs:
        return _bucket_subresource(method, bucket, subs)
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


def _bucket_subresource(method: str, bucket: str, subs: list[str]) -> ops.Operation:
    """A bucket subresource request (at the bucket, or at a key of it: S3 routes those to the
    bucket's operation and ignores the key). 405 when no named subresource takes the method;
    the three the gateway implements; 501 for the rest, which touches nothing."""
    usable = [s for s in subs if method in BUCKET_SUBRESOURCES.get(s, ())]
    if not usable:
        if any(s in BUCKET_SUBRESOURCES for s in subs):
            raise MethodNotAllowed()
        return ops.Unsupported(f"{method} ?{subs[0]} on a bucket")
    if usable == subs:
        if subs == ["location"]:
            return ops.GetBucketLocation(bucket)
        if subs == ["uploads"]:
            return ops.ListMultipartUploads(bucket)
        if subs == ["delete"]:
            return ops.DeleteObjects(bucket)
    return ops.Unsupported(f"{method} ?{usable[0]}")


def _object_operation(
    method: str, bucket: str, key: str, query: Mapping[str, str], headers: Mapping[str, str]
) -> ops.Operation:
    subs = sorted(q for q in query if q in OBJECT_SUBRESOURCES)
    if subs and any(method in OBJECT_SUBRESOURCES[s] for s in subs):
        if subs == ["uploads"] and _UPLOAD_ID not in query:
            return ops.CreateMultipartUpload(bucket, key)
        if subs == ["attributes"] and _UPLOAD_ID not in query:
            return ops.GetObjectAttributes(bucket, key)
        return ops.Unsupported(f"{method} ?{subs[0]}")
    bucket_subs = sorted(q for q in query if q in BUCKET_SUBRESOURCES)
    if bucket_subs:
        return _bucket_subresource(method, bucket, bucket_subs)
    if subs:  # an object subresource that does not take this method
        raise MethodNotAllowed()
    if _UPLOAD_ID in query:
        return _multipart_operation(method, bucket, key, query, headers)
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
    upload_id = query[_UPLOAD_ID]
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
