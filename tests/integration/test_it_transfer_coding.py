"""Transfer codings over a raw socket: ``chunked`` is decoded; any other coding is a coding
the gateway does not decode, refused as S3 does (501 NotImplemented naming the header, in
S3 XML with a request id) with nothing stored."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_status, parse_s3_error, read_body
from s3raw import raw_exchange, signed_head

DATA = b"abc"
CHUNKED_BODY = b"3\r\nabc\r\n0\r\n\r\n"


def _put(gw: Any, bucket: str, key: str, coding_lines: bytes) -> tuple[int, dict[str, str], bytes]:
    head = signed_head(gw, "PUT", f"/{bucket}/{key}", DATA)
    return raw_exchange(gw.port, head + coding_lines + b"\r\n" + CHUNKED_BODY)


def _absent(s3: Any, bucket: str, key: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key=key)
    assert error_status(exc.value) == 404


def test_transfer_coding_chunked_is_decoded(gateway: Any, s3: Any, bucket: str) -> None:
    status, _, body = _put(gateway, bucket, "chunked", b"Transfer-Encoding: chunked\r\n")
    assert status == 200, body
    assert read_body(s3.get_object(Bucket=bucket, Key="chunked")) == DATA


@pytest.mark.parametrize(
    "lines",
    [
        b"Transfer-Encoding: gzip, chunked\r\n",
        b"Transfer-Encoding: deflate,chunked\r\n",
        b"Transfer-Encoding: identity, chunked\r\n",
        b"Transfer-Encoding: gzip\r\n",
        b"Transfer-Encoding: chunked, gzip\r\n",
    ],
)
def test_transfer_coding_other_than_chunked_is_not_implemented(
    gateway: Any, s3: Any, bucket: str, lines: bytes
) -> None:
    key = "coded-" + lines.split(b":")[1].strip().decode().replace(",", "").replace(" ", "-")
    status, headers, body = _put(gateway, bucket, key, lines)
    assert status == 501, body
    err = parse_s3_error(body)
    assert err["Code"] == "NotImplemented"
    assert err["Header"] == "Transfer-Encoding"
    assert headers.get("x-amz-request-id")
    _absent(s3, bucket, key)
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
