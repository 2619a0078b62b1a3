"""Logs of a real gateway: JSON lines, the access log, and no secrets in either."""

from __future__ import annotations

import json
import re
from typing import Any

from harness import GATEWAY_SECRET_KEY, http_request, payload

# Combined Log Format plus the gateway's key=value fields.
ACCESS_LINE = re.compile(
    r'^(?P<remote>\S+) - - \[(?P<time>[^\]]+)\] "(?P<method>[A-Z]+) (?P<target>\S+) HTTP/1\.1" '
    r'(?P<status>\d{3}) (?P<bytes>\d+) "(?P<referer>[^"]*)" "(?P<agent>[^"]*)" '
    r"rid=(?P<rid>\S+) op=(?P<op>\S+) in=(?P<bytes_in>\d+) ms=(?P<ms>[\d.]+)$"
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
