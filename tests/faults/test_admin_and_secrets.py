"""Admin bearer token off loopback, client credentials from a file or a Secret directory
(reloaded on change), and no secret, signature or Authorization value in the debug log."""

from __future__ import annotations

import datetime
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    GATEWAY_ACCESS_KEY,
    GATEWAY_SECRET_KEY,
    UPSTREAM_SECRET_KEY,
    GatewayProcess,
    aws_chunked_signed,
    client_clock_offset,
    error_code,
    http_request,
    s3_client,
    send_signed,
    sign_request,
    signed_chunked_body_length,
)

TOKEN = "admin-token-0123456789abcdef-not-a-secret-in-real-life"
PAIRS = {
    "AKIDFILEKEY000000001": "file-secret-one/0123456789abcdefghijklmn",
    "AKIDFILEKEY000000002": "file-secret-two/0123456789abcdefghijklmn",
}


def _admin(gw: GatewayProcess, method: str, path: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    body = b"" if method == "POST" else None
    return http_request(method, f"{gw.admin}{path}", body=body, headers=headers).status


def test_admin_off_loopback_refuses_to_start_without_token(
    moto_server: str, tmp_path: Path
) -> None:
    gw = GatewayProcess(tmp_path / "data", moto_server)
    cmd = [*gw.command(), "--admin-listen", f"0.0.0.0:{gw.admin_port}"]
    done = subprocess.run(cmd, env=gw.environment(), capture_output=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert b"admin-token" in done.stderr


def test_malformed_credentials_file_refuses_to_start(moto_server: str, tmp_path: Path) -> None:
    """A file that parses to no mapping: a configuration error naming the file, exit 2, no
    traceback and no secret in the message."""
    bad = tmp_path / "creds.yaml"
    bad.write_text("- AKIDLISTNOTAMAPPING\n- list-secret-never-printed\n")
    gw = GatewayProcess(tmp_path / "data", moto_server)
    cmd = [*gw.command(), "--credentials-file", str(bad)]
    done = subprocess.run(cmd, env=gw.environment(), capture_output=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert b"configuration error" in done.stderr and str(bad).encode() in done.stderr
    assert b"Traceback" not in done.stderr
    assert b"list-secret-never-printed" not in done.stderr


def test_missing_credentials_file_refuses_to_start(moto_server: str, tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "data", moto_server)
    cmd = [*gw.command(), "--credentials-file", str(tmp_path / "absent.yaml")]
    done = subprocess.run(cmd, env=gw.environment(), capture_output=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert b"credentials-file" in done.stderr


@pytest.mark.parametrize("via", ["env", "file"])
def test_admin_off_loopback_requires_bearer_token(
    gateway_factory: Any, tmp_path: Path, via: str
) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    kwargs: dict[str, Any] = (
        {"env": {"GATEWAY_ADMIN_TOKEN": TOKEN}}
        if via == "env"
        else {"extra_args": ["--admin-token-file", str(token_file)]}
    )
    gw = gateway_factory(start=False, **kwargs)
    gw.extra_args += ["--admin-listen", f"0.0.0.0:{gw.admin_port}"]
    gw.start()  # waits on /readyz without a token: probes stay open
    assert _admin(gw, "GET", "/healthz", None) == 200
    assert _admin(gw, "GET", "/readyz", None) == 200
    for method, path in [
        ("GET", "/admin/v1/status"),
        ("GET", "/metrics"),
        ("POST", "/admin/v1/flush/pause"),
        ("GET", "/admin/v1/drain"),
    ]:
        assert _admin(gw, method, path, None) == 401, path
        assert _admin(gw, method, path, TOKEN + "x") == 401, path
        assert _admin(gw, method, path, TOKEN[:-1]) == 401, path
    assert _admin(gw, "GET", "/admin/v1/status", TOKEN) == 200
    assert _admin(gw, "POST", "/admin/v1/flush/pause", TOKEN) == 200
    assert _admin(gw, "POST", "/admin/v1/flush/resume", TOKEN) == 200
    assert (
        http_request(
            "GET", f"{gw.admin}/metrics", headers={"Authorization": f"bearer {TOKEN}"}
        ).status
        == 200
    )


def _client(gw: GatewayProcess, key: str, secret: str) -> Any:
    return s3_client(gw.endpoint, access_key=key, secret_key=secret)


def _wait_until(check: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.1)


def _works(client: Any, bucket: str) -> bool:
    try:
        client.head_bucket(Bucket=bucket)
        return True
    except ClientError:
        return False


def test_credentials_file_with_several_pairs(
    gateway_factory: Any, bucket: str, tmp_path: Path
) -> None:
    path = tmp_path / "creds.json"
    path.write_text(json.dumps(PAIRS))
    gw = gateway_factory(extra_args=["--credentials-file", str(path)])
    for key, secret in PAIRS.items():
        c = _client(gw, key, secret)
        c.put_object(Bucket=bucket, Key=f"by/{key}", Body=key.encode())
        assert c.get_object(Bucket=bucket, Key=f"by/{key}")["Body"].read() == key.encode()
    with pytest.raises(ClientError) as exc:
        _client(gw, "AKIDFILEKEY000000001", "wrong").head_object(Bucket=bucket, Key="by/x")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as exc:
        _client(gw, "AKIDNOTINFILE0000000", "x").list_objects_v2(Bucket=bucket)
    assert error_code(exc.value) == "InvalidAccessKeyId"
    # The --access-key pair still works beside the file.
    assert _works(gw.client(), bucket)


def test_credentials_secret_directory_is_reloaded(
    gateway_factory: Any, bucket: str, tmp_path: Path
) -> None:
    """A Kubernetes Secret mount: file name = access key, content = secret; ``..data`` and
    other dot entries are ignored; adding, rotating and removing keys needs no restart."""
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    (secret_dir / "..data").mkdir()
    (secret_dir / "AKIDDIRKEY0000000001").write_text("dir-secret-one/0123456789abcdef\n")
    gw = gateway_factory(extra_args=["--credentials-file", str(secret_dir)])
    one = _client(gw, "AKIDDIRKEY0000000001", "dir-secret-one/0123456789abcdef")
    assert _works(one, bucket)
    two = _client(gw, "AKIDDIRKEY0000000002", "dir-secret-two/0123456789abcdef")
    assert not _works(two, bucket)
    (secret_dir / "AKIDDIRKEY0000000002").write_text("dir-secret-two/0123456789abcdef")
    _wait_until(lambda: _works(two, bucket))
    (secret_dir / "AKIDDIRKEY0000000001").write_text("dir-secret-one/rotated0123456789")
    _wait_until(lambda: not _works(one, bucket))
    assert _works(_client(gw, "AKIDDIRKEY0000000001", "dir-secret-one/rotated0123456789"), bucket)


class _Capture:
    """Every Authorization header and presigned signature boto3 sends."""

    def __init__(self) -> None:
        self.values: set[str] = set()

    def __call__(self, request: Any, **_: Any) -> None:
        auth = request.headers.get("Authorization")
        if auth:
            value = auth.decode() if isinstance(auth, bytes) else auth
            self.values.add(value)
            self.values.add(value.rsplit("Signature=", 1)[-1])


def test_no_secret_in_debug_log(gateway_factory: Any, bucket: str, tmp_path: Path) -> None:
    path = tmp_path / "creds.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in PAIRS.items()))
    gw = gateway_factory(extra_args=["--credentials-file", str(path), "--log-level", "trace"])
    secrets = {GATEWAY_SECRET_KEY, UPSTREAM_SECRET_KEY, *PAIRS.values()}
    capture = _Capture()
    c = gw.client()
    c.meta.events.register("before-send.s3", capture)
    c.put_object(Bucket=bucket, Key="log/a", Body=b"a" * 1000)
    c.get_object(Bucket=bucket, Key="log/a")["Body"].read()
    c.upload_fileobj(__import__("io").BytesIO(b"b" * 6_000_000), bucket, "log/mp")
    url = c.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "log/a"})
    with client_clock_offset(datetime.timedelta(hours=-3)):
        expired = c.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "log/a"}, ExpiresIn=60
        )
    presigned_sigs = {u.rsplit("X-Amz-Signature=", 1)[1] for u in (url, expired)}
    assert http_request("GET", url).status == 200
    assert http_request("GET", expired).status == 403
    bad = _client(gw, "AKIDFILEKEY000000001", "wrong-secret")
    bad.meta.events.register("before-send.s3", capture)
    with pytest.raises(ClientError):
        bad.put_object(Bucket=bucket, Key="log/denied", Body=b"x")
    streamed = _signed_streaming_put(gw, bucket)
    gw.drained(bucket=bucket)
    gw.stop()
    # The harness writes its own command line (with --secret-key) into the same file.
    lines = gw.log_path.read_text(errors="replace").splitlines()
    log = "\n".join(line for line in lines if not line.startswith("===== start #"))
    assert "SignatureDoesNotMatch" in log and "DEBUG" in log  # the log did capture those
    leaked = [s for s in secrets | presigned_sigs | capture.values | streamed if s in log]
    assert leaked == []
    assert "Authorization" not in log  # (X-Amz-Signature=REDACTED may appear: the name only)


def _signed_streaming_put(gw: GatewayProcess, bucket: str) -> set[str]:
    data = b"z" * 3000
    headers = {
        "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(data)),
        "Content-Length": str(signed_chunked_body_length(len(data), 1024)),
    }
    req = sign_request(
        "PUT",
        f"{gw.endpoint}/{bucket}/log/streamed",
        headers=headers,
        content_sha256="STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    )
    body = aws_chunked_signed(
        data, seed_signature=req.signature, timestamp=req.timestamp, chunk_size=1024
    )
    assert send_signed(req, body=body).status == 200
    chunk_sigs = {
        line.split(b"chunk-signature=")[1].decode()
        for line in body.split(b"\r\n")
        if b"chunk-signature=" in line
    }
    return {req.signature, req.headers["Authorization"], *chunk_sigs, GATEWAY_ACCESS_KEY + "x"}
