"""What a write asks S3 to do with the object in the bucket, not with its bytes: encryption
at rest (``x-amz-server-side-encryption: AES256``), the storage class and the tags. The
gateway keeps them with the version, answers them on reads as S3 does (tags as their
count, no STANDARD class) and sends them with the upload: a single PUT, a multipart
upload, a copy. They used to be dropped: an object asked for STANDARD_IA landed as
STANDARD, its tags lost. What it cannot carry (SSE-KMS, whose ETags are not MD5s; SSE-C,
object lock, appends) is refused 501 instead of dropped, and a value S3 would refuse is
refused at once, before anything is acknowledged."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_code, error_status, payload

SETTINGS = {
    "ServerSideEncryption": "AES256",
    "StorageClass": "STANDARD_IA",
    "Tagging": "team=llm&run=70b%20v2",
}
TAGS = [{"Key": "run", "Value": "70b v2"}, {"Key": "team", "Value": "llm"}]


def multipart_put(s3: Any, bucket: str, key: str, parts: list[bytes], **settings: str) -> str:
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key, **settings)["UploadId"]
    done = [
        {
            "PartNumber": n,
            "ETag": s3.upload_part(
                Bucket=bucket, Key=key, UploadId=upload, PartNumber=n, Body=body
            )["ETag"],
        }
        for n, body in enumerate(parts, 1)
    ]
    return str(
        s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": done}
        )["ETag"]
    )


CLASSES = {"set/multi": "STANDARD_IA", "set/plain": "STANDARD", "set/single": "STANDARD_IA"}


def _classes(client: Any, bucket: str) -> dict[str, str]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix="set/")["Contents"]
    return {o["Key"]: o["StorageClass"] for o in listed}


def _tags(client: Any, bucket: str, key: str) -> list[dict[str, str]]:
    got = client.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]
    return sorted(got, key=lambda t: t["Key"])


def _assert_read_back(head: dict[str, Any]) -> None:
    assert head["ServerSideEncryption"] == "AES256"
    assert head["StorageClass"] == "STANDARD_IA"
    assert head["TagCount"] == 2


def test_encryption_class_and_tags_reach_the_bucket(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="set/single", Body=b"x" * 3000, **SETTINGS)
        etag = multipart_put(
            s3, bucket, "set/multi", [payload(5 << 20, "p1"), payload(1000, "p2")], **SETTINGS
        )
        s3.put_object(Bucket=bucket, Key="set/plain", Body=b"plain")
        for key in ("set/single", "set/multi"):  # pending: answered from the journal
            _assert_read_back(s3.head_object(Bucket=bucket, Key=key))
            _assert_read_back(s3.get_object(Bucket=bucket, Key=key))
        plain = s3.head_object(Bucket=bucket, Key="set/plain")
        assert "StorageClass" not in plain and "TagCount" not in plain
        assert _classes(s3, bucket) == CLASSES
    gateway.drained(bucket=bucket)
    assert _classes(s3, bucket) == CLASSES  # listed from the bucket now
    for key in ("set/single", "set/multi"):
        _assert_read_back(upstream.head_object(Bucket=bucket, Key=key))
        assert _tags(upstream, bucket, key) == TAGS
    assert upstream.head_object(Bucket=bucket, Key="set/multi")["ETag"] == etag
    assert "StorageClass" not in upstream.head_object(Bucket=bucket, Key="set/plain")


def test_a_copy_takes_the_requests_encryption_and_class_and_the_sources_tags(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="cp/src", Body=b"source", **SETTINGS)
    source = {"Bucket": bucket, "Key": "cp/src"}
    s3.copy_object(Bucket=bucket, Key="cp/plain", CopySource=source)
    s3.copy_object(Bucket=bucket, Key="cp/glacier", CopySource=source, StorageClass="GLACIER_IR")
    s3.copy_object(
        Bucket=bucket,
        Key="cp/retagged",
        CopySource=source,
        TaggingDirective="REPLACE",
        Tagging="only=one",
    )
    plain = s3.head_object(Bucket=bucket, Key="cp/plain")
    assert "StorageClass" not in plain and "ServerSideEncryption" not in plain
    assert plain["TagCount"] == 2
    assert s3.head_object(Bucket=bucket, Key="cp/glacier")["StorageClass"] == "GLACIER_IR"
    assert s3.head_object(Bucket=bucket, Key="cp/retagged")["TagCount"] == 1
    gateway.drained(bucket=bucket)
    assert _tags(upstream, bucket, "cp/plain") == TAGS
    assert "StorageClass" not in upstream.head_object(Bucket=bucket, Key="cp/plain")
    assert upstream.head_object(Bucket=bucket, Key="cp/glacier")["StorageClass"] == "GLACIER_IR"
    assert _tags(upstream, bucket, "cp/retagged") == [{"Key": "only", "Value": "one"}]


@pytest.mark.parametrize(
    ("settings", "status", "code"),
    [
        ({"ServerSideEncryption": "ROT13"}, 400, "InvalidArgument"),
        ({"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/mine"}, 501, "NotImplemented"),
        ({"ServerSideEncryption": "aws:kms:dsse"}, 501, "NotImplemented"),
        ({"StorageClass": "FASTEST"}, 400, "InvalidStorageClass"),
        ({"Tagging": "&".join(f"k{i}=v" for i in range(11))}, 400, "InvalidTag"),
        ({"Tagging": "a=1&a=2"}, 400, "InvalidTag"),
        ({"Tagging": f"{'k' * 129}=v"}, 400, "InvalidTag"),
        ({"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "k" * 32}, 501, "NotImplemented"),
        ({"ObjectLockLegalHoldStatus": "ON"}, 501, "NotImplemented"),
        ({"WriteOffsetBytes": 0}, 501, "NotImplemented"),
    ],
)
def test_what_s3_would_refuse_or_this_gateway_cannot_carry_is_refused(
    s3: Any, bucket: str, settings: dict[str, Any], status: int, code: str
) -> None:
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key="refused", Body=b"x", **settings)
    assert (error_status(refused.value), error_code(refused.value)) == (status, code)
    with pytest.raises(ClientError) as nothing:
        s3.head_object(Bucket=bucket, Key="refused")
    assert error_code(nothing.value) == "404"
