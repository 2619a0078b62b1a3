"""Logs of a real gateway: JSON lines, the access log, and no secrets in either."""

from __future__ import annotations

import http.client
import json
import re
import socket
import struct
import time
import urllib.parse
from typing import Any

from harness import GATEWAY_SECRET_KEY, http_request, payload, sign_request

# Combined Log Format plus the gateway's key=value fields.
ACCESS_LINE = re.compile(
    r'^(?P<remote>\S+) - - \[(?P<time>[^\]]+)\] "(?P<method>[A-Z]+) (?P<target>\S+) HTTP/1\.1" '
    r'(?P<status>\d{3}) (?P<bytes>\d+) "(?P<referer>[^"]*)" "(?P<agent>[^"]*)" '
    r"rid=(?P<rid>\S+) op=(?P<op>\S+) in=(?P<bytes_in>\d+) ms=(?P<ms>[\d.]+)( abort=client)?$"
)


def _exercise(gw: Any, bucket: str) -> tuple[bytes, str, str]:
    """A signed PUT, a presigned GET and a 404; returns (body, presigned url, signature)."""
    s3 = gw.client()
    body = payload(4321, seed="logs")
    s3.put_object(Bucket=bucket, Key="logs/obj", Body=body)
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "logs/obj"})
    assert http_request("GET", url).body == body
    signature = re.search(r"X-Amz-Signature=([0-9a-f]+)", url)
    assert signature
    missing = http_request("GET", gw.endpoint + f"/{bucket}/logs/missing")
    assert missing.status == 403  # unsigned: AccessDenied
    return body, url, signature.group(1)


def _gateway_lines(gw: Any) -> list[str]:
    text: str = gw.log_path.read_text()
    return [line for line in text.splitlines() if line and not line.startswith("=====")]


def test_json_logs_carry_access_records_without_secrets(gateway_factory: Any, bucket: str) -> None:
    gw = gateway_factory(extra_args=["--log-format", "json"])
    body, _, signature = _exercise(gw, bucket)
    gw.stop()
    records = [json.loads(line) for line in _gateway_lines(gw)]  # every line is JSON
    access = [r["access"] for r in records if r["logger"] == "gateway.access"]
    by_op = {a["operation"]: a for a in access}
    put = by_op["PutObject"]
    assert (put["method"], put["status"], put["bytes_in"]) == ("PUT", 200, len(body))
    assert put["target"] == f"/{bucket}/logs/obj"
    assert re.fullmatch(r"[0-9A-F]{16}", put["request_id"])
    get = by_op["GetObject"]
    assert (get["status"], get["bytes_out"]) == (200, len(body))
    assert "X-Amz-Signature=REDACTED" in get["target"]
    assert "X-Amz-Credential=REDACTED" in get["target"]
    assert "X-Amz-Expires=" in get["target"]
    denied = [a for a in access if a["status"] == 403]
    assert denied and denied[0]["target"] == f"/{bucket}/logs/missing"
    assert all(r["level"] in ("debug", "info", "warning", "error") for r in records)
    raw = "\n".join(_gateway_lines(gw))  # the harness's own command line left out
    for secret in (signature, GATEWAY_SECRET_KEY, gw.access_key, "Authorization"):
        assert secret not in raw, f"{secret!r} leaked into the log"


def test_text_access_log_is_combined_format_and_can_be_turned_off(
    gateway_factory: Any, bucket: str
) -> None:
    gw = gateway_factory()
    body, _, signature = _exercise(gw, bucket)
    gw.stop()
    matches = [m for m in map(ACCESS_LINE.match, _gateway_lines(gw)) if m]
    assert [m["op"] for m in matches][:2] == ["PutObject", "GetObject"]
    put, get = matches[0], matches[1]
    assert (put["method"], put["status"], put["bytes_in"]) == ("PUT", "200", str(len(body)))
    assert put["agent"].startswith("Boto3/")
    assert (get["status"], get["bytes"]) == ("200", str(len(body)))
    assert signature not in "\n".join(_gateway_lines(gw))

    quiet = gateway_factory(extra_args=["--access-log", "false"])
    _exercise(quiet, bucket)
    quiet.stop()
    lines = _gateway_lines(quiet)
    assert not any(ACCESS_LINE.match(line) for line in lines)
    assert any("S3 endpoint" in line for line in lines)  # the gateway's own lines remain


