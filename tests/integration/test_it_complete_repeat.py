"""CompleteMultipartUpload is idempotent, as in S3: an SDK whose first Complete answer was
lost retries, and gets 200 with the same ETag and body while the key still holds that
upload's object, also after a restart of the gateway (kill -9) and after the flush. Once
the key was overwritten or deleted, the repeat is NoSuchUpload, as S3 answers."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_code, error_status, payload, read_body
from s3raw import signed_raw

# S3's smallest non-last part, then a short last one.
PART_SIZES = (5 << 20, 2048)


@pytest.fixture
def gw(gateway: Any) -> Any:
    return gateway


def _upload(s3: Any, bucket: str, key: str) -> tuple[str, list[dict[str, Any]], bytes]:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32")[
        "UploadId"
    ]
    parts, data = [], b""
    for number, size in enumerate(PART_SIZES, 1):
        body = payload(size, f"{key}-{number}")
        data += body
        resp = s3.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=body,
            ChecksumAlgorithm="CRC32",
        )
        parts.append(
            {"PartNumber": number, "ETag": resp["ETag"], "ChecksumCRC32": resp["ChecksumCRC32"]}
        )
    return upload_id, parts, data


def _complete_raw(gw: Any, bucket: str, key: str, upload_id: str, parts: list[Any]) -> Any:
    doc = "".join(
        f"<Part><PartNumber>{p['PartNumber']}</PartNumber><ETag>{p['ETag']}</ETag>"
        f"<ChecksumCRC32>{p['ChecksumCRC32']}</ChecksumCRC32></Part>"
        for p in parts
    )
    body = f"<CompleteMultipartUpload>{doc}</CompleteMultipartUpload>".encode()
    return signed_raw(gw, "POST", f"/{bucket}/{key}?uploadId={upload_id}", body)


def test_complete_repeat_answers_as_the_first(gw: Any, upstream: Any, bucket: str) -> None:
    s3 = gw.client()
    upload_id, parts, data = _upload(s3, bucket, "ckpt/shard")
    first = _complete_raw(gw, bucket, "ckpt/shard", upload_id, parts)
    assert first.status == 200, first.body
    again = _complete_raw(gw, bucket, "ckpt/shard", upload_id, parts)
    assert again.status == 200, again.body
    assert again.body == first.body  # same ETag, checksum, location: the same document
    # boto3's own retry path, with a precondition the first Complete made false.
    resp = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="ckpt/shard",
        UploadId=upload_id,
        MultipartUpload={"Parts": parts},
        IfNoneMatch="*",
    )
    head = s3.head_object(Bucket=bucket, Key="ckpt/shard")
    assert resp["ETag"] == head["ETag"]
    assert resp["ETag"].strip('"').endswith("-2")
    assert resp["ChecksumCRC32"].endswith("-2")
    assert read_body(s3.get_object(Bucket=bucket, Key="ckpt/shard")) == data
    # Only one version was made: the repeat acknowledged nothing new.
    assert gw.drained(bucket=bucket)["drained"] is True
    assert upstream.head_object(Bucket=bucket, Key="ckpt/shard")["ETag"] == head["ETag"]
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_complete_repeat_survives_a_restart(gateway_factory: Any, bucket: str) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    with gw.flush_paused():
        upload_id, parts, _ = _upload(s3, bucket, "k")
        first = _complete_raw(gw, bucket, "k", upload_id, parts)
        assert first.status == 200
        gw.restart(hard=True)  # kill -9: the completion record is in the journal
    again = _complete_raw(gw, bucket, "k", upload_id, parts)
    assert again.status == 200, again.body
    assert again.body == first.body
    gw.drained(bucket=bucket)
    assert _complete_raw(gw, bucket, "k", upload_id, parts).body == first.body


@pytest.mark.parametrize("change", ["overwrite", "delete", "new-upload"])
def test_complete_repeat_after_the_key_changed_is_no_such_upload(
    gw: Any, bucket: str, change: str
) -> None:
    s3 = gw.client()
    upload_id, parts, _ = _upload(s3, bucket, "k")
    assert _complete_raw(gw, bucket, "k", upload_id, parts).status == 200
    if change == "overwrite":
        s3.put_object(Bucket=bucket, Key="k", Body=b"newer")
    elif change == "delete":
        s3.delete_object(Bucket=bucket, Key="k")
    else:
        other, other_parts, _ = _upload(s3, bucket, "k")
        assert _complete_raw(gw, bucket, "k", other, other_parts).status == 200
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="k", UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
    assert error_status(exc.value) == 404
    assert error_code(exc.value) == "NoSuchUpload"


def test_complete_repeat_is_bound_to_its_key(gw: Any, bucket: str) -> None:
    s3 = gw.client()
    upload_id, parts, _ = _upload(s3, bucket, "k")
    assert _complete_raw(gw, bucket, "k", upload_id, parts).status == 200
    resp = _complete_raw(gw, bucket, "other-key", upload_id, parts)
    assert resp.status == 404
    assert b"<Code>NoSuchUpload</Code>" in resp.body
