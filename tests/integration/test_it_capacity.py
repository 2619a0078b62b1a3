"""Cache capacity: LRU eviction of flushed objects between the watermarks (reads then go
upstream), status and metrics figures, and a real ENOSPC on a small tmpfs data dir."""

from __future__ import annotations

import contextlib
import http.client
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    error_code,
    error_status,
    flush_state,
    http_request,
    parse_s3_error,
    payload,
    quoted_md5,
    read_body,
    sign_request,
    upstream_objects,
)

KiB = 1024
MiB = 1024 * KiB


def _metric(gw: Any, name: str) -> float:
    text = http_request("GET", f"{gw.admin}/metrics", timeout=10).body.decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "_total "):
            return float(line.split()[-1])
    raise AssertionError(f"metric {name} not found")


def _wait_for(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _is_local(gw: Any, bucket: str, key: str) -> bool:
    resp = http_request("GET", f"{gw.admin}/admin/v1/objects/{bucket}/{key}", timeout=10)
    return resp.status == 200


def test_capacity_evicts_least_recently_used_flushed_objects(
    gateway_factory: Any, upstream: Any, bucket: str
) -> None:
    gw = gateway_factory(
        extra_args=[
            "--capacity",
            str(1000 * KiB),
            "--cache-high-watermark",
            "0.45",
            "--cache-low-watermark",
            "0.25",
        ]
    )
    s3 = gw.client()
    bodies = {f"lru/k{i}": payload(100 * KiB, seed=f"lru{i}") for i in range(5)}
    for key in list(bodies)[:4]:
        s3.put_object(Bucket=bucket, Key=key, Body=bodies[key])
    gw.drained(bucket=bucket)
    assert gw.status()["cache_used_bytes"] == 400 * KiB  # under the high watermark: kept
    assert read_body(s3.get_object(Bucket=bucket, Key="lru/k0")) == bodies["lru/k0"]

    with gw.flush_paused():  # k4 stays pending: it must never be evicted
        s3.put_object(Bucket=bucket, Key="lru/k4", Body=bodies["lru/k4"])
        # 500 KiB > 450 KiB: evict down to 250 KiB, least recently used first.
        _wait_for(lambda: gw.status()["cache_used_bytes"] <= 250 * KiB, "eviction")
        assert _is_local(gw, bucket, "lru/k0")  # read after k1..k3 were written
        assert _is_local(gw, bucket, "lru/k4")
        assert gw.object_state(bucket, "lru/k4")["state"] == "pending"
        for key in ("lru/k1", "lru/k2", "lru/k3"):
            assert not _is_local(gw, bucket, key)
        status = gw.status()
        assert status["cache_used_bytes"] == 200 * KiB
        assert status["cache_capacity_bytes"] == 1000 * KiB
        assert _metric(gw, "gateway_cache_evicted_objects") == 3
        assert _metric(gw, "gateway_cache_evicted_bytes") == 300 * KiB
        # Evicted objects are read from the upstream, bytes and ETag intact.
        for key in ("lru/k1", "lru/k2", "lru/k3"):
            got = s3.get_object(Bucket=bucket, Key=key)
            assert read_body(got) == bodies[key]
            assert got["ETag"] == quoted_md5(bodies[key])
            assert flush_state(got) == "durable"
    gw.drained(bucket=bucket)
    assert sorted(upstream_objects(upstream, bucket, "lru/")) == sorted(bodies)


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(path: Path, leave_bytes: int) -> None:
    """Write ``path`` until the filesystem has about ``leave_bytes`` free."""
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize
    with path.open("wb") as f:
        f.write(b"\0" * max(0, free - leave_bytes))
        f.flush()
        os.fsync(f.fileno())


def test_disk_full_is_slowdown_and_recovers(
    gateway_factory: Any, upstream: Any, bucket: str, tmp_path: Path
) -> None:
    with _tmpfs(tmp_path / "small", "16m") as mount:
        data_dir = mount / "data"
        # Capacity above the filesystem size: admission lets writes in, the disk says no.
        gw = gateway_factory(
            start=False,
            extra_args=[
                "--capacity",
                str(64 * MiB),
                "--cache-high-watermark",
                "0.5",
                "--cache-low-watermark",
                "0.1",
            ],
        )
        gw.data_dir = data_dir
        gw.start()
        s3 = gw.client()
        keep = payload(512 * KiB, seed="keep")
        s3.put_object(Bucket=bucket, Key="full/keep", Body=keep)
        gw.pause_flush()
        filler = mount / "filler"
        _fill(filler, 256 * KiB)
        big = payload(2 * MiB, seed="big")
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket=bucket, Key="full/big", Body=big)
        assert (error_code(exc.value), error_status(exc.value)) == ("SlowDown", 503)
        assert list((data_dir / "tmp").iterdir()) == []  # the partial file is gone
        assert read_body(s3.get_object(Bucket=bucket, Key="full/keep")) == keep
        with pytest.raises(ClientError) as exc:
            s3.head_object(Bucket=bucket, Key="full/big")
        assert error_status(exc.value) == 404
        assert _metric(gw, "gateway_disk_full_errors") >= 1

        filler.unlink()  # space returns
        assert s3.put_object(Bucket=bucket, Key="full/big", Body=big)["ETag"] == quoted_md5(big)
        gw.resume_flush()
        gw.drained(bucket=bucket)

        # Full again, this time with flushed objects on disk: the disk-full error starts an
        # eviction round (down to 10 % of what is used), and a retry then fits.
        _fill(filler, 64 * KiB)
        third = payload(1 * MiB, seed="third")
        disk_full_before = _metric(gw, "gateway_disk_full_errors")
        deadline = time.monotonic() + 20
        while True:  # the SDK may retry too: what matters is the disk-full error happened
            try:
                s3.put_object(Bucket=bucket, Key="full/third", Body=third)
                break
            except ClientError as err:
                assert error_code(err) == "SlowDown"
                assert time.monotonic() < deadline, "eviction never made room"
                time.sleep(0.05)
        assert filler.exists()  # the room came from evicting flushed objects
        assert _metric(gw, "gateway_disk_full_errors") > disk_full_before
        assert _metric(gw, "gateway_cache_evicted_objects") >= 1
        filler.unlink()
        gw.drained(bucket=bucket)
        gw.restart(hard=True)  # the journal opens and every object is intact
        s3 = gw.client()
        assert read_body(s3.get_object(Bucket=bucket, Key="full/keep")) == keep
        assert read_body(s3.get_object(Bucket=bucket, Key="full/big")) == big
        assert read_body(s3.get_object(Bucket=bucket, Key="full/third")) == third
        assert sorted(upstream_objects(upstream, bucket, "full/")) == [
            "full/big",
            "full/keep",
            "full/third",
        ]
        gw.stop()


