"""Header cases of ceph/s3-tests (test_headers.py), rewritten against the gateway with the
moto upstream: headers added or removed through boto3 hooks as s3-tests does, the same codes
asserted. SigV2 cases (auth_aws2) use boto3 with ``signature_version='s3'``, as s3-tests'
get_v2_client does."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from email.utils import formatdate
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
    parse_s3_error,
)
from s3raw import raw_exchange


def _v2_client(gateway: Any) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=gateway.endpoint,
        aws_access_key_id=GATEWAY_ACCESS_KEY,
        aws_secret_access_key=GATEWAY_SECRET_KEY,
        region_name=REGION,
        config=Config(signature_version="s3", retries={"max_attempts": 1}),
    )


def _with_hook(client: Any, event: str, hook: Callable[..., None], call: Callable[[], Any]) -> Any:
    client.meta.events.register(event, hook)
    try:
        return call()
    finally:
        client.meta.events.unregister(event, hook)


def _put_with_headers(
    client: Any, bucket: str, headers: dict[str, str], body: bytes = b"bar"
) -> Any:
    def add(**kwargs: Any) -> None:
        kwargs["params"]["headers"].update(headers)

    return _with_hook(
        client,
        "before-call.s3.PutObject",
        add,
        lambda: client.put_object(Bucket=bucket, Key="foo", Body=body),
    )


def _refused(call: Callable[[], Any]) -> tuple[int, str]:
    with pytest.raises(ClientError) as exc:
        call()
    return error_status(exc.value), error_code(exc.value)


@pytest.mark.parametrize(
    ("md5", "code"),
    [
        ("YWJyYWNhZGFicmE=", "InvalidDigest"),
        ("rL0Y20xC+Fzt72VPzMSk2A==", "BadDigest"),
        ("", "InvalidDigest"),
    ],
)
def test_object_create_bad_md5(s3: Any, bucket: str, md5: str, code: str) -> None:
    assert _refused(lambda: _put_with_headers(s3, bucket, {"Content-MD5": md5})) == (400, code)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="foo")


@pytest.mark.parametrize("expect", ["200", ""])
def test_object_create_bad_expect(s3: Any, bucket: str, expect: str) -> None:
    """test_object_create_bad_expect_mismatch / _empty: S3 serves the request."""
    _put_with_headers(s3, bucket, {"Expect": expect})
    assert s3.get_object(Bucket=bucket, Key="foo")["Body"].read() == b"bar"


def test_object_create_bad_contentlength_empty(s3: Any, bucket: str) -> None:
    status, _ = _refused(lambda: _put_with_headers(s3, bucket, {"Content-Length": ""}))
    assert status == 400


class _Unsent(Exception):
    """Raised from botocore's before-send hook: the request it was about to send."""

    def __init__(self, request: Any) -> None:
        super().__init__("captured")
        self.request = request


def _as_sent_in_aws_chunked_mode(gateway: Any, bucket: str, headers: dict[str, str]) -> Any:
    """s3-tests' PUT with ``headers`` added (its before-call hook), as botocore prepares it
    for an https endpoint: the mode in which it streams PutObject bodies aws-chunked with a
    trailing checksum. Captured before it leaves, to be replayed over this gateway's http."""
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=f"https://127.0.0.1:{gateway.port}",
        aws_access_key_id=GATEWAY_ACCESS_KEY,
        aws_secret_access_key=GATEWAY_SECRET_KEY,
        region_name=REGION,
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )

    def add(**kwargs: Any) -> None:
        kwargs["params"]["headers"].update(headers)

    def capture(request: Any, **kwargs: Any) -> None:
        raise _Unsent(request)

    client.meta.events.register("before-call.s3.PutObject", add)
    client.meta.events.register("before-send.s3.PutObject", capture)
    with pytest.raises(_Unsent) as unsent:
        client.put_object(Bucket=bucket, Key="foo", Body="bar")
    return unsent.value.request


def _wire(request: Any) -> tuple[bytes, bytes]:
    """The captured request's head (without the blank line) and body as urllib3 sends them:
    the aws-chunked body inside HTTP chunked framing."""
    url = urllib.parse.urlsplit(request.url)
    head = f"{request.method} {url.path} HTTP/1.1\r\n".encode()
    for name, value in request.headers.items():
        head += name.encode() + b": " + (value if isinstance(value, bytes) else value.encode())
        head += b"\r\n"
    body = request.body.read()
    return head, b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)


