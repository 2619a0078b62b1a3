"""CopyObject, UploadPartCopy and DeleteObjects through the gateway: real boto3, moto upstream.

Copies of local sources are hard links (no bytes copied), copies of upstream-only sources are
streamed in; both are pending writes that reach the upstream on drain with the bytes and ETag
the client was given.
"""

from __future__ import annotations

import email.utils
import hashlib
import time
import urllib.parse
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    content_md5,
    crc32_b64,
    error_code,
    error_status,
    flush_state,
    list_all_keys,
    object_url,
    parse_s3_error,
    payload,
    quoted_md5,
    read_body,
    send_signed,
    sign_request,
    unique_bucket_name,
    upstream_objects,
)

MiB = 1024 * 1024


def _multipart_etag(parts: list[bytes]) -> str:
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    return f'"{digest}-{len(parts)}"'


def _client_error(fn: Any, **kwargs: Any) -> ClientError:
    with pytest.raises(ClientError) as exc:
        fn(**kwargs)
    return exc.value


# --------------------------------------------------------------------------- CopyObject


def test_copy_pending_object_keeps_body_etag_and_metadata(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    body = payload(300_000, seed="copy-src")
    with gateway.flush_paused():
        s3.put_object(
            Bucket=bucket,
            Key="src/a.bin",
            Body=body,
            ContentType="application/x-shard",
            CacheControl="max-age=60",
            Metadata={"step": "42"},
        )
        resp = s3.copy_object(
            Bucket=bucket, Key="dst/a.bin", CopySource={"Bucket": bucket, "Key": "src/a.bin"}
        )
        assert resp["CopyObjectResult"]["ETag"] == quoted_md5(body)
        assert resp["CopyObjectResult"]["LastModified"].year >= 2024

        got = s3.get_object(Bucket=bucket, Key="dst/a.bin")
        assert read_body(got) == body
        assert got["ETag"] == quoted_md5(body)
        assert got["ContentType"] == "application/x-shard"
        assert got["CacheControl"] == "max-age=60"
        assert got["Metadata"] == {"step": "42"}
        assert flush_state(got) == "pending"
        assert "dst/a.bin" in list_all_keys(s3, bucket)
        assert "dst/a.bin" not in upstream_objects(upstream, bucket)
        # No bytes were copied: source and copy are two names of one file.
        linked = [
            f
            for f in (gateway.data_dir / "blobs").glob("*/*")
            if f.stat().st_nlink == 2 and f.stat().st_size == len(body)
        ]
        assert len(linked) == 2 and linked[0].stat().st_ino == linked[1].stat().st_ino

    gateway.drained(bucket=bucket)
    remote = upstream.get_object(Bucket=bucket, Key="dst/a.bin")
    assert read_body(remote) == body
    assert remote["ETag"] == quoted_md5(body)
    assert remote["ContentType"] == "application/x-shard"
    assert remote["Metadata"] == {"step": "42"}


def test_copy_replace_metadata(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    body = b"replace me"
    s3.put_object(Bucket=bucket, Key="k", Body=body, Metadata={"old": "1"}, ContentType="a/b")
    s3.copy_object(
        Bucket=bucket,
        Key="k2",
        CopySource={"Bucket": bucket, "Key": "k"},
        MetadataDirective="REPLACE",
        Metadata={"new": "2"},
        ContentType="text/plain",
        ContentDisposition="attachment",
    )
    head = s3.head_object(Bucket=bucket, Key="k2")
    assert head["Metadata"] == {"new": "2"}
    assert head["ContentType"] == "text/plain"
    assert head["ContentDisposition"] == "attachment"
    assert head["ETag"] == quoted_md5(body)
    # The source is untouched.
    assert s3.head_object(Bucket=bucket, Key="k")["Metadata"] == {"old": "1"}

    gateway.drained(bucket=bucket)
    remote = upstream.head_object(Bucket=bucket, Key="k2")
    assert remote["Metadata"] == {"new": "2"}
    assert remote["ContentType"] == "text/plain"


def test_copy_onto_itself_needs_replace(gateway: Any, s3: Any, bucket: str) -> None:
    body = payload(1000, seed="self")
    s3.put_object(Bucket=bucket, Key="self", Body=body, Metadata={"v": "1"})
    err = _client_error(
        s3.copy_object, Bucket=bucket, Key="self", CopySource={"Bucket": bucket, "Key": "self"}
    )
    assert error_code(err) == "InvalidRequest"
    assert error_status(err) == 400
    assert "copy an object to itself" in err.response["Error"]["Message"]

    s3.copy_object(
        Bucket=bucket,
        Key="self",
        CopySource={"Bucket": bucket, "Key": "self"},
        MetadataDirective="REPLACE",
        Metadata={"v": "2"},
    )
    got = s3.get_object(Bucket=bucket, Key="self")
    assert read_body(got) == body
    assert got["Metadata"] == {"v": "2"}
    assert got["ETag"] == quoted_md5(body)


def test_copy_upstream_only_object(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    body = payload(2 * MiB + 5, seed="remote")
    upstream.put_object(
        Bucket=bucket, Key="remote/src", Body=body, Metadata={"from": "moto"}, ContentType="x/y"
    )
    with gateway.flush_paused():
        resp = s3.copy_object(
            Bucket=bucket, Key="local/dst", CopySource={"Bucket": bucket, "Key": "remote/src"}
        )
        assert resp["CopyObjectResult"]["ETag"] == quoted_md5(body)
        got = s3.get_object(Bucket=bucket, Key="local/dst")
        assert read_body(got) == body
        assert got["Metadata"] == {"from": "moto"}
        assert got["ContentType"] == "x/y"
        assert flush_state(got) == "pending"
    gateway.drained(bucket=bucket)
    remote = upstream.get_object(Bucket=bucket, Key="local/dst")
    assert read_body(remote) == body
    assert remote["ETag"] == quoted_md5(body)


def test_copy_multipart_object_keeps_parts(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    parts = [payload(5 * MiB, seed="mp1"), payload(5 * MiB, seed="mp2"), b"tail"]
    with gateway.flush_paused():
        upload = s3.create_multipart_upload(Bucket=bucket, Key="mp/src", Metadata={"m": "p"})
        done = []
        for n, data in enumerate(parts, 1):
            r = s3.upload_part(
                Bucket=bucket, Key="mp/src", UploadId=upload["UploadId"], PartNumber=n, Body=data
            )
            done.append({"PartNumber": n, "ETag": r["ETag"]})
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="mp/src",
            UploadId=upload["UploadId"],
            MultipartUpload={"Parts": done},
        )
        resp = s3.copy_object(
            Bucket=bucket, Key="mp/dst", CopySource={"Bucket": bucket, "Key": "mp/src"}
        )
        # Hard-linked parts keep their boundaries, so the -N ETag is kept.
        assert resp["CopyObjectResult"]["ETag"] == _multipart_etag(parts)
        got = s3.get_object(Bucket=bucket, Key="mp/dst")
        assert read_body(got) == b"".join(parts)
        assert got["Metadata"] == {"m": "p"}
    gateway.drained(bucket=bucket)
    remote = upstream.head_object(Bucket=bucket, Key="mp/dst")
    assert remote["ETag"] == _multipart_etag(parts)
    assert read_body(upstream.get_object(Bucket=bucket, Key="mp/dst")) == b"".join(parts)


def test_copy_is_independent_of_its_source(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    """Rename emulation: copy then delete. The copy keeps its own hard link; the temporary
    key never reaches the upstream."""
    body = payload(100_000, seed="rename")
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="tmp/x", Body=body)
        s3.copy_object(Bucket=bucket, Key="final/x", CopySource=f"{bucket}/tmp/x")
        s3.delete_object(Bucket=bucket, Key="tmp/x")
        s3.put_object(Bucket=bucket, Key="tmp/x", Body=b"reused")  # and the name reused
        s3.delete_object(Bucket=bucket, Key="tmp/x")
        assert read_body(s3.get_object(Bucket=bucket, Key="final/x")) == body
        assert list_all_keys(s3, bucket) == ["final/x"]
    gateway.drained(bucket=bucket)
    assert list(upstream_objects(upstream, bucket)) == ["final/x"]
    assert read_body(upstream.get_object(Bucket=bucket, Key="final/x")) == body
    assert read_body(s3.get_object(Bucket=bucket, Key="final/x")) == body


def test_copy_source_conditions(s3: Any, bucket: str) -> None:
    body = b"conditional"
    etag = s3.put_object(Bucket=bucket, Key="c", Body=body)["ETag"]
    source = {"Bucket": bucket, "Key": "c"}
    past = email.utils.formatdate(time.time() - 3600, usegmt=True)
    future = email.utils.formatdate(time.time() + 3600, usegmt=True)
    failing: list[dict[str, Any]] = [
        {"CopySourceIfMatch": '"0123456789abcdef0123456789abcdef"'},
        {"CopySourceIfNoneMatch": etag},
        {"CopySourceIfModifiedSince": future},
        {"CopySourceIfUnmodifiedSince": past},
        {"CopySourceIfNoneMatch": etag, "CopySourceIfModifiedSince": past},
    ]
    for cond in failing:
        err = _client_error(s3.copy_object, Bucket=bucket, Key="d", CopySource=source, **cond)
        assert error_code(err) == "PreconditionFailed", cond
        assert error_status(err) == 412, cond
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="d")

    # If-Match holds: If-Unmodified-Since is not consulted (S3 copies).
    s3.copy_object(
        Bucket=bucket,
        Key="d",
        CopySource=source,
        CopySourceIfMatch=etag,
        CopySourceIfUnmodifiedSince=past,
    )
    s3.copy_object(
        Bucket=bucket,
        Key="e",
        CopySource=source,
        CopySourceIfNoneMatch='"ffffffffffffffffffffffffffffffff"',
        CopySourceIfModifiedSince=past,
    )
    assert read_body(s3.get_object(Bucket=bucket, Key="d")) == body
    assert read_body(s3.get_object(Bucket=bucket, Key="e")) == body


def test_conditional_copy_checks_its_destination(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    """CopyObject's own ``If-None-Match: *`` / ``If-Match`` (the destination's, not the
    source's ``x-amz-copy-source-if-*``): refused 412 as a conditional PutObject is, from a
    pending source and from one only upstream. They used to be ignored."""
    upstream.put_object(Bucket=bucket, Key="cc/remote-src", Body=b"remote source")
    s3.put_object(Bucket=bucket, Key="cc/src", Body=b"source")
    s3.put_object(Bucket=bucket, Key="cc/dst", Body=b"destination v1")

    def copy(source: str, **condition: str) -> Any:
        return s3.copy_object(
            Bucket=bucket, Key="cc/dst", CopySource={"Bucket": bucket, "Key": source}, **condition
        )

    for source in ("cc/src", "cc/remote-src"):
        exists = _client_error(copy, source=source, IfNoneMatch="*")
        assert (error_status(exists), error_code(exists)) == (412, "PreconditionFailed")
        stale = _client_error(copy, source=source, IfMatch=quoted_md5(b"destination v0"))
        assert error_code(stale) == "PreconditionFailed"
    assert read_body(s3.get_object(Bucket=bucket, Key="cc/dst")) == b"destination v1"
    copy("cc/src", IfMatch=quoted_md5(b"destination v1"))
    assert read_body(s3.get_object(Bucket=bucket, Key="cc/dst")) == b"source"
    copy("cc/remote-src", IfMatch=quoted_md5(b"source"))
    assert read_body(s3.get_object(Bucket=bucket, Key="cc/dst")) == b"remote source"
    s3.copy_object(
        Bucket=bucket, Key="cc/new", CopySource={"Bucket": bucket, "Key": "cc/src"}, IfNoneMatch="*"
    )
    gone = _client_error(
        s3.copy_object,
        Bucket=bucket,
        Key="cc/none",
        CopySource={"Bucket": bucket, "Key": "cc/src"},
        IfMatch=quoted_md5(b"x"),
    )
    assert error_code(gone) == "NoSuchKey"
    gateway.drained(bucket=bucket)
    stored = upstream_objects(upstream, bucket, "cc/")
    assert sorted(stored) == ["cc/dst", "cc/new", "cc/remote-src", "cc/src"]
    assert stored["cc/dst"]["ETag"] == quoted_md5(b"remote source")


def test_copy_source_forms(gateway: Any, s3: Any, bucket: str) -> None:
    key = "dir/with space+plus ü?.bin"
    body = payload(4096, seed="forms")
    s3.put_object(Bucket=bucket, Key=key, Body=body)

    # boto3 with a leading-slash string (botocore percent-encodes the key part).
    s3.copy_object(Bucket=bucket, Key="c1", CopySource=f"/{bucket}/{key}")
    # A raw request with a leading slash and ?versionId=null, as s3torchconnector sends it.
    source = "/" + bucket + "/" + urllib.parse.quote(key, safe="/") + "?versionId=null"
    req = sign_request(
        "PUT", object_url(gateway.endpoint, bucket, "c2"), headers={"x-amz-copy-source": source}
    )
    resp = send_signed(req)
    assert resp.status == 200, resp.body
    assert b"<CopyObjectResult" in resp.body and quoted_md5(body).encode() in resp.body
    for name in ("c1", "c2"):
        assert read_body(s3.get_object(Bucket=bucket, Key=name)) == body


def test_copy_errors(s3: Any, bucket: str) -> None:
    err = _client_error(
        s3.copy_object, Bucket=bucket, Key="x", CopySource={"Bucket": bucket, "Key": "missing"}
    )
    assert (error_code(err), error_status(err)) == ("NoSuchKey", 404)

    s3.put_object(Bucket=bucket, Key="gone", Body=b"1")
    s3.delete_object(Bucket=bucket, Key="gone")  # a pending delete hides the source
    err = _client_error(
        s3.copy_object, Bucket=bucket, Key="x", CopySource={"Bucket": bucket, "Key": "gone"}
    )
    assert error_code(err) == "NoSuchKey"

    err = _client_error(
        s3.copy_object,
        Bucket=bucket,
        Key="x",
        CopySource={"Bucket": unique_bucket_name("nobucket"), "Key": "k"},
    )
    assert (error_code(err), error_status(err)) == ("NoSuchBucket", 404)

    s3.put_object(Bucket=bucket, Key="v", Body=b"1")
    err = _client_error(
        s3.copy_object,
        Bucket=bucket,
        Key="x",
        CopySource={"Bucket": bucket, "Key": "v", "VersionId": "3HL4kqtJlcpXroDTDmJ"},
    )
    assert (error_code(err), error_status(err)) == ("NotImplemented", 501)

    err = _client_error(
        s3.copy_object,
        Bucket=bucket,
        Key="x",
        CopySource={"Bucket": bucket, "Key": "v"},
        MetadataDirective="MOVE",
    )
    assert (error_code(err), error_status(err)) == ("InvalidArgument", 400)


# --------------------------------------------------------------------------- UploadPartCopy


def test_upload_part_copy_assembles_ranges(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    local = payload(6 * MiB, seed="local-src")
    remote = payload(7 * MiB, seed="remote-src")
    upstream.put_object(Bucket=bucket, Key="src/remote", Body=remote)
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="src/local", Body=local)
        upload_id = s3.create_multipart_upload(Bucket=bucket, Key="out")["UploadId"]
        ranges = [
            ("src/local", 100, 100 + 5 * MiB - 1),
            ("src/remote", MiB, 7 * MiB - 1),
            ("src/local", 0, 9),
        ]
        expected = []
        parts = []
        for n, (src, first, last) in enumerate(ranges, 1):
            resp = s3.upload_part_copy(
                Bucket=bucket,
                Key="out",
                UploadId=upload_id,
                PartNumber=n,
                CopySource={"Bucket": bucket, "Key": src},
                CopySourceRange=f"bytes={first}-{last}",
            )
            data = (local if src == "src/local" else remote)[first : last + 1]
            expected.append(data)
            assert resp["CopyPartResult"]["ETag"] == quoted_md5(data)
            parts.append({"PartNumber": n, "ETag": resp["CopyPartResult"]["ETag"]})
        listed = s3.list_parts(Bucket=bucket, Key="out", UploadId=upload_id)["Parts"]
        assert [p["Size"] for p in listed] == [len(d) for d in expected]
        done = s3.complete_multipart_upload(
            Bucket=bucket, Key="out", UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
        assert done["ETag"] == _multipart_etag(expected)
        assert read_body(s3.get_object(Bucket=bucket, Key="out")) == b"".join(expected)
    gateway.drained(bucket=bucket)
    got = upstream.get_object(Bucket=bucket, Key="out")
    assert read_body(got) == b"".join(expected)
    assert got["ETag"] == _multipart_etag(expected)


def test_upload_part_copy_whole_object_and_errors(s3: Any, bucket: str) -> None:
    body = payload(1000, seed="whole")
    s3.put_object(Bucket=bucket, Key="w", Body=body)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="out")["UploadId"]
    common = {"Bucket": bucket, "Key": "out", "UploadId": upload_id, "PartNumber": 1}
    resp = s3.upload_part_copy(CopySource={"Bucket": bucket, "Key": "w"}, **common)
    assert resp["CopyPartResult"]["ETag"] == quoted_md5(body)

    source = {"Bucket": bucket, "Key": "w"}
    for bad in ("bytes=0", "0-10", "bytes=5-", "bytes=0-1,3-4"):
        err = _client_error(s3.upload_part_copy, CopySource=source, CopySourceRange=bad, **common)
        assert (error_code(err), error_status(err)) == ("InvalidArgument", 400), bad
    for bad in ("bytes=0-1000", "bytes=10-5"):
        err = _client_error(s3.upload_part_copy, CopySource=source, CopySourceRange=bad, **common)
        assert error_code(err) == "InvalidArgument", bad
        assert "size: 1000" in err.response["Error"]["Message"]

    err = _client_error(
        s3.upload_part_copy, CopySource=source, CopySourceIfMatch='"nope"', **common
    )
    assert error_code(err) == "PreconditionFailed"
    err = _client_error(
        s3.upload_part_copy, CopySource={"Bucket": bucket, "Key": "missing"}, **common
    )
    assert error_code(err) == "NoSuchKey"
    err = _client_error(
        s3.upload_part_copy, CopySource=source, **{**common, "UploadId": "no-such-upload"}
    )
    assert error_code(err) == "NoSuchUpload"
    s3.abort_multipart_upload(Bucket=bucket, Key="out", UploadId=upload_id)


# --------------------------------------------------------------------------- DeleteObjects


def test_delete_objects(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    upstream.put_object(Bucket=bucket, Key="d/remote", Body=b"remote")
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="d/local", Body=b"local")
        s3.put_object(Bucket=bucket, Key="d/keep", Body=b"keep")
        resp = s3.delete_objects(
            Bucket=bucket,
            Delete={
                "Objects": [{"Key": "d/local"}, {"Key": "d/remote"}, {"Key": "d/missing"}],
                "Quiet": False,
            },
        )
        assert sorted(d["Key"] for d in resp["Deleted"]) == ["d/local", "d/missing", "d/remote"]
        assert "Errors" not in resp
        for key in ("d/local", "d/remote", "d/missing"):
            err = _client_error(s3.get_object, Bucket=bucket, Key=key)
            assert error_code(err) == "NoSuchKey"
        assert list_all_keys(s3, bucket) == ["d/keep"]
        assert "d/remote" in upstream_objects(upstream, bucket)
    gateway.drained(bucket=bucket)
    assert list(upstream_objects(upstream, bucket)) == ["d/keep"]


def test_delete_objects_quiet_and_per_key_errors(s3: Any, bucket: str) -> None:
    for key in ("q1", "q2"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    long_key = "k" * 1025
    resp = s3.delete_objects(
        Bucket=bucket,
        Delete={"Objects": [{"Key": "q1"}, {"Key": long_key}, {"Key": "q2"}], "Quiet": True},
    )
    assert "Deleted" not in resp
    assert [(e["Key"], e["Code"]) for e in resp["Errors"]] == [(long_key, "KeyTooLongError")]
    assert list_all_keys(s3, bucket) == []


def test_conditional_delete_object(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    """S3's conditional delete (general purpose buckets since 2025-09): ``If-Match`` an ETag
    or ``*``; 412 on another version, 404 when there is none; the object stays on a
    refusal. It used to be ignored: every conditional delete deleted."""
    upstream.put_object(Bucket=bucket, Key="cd/remote", Body=b"remote")  # upstream only
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="cd/local", Body=b"v1")
        s3.put_object(Bucket=bucket, Key="cd/star", Body=b"any")
        stale = _client_error(
            s3.delete_object, Bucket=bucket, Key="cd/local", IfMatch=quoted_md5(b"v0")
        )
        assert (error_status(stale), error_code(stale)) == (412, "PreconditionFailed")
        assert read_body(s3.get_object(Bucket=bucket, Key="cd/local")) == b"v1"
        s3.delete_object(Bucket=bucket, Key="cd/local", IfMatch=quoted_md5(b"v1"))
        gone = _client_error(s3.delete_object, Bucket=bucket, Key="cd/local", IfMatch="*")
        assert (error_status(gone), error_code(gone)) == (404, "NoSuchKey")
        s3.delete_object(Bucket=bucket, Key="cd/star", IfMatch="*")
        wrong = _client_error(s3.delete_object, Bucket=bucket, Key="cd/remote", IfMatch='"00"')
        assert error_code(wrong) == "PreconditionFailed"
        s3.delete_object(Bucket=bucket, Key="cd/remote", IfMatch=quoted_md5(b"remote"))
        size = _client_error(s3.delete_object, Bucket=bucket, Key="cd/x", IfMatchSize=3)
        assert (error_status(size), error_code(size)) == (501, "NotImplemented")
        for key in ("cd/local", "cd/star", "cd/remote"):
            assert error_code(_client_error(s3.head_object, Bucket=bucket, Key=key)) == "404"
    gateway.drained(bucket=bucket)
    assert not [k for k in upstream_objects(upstream, bucket) if k.startswith("cd/")]


def test_conditional_entries_of_delete_objects(s3: Any, bucket: str) -> None:
    """An ``<ETag>`` in a DeleteObjects entry deletes that key only if it is this version;
    a refusal is that key's ``Error``, the others are deleted."""
    for key in ("ce/a", "ce/b", "ce/c"):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    resp = s3.delete_objects(
        Bucket=bucket,
        Delete={
            "Objects": [
                {"Key": "ce/a", "ETag": quoted_md5(b"ce/a")},
                {"Key": "ce/b", "ETag": quoted_md5(b"not b")},
                {"Key": "ce/c"},
                {"Key": "ce/none", "ETag": quoted_md5(b"x")},
            ]
        },
    )
    assert sorted(d["Key"] for d in resp["Deleted"]) == ["ce/a", "ce/c"]
    assert sorted((e["Key"], e["Code"]) for e in resp["Errors"]) == [
        ("ce/b", "PreconditionFailed"),
        ("ce/none", "NoSuchKey"),
    ]
    assert list_all_keys(s3, bucket) == ["ce/b"]


def _post_delete(gateway: Any, bucket: str, body: bytes, headers: dict[str, str]) -> Any:
    url = f"{gateway.endpoint}/{bucket}?delete="
    return send_signed(sign_request("POST", url, headers=headers, body=body))


def test_delete_objects_body_checks(gateway: Any, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="survivor", Body=b"x")
    good = b"<Delete><Object><Key>survivor</Key></Object></Delete>"
    cases = [
        (b"<Delete><Object><Key>a</Key>", {"Content-MD5": None}, "MalformedXML"),
        (b"<Delete></Delete>", {"Content-MD5": None}, "MalformedXML"),
        (b"<Other/>", {"Content-MD5": None}, "MalformedXML"),
        (
            b"<Delete>" + b"<Object><Key>k</Key></Object>" * 1001 + b"</Delete>",
            {"Content-MD5": None},
            "MalformedXML",
        ),
        (good, {}, "InvalidRequest"),
        (good, {"Content-MD5": content_md5(b"other")}, "BadDigest"),
        (good, {"x-amz-checksum-crc32": crc32_b64(b"other")}, "BadDigest"),
        (good, {"Content-MD5": "not base64!"}, "InvalidDigest"),
    ]
    for body, headers, code in cases:
        sent = {k: (content_md5(body) if v is None else v) for k, v in headers.items()}
        resp = _post_delete(gateway, bucket, body, sent)
        assert resp.status == 400, (code, resp.body)
        assert parse_s3_error(resp.body)["Code"] == code
    assert read_body(s3.get_object(Bucket=bucket, Key="survivor")) == b"x"

    # With a CRC32 (what botocore sends) and pretty-printed XML with a namespace.
    pretty = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n'
        b'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/">\n'
        b"  <Object>\n    <Key> survivor </Key>\n  </Object>\n"
        b"  <Object>\n    <Key>survivor</Key>\n  </Object>\n</Delete>\n"
    )
    resp = _post_delete(gateway, bucket, pretty, {"x-amz-checksum-crc32": crc32_b64(pretty)})
    assert resp.status == 200, resp.body
    assert b"<Key> survivor </Key>" in resp.body
    assert list_all_keys(s3, bucket) == []


def test_copy_survives_sigkill(fresh_gateway: Any, upstream: Any, bucket: str) -> None:
    s3 = fresh_gateway.client()
    body = payload(50_000, seed="crash")
    fresh_gateway.pause_flush()
    s3.put_object(Bucket=bucket, Key="src", Body=body)
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": "src"}, {"Key": "other"}], "Quiet": True}
    )
    fresh_gateway.restart(hard=True)  # SIGKILL: only what was durable survives
    s3 = fresh_gateway.client()
    got = s3.get_object(Bucket=bucket, Key="dst")
    assert read_body(got) == body
    assert got["ETag"] == quoted_md5(body)
    assert list_all_keys(s3, bucket) == ["dst"]
    fresh_gateway.drained(bucket=bucket)
    assert list(upstream_objects(upstream, bucket)) == ["dst"]
    assert read_body(upstream.get_object(Bucket=bucket, Key="dst")) == body
