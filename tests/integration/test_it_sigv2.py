"""Signature Version 2, as S3 still verifies it: boto3's default presigned URL (a client
without an explicit ``signature_version`` signs it with SigV2 in us-east-1) used from a
plain HTTP client, and SigV2 header auth from boto3 (``signature_version='s3'``)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from harness import (
    GATEWAY_ACCESS_KEY,
    GATEWAY_SECRET_KEY,
    REGION,
    error_code,
    error_status,
    http_request,
    parse_s3_error,
    read_body,
)


def _default_client(gateway: Any, **config: Any) -> Any:
    """boto3 as a user builds it: no signature_version anywhere."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=gateway.endpoint,
        aws_access_key_id=GATEWAY_ACCESS_KEY,
        aws_secret_access_key=GATEWAY_SECRET_KEY,
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, **config),
    )


def _fetch(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_sigv2_boto3_default_presigned_get_and_put(gateway: Any, s3: Any, bucket: str) -> None:
    client = _default_client(gateway)
    s3.put_object(Bucket=bucket, Key="dir/a b+c", Body=b"presigned body")
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "dir/a b+c"}, ExpiresIn=300
    )
    assert "AWSAccessKeyId=" in url and "Signature=" in url and "Expires=" in url
    assert "X-Amz-Algorithm" not in url
    assert _fetch(url) == (200, b"presigned body")
    # A signed subresource: response-content-disposition is part of the string to sign.
    url = client.generate_presigned_url(
        "get_object",
        Params={"Bucket": bucket, "Key": "dir/a b+c", "ResponseContentDisposition": "inline"},
    )
    req = urllib.request.urlopen(url, timeout=30)
    assert req.headers["Content-Disposition"] == "inline"
    put_url = client.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "uploaded"}, ExpiresIn=300
    )
    # (urllib would add a form Content-Type, which is signed: S3 refuses that too)
    assert http_request("PUT", put_url, body=b"put through sigv2").status == 200
    assert read_body(s3.get_object(Bucket=bucket, Key="uploaded")) == b"put through sigv2"


def test_sigv2_presigned_url_expires_and_tampering(gateway: Any, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    client = _default_client(gateway)
    expired = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=-10
    )
    status, body = _fetch(expired)
    assert status == 403
    err = parse_s3_error(body)
    assert err["Code"] == "AccessDenied" and err["Message"] == "Request has expired"
    url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
    status, body = _fetch(url.replace("/k?", "/other?"))
    assert status == 403 and parse_s3_error(body)["Code"] == "SignatureDoesNotMatch"
    status, body = _fetch(url.replace("Signature=", "Signature=x"))
    assert status == 403 and parse_s3_error(body)["Code"] == "SignatureDoesNotMatch"


def test_sigv2_header_auth_from_boto3(gateway: Any, bucket: str) -> None:
    client = _default_client(gateway, signature_version="s3")
    client.put_object(Bucket=bucket, Key="v2/obj", Body=b"v2", Metadata={"m": "1"})
    got = client.get_object(Bucket=bucket, Key="v2/obj")
    assert read_body(got) == b"v2" and got["Metadata"] == {"m": "1"}
    assert [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]] == ["v2/obj"]
    upload = client.create_multipart_upload(Bucket=bucket, Key="v2/mpu")["UploadId"]
    part = client.upload_part(
        Bucket=bucket, Key="v2/mpu", UploadId=upload, PartNumber=1, Body=b"part"
    )
    client.complete_multipart_upload(
        Bucket=bucket,
        Key="v2/mpu",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )
    assert read_body(client.get_object(Bucket=bucket, Key="v2/mpu")) == b"part"
    client.delete_object(Bucket=bucket, Key="v2/obj")
    wrong = boto3.session.Session().client(
        "s3",
        endpoint_url=gateway.endpoint,
        aws_access_key_id=GATEWAY_ACCESS_KEY,
        aws_secret_access_key=GATEWAY_SECRET_KEY + "x",
        region_name=REGION,
        config=Config(signature_version="s3", retries={"max_attempts": 1}),
    )
    with pytest.raises(ClientError) as exc:
        wrong.get_object(Bucket=bucket, Key="v2/mpu")
    assert error_status(exc.value) == 403
    assert error_code(exc.value) == "SignatureDoesNotMatch"
    assert gateway.drained(bucket=bucket)["drained"] is True