def test_object_create_bad_contentlength_empty_aws_chunked(gateway: Any, bucket: str) -> None:
    """test_object_create_bad_contentlength_empty in aws-chunked mode. botocore deletes the
    empty Content-Length the hook added (an aws-chunked body goes HTTP chunked, without
    one), so what leaves the client is an ordinary streaming upload, which S3 stores like
    every boto3 upload over https, and so does the gateway. The request the test means, with
    the empty header on the wire, is refused 400 as S3 refuses it."""
    request = _as_sent_in_aws_chunked_mode(gateway, bucket, {"Content-Length": ""})
    sent = {name.lower(): value for name, value in request.headers.items()}
    assert "content-length" not in sent
    assert sent["transfer-encoding"] == b"chunked"
    assert sent["content-encoding"] == b"aws-chunked"
    assert sent["x-amz-content-sha256"] == b"STREAMING-UNSIGNED-PAYLOAD-TRAILER"

    head, body = _wire(request)
    status, _, answer = raw_exchange(gateway.port, head + b"Content-Length: \r\n\r\n" + body)
    assert (status, parse_s3_error(answer)["Code"]) == (400, "BadRequest")
    with pytest.raises(ClientError) as missing:
        gateway.client().head_object(Bucket=bucket, Key="foo")
    assert error_status(missing.value) == 404

    status, _, answer = raw_exchange(gateway.port, head + b"\r\n" + body)
    assert status == 200, answer
    assert gateway.client().get_object(Bucket=bucket, Key="foo")["Body"].read() == b"bar"


def test_object_create_bad_contentlength_negative(gateway: Any, bucket: str) -> None:
    client = gateway.client(config=Config(request_checksum_calculation="when_required"))
    status, _ = _refused(lambda: client.put_object(Bucket=bucket, Key="foo", ContentLength=-1))
    assert status == 400


@pytest.mark.parametrize("content_type", ["text/plain", ""])
def test_object_create_bad_contenttype(s3: Any, bucket: str, content_type: str) -> None:
    s3.put_object(Bucket=bucket, Key="foo", Body=b"bar", ContentType=content_type)
    assert s3.head_object(Bucket=bucket, Key="foo")["ContentType"] == content_type


def test_object_create_bad_authorization_empty(s3: Any, bucket: str) -> None:
    def blank(request: Any, **kwargs: Any) -> None:
        request.headers["Authorization"] = ""

    status, _ = _refused(
        lambda: _with_hook(
            s3,
            "before-send.s3.PutObject",
            blank,
            lambda: s3.put_object(Bucket=bucket, Key="foo", Body=b"bar"),
        )
    )
    assert status == 403


def test_object_create_date_and_amz_date(s3: Any, bucket: str) -> None:
    date = formatdate(usegmt=True)
    _put_with_headers(s3, bucket, {"Date": date, "X-Amz-Date": date})


# ------------------------------------------------------------------------- SigV2 (auth_aws2)


def test_object_create_bad_md5_invalid_garbage_aws2(gateway: Any, bucket: str) -> None:
    v2 = _v2_client(gateway)
    assert _refused(lambda: _put_with_headers(v2, bucket, {"Content-MD5": "AWS HAHAHA"})) == (
        400,
        "InvalidDigest",
    )


def test_object_create_bad_authorization_invalid_aws2(gateway: Any, bucket: str) -> None:
    v2 = _v2_client(gateway)

    def garble(request: Any, **kwargs: Any) -> None:
        request.headers["Authorization"] = "AWS HAHAHA"

    result = _refused(
        lambda: _with_hook(
            v2,
            "before-send.s3.PutObject",
            garble,
            lambda: v2.put_object(Bucket=bucket, Key="foo", Body=b"bar"),
        )
    )
    assert result == (400, "InvalidArgument")


@pytest.mark.parametrize(
    ("amz_date", "status", "code"),
    [
        ("Bad Date", 403, "AccessDenied"),
        ("", 403, "AccessDenied"),
        ("Tue, 07 Jul 2010 21:53:04 GMT", 403, "RequestTimeTooSkewed"),
        ("Tue, 07 Jul 1950 21:53:04 GMT", 403, "AccessDenied"),
        ("Tue, 07 Jul 9999 21:53:04 GMT", 403, "RequestTimeTooSkewed"),
    ],
)
def test_object_create_bad_date_aws2(
    gateway: Any, s3: Any, bucket: str, amz_date: str, status: int, code: str
) -> None:
    v2 = _v2_client(gateway)
    assert _refused(lambda: _put_with_headers(v2, bucket, {"x-amz-date": amz_date})) == (
        status,
        code,
    )
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="foo")


def test_object_create_bad_ua_empty_aws2(gateway: Any, bucket: str) -> None:
    v2 = _v2_client(gateway)
    _put_with_headers(v2, bucket, {"User-Agent": ""})
    assert v2.get_object(Bucket=bucket, Key="foo")["Body"].read() == b"bar"
