"""Signatures scoped to another region are refused, as S3 refuses them, naming the region
the gateway expects (its ``--upstream-region``): header auth, presigned URLs and streaming
(chunk-signed) uploads. Nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    REGION,
    aws_chunked_signed,
    error_status,
    http_request,
    parse_s3_error,
    send_signed,
    sign_request,
    signed_chunked_body_length,
)

OTHER = "eu-west-1"


def _absent(s3: Any, bucket: str, key: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key=key)
    assert error_status(exc.value) == 404


def test_region_header_auth_for_another_region(gateway: Any, s3: Any, bucket: str) -> None:
    req = sign_request("PUT", f"{gateway.endpoint}/{bucket}/k", body=b"x", region=OTHER)
    resp = send_signed(req)
    assert resp.status == 400
    err = parse_s3_error(resp.body)
    assert err["Code"] == "AuthorizationHeaderMalformed"
    assert err["Message"] == (
        f"The authorization header is malformed; the region '{OTHER}' is wrong; "
        f"expecting '{REGION}'"
    )
    assert err["Region"] == REGION
    _absent(s3, bucket, "k")


def test_region_boto3_follows_the_named_region(gateway: Any, s3: Any, bucket: str) -> None:
    """botocore reads <Region> from that error and signs again for it, as with S3: the first
    attempt is refused, the second (scoped to the gateway's region) stores the object."""
    statuses: list[int] = []
    other = gateway.client(region=OTHER)
    other.meta.events.register(
        "needs-retry.s3.PutObject",
        lambda response, **kw: statuses.append(response[0].status_code) if response else None,
    )
    other.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert statuses[0] == 400 and statuses[-1] == 200
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"


def test_region_presigned_url_for_another_region(gateway: Any, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = gateway.client(region=OTHER).generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=60
    )
    resp = http_request("GET", url)
    assert resp.status == 400
    err = parse_s3_error(resp.body)
    assert err["Code"] == "AuthorizationQueryParametersError"
    assert err["Region"] == REGION
    assert f"the region '{OTHER}' is wrong; expecting '{REGION}'" in err["Message"]
    put_url = gateway.client(region=OTHER).generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=60
    )
    assert http_request("PUT", put_url, body=b"x").status == 400
    _absent(s3, bucket, "p")


def test_region_streaming_signature_for_another_region(gateway: Any, s3: Any, bucket: str) -> None:
    data = b"s" * 3000
    headers = {
        "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(data)),
        "Content-Length": str(signed_chunked_body_length(len(data), 1024)),
    }
    url = f"{gateway.endpoint}/{bucket}/streamed"
    for region, status in ((OTHER, 400), (REGION, 200)):
        req = sign_request(
            "PUT",
            url,
            headers=headers,
            content_sha256="STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
            region=region,
        )
        body = aws_chunked_signed(
            data,
            seed_signature=req.signature,
            timestamp=req.timestamp,
            region=region,
            chunk_size=1024,
        )
        resp = send_signed(req, body=body)
        assert resp.status == status, resp.body
        if status == 400:
            assert parse_s3_error(resp.body)["Code"] == "AuthorizationHeaderMalformed"
            _absent(s3, bucket, "streamed")
    assert s3.get_object(Bucket=bucket, Key="streamed")["Body"].read() == data
