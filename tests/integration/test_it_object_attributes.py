"""GetObjectAttributes through boto3's get_object_attributes: local objects (pending and
durable, single and multipart with part checksums, paged) answered from the journal, remote
objects read through the moto upstream, deletes and unknown keys NoSuchKey."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_code, error_status, payload

ALL = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"]
PART = 5 << 20


def _sha256_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def multipart(s3: Any, bucket: str, key: str, sizes: list[int]) -> tuple[Any, list[str]]:
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")
    parts, sums = [], []
    for number, size in enumerate(sizes, 1):
        body = payload(size, f"{key}-{number}")
        resp = s3.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=body,
            ChecksumAlgorithm="SHA256",
        )
        assert resp["ChecksumSHA256"] == _sha256_b64(body)
        sums.append(resp["ChecksumSHA256"])
        parts.append(
            {"PartNumber": number, "ETag": resp["ETag"], "ChecksumSHA256": resp["ChecksumSHA256"]}
        )
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
    )
    return done, sums


def test_object_attributes_single_put(gateway: Any, s3: Any, bucket: str) -> None:
    put = s3.put_object(Bucket=bucket, Key="obj", Body=b"foo")
    with gateway.flush_paused():
        resp = s3.get_object_attributes(Bucket=bucket, Key="obj", ObjectAttributes=ALL)
    assert resp["ETag"] == put["ETag"].strip('"')
    assert resp["ObjectSize"] == 3
    assert resp["StorageClass"] == "STANDARD"
    assert "ObjectParts" not in resp and "DeleteMarker" not in resp and "VersionId" not in resp
    head = s3.head_object(Bucket=bucket, Key="obj")
    assert resp["LastModified"] == head["LastModified"]


def test_object_attributes_checksum_of_a_put(gateway: Any, s3: Any, bucket: str) -> None:
    body = b"A" * 1024
    sha = _sha256_b64(body)
    assert (
        s3.put_object(Bucket=bucket, Key="c", Body=body, ChecksumSHA256=sha)["ChecksumSHA256"]
        == sha
    )
    resp = s3.get_object_attributes(Bucket=bucket, Key="c", ObjectAttributes=ALL)
    assert resp["Checksum"] == {"ChecksumSHA256": sha, "ChecksumType": "FULL_OBJECT"}
    only = s3.get_object_attributes(Bucket=bucket, Key="c", ObjectAttributes=["ObjectSize"])
    assert only["ObjectSize"] == 1024 and "ETag" not in only and "Checksum" not in only


def test_object_attributes_multipart_with_part_checksums(
    gateway: Any, s3: Any, bucket: str
) -> None:
    sizes = [PART, PART, 1234]
    with gateway.flush_paused():  # pending: answered from the journal
        done, sums = multipart(s3, bucket, "mpu", sizes)
        pending = s3.get_object_attributes(Bucket=bucket, Key="mpu", ObjectAttributes=ALL)
    gateway.drained(bucket=bucket)
    durable = s3.get_object_attributes(Bucket=bucket, Key="mpu", ObjectAttributes=ALL)
    for resp in (pending, durable):
        assert resp["ETag"] == done["ETag"].strip('"')
        assert resp["ETag"].endswith("-3")
        assert resp["ObjectSize"] == sum(sizes)
        assert resp["Checksum"]["ChecksumSHA256"] == done["ChecksumSHA256"]
        assert resp["Checksum"]["ChecksumType"] == "COMPOSITE"
        parts = resp["ObjectParts"]
        assert parts["TotalPartsCount"] == 3 and parts["IsTruncated"] is False
        assert [(p["PartNumber"], p["Size"], p["ChecksumSHA256"]) for p in parts["Parts"]] == [
            (n, size, sums[n - 1]) for n, size in enumerate(sizes, 1)
        ]


def test_object_attributes_parts_are_paged(gateway: Any, s3: Any, bucket: str) -> None:
    _, sums = multipart(s3, bucket, "paged", [PART, PART, PART, 10])
    first = s3.get_object_attributes(
        Bucket=bucket,
        Key="paged",
        ObjectAttributes=["ObjectParts"],
        MaxParts=1,
        PartNumberMarker=2,
    )["ObjectParts"]
    assert first["MaxParts"] == 1 and first["PartNumberMarker"] == 2
    assert first["IsTruncated"] is True and first["NextPartNumberMarker"] == 3
    assert [p["PartNumber"] for p in first["Parts"]] == [3]
    rest = s3.get_object_attributes(
        Bucket=bucket, Key="paged", ObjectAttributes=["ObjectParts"], PartNumberMarker=3
    )["ObjectParts"]
    assert rest["IsTruncated"] is False
    assert [(p["PartNumber"], p["ChecksumSHA256"]) for p in rest["Parts"]] == [(4, sums[3])]


def test_object_attributes_remote_object(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    body = b"upstream only"
    # (moto records a checksum when the algorithm is named, not from the value alone)
    put = upstream.put_object(Bucket=bucket, Key="remote", Body=body, ChecksumAlgorithm="SHA256")
    resp = s3.get_object_attributes(Bucket=bucket, Key="remote", ObjectAttributes=ALL)
    assert resp["ETag"] == put["ETag"].strip('"')
    assert resp["ObjectSize"] == len(body)
    assert resp["Checksum"]["ChecksumSHA256"] == _sha256_b64(body)
    assert resp["StorageClass"] == "STANDARD"


def test_object_attributes_missing_and_deleted(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    for key in ("missing", "deleted"):
        if key == "deleted":
            upstream.put_object(Bucket=bucket, Key=key, Body=b"x")
            s3.delete_object(Bucket=bucket, Key=key)
        with pytest.raises(ClientError) as exc:
            s3.get_object_attributes(Bucket=bucket, Key=key, ObjectAttributes=ALL)
        assert error_status(exc.value) == 404
        assert error_code(exc.value) == "NoSuchKey"


def test_object_attributes_invalid_attribute_name(gateway: Any, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")

    def bad_name(params: dict[str, Any], **kwargs: Any) -> None:
        params["headers"]["x-amz-object-attributes"] = "ETag,Colour"

    s3.meta.events.register("before-call.s3.GetObjectAttributes", bad_name)
    try:
        with pytest.raises(ClientError) as exc:
            s3.get_object_attributes(Bucket=bucket, Key="k", ObjectAttributes=["ETag"])
    finally:
        s3.meta.events.unregister("before-call.s3.GetObjectAttributes", bad_name)
    assert error_status(exc.value) == 400
    assert error_code(exc.value) == "InvalidArgument"
