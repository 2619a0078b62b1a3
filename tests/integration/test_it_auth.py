"""SigV4 verification and S3 XML errors: every bad request gets the right code, and the
server keeps serving."""

from __future__ import annotations

import datetime
import urllib.parse
from typing import Any

import botocore
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from harness import (
    GATEWAY_ACCESS_KEY,
    GATEWAY_SECRET_KEY,
    client_clock_offset,
    error_code,
    error_status,
    http_request,
    object_url,
    parse_s3_error,
    quoted_md5,
    read_body,
    send_signed,
    sign_request,
)


@pytest.fixture
def seeded(s3: Any, bucket: str) -> str:
    s3.put_object(Bucket=bucket, Key="seed", Body=b"seed body")
    return bucket


def _assert_denied(client: Any, bucket: str, code: str, status: int) -> None:
    calls = [
        lambda: client.get_object(Bucket=bucket, Key="seed"),
        lambda: client.put_object(Bucket=bucket, Key="intruder", Body=b"nope"),
        lambda: client.list_objects_v2(Bucket=bucket),
        lambda: client.delete_object(Bucket=bucket, Key="seed"),
        lambda: client.list_buckets(),
    ]
    for call in calls:
        with pytest.raises(ClientError) as exc:
            call()
        assert error_code(exc.value) == code
        assert error_status(exc.value) == status


def _assert_still_intact(s3: Any, bucket: str) -> None:
    assert read_body(s3.get_object(Bucket=bucket, Key="seed")) == b"seed body"
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="intruder")
    assert error_status(exc.value) == 404


def test_wrong_secret(gateway: Any, s3: Any, seeded: str) -> None:
    bad = gateway.client(secret_key=GATEWAY_SECRET_KEY + "x")
    _assert_denied(bad, seeded, "SignatureDoesNotMatch", 403)
    _assert_still_intact(s3, seeded)


def test_unknown_access_key(gateway: Any, s3: Any, seeded: str) -> None:
    bad = gateway.client(access_key="AKIDUNKNOWN000000000")
    _assert_denied(bad, seeded, "InvalidAccessKeyId", 403)
    _assert_still_intact(s3, seeded)


def test_upstream_credentials_are_not_client_credentials(
    gateway: Any, s3: Any, seeded: str
) -> None:
    bad = gateway.client(
        access_key=gateway.upstream_access_key, secret_key=gateway.upstream_secret_key
    )
    _assert_denied(bad, seeded, "InvalidAccessKeyId", 403)


def test_unsigned_request(gateway: Any, s3: Any, seeded: str) -> None:
    anon = gateway.client(config=Config(signature_version=botocore.UNSIGNED))
    _assert_denied(anon, seeded, "AccessDenied", 403)
    _assert_still_intact(s3, seeded)


def test_error_documents_are_s3_xml(gateway: Any, seeded: str) -> None:
    url = object_url(gateway.endpoint, seeded, "seed")
    resp = http_request("GET", url)  # no Authorization at all
    assert resp.status == 403
    err = parse_s3_error(resp.body)
    assert err["Code"] == "AccessDenied"
    assert err.get("Message")
    assert "xml" in (resp.header("content-type") or "")
    assert b"Traceback" not in resp.body

    req = sign_request("GET", object_url(gateway.endpoint, seeded, "missing"))
    resp = send_signed(req)
    assert resp.status == 404
    err = parse_s3_error(resp.body)
    assert err["Code"] == "NoSuchKey"
    assert err.get("Key") in (None, "missing")


def test_tampered_request_after_signing(gateway: Any, s3: Any, seeded: str) -> None:
    body = b"signed body"
    req = sign_request("PUT", object_url(gateway.endpoint, seeded, "tampered"), body=body)
    # Same length, different bytes: the x-amz-content-sha256 no longer matches.
    resp = send_signed(req, body=b"SIGNED BODY")
    assert resp.status in (400, 403), resp.body
    assert parse_s3_error(resp.body)["Code"] in (
        "XAmzContentSHA256Mismatch",
        "SignatureDoesNotMatch",
        "BadDigest",
    )
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=seeded, Key="tampered")
    assert error_status(exc.value) == 404

    # Sanity: the untampered request is accepted.
    assert send_signed(req).status == 200
    assert read_body(s3.get_object(Bucket=seeded, Key="tampered")) == body

    # A signed header changed after signing.
    req = sign_request(
        "PUT",
        object_url(gateway.endpoint, seeded, "tampered-header"),
        body=body,
        headers={"x-amz-meta-owner": "alice"},
    )
    headers = dict(req.headers)
    headers["x-amz-meta-owner"] = "mallory"
    resp = http_request("PUT", req.url, body=body, headers=headers)
    assert resp.status == 403
    assert parse_s3_error(resp.body)["Code"] == "SignatureDoesNotMatch"