def _chunked_put(gw: Any, bucket: str, key: str, body: bytes) -> tuple[int, bytes]:
    """PUT with HTTP chunked transfer coding and no length anywhere (no Content-Length, no
    x-amz-decoded-content-length). (status, body); status 0 if the gateway closed first."""
    url = f"{gw.endpoint}/{bucket}/{key}"
    signed = sign_request("PUT", url, content_sha256="UNSIGNED-PAYLOAD")
    headers = {k: v for k, v in signed.headers.items() if k.lower() != "content-length"}
    pieces = [body[i : i + 64 * KiB] for i in range(0, len(body), 64 * KiB)]
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        with contextlib.suppress(OSError):  # the answer may come before the whole body
            conn.request("PUT", f"/{bucket}/{key}", iter(pieces), headers, encode_chunked=True)
        try:
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException):
            return 0, b""
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_write_without_a_length_reserves_what_it_writes(
    gateway_factory: Any, upstream: Any, bucket: str
) -> None:
    gw = gateway_factory(extra_args=["--capacity", str(1 * MiB)])
    first, second = payload(700 * KiB, seed="first"), payload(700 * KiB, seed="second")
    with gw.flush_paused():
        assert _chunked_put(gw, bucket, "nolen/first", first)[0] == 200
        # 700 KiB unflushed + 700 KiB more would pass the 1 MiB capacity: refused as it is
        # written (it reserved 0 bytes and was accepted), nothing of it visible or kept.
        status, answer = _chunked_put(gw, bucket, "nolen/second", second)
        assert status in (503, 0), (status, answer[:300])
        if status == 503:
            assert parse_s3_error(answer)["Code"] == "SlowDown"
        assert not _is_local(gw, bucket, "nolen/second")
        assert list((gw.data_dir / "tmp").iterdir()) == []
        assert gw.status()["pending_bytes"] == len(first)
        # One body larger than the whole capacity is refused too.
        assert _chunked_put(gw, bucket, "nolen/huge", payload(2 * MiB, seed="huge"))[0] in (
            503,
            0,
        )
        assert _metric(gw, "gateway_capacity_refusals") >= 2
    gw.drained(bucket=bucket)
    # Once the first is flushed (evictable), the second fits.
    assert _chunked_put(gw, bucket, "nolen/second", second)[0] == 200
    gw.drained(bucket=bucket)
    assert read_body(upstream.get_object(Bucket=bucket, Key="nolen/second")) == second
    assert read_body(upstream.get_object(Bucket=bucket, Key="nolen/first")) == first
