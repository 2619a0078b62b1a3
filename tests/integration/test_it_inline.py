"""Small bodies stored in the journal, over real sockets (boto3 -> gateway -> moto): no
blob file, every read path serves them, the flush sends the exact bytes, and a corrupt one
is neither served nor flushed, and is found by ``gateway verify``."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_code, payload, quoted_md5, read_body, upstream_objects

KiB = 1024


def _blob_files(data_dir: Path) -> list[Path]:
    return [p for p in (data_dir / "blobs").rglob("*") if p.is_file()]


def _inline_keys(data_dir: Path, bucket: str) -> set[str]:
    conn = sqlite3.connect(f"file:{data_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT key FROM objects WHERE bucket = ? AND body IS NOT NULL AND blob_id IS NULL",
            (bucket,),
        ).fetchall()
    finally:
        conn.close()
    return {str(r[0]) for r in rows}


def test_small_puts_live_in_the_journal_and_flush_exactly(
    gateway_factory: Any, upstream: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    bodies = {
        "small/empty": b"",
        "small/one": b"1",
        "small/4k": payload(4 * KiB, seed="4k"),
        "small/64k": payload(64 * KiB, seed="64k"),
        "small/above": payload(64 * KiB + 1, seed="above"),
    }
    with gw.flush_paused():
        before = len(_blob_files(gw.data_dir))
        for key, body in bodies.items():
            s3.put_object(Bucket=bucket, Key=key, Body=body)
        assert len(_blob_files(gw.data_dir)) == before + 1  # only the one above 64 KiB
        assert _inline_keys(gw.data_dir, bucket) == set(bodies) - {"small/above"}
        for key, body in bodies.items():
            got = s3.get_object(Bucket=bucket, Key=key)
            assert read_body(got) == body and got["ETag"] == quoted_md5(body), key
        ranged = s3.get_object(Bucket=bucket, Key="small/4k", Range="bytes=100-199")
        assert read_body(ranged) == bodies["small/4k"][100:200]
        s3.copy_object(Bucket=bucket, Key="small/copy", CopySource=f"{bucket}/small/4k")
        bodies["small/copy"] = bodies["small/4k"]
    gw.drained(bucket=bucket, prefix="small/")
    stored = upstream_objects(upstream, bucket, "small/")
    assert sorted(stored) == sorted(bodies)
    for key, body in bodies.items():
        got = upstream.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body and got["ETag"] == quoted_md5(body), key


def test_corrupt_inline_body_is_never_served_or_flushed(
    gateway_factory: Any, upstream: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="rot/inline", Body=b"the acknowledged bytes")
        conn = sqlite3.connect(gw.data_dir / "journal.db", timeout=10)
        try:
            conn.execute(
                "UPDATE objects SET body = ? WHERE bucket = ? AND key = 'rot/inline'",
                (b"the acknowledged bytez", bucket),
            )
            conn.commit()
        finally:
            conn.close()
        verify = subprocess.run(
            [sys.executable, "-m", "gateway", "verify", "--data-dir", str(gw.data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert verify.returncode == 1
        assert f"CORRUPT {bucket}/rot/inline [pending] blob inline: CRC32C" in verify.stdout
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=bucket, Key="rot/inline")
        assert error_code(exc.value) == "InternalError"  # refused before a byte was sent
        state = gw.object_state(bucket, "rot/inline")
        assert state["state"] == "failed"
        assert state["last_error"].startswith("local corruption")
    assert "rot/inline" not in upstream_objects(upstream, bucket, "rot/")
