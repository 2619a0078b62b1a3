"""Integrity of local bodies: a blob file changed on disk after the ack is detected on GET
(the client never gets a complete corrupt body), on flush (the upstream's digest check
fails it as local corruption, never retried into the bucket), and by ``gateway verify``."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import IncompleteReadError, ResponseStreamingError
from harness import http_request, payload, quoted_md5, read_body, upstream_objects
from urllib3.exceptions import HTTPError as Urllib3Error

KiB = 1024
_TRUNCATED = (IncompleteReadError, ResponseStreamingError, Urllib3Error)


def _blob_path(data_dir: Path, bucket: str, key: str) -> Path:
    conn = sqlite3.connect(f"file:{data_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        (blob_id,) = conn.execute(
            "SELECT blob_id FROM objects WHERE bucket = ? AND key = ?", (bucket, key)
        ).fetchone()
    finally:
        conn.close()
    return data_dir / "blobs" / blob_id[:2] / blob_id


def _corrupt(path: Path) -> None:
    """Flip one byte in the middle: same size, different content (bit rot)."""
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def _metric(gw: Any, name: str) -> float:
    text = http_request("GET", f"{gw.admin}/metrics", timeout=10).body.decode()
    for line in text.splitlines():
        if line.startswith((name + " ", name + "_total ")):
            return float(line.split()[-1])
    raise AssertionError(f"metric {name} not found")


def _verify(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "verify", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _wait_state(gw: Any, bucket: str, key: str, state: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = gw.object_state(bucket, key)
        if got["state"] == state:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{key} never became {state}: {got}")


def test_corrupt_pending_blob_is_never_served_or_flushed(
    gateway_factory: Any, upstream: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    good = payload(300 * KiB, seed="good")
    body = payload(300 * KiB, seed="rot")
    s3.put_object(Bucket=bucket, Key="rot/good", Body=good)
    gw.drained(bucket=bucket)
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="rot/bad", Body=body)
        assert _verify(gw.data_dir).returncode == 0
        _corrupt(_blob_path(gw.data_dir, bucket, "rot/bad"))

        check = _verify(gw.data_dir)
        assert check.returncode == 1
        assert f"CORRUPT {bucket}/rot/bad [pending]" in check.stdout
        assert "1 problem(s)" in check.stdout

        resp = s3.get_object(Bucket=bucket, Key="rot/bad")
        with pytest.raises(_TRUNCATED):
            resp["Body"].read()
        state = gw.object_state(bucket, "rot/bad")
        assert state["state"] == "failed"
        assert "local corruption" in state["last_error"]
        assert _metric(gw, "gateway_corrupt_blobs") == 1
        assert gw.status()["failed_objects"] == 1
        # The good object is untouched (each body file is verified on its own).
        assert read_body(s3.get_object(Bucket=bucket, Key="rot/good")) == good
    gw.drained(bucket=bucket, prefix="rot/good")
    assert gw.object_state(bucket, "rot/bad")["state"] == "failed"  # never flushed
    assert "rot/bad" not in upstream_objects(upstream, bucket, "rot/")


def test_corrupt_cached_copy_is_dropped_and_read_from_upstream(
    gateway_factory: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    body = payload(200 * KiB, seed="cached")
    s3.put_object(Bucket=bucket, Key="rot/cached", Body=body)
    gw.drained(bucket=bucket)
    _corrupt(_blob_path(gw.data_dir, bucket, "rot/cached"))
    resp = s3.get_object(Bucket=bucket, Key="rot/cached")
    with pytest.raises(_TRUNCATED):
        resp["Body"].read()
    # The upstream holds the good bytes: the bad local copy is gone, reads go there.
    got = s3.get_object(Bucket=bucket, Key="rot/cached")
    assert read_body(got) == body and got["ETag"] == quoted_md5(body)
    assert _verify(gw.data_dir).returncode == 0  # a good copy (if re-cached) only


def test_corruption_found_by_flush_fails_as_local_corruption(
    gateway_factory: Any, upstream: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    body = payload(128 * KiB, seed="flushrot")
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="rot/flush", Body=body)
        _corrupt(_blob_path(gw.data_dir, bucket, "rot/flush"))
    state = _wait_state(gw, bucket, "rot/flush", "failed")
    assert state["last_error"].startswith("local corruption")
    assert "rot/flush" not in upstream_objects(upstream, bucket, "rot/")
    assert gw.status()["failed_objects"] == 1


def test_corrupt_part_of_multipart_object_fails_flush(
    gateway_factory: Any, upstream: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    parts = [payload(5 * 1024 * KiB, seed="mp1"), payload(64 * KiB, seed="mp2")]
    with gw.flush_paused():
        upload = s3.create_multipart_upload(Bucket=bucket, Key="rot/mp")
        etags = [
            s3.upload_part(
                Bucket=bucket, Key="rot/mp", UploadId=upload["UploadId"], PartNumber=n, Body=p
            )["ETag"]
            for n, p in enumerate(parts, 1)
        ]
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="rot/mp",
            UploadId=upload["UploadId"],
            MultipartUpload={
                "Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]
            },
        )
        conn = sqlite3.connect(f"file:{gw.data_dir / 'journal.db'}?mode=ro", uri=True)
        (parts_json,) = conn.execute(
            "SELECT parts FROM objects WHERE bucket = ? AND key = 'rot/mp'", (bucket,)
        ).fetchone()
        conn.close()
        blob_id = json.loads(parts_json)[1][0]
        _corrupt(gw.data_dir / "blobs" / blob_id[:2] / blob_id)
        check = _verify(gw.data_dir)
        assert check.returncode == 1 and f"{bucket}/rot/mp part 2 [pending]" in check.stdout
    state = _wait_state(gw, bucket, "rot/mp", "failed")
    assert state["last_error"].startswith("local corruption")
    assert "rot/mp" not in upstream_objects(upstream, bucket, "rot/")