def test_clock_skew(gateway: Any, seeded: str) -> None:
    client = gateway.client()
    with client_clock_offset(-datetime.timedelta(hours=2)), pytest.raises(ClientError) as exc:
        client.get_object(Bucket=seeded, Key="seed")
    assert error_code(exc.value) == "RequestTimeTooSkewed"
    assert error_status(exc.value) == 403
    # Within the allowed skew (15 minutes in S3): accepted.
    with client_clock_offset(datetime.timedelta(minutes=5)):
        assert read_body(client.get_object(Bucket=seeded, Key="seed")) == b"seed body"


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda c, b: c.get_bucket_policy(Bucket=b), id="GetBucketPolicy"),
        pytest.param(
            lambda c, b: c.put_bucket_tagging(
                Bucket=b, Tagging={"TagSet": [{"Key": "k", "Value": "v"}]}
            ),
            id="PutBucketTagging",
        ),
        pytest.param(lambda c, b: c.get_bucket_versioning(Bucket=b), id="GetBucketVersioning"),
        pytest.param(lambda c, b: c.get_object_acl(Bucket=b, Key="seed"), id="GetObjectAcl"),
        pytest.param(
            lambda c, b: c.get_object_tagging(Bucket=b, Key="seed"), id="GetObjectTagging"
        ),
        pytest.param(
            lambda c, b: c.put_bucket_lifecycle_configuration(
                Bucket=b,
                LifecycleConfiguration={
                    "Rules": [{"ID": "r", "Status": "Enabled", "Filter": {"Prefix": ""}}]
                },
            ),
            id="PutBucketLifecycleConfiguration",
        ),
    ],
)
def test_unsupported_operations(s3: Any, seeded: str, call: Any) -> None:
    with pytest.raises(ClientError) as exc:
        call(s3, seeded)
    assert error_code(exc.value) == "NotImplemented"
    assert error_status(exc.value) == 501
    # The object is untouched and the server still serves.
    assert read_body(s3.get_object(Bucket=seeded, Key="seed")) == b"seed body"


def test_unknown_method(gateway: Any, seeded: str) -> None:
    req = sign_request("PATCH", object_url(gateway.endpoint, seeded, "seed"), body=b"x")
    resp = send_signed(req)
    err = parse_s3_error(resp.body)
    assert (resp.status, err["Code"]) in ((405, "MethodNotAllowed"), (501, "NotImplemented"))


def test_presigned_get_and_put(gateway: Any, s3: Any, seeded: str) -> None:
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": seeded, "Key": "seed"}, ExpiresIn=300
    )
    resp = http_request("GET", url)
    assert resp.status == 200
    assert resp.body == b"seed body"
    assert resp.header("etag") == quoted_md5(b"seed body")

    # Tampered signature.
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    sig = query["X-Amz-Signature"][0]
    query["X-Amz-Signature"] = [("0" if sig[0] != "0" else "1") + sig[1:]]
    bad = parts._replace(query=urllib.parse.urlencode(query, doseq=True)).geturl()
    resp = http_request("GET", bad)
    assert resp.status == 403
    assert parse_s3_error(resp.body)["Code"] == "SignatureDoesNotMatch"

    put_url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": seeded, "Key": "presigned-put"}, ExpiresIn=300
    )
    resp = http_request("PUT", put_url, body=b"via presigned url")
    assert resp.status == 200, resp.body
    assert resp.header("etag") == quoted_md5(b"via presigned url")
    got = s3.get_object(Bucket=seeded, Key="presigned-put")
    assert read_body(got) == b"via presigned url"


def test_presigned_expired(gateway: Any, seeded: str) -> None:
    with client_clock_offset(-datetime.timedelta(hours=1)):
        url = gateway.client().generate_presigned_url(
            "get_object", Params={"Bucket": seeded, "Key": "seed"}, ExpiresIn=60
        )
    assert "X-Amz-Signature=" in url
    resp = http_request("GET", url)
    assert resp.status == 403
    assert parse_s3_error(resp.body)["Code"] == "AccessDenied"


JUNK_REQUESTS = [
    pytest.param("GET", "/", {"Authorization": "garbage"}, None, id="garbage-authorization"),
    pytest.param(
        "GET",
        "/{bucket}/k",
        {"Authorization": "AWS4-HMAC-SHA256 Credential=broken"},
        None,
        id="truncated-sigv4",
    ),
    pytest.param("PUT", "/{bucket}/k", {"Authorization": "AWS AKID:sig"}, b"v2", id="sigv2"),
    pytest.param("GET", "/{bucket}/%ff%fe", {}, None, id="invalid-utf8-path"),
    pytest.param("GET", "/{bucket}/a%00b", {}, None, id="nul-in-path"),
    pytest.param("DELETE", "/", {}, None, id="delete-root"),
    pytest.param(
        "PUT",
        "/{bucket}/k",
        {"Authorization": "AWS4-HMAC-SHA256 Credential=a/b/c, SignedHeaders=host, Signature=zz"},
        b"x",
        id="bad-scope",
    ),
]


@pytest.mark.parametrize(("method", "path", "headers", "body"), JUNK_REQUESTS)
def test_server_keeps_serving_after_bad_requests(
    gateway: Any,
    s3: Any,
    bucket: str,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes | None,
) -> None:
    path = path.format(bucket=bucket)
    resp = http_request(method, gateway.endpoint + path, body=body, headers=headers)
    assert 400 <= resp.status < 500, (method, path, resp.status, resp.body[:300])
    assert b"Traceback" not in resp.body
    err = parse_s3_error(resp.body)
    assert err["Code"], (method, path)
    s3.put_object(Bucket=bucket, Key="after", Body=b"still alive")
    assert read_body(s3.get_object(Bucket=bucket, Key="after")) == b"still alive"
    assert gateway.admin_request("GET", "/healthz").status == 200


def test_signed_request_signature_components(gateway: Any, bucket: str) -> None:
    """A hand-signed request (the harness's signer) is accepted: the harness is sound."""
    body = b"hand signed"
    req = sign_request(
        "PUT",
        object_url(gateway.endpoint, bucket, "hand signed/ key+%"),
        body=body,
        access_key=GATEWAY_ACCESS_KEY,
    )
    resp = send_signed(req)
    assert resp.status == 200, resp.body
    assert resp.header("etag") == quoted_md5(body)
    get = sign_request("GET", object_url(gateway.endpoint, bucket, "hand signed/ key+%"))
    resp = send_signed(get)
    assert resp.status == 200
    assert resp.body == body
