"""``Expect`` values other than ``100-continue`` are ignored and the request served, as S3
does: every answer is S3's (XML errors, a request id) and logged, never aiohttp's bare 417.
``Expect: 100-continue`` still gets its interim 100 before the body is sent."""

from __future__ import annotations

import http.client
import socket
from typing import Any

import pytest
from harness import parse_s3_error, read_body
from s3raw import raw_exchange, signed_head


@pytest.mark.parametrize("expect", [b"foo", b"200-ok", b"100-continue-please", b""])
def test_expect_other_values_are_served(gateway: Any, s3: Any, bucket: str, expect: bytes) -> None:
    key = "expect-" + (expect.decode() or "empty")
    head = signed_head(gateway, "PUT", f"/{bucket}/{key}", b"abc")
    status, headers, body = raw_exchange(
        gateway.port, head + b"Expect: " + expect + b"\r\nContent-Length: 3\r\n\r\nabc"
    )
    assert status == 200, body
    assert headers.get("x-amz-request-id")
    assert read_body(s3.get_object(Bucket=bucket, Key=key)) == b"abc"
    rid = f"rid={headers['x-amz-request-id']}"
    assert rid in gateway.logged(rid)  # one access-log line per answer


def test_expect_error_answers_are_s3_xml(gateway: Any, bucket: str) -> None:
    head = signed_head(gateway, "GET", f"/{bucket}/missing")
    status, headers, body = raw_exchange(gateway.port, head + b"Expect: foo\r\n\r\n")
    assert status == 404
    assert parse_s3_error(body)["Code"] == "NoSuchKey"
    assert headers.get("x-amz-request-id")
    anonymous = f"GET /{bucket}/missing HTTP/1.1\r\nHost: x\r\nExpect: foo\r\n\r\n".encode()
    status, _, body = raw_exchange(gateway.port, anonymous)
    assert status == 403 and parse_s3_error(body)["Code"] == "AccessDenied"


def test_expect_100_continue_gets_the_interim_answer(gateway: Any, s3: Any, bucket: str) -> None:
    head = signed_head(gateway, "PUT", f"/{bucket}/continued", b"abc")
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(head + b"Expect: 100-continue\r\nContent-Length: 3\r\n\r\n")
        interim = sock.recv(64)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim
        sock.sendall(b"abc")
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        assert resp.status == 200
    assert read_body(s3.get_object(Bucket=bucket, Key="continued")) == b"abc"
