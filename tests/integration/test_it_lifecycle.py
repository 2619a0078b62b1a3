"""Process lifecycle and backpressure: cache capacity -> 503 SlowDown (reads keep working),
and SIGTERM -> not ready, writes refused with SlowDown, the rest kept on disk for the next
start."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    error_code,
    error_status,
    http_request,
    payload,
    quoted_md5,
    read_body,
    upstream_objects,
)

KiB = 1024


def test_capacity_backpressure(gateway_factory: Any, upstream: Any, bucket: str) -> None:
    gw = gateway_factory(extra_args=["--capacity", str(256 * KiB)])
    s3 = gw.client()
    assert gw.status()["cache_capacity_bytes"] == 256 * KiB
    gw.pause_flush()
    first = payload(150 * KiB, seed="first")
    s3.put_object(Bucket=bucket, Key="bp/first", Body=first)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="bp/second", Body=payload(150 * KiB, seed="second"))
    assert error_code(exc.value) == "SlowDown"
    assert error_status(exc.value) == 503
    # Reads keep working, and the refused write left nothing behind.
    assert read_body(s3.get_object(Bucket=bucket, Key="bp/first")) == first
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="bp/second")
    assert error_status(exc.value) == 404
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["bp/first"]
    status = gw.status()
    assert status["pending_bytes"] == len(first)

    gw.resume_flush()
    gw.drained(bucket=bucket)
    second = payload(150 * KiB, seed="second")
    put = s3.put_object(Bucket=bucket, Key="bp/second", Body=second)
    assert put["ETag"] == quoted_md5(second)
    gw.drained(bucket=bucket)
    assert sorted(upstream_objects(upstream, bucket)) == ["bp/first", "bp/second"]


def test_backpressure_is_retried_by_sdk(gateway_factory: Any, bucket: str) -> None:
    """With the SDK's default retries a burst over capacity completes as the flush frees
    space: backpressure, not failure."""
    gw = gateway_factory(extra_args=["--capacity", str(256 * KiB)])
    s3 = gw.client(retries=20)
    bodies = {f"burst/{i}": payload(100 * KiB, seed=i) for i in range(8)}
    for key, body in bodies.items():
        assert s3.put_object(Bucket=bucket, Key=key, Body=body)["ETag"] == quoted_md5(body)
    for key, body in bodies.items():
        assert read_body(s3.get_object(Bucket=bucket, Key=key)) == body
    gw.drained(bucket=bucket)


def _wait_not_ready(gw: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http_request("GET", f"{gw.admin}/readyz", timeout=2).status != 200:
                return
        except OSError:
            return
        time.sleep(0.02)
    raise AssertionError("still ready after SIGTERM")


def test_sigterm_refuses_writes_and_keeps_pending(
    gateway_factory: Any, upstream: Any, bucket: str
) -> None:
    # The write-back delay keeps the objects pending past the 3 s drain deadline, so the
    # gateway is still draining (and answering) when the late write arrives.
    gw = gateway_factory(extra_args=["--shutdown-drain-timeout", "3", "--write-back-delay", "6"])
    s3 = gw.client()
    bodies = {f"term/{i}": payload(10 * KiB + i, seed=f"term{i}") for i in range(5)}
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)

    started = time.monotonic()
    gw.send_signal(signal.SIGTERM)
    _wait_not_ready(gw)
    assert time.monotonic() - started < 2, "readiness must fail at once on SIGTERM"
    assert gw.running
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="term/late", Body=b"too late")
    assert error_code(exc.value) == "SlowDown"
    assert error_status(exc.value) == 503
    for key, body in bodies.items():  # reads keep working while draining
        assert read_body(s3.get_object(Bucket=bucket, Key=key)) == body
    rc = gw.wait_exit(timeout=30)
    assert rc == 0, f"exit status {rc}:\n{gw.log_tail()}"

    gw.start()
    for key, body in bodies.items():
        assert read_body(s3.get_object(Bucket=bucket, Key=key)) == body
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="term/late")
    assert error_status(exc.value) == 404
    gw.resume_flush()
    gw.drained(bucket=bucket)
    up = upstream_objects(upstream, bucket)
    assert sorted(up) == sorted(bodies)
    for key, body in bodies.items():
        assert up[key]["ETag"] == quoted_md5(body)


def test_sigterm_flushes_what_it_can(gateway_factory: Any, upstream: Any, bucket: str) -> None:
    """Flushing running at SIGTERM: the drain deadline lets small pending writes reach the
    upstream before the process exits."""
    gw = gateway_factory(extra_args=["--shutdown-drain-timeout", "20"])
    s3 = gw.client()
    bodies = {f"last/{i}": payload(2 * KiB, seed=f"last{i}") for i in range(5)}
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    assert gw.stop(timeout=40) == 0
    up = upstream_objects(upstream, bucket)
    assert sorted(up) == sorted(bodies)


def test_orphan_blobs_swept_in_background_after_start(gateway_factory: Any, bucket: str) -> None:
    """Crash leftovers (blob files no journal row references) are removed after the
    listeners start; writes accepted meanwhile are never swept."""
    gw = gateway_factory()
    s3 = gw.client()
    kept = payload(64 * KiB, seed="kept")
    s3.put_object(Bucket=bucket, Key="sweep/kept", Body=kept)
    gw.stop()
    orphans = [gw.data_dir / "blobs" / f"{i:02x}" / f"{i:02x}{'0' * 30}" for i in range(0, 256, 8)]
    for orphan in orphans:
        orphan.write_bytes(b"left by a crash between blob rename and journal commit")
    gw.start()
    fresh = {f"sweep/new{i}": payload(32 * KiB, seed=f"new{i}") for i in range(20)}
    for key, body in fresh.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    deadline = time.monotonic() + 20
    while any(o.exists() for o in orphans) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(o.exists() for o in orphans)
    for key, body in {"sweep/kept": kept, **fresh}.items():
        assert read_body(s3.get_object(Bucket=bucket, Key=key)) == body
    gw.drained(bucket=bucket)
