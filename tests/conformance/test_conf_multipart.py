"""Multipart and checksum cases of ceph/s3-tests (test_s3.py: test_multipart_*,
test_abort_multipart_*, test_object_checksum_*, test_multipart_checksum_*,
test_get_*object_attributes), rewritten against the gateway with the moto upstream: the
same requests through boto3, the same codes and values asserted."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_code, error_status, payload, read_body

MB = 1 << 20
A_1K_SHA256 = "arcu6553sHVAiX4MjW0j7I7vD4w6R+Gz9Ok0Q9lTa+0="  # sha256(b"A" * 1024)
A_1K_CRC64NVME = "Qeh8oXvGiSo="
ALL = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"]


def _upload(
    s3: Any, bucket: str, key: str, size: int, part_size: int = 5 * MB, **create: Any
) -> tuple[str, bytes, list[dict[str, Any]]]:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, **create)["UploadId"]
    data = payload(size, key)
    parts = []
    for number, start in enumerate(range(0, size, part_size), 1):
        resp = s3.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=data[start : start + part_size],
        )
        parts.append({"ETag": resp["ETag"].strip('"'), "PartNumber": number})
    return upload_id, data, parts


def test_multipart_upload_empty(s3: Any, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="mymultipart")["UploadId"]
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(Bucket=bucket, Key="mymultipart", UploadId=upload_id)
    assert error_status(exc.value) == 400
    assert error_code(exc.value) == "MalformedXML"


def test_multipart_upload_complete_without_create(s3: Any, bucket: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="mymultipart",
            UploadId="abc1234def",
            MultipartUpload={"Parts": [{"ETag": "1234", "PartNumber": 1}]},
        )
    assert error_status(exc.value) == 404
    assert error_code(exc.value) == "NoSuchUpload"


def test_multipart_upload_small(s3: Any, bucket: str) -> None:
    upload_id, data, parts = _upload(s3, bucket, "mymultipart", 1)
    s3.complete_multipart_upload(
        Bucket=bucket, Key="mymultipart", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    got = s3.get_object(Bucket=bucket, Key="mymultipart")
    assert got["ContentLength"] == 1 and read_body(got) == data


def test_multipart_upload_size_too_small(s3: Any, bucket: str) -> None:
    upload_id, _, parts = _upload(s3, bucket, "mymultipart", 100 * 1024, part_size=10 * 1024)
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="mymultipart", UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
    assert error_status(exc.value) == 400
    assert error_code(exc.value) == "EntityTooSmall"


@pytest.mark.parametrize("mistake", ["missing_part", "incorrect_etag"])
def test_multipart_upload_missing_part_and_incorrect_etag(
    s3: Any, bucket: str, mistake: str
) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="mymultipart")["UploadId"]
    resp = s3.upload_part(
        UploadId=upload_id, Bucket=bucket, Key="mymultipart", PartNumber=1, Body=b"\x00"
    )
    part = {"ETag": resp["ETag"].strip('"'), "PartNumber": 9999}
    if mistake == "incorrect_etag":
        part = {"ETag": "ffffffffffffffffffffffffffffffff", "PartNumber": 1}
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="mymultipart", UploadId=upload_id, MultipartUpload={"Parts": [part]}
        )
    assert error_status(exc.value) == 400
    assert error_code(exc.value) == "InvalidPart"


def test_abort_multipart_upload_not_found(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="mymultipart")
    with pytest.raises(ClientError) as exc:
        s3.abort_multipart_upload(Bucket=bucket, Key="mymultipart", UploadId="56788")
    assert error_status(exc.value) == 404
    assert error_code(exc.value) == "NoSuchUpload"


def test_multipart_upload_overwrite_existing_object(s3: Any, bucket: str) -> None:
    data = b"12345" * MB
    s3.put_object(Bucket=bucket, Key="mymultipart", Body=data)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="mymultipart")["UploadId"]
    parts = []
    for number in (1, 2):
        resp = s3.upload_part(
            UploadId=upload_id, Bucket=bucket, Key="mymultipart", PartNumber=number, Body=data
        )
        parts.append({"ETag": resp["ETag"].strip('"'), "PartNumber": number})
    s3.complete_multipart_upload(
        Bucket=bucket, Key="mymultipart", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    assert read_body(s3.get_object(Bucket=bucket, Key="mymultipart")) == data * 2


def test_multipart_get_part(s3: Any, bucket: str) -> None:
    sizes = [5 * MB, 5 * MB, 1 * MB]
    upload_id, data, parts = _upload(s3, bucket, "mymultipart", sum(sizes))
    with pytest.raises(ClientError) as exc:  # before Complete: no such key
        s3.get_object(Bucket=bucket, Key="mymultipart", PartNumber=1)
    assert error_status(exc.value) == 404
    assert error_code(exc.value) == "NoSuchKey"
    res = s3.complete_multipart_upload(
        Bucket=bucket, Key="mymultipart", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    offset = 0
    for part, size in zip(parts, sizes, strict=True):
        head = s3.head_object(Bucket=bucket, Key="mymultipart", PartNumber=part["PartNumber"])
        assert head["PartsCount"] == 3 and head["ETag"] == res["ETag"]
        got = s3.get_object(Bucket=bucket, Key="mymultipart", PartNumber=part["PartNumber"])
        assert got["PartsCount"] == 3 and got["ETag"] == res["ETag"]
        assert read_body(got) == data[offset : offset + size]
        offset += size
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="mymultipart", PartNumber=4)
    assert error_status(exc.value) == 416
    assert error_code(exc.value) == "InvalidPartNumber"


def test_multipart_complete_is_idempotent(gateway: Any, s3: Any, bucket: str) -> None:
    """s3-tests' re-Complete (test_multipart_checksum_sha256 retries a Complete): S3 answers
    a repeat of a successful Complete with the same result."""
    upload_id, _, parts = _upload(s3, bucket, "mymultipart", 6 * MB)
    first = s3.complete_multipart_upload(
        Bucket=bucket, Key="mymultipart", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    again = s3.complete_multipart_upload(
        Bucket=bucket, Key="mymultipart", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    assert again["ETag"] == first["ETag"] and again["Key"] == first["Key"]


def test_object_checksum_sha256_and_crc64nvme(s3: Any, bucket: str) -> None:
    body = b"A" * 1024
    for algorithm, value in (("SHA256", A_1K_SHA256), ("CRC64NVME", A_1K_CRC64NVME)):
        param = f"Checksum{algorithm}"
        resp = s3.put_object(
            Bucket=bucket, Key="myobj", Body=body, ChecksumAlgorithm=algorithm, **{param: value}
        )
        assert resp[param] == value
        assert param not in s3.head_object(Bucket=bucket, Key="myobj")
        assert s3.head_object(Bucket=bucket, Key="myobj", ChecksumMode="ENABLED")[param] == value
        with pytest.raises(ClientError) as exc:
            s3.put_object(
                Bucket=bucket,
                Key="myobj",
                Body=body,
                ChecksumAlgorithm=algorithm,
                **{param: "bad"},
            )
        assert error_status(exc.value) == 400
        assert error_code(exc.value) in ("BadDigest", "InvalidRequest")


def test_multipart_checksum_sha256(s3: Any, bucket: str) -> None:
    created = s3.create_multipart_upload(
        Bucket=bucket, Key="mymultipart", ChecksumAlgorithm="SHA256"
    )
    assert created["ChecksumAlgorithm"] == "SHA256"
    upload_id = created["UploadId"]
    resp = s3.upload_part(
        UploadId=upload_id,
        Bucket=bucket,
        Key="mymultipart",
        PartNumber=1,
        Body=b"A" * 1024,
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256=A_1K_SHA256,
    )
    part = {
        "ETag": resp["ETag"].strip('"'),
        "ChecksumSHA256": resp["ChecksumSHA256"],
        "PartNumber": 1,
    }
    with pytest.raises(ClientError) as exc:  # a whole-object value that does not match
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="mymultipart",
            UploadId=upload_id,
            ChecksumSHA256="bad",
            MultipartUpload={"Parts": [part]},
        )
    assert error_status(exc.value) == 400
    assert error_code(exc.value) == "BadDigest"
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="mymultipart", UploadId=upload_id, MultipartUpload={"Parts": [part]}
    )
    composite = base64.b64encode(hashlib.sha256(base64.b64decode(A_1K_SHA256)).digest()).decode()
    assert done["ChecksumSHA256"] == f"{composite}-1"
    head = s3.head_object(Bucket=bucket, Key="mymultipart", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == done["ChecksumSHA256"]
    attrs = s3.get_object_attributes(
        Bucket=bucket, Key="mymultipart", ObjectAttributes=["Checksum"]
    )
    assert attrs["Checksum"] == {
        "ChecksumSHA256": done["ChecksumSHA256"],
        "ChecksumType": "COMPOSITE",
    }


def test_get_object_attributes(s3: Any, bucket: str) -> None:
    etag = s3.put_object(Bucket=bucket, Key="obj", Body=b"foo")["ETag"].strip('"')
    resp = s3.get_object_attributes(Bucket=bucket, Key="obj", ObjectAttributes=ALL)
    assert "DeleteMarker" not in resp and "VersionId" not in resp
    assert resp["ObjectSize"] == 3 and resp["ETag"] == etag
    assert resp["StorageClass"] == "STANDARD" and "ObjectParts" not in resp


def test_get_checksum_object_attributes(s3: Any, bucket: str) -> None:
    resp = s3.put_object(
        Bucket=bucket,
        Key="myobj",
        Body=b"A" * 1024,
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256=A_1K_SHA256,
    )
    etag = resp["ETag"].strip('"')
    resp = s3.get_object_attributes(Bucket=bucket, Key="myobj", ObjectAttributes=ALL)
    assert resp["ObjectSize"] == 1024 and resp["ETag"] == etag
    assert resp["StorageClass"] == "STANDARD"
    assert resp["Checksum"]["ChecksumSHA256"] == A_1K_SHA256
    assert "ObjectParts" not in resp


def test_get_multipart_checksum_object_attributes(s3: Any, bucket: str) -> None:
    objlen = 12 * MB
    created = s3.create_multipart_upload(
        Bucket=bucket,
        Key="mpc",
        ChecksumAlgorithm="SHA256",
        ContentType="text/plain",
        Metadata={"foo": "bar"},
    )
    data = payload(objlen, "mpc")
    parts, sums = [], []
    for number, start in enumerate(range(0, objlen, 5 * MB), 1):
        chunk = data[start : start + 5 * MB]
        resp = s3.upload_part(
            Bucket=bucket,
            Key="mpc",
            UploadId=created["UploadId"],
            PartNumber=number,
            Body=chunk,
            ChecksumAlgorithm="SHA256",
        )
        sums.append(resp["ChecksumSHA256"])
        parts.append(
            {"ETag": resp["ETag"], "ChecksumSHA256": resp["ChecksumSHA256"], "PartNumber": number}
        )
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="mpc", UploadId=created["UploadId"], MultipartUpload={"Parts": parts}
    )
    resp = s3.get_object_attributes(Bucket=bucket, Key="mpc", ObjectAttributes=ALL)
    assert resp["ObjectSize"] == objlen
    assert resp["Checksum"]["ChecksumSHA256"] == done["ChecksumSHA256"]
    assert resp["ObjectParts"]["TotalPartsCount"] == len(parts)
    for number, part in enumerate(resp["ObjectParts"]["Parts"], 1):
        assert part["PartNumber"] == number
        assert part["Size"] == (5 * MB if number < len(parts) else objlen - 2 * 5 * MB)
        assert part["ChecksumSHA256"] == sums[number - 1]