def _access_lines(gw: Any) -> list[re.Match[str]]:
    return [m for m in map(ACCESS_LINE.match, _gateway_lines(gw)) if m]


def _await_access_line(gw: Any, op: str, timeout_s: float = 20.0) -> re.Match[str]:
    """The first access line of ``op``, once the gateway wrote it (logs are unbuffered)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [m for m in _access_lines(gw) if m["op"] == op]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no access line for {op}:\n{gw.log_tail()}")


def test_client_closing_mid_get_is_a_client_abort_not_an_error(
    gateway_factory: Any, bucket: str
) -> None:
    gw = gateway_factory()
    size = 32 << 20  # far more than the socket buffers hold: the gateway is still writing
    gw.client().put_object(Bucket=bucket, Key="abort/big", Body=payload(size, seed="abort"))
    request = sign_request("GET", f"{gw.endpoint}/{bucket}/abort/big")
    head = f"GET /{bucket}/abort/big HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in request.headers.items()
    )
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(head.encode() + b"\r\n")
        got = b""
        while len(got) < 1 << 20:  # the status line and some of the body
            got += sock.recv(65536)
        assert got.startswith(b"HTTP/1.1 200 OK"), got[:200]
        # Reset (not a graceful FIN), as a killed client or a timed-out SDK does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    line = _await_access_line(gw, "GetObject")
    gw.client().head_object(Bucket=bucket, Key="abort/big")  # still serving
    gw.stop()
    assert line["status"] == "200"  # what was sent; no client saw a 500
    body_received = len(got) - got.index(b"\r\n\r\n") - 4
    assert body_received <= int(line["bytes"]) < size  # what was written before the reset
    text = gw.log_path.read_text()
    assert line.string.endswith(" abort=client")
    assert "client closed the connection: GET" in text
    assert "Traceback" not in text and " ERROR " not in text


def test_access_log_counts_bytes_received_without_content_length(
    gateway_factory: Any, bucket: str
) -> None:
    gw = gateway_factory()
    body = payload(300_000, seed="chunked-in")
    url = f"{gw.endpoint}/{bucket}/chunked/in"
    signed = sign_request("PUT", url, content_sha256="UNSIGNED-PAYLOAD")
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        headers = {k: v for k, v in signed.headers.items() if k.lower() != "content-length"}
        # HTTP chunked transfer coding: no Content-Length anywhere.
        conn.request(
            "PUT",
            parts.path,
            body=iter([body[:100_000], body[100_000:]]),
            headers=headers,
            encode_chunked=True,
        )
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
    finally:
        conn.close()
    assert gw.client().get_object(Bucket=bucket, Key="chunked/in")["Body"].read() == body
    put = _await_access_line(gw, "PutObject")
    assert put["bytes_in"] == str(len(body))


def test_client_closing_mid_upload_is_a_client_abort(gateway_factory: Any, bucket: str) -> None:
    gw = gateway_factory()
    size = 16 << 20
    request = sign_request(
        "PUT", f"{gw.endpoint}/{bucket}/abort/upload", content_sha256="UNSIGNED-PAYLOAD"
    )
    head = f"PUT /{bucket}/abort/upload HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in request.headers.items() if k.lower() != "content-length"
    )
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(f"{head}Content-Length: {size}\r\n\r\n".encode() + b"x" * (1 << 20))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    line = _await_access_line(gw, "PutObject")
    # The body reader reports the lost connection as IncompleteBody (or the middleware as a
    # client abort): either way at info level, with the bytes received, not the declared.
    assert line["status"] in ("400", "499"), line.string
    assert 0 < int(line["bytes_in"]) <= 1 << 20
    assert gw.admin_request("GET", f"/admin/v1/objects/{bucket}/abort/upload").status == 404
    assert not list((gw.data_dir / "tmp").iterdir())  # the partial body is gone
    gw.stop()
    text = gw.log_path.read_text()
    assert "Traceback" not in text and " ERROR " not in text
