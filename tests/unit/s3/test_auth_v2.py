"""SigV2 verification against what botocore's own SigV2 signers (HmacV1Auth for headers,
HmacV1QueryAuth for presigned URLs) produce: string to sign, subresources, x-amz-* headers,
virtual-hosted resources, expiry and skew."""

from __future__ import annotations

import time
from email.utils import formatdate
from urllib.parse import urlsplit

import pytest
from botocore.auth import HmacV1Auth, HmacV1QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.errors import (
    AccessDenied,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidRequest,
    RequestTimeTooSkewed,
    SignatureDoesNotMatch,
)
from gateway.s3.auth import UNSIGNED_PAYLOAD, verify_request

KEY, SECRET = "AKIDV2EXAMPLE", "v2-secret/with+chars"
CREDS = {KEY: SECRET}
HOST = "127.0.0.1:9000"


def _headers(req: AWSRequest) -> dict[str, str]:
    return {k: v for k, v in req.headers.items()}


def _split(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.path, parts.query


def _header_signed(
    method: str, url: str, headers: dict[str, str] | None = None, auth_path: str | None = None
) -> AWSRequest:
    req = AWSRequest(method=method, url=url, headers=dict(headers or {}))
    if auth_path is not None:
        req.auth_path = auth_path
    HmacV1Auth(Credentials(KEY, SECRET)).add_auth(req)
    return req


CASES = [
    ("GET", f"http://{HOST}/b1/k", {}),
    ("PUT", f"http://{HOST}/b1/dir/a%20b%2Bc", {"Content-Type": "text/plain"}),
    (
        "PUT",
        f"http://{HOST}/b1/k",
        {"Content-MD5": "1B2M2Y8AsgTpgAZPz8t9jw==", "x-amz-meta-b": "2", "x-amz-meta-a": " 1 "},
    ),
    ("PUT", f"http://{HOST}/b1/k?partNumber=2&uploadId=abc-_", {}),
    ("POST", f"http://{HOST}/b1/k?uploads", {}),
    ("GET", f"http://{HOST}/b1/k?response-content-disposition=attachment%3B%20x&foo=bar", {}),
    ("POST", f"http://{HOST}/b1?delete", {"Content-MD5": "x"}),
    ("GET", f"http://{HOST}/b1?list-type=2&prefix=a%2Fb", {}),
    ("GET", f"http://{HOST}/", {}),
]


@pytest.mark.parametrize(("method", "url", "headers"), CASES)
def test_auth_v2_header_signatures_botocore_makes(
    method: str, url: str, headers: dict[str, str]
) -> None:
    req = _header_signed(method, url, headers)
    path, query = _split(url)
    ctx = verify_request(method, path, query, _headers(req), CREDS, time.time())
    assert ctx.access_key == KEY
    assert ctx.content_sha256 == UNSIGNED_PAYLOAD


@pytest.mark.parametrize(("method", "url", "headers"), CASES)
def test_auth_v2_presigned_urls_botocore_makes(
    method: str, url: str, headers: dict[str, str]
) -> None:
    req = AWSRequest(method=method, url=url, headers=dict(headers))
    HmacV1QueryAuth(Credentials(KEY, SECRET), expires=60).add_auth(req)
    path, query = _split(req.url)
    assert "AWSAccessKeyId=" in query and "Signature=" in query and "Expires=" in query
    sent = {k: v for k, v in headers.items() if not k.lower().startswith("x-amz-")}
    assert verify_request(method, path, query, sent, CREDS, time.time()).access_key == KEY


def test_auth_v2_virtual_hosted_resource_has_the_bucket() -> None:
    req = _header_signed("GET", "http://b1.s3.test:9000/k", auth_path="/b1/k")
    ctx = verify_request("GET", "/k", "", _headers(req), CREDS, time.time(), virtual_bucket="b1")
    assert ctx.access_key == KEY
    with pytest.raises(SignatureDoesNotMatch):
        verify_request("GET", "/k", "", _headers(req), CREDS, time.time())


def test_auth_v2_tampering_is_signature_does_not_match() -> None:
    req = _header_signed("PUT", f"http://{HOST}/b1/k", {"x-amz-meta-a": "1"})
    headers = _headers(req) | {"x-amz-meta-a": "2"}
    with pytest.raises(SignatureDoesNotMatch) as exc:
        verify_request("PUT", "/b1/k", "", headers, CREDS, time.time())
    assert "x-amz-meta-a:2" in exc.value.fields["StringToSign"]
    with pytest.raises(SignatureDoesNotMatch):
        verify_request("PUT", "/b1/other", "", _headers(req), CREDS, time.time())
    with pytest.raises(SignatureDoesNotMatch):  # a signed subresource added afterwards
        verify_request("PUT", "/b1/k", "acl", _headers(req), CREDS, time.time())
    # An unsigned, unknown query parameter is not part of the resource (as in S3).
    assert verify_request("PUT", "/b1/k", "foo=1", _headers(req), CREDS, time.time())


def test_auth_v2_presigned_expiry() -> None:
    req = AWSRequest(method="GET", url=f"http://{HOST}/b1/k")
    HmacV1QueryAuth(Credentials(KEY, SECRET), expires=60).add_auth(req)
    path, query = _split(req.url)
    assert verify_request("GET", path, query, {}, CREDS, time.time() + 30)
    with pytest.raises(AccessDenied) as exc:
        verify_request("GET", path, query, {}, CREDS, time.time() + 120)
    assert exc.value.message == "Request has expired"
    assert "Expires" in exc.value.fields and "ServerTime" in exc.value.fields


def test_auth_v2_header_date_skew_and_x_amz_date() -> None:
    old = formatdate(time.time() - 3600, usegmt=True)
    req = _header_signed("GET", f"http://{HOST}/b1/k")
    headers = _headers(req)
    assert verify_request("GET", "/b1/k", "", headers, CREDS, time.time())
    with pytest.raises(RequestTimeTooSkewed):
        verify_request("GET", "/b1/k", "", headers, CREDS, time.time() + 3600)
    # x-amz-date is signed among the x-amz-* headers; the Date line is then empty.
    req = _header_signed("GET", f"http://{HOST}/b1/k", {"x-amz-date": formatdate(usegmt=True)})
    headers = _headers(req) | {"Date": old}
    with pytest.raises(SignatureDoesNotMatch):
        verify_request("GET", "/b1/k", "", headers, CREDS, time.time())
    with pytest.raises(AccessDenied):  # no date at all: refused, never taken as anonymous
        verify_request("GET", "/b1/k", "", {"Authorization": "AWS a:b"}, CREDS, time.time())


@pytest.mark.parametrize(
    ("query", "headers", "error"),
    [
        ("AWSAccessKeyId=AKIDV2EXAMPLE&Expires=9999999999", {}, AccessDenied),
        ("AWSAccessKeyId=AKIDV2EXAMPLE&Signature=x&Expires=soon", {}, AccessDenied),
        ("AWSAccessKeyId=NOPE&Signature=x&Expires=9999999999", {}, InvalidAccessKeyId),
        ("", {"Authorization": "AWS no-colon"}, InvalidArgument),
        (
            "",
            {
                "Authorization": "AWS AKIDV2EXAMPLE:x",
                "Date": formatdate(usegmt=True),
                "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
            },
            InvalidRequest,
        ),
    ],
)
def test_auth_v2_malformed(query: str, headers: dict[str, str], error: type[Exception]) -> None:
    with pytest.raises(error):
        verify_request("GET", "/b1/k", query, headers, CREDS, time.time())


def test_auth_v2_bucket_resource_signed_with_its_slash() -> None:
    """botocore signs a bucket request as ``/bucket/`` (its auth_path) and sends ``/bucket``."""
    req = _header_signed("GET", f"http://{HOST}/b1?list-type=2", auth_path="/b1/")
    assert verify_request("GET", "/b1", "list-type=2", _headers(req), CREDS, time.time())
