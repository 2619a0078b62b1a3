"""Write-back: after a drain the upstream holds exactly what the clients were acknowledged."""

from __future__ import annotations

import time
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    error_status,
    flush_state,
    payload,
    quoted_md5,
    read_body,
    unique_bucket_name,
    upstream_objects,
)

MiB = 1024 * 1024


def test_drain_makes_everything_durable_upstream(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    # Something already upstream, to be deleted and overwritten through the gateway.
    upstream.put_object(Bucket=bucket, Key="old/delete-me", Body=b"old")
    upstream.put_object(Bucket=bucket, Key="old/overwrite-me", Body=b"old")

    expected: dict[str, tuple[bytes, dict[str, str], str]] = {}

    def put(key: str, body: bytes, meta: dict[str, str] | None = None, ctype: str = "") -> None:
        kwargs: dict[str, Any] = {"Metadata": meta or {}}
        if ctype:
            kwargs["ContentType"] = ctype
        resp = s3.put_object(Bucket=bucket, Key=key, Body=body, **kwargs)
        assert resp["ETag"] == quoted_md5(body)
        expected[key] = (body, meta or {}, ctype)

    with gateway.flush_paused():
        put("ckpt/empty", b"")
        put("ckpt/one-byte", b"1")
        put("ckpt/small", payload(10_000, seed=1), {"step": "100"}, "application/octet-stream")
        put("ckpt/1mib", payload(MiB, seed=2))
        put("ckpt/large", payload(12 * MiB + 3, seed=3), {"kind": "large"})
        put("ckpt/json", b'{"a": 1}', ctype="application/json")
        put("ckpt/rewritten", payload(5000, seed=4))
        put("ckpt/rewritten", payload(6000, seed=5))
        put("ckpt/rewritten", payload(7000, seed=6), {"version": "3"})
        put("ckpt/put-then-delete", b"short-lived")
        s3.delete_object(Bucket=bucket, Key="ckpt/put-then-delete")
        del expected["ckpt/put-then-delete"]
        s3.delete_object(Bucket=bucket, Key="old/delete-me")
        put("old/overwrite-me", b"new body")
        put("unicode/日本語 キー", b"unicode")

        pending = gateway.drain(bucket=bucket, wait=False)
        assert pending["drained"] is False
        assert pending["pending_objects"] > 0
        assert pending["pending_bytes"] > 12 * MiB

    result = gateway.drain(bucket=bucket, timeout=60)
    assert result["drained"] is True, result
    assert result["pending_objects"] == 0
    assert result["pending_bytes"] == 0

    up = upstream_objects(upstream, bucket)
    assert sorted(up) == sorted(expected)
    for key, (body, meta, ctype) in expected.items():
        got = upstream.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body, key
        assert got["ETag"] == quoted_md5(body), key
        assert up[key]["ETag"] == quoted_md5(body), key
        assert up[key]["Size"] == len(body), key
        assert got["Metadata"] == meta, key
        if ctype:
            assert got["ContentType"] == ctype, key
        head = s3.head_object(Bucket=bucket, Key=key)
        assert flush_state(head) == "durable", key
        assert head["ETag"] == quoted_md5(body)

    for gone in ("ckpt/put-then-delete", "old/delete-me"):
        with pytest.raises(ClientError) as exc:
            upstream.head_object(Bucket=bucket, Key=gone)
        assert error_status(exc.value) == 404

    status = gateway.status()
    assert status["pending_objects"] == 0
    assert status["pending_bytes"] == 0
    assert status["oldest_pending_seconds"] is None
    assert status["flush_state"] == "running"
    assert status["flushed_objects"] >= len(expected)
    assert status["flushed_bytes"] >= sum(len(b) for b, _, _ in expected.values())


def test_drain_is_scoped_to_bucket_and_prefix(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    other = unique_bucket_name()
    upstream.create_bucket(Bucket=other)
    with gateway.flush_paused():
        for i in range(3):
            s3.put_object(Bucket=bucket, Key=f"a/{i}", Body=b"x" * (10 + i))
        s3.put_object(Bucket=bucket, Key="b/0", Body=b"y" * 100)
        s3.put_object(Bucket=other, Key="a/0", Body=b"z" * 1000)

        a = gateway.drain(bucket=bucket, prefix="a/", wait=False)
        assert a["drained"] is False
        assert a["pending_objects"] == 3
        assert a["pending_bytes"] == 10 + 11 + 12

        b = gateway.drain(bucket=bucket, prefix="b/", wait=False)
        assert (b["drained"], b["pending_objects"], b["pending_bytes"]) == (False, 1, 100)

        whole = gateway.drain(bucket=bucket, wait=False)
        assert (whole["pending_objects"], whole["pending_bytes"]) == (4, 133)

        nothing = gateway.drain(bucket=bucket, prefix="c/", wait=False)
        assert (nothing["drained"], nothing["pending_objects"]) == (True, 0)

        everything = gateway.drain(wait=False)
        assert everything["drained"] is False
        assert everything["pending_objects"] >= 5

        # wait=true with a short timeout while paused: returns not drained, after the timeout.
        started = time.monotonic()
        waited = gateway.drain(bucket=bucket, prefix="a/", wait=True, timeout=1)
        elapsed = time.monotonic() - started
        assert waited["drained"] is False
        assert waited["pending_objects"] == 3
        assert 0.8 <= elapsed < 15

    assert gateway.drain(bucket=bucket, prefix="a/")["drained"] is True
    assert gateway.drain(bucket=other)["drained"] is True
    assert sorted(upstream_objects(upstream, bucket)) == ["a/0", "a/1", "a/2", "b/0"]
    assert sorted(upstream_objects(upstream, other)) == ["a/0"]


def test_status_fields(gateway: Any, s3: Any, bucket: str) -> None:
    status = gateway.status()
    for name in (
        "pending_objects",
        "pending_bytes",
        "flushed_objects",
        "flushed_bytes",
        "failed_objects",
    ):
        assert isinstance(status[name], int) and status[name] >= 0, name
    assert status["flush_state"] in ("running", "paused")
    assert isinstance(status["cache_used_bytes"], int)
    assert isinstance(status["cache_capacity_bytes"], int)
    assert status["cache_capacity_bytes"] > 0
    assert isinstance(status["lanes"], list)
    assert "oldest_pending_seconds" in status

    with gateway.flush_paused():
        paused = gateway.status()
        assert paused["flush_state"] == "paused"
        before = paused["pending_objects"], paused["pending_bytes"]
        s3.put_object(Bucket=bucket, Key="status/1", Body=b"a" * 1000)
        s3.put_object(Bucket=bucket, Key="status/2", Body=b"b" * 500)
        after = gateway.status()
        assert after["pending_objects"] == before[0] + 2
        assert after["pending_bytes"] == before[1] + 1500
        assert after["oldest_pending_seconds"] is not None
        assert after["oldest_pending_seconds"] >= 0
        assert after["cache_used_bytes"] >= 1500
        lanes = [ln for ln in after["lanes"] if ln.get("bucket") == bucket]
        assert lanes, after["lanes"]
        assert sum(ln["pending_objects"] for ln in lanes) == 2
        assert sum(ln["pending_bytes"] for ln in lanes) == 1500
        flushed_before = after["flushed_objects"]
    gateway.drained(bucket=bucket)
    final = gateway.status()
    assert final["flush_state"] == "running"
    assert final["flushed_objects"] >= flushed_before + 2


def test_pause_and_resume_are_idempotent(gateway: Any) -> None:
    gateway.pause_flush()
    gateway.pause_flush()
    assert gateway.status()["flush_state"] == "paused"
    gateway.resume_flush()
    gateway.resume_flush()
    assert gateway.status()["flush_state"] == "running"


def test_health_endpoints(gateway: Any) -> None:
    assert gateway.admin_request("GET", "/healthz").status == 200
    assert gateway.admin_request("GET", "/readyz").status == 200


def test_delete_of_flushed_object_reaches_upstream(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="del/x", Body=b"x")
    gateway.drained(bucket=bucket)
    assert "del/x" in upstream_objects(upstream, bucket)
    s3.delete_object(Bucket=bucket, Key="del/x")
    gateway.drained(bucket=bucket)
    assert upstream_objects(upstream, bucket) == {}


def test_overwrite_after_flush_reaches_upstream(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    for version in range(4):
        body = payload(1000 + version, seed=f"v{version}")
        s3.put_object(Bucket=bucket, Key="ver", Body=body)
        gateway.drained(bucket=bucket)
        got = upstream.get_object(Bucket=bucket, Key="ver")
        assert read_body(got) == body
        assert got["ETag"] == quoted_md5(body)
