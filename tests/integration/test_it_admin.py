"""Operator interfaces: admin object state, /metrics, and the `gateway status|drain` commands."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from harness import REPO_ROOT, flush_state, payload, quoted_md5


def _cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_object_state_endpoint(gateway: Any, s3: Any, bucket: str) -> None:
    body = payload(2048, seed="objstate")
    key = "state/some key+ü"
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        state = gateway.object_state(bucket, key)
        assert state["state"] == "pending"
        assert flush_state(s3.head_object(Bucket=bucket, Key=key)) == "pending"
    gateway.drained(bucket=bucket)
    resp = gateway.admin_request("GET", f"/admin/v1/objects/{bucket}/state/some%20key%2B%C3%BC")
    # Durable, or no longer held locally; never still pending after a drain.
    assert resp.status in (200, 404), resp.body
    if resp.status == 200:
        assert resp.json()["state"] == "durable"
    assert flush_state(s3.head_object(Bucket=bucket, Key=key)) == "durable"


def test_metrics_endpoint(gateway: Any, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="m", Body=b"metrics")
    resp = gateway.admin_request("GET", "/metrics")
    assert resp.status == 200
    assert (resp.header("content-type") or "").startswith("text/plain")
    text = resp.body.decode()
    assert "# TYPE" in text
    assert "# HELP" in text


def test_unknown_admin_path_is_404(gateway: Any) -> None:
    assert gateway.admin_request("GET", "/admin/v1/nope").status == 404


def test_cli_status(gateway: Any, s3: Any, bucket: str) -> None:
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="cli/1", Body=b"x" * 321)
        proc = _cli("status", "--admin", gateway.admin)
        assert proc.returncode == 0, proc.stderr
        assert "paused" in proc.stdout
        assert "pending" in proc.stdout
    proc = _cli("status", "--admin", gateway.admin)
    assert proc.returncode == 0, proc.stderr
    assert "running" in proc.stdout


def test_cli_drain(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    body = payload(4000, seed="cli-drain")
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="cli/obj", Body=body)
        proc = _cli(
            "drain", "--admin", gateway.admin, "--bucket", bucket, "--wait", "--timeout", "1"
        )
        assert proc.returncode != 0, "a drain that timed out must not exit 0"
        out = json.loads(proc.stdout)
        assert out["drained"] is False
        assert out["pending_objects"] == 1
        assert out["pending_bytes"] == len(body)
    proc = _cli("drain", "--admin", gateway.admin, "--bucket", bucket, "--wait", "--timeout", "30")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["drained"] is True
    got = upstream.get_object(Bucket=bucket, Key="cli/obj")
    assert got["Body"].read() == body
    assert got["ETag"] == quoted_md5(body)


def test_cli_unreachable_admin(gateway: Any) -> None:
    proc = _cli("status", "--admin", "http://127.0.0.1:9", timeout=30)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
