"""Multipart uploads through the gateway: S3's multipart ETag, and the same part boundaries
upstream so the upstream ETag equals the one the client saw."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from harness import error_code, error_status, payload, read_body, upstream_objects

MiB = 1024 * 1024


def multipart_etag(parts: list[bytes]) -> str:
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    return f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'


def _upload(s3: Any, bucket: str, key: str, parts: list[bytes], **create: Any) -> dict[str, Any]:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, **create)["UploadId"]
    done = []
    for number, part in enumerate(parts, start=1):
        resp = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=part
        )
        assert resp["ETag"] == f'"{hashlib.md5(part).hexdigest()}"'
        done.append({"PartNumber": number, "ETag": resp["ETag"]})
    result: dict[str, Any] = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
    )
    return result


def test_multipart_roundtrip_and_flush(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    parts = [payload(5 * MiB, seed="p1"), payload(5 * MiB + 7, seed="p2"), b"tail" * 300]
    body = b"".join(parts)
    with gateway.flush_paused():
        done = _upload(
            s3,
            bucket,
            "mp/ckpt.bin",
            parts,
            Metadata={"kind": "multipart"},
            ContentType="application/x-ckpt",
        )
        assert done["ETag"] == multipart_etag(parts)
        got = s3.get_object(Bucket=bucket, Key="mp/ckpt.bin")
        assert read_body(got) == body
        assert got["ETag"] == multipart_etag(parts)
        assert got["Metadata"] == {"kind": "multipart"}
        assert got["ContentType"] == "application/x-ckpt"
        head = s3.head_object(Bucket=bucket, Key="mp/ckpt.bin")
        assert head["ContentLength"] == len(body)
        listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
        assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [
            ("mp/ckpt.bin", len(body), multipart_etag(parts))
        ]
        assert upstream_objects(upstream, bucket) == {}
    gateway.drained(bucket=bucket, timeout=60)
    up = upstream.get_object(Bucket=bucket, Key="mp/ckpt.bin")
    assert read_body(up) == body
    assert up["ETag"] == multipart_etag(parts)
    assert up["Metadata"] == {"kind": "multipart"}
    # Same part boundaries upstream.
    for number, part in enumerate(parts, start=1):
        head = upstream.head_object(Bucket=bucket, Key="mp/ckpt.bin", PartNumber=number)
        assert head["ContentLength"] == len(part), number


def test_upload_fileobj_uses_multipart(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    import io

    body = payload(12 * MiB + 5, seed="transfer")
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.upload_fileobj(io.BytesIO(body), bucket, "transfer/obj", Config=config)
    parts = [body[i : i + 5 * MiB] for i in range(0, len(body), 5 * MiB)]
    head = s3.head_object(Bucket=bucket, Key="transfer/obj")
    assert head["ETag"] == multipart_etag(parts)
    out = io.BytesIO()
    s3.download_fileobj(bucket, "transfer/obj", out)
    assert out.getvalue() == body
    gateway.drained(bucket=bucket, timeout=60)
    assert upstream.head_object(Bucket=bucket, Key="transfer/obj")["ETag"] == multipart_etag(parts)


def test_list_parts_and_uploads(s3: Any, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="lp")["UploadId"]
    parts = [payload(5 * MiB, seed="lp1"), payload(1000, seed="lp2")]
    for number, part in enumerate(parts, start=1):
        s3.upload_part(Bucket=bucket, Key="lp", UploadId=upload_id, PartNumber=number, Body=part)
    listed = s3.list_parts(Bucket=bucket, Key="lp", UploadId=upload_id)
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed["Parts"]] == [
        (n, len(p), f'"{hashlib.md5(p).hexdigest()}"') for n, p in enumerate(parts, start=1)
    ]
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("lp", upload_id)]
    s3.abort_multipart_upload(Bucket=bucket, Key="lp", UploadId=upload_id)


def test_abort(s3: Any, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="ab")["UploadId"]
    part = payload(5 * MiB, seed="ab")
    etag = s3.upload_part(Bucket=bucket, Key="ab", UploadId=upload_id, PartNumber=1, Body=part)[
        "ETag"
    ]
    s3.abort_multipart_upload(Bucket=bucket, Key="ab", UploadId=upload_id)
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="ab",
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
        )
    assert error_code(exc.value) == "NoSuchUpload"
    assert error_status(exc.value) == 404
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="ab")
    assert error_status(exc.value) == 404


def test_part_too_small(s3: Any, bucket: str) -> None:
    parts = [b"small" * 10, b"also small"]
    with pytest.raises(ClientError) as exc:
        _upload(s3, bucket, "small", parts)
    assert error_code(exc.value) == "EntityTooSmall"
    assert error_status(exc.value) == 400
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="small")


def test_complete_with_wrong_etag(s3: Any, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="we")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="we", UploadId=upload_id, PartNumber=1, Body=b"x")
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="we",
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"' + "0" * 32 + '"'}]},
        )
    assert error_code(exc.value) == "InvalidPart"
    assert error_status(exc.value) == 400


def test_single_part_multipart(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    parts = [b"only part"]
    done = _upload(s3, bucket, "single", parts)
    assert done["ETag"] == multipart_etag(parts)
    gateway.drained(bucket=bucket)
    assert upstream.head_object(Bucket=bucket, Key="single")["ETag"] == multipart_etag(parts)


@pytest.mark.parametrize(
    "parts", [[b"p" * (5 * MiB), b""], [b""]], ids=["empty last part", "one empty part"]
)
def test_an_empty_part_is_a_part(
    gateway: Any, s3: Any, upstream: Any, bucket: str, parts: list[bytes]
) -> None:
    """An UploadPart of no bytes is a part as S3's (the last may be any size): it was 500
    InternalError, the body held in memory where a part needs a file (loadtest/fuzz.py)."""
    done = _upload(s3, bucket, "empty-part", parts)
    assert done["ETag"] == multipart_etag(parts)
    assert read_body(s3.get_object(Bucket=bucket, Key="empty-part")) == b"".join(parts)
    gateway.drained(bucket=bucket)
    assert upstream.head_object(Bucket=bucket, Key="empty-part")["ETag"] == multipart_etag(parts)


def test_multipart_survives_sigkill(fresh_gateway: Any, upstream: Any, bucket: str) -> None:
    gw = fresh_gateway
    s3 = gw.client()
    gw.pause_flush()
    parts = [payload(5 * MiB, seed="k1"), payload(100, seed="k2")]
    _upload(s3, bucket, "mpk", parts)
    gw.kill()
    gw.start()
    got = s3.get_object(Bucket=bucket, Key="mpk")
    assert read_body(got) == b"".join(parts)
    assert got["ETag"] == multipart_etag(parts)
    gw.resume_flush()
    gw.drained(bucket=bucket)
    assert upstream.head_object(Bucket=bucket, Key="mpk")["ETag"] == multipart_etag(parts)


def test_incomplete_upload_survives_sigkill(fresh_gateway: Any, bucket: str) -> None:
    """Acknowledged parts of an open upload survive a crash; the upload completes after."""
    gw = fresh_gateway
    s3 = gw.client()
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="open")["UploadId"]
    p1 = payload(5 * MiB, seed="o1")
    e1 = s3.upload_part(Bucket=bucket, Key="open", UploadId=upload_id, PartNumber=1, Body=p1)[
        "ETag"
    ]
    gw.kill()
    gw.start()
    p2 = b"second part after restart"
    e2 = s3.upload_part(Bucket=bucket, Key="open", UploadId=upload_id, PartNumber=2, Body=p2)[
        "ETag"
    ]
    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="open",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]},
    )
    assert done["ETag"] == multipart_etag([p1, p2])
    assert read_body(s3.get_object(Bucket=bucket, Key="open")) == p1 + p2
