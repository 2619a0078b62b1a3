"""`gateway status` and `gateway drain` against a real gateway subprocess.

Exit codes are the contract scripts and the Helm chart's preStop hook rely on: 0 drained,
3 still pending at the timeout, 1 admin API unreachable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from harness import REPO_ROOT, payload, quoted_md5


def _cli(
    *args: str, env: dict[str, str] | None = None, stderr: Any = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=str(REPO_ROOT),
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_status_table_shows_totals_lanes_and_human_sizes(gateway_factory: Any, bucket: str) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="ckpt/step_7/rank_0/a.pt", Body=payload(1536, 1))
        s3.put_object(Bucket=bucket, Key="ckpt/step_7/rank_1/b.pt", Body=payload(3 << 20, 2))
        s3.put_object(Bucket=bucket, Key="ckpt/step_7/rank_1/c.pt", Body=payload(1 << 20, 3))
        proc = _cli("status", "--admin", gw.admin)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # What needs an operator first, with the command that resolves it.
    assert lines[:2] == [
        "PAUSED  flusher paused: nothing is uploaded until it is resumed -> run `gateway resume`",
        "",
    ]
    table = {line[:18].strip(): line[18:] for line in lines[2:12]}
    assert table["flush rate"] == "0 B/s (no ETA: flusher paused: `gateway resume`)"
    assert table["flush state"] == "paused"
    assert table["pending"] == "3 objects, 4.0 MiB"  # 1536 + 3 MiB + 1 MiB
    assert table["failed"] == "0 objects, 0 B"
    assert table["unflushed"] == "3 objects, 4.0 MiB (not durable upstream yet)"
    assert table["oldest unflushed"].endswith("s")
    rows = [line.split() for line in lines if line.startswith(bucket)]
    # The measured rate (0 requests/s: paused) and the limit (3500/s) in separate columns.
    assert rows == [
        [bucket, "ckpt/step_7/rank_0/", "1", "1.5", "KiB", "0", "0", "0", "0", "3500", "0"],
        [bucket, "ckpt/step_7/rank_1/", "2", "4.0", "MiB", "0", "0", "0", "0", "3500", "0"],
    ]
    header = next(line for line in lines if line.startswith("bucket"))
    expected = "bucket prefix objects bytes failed held in flight req/s limit/s 503s"
    assert header.split() == expected.split()


def test_status_json_is_the_admin_document(gateway_factory: Any) -> None:
    gw = gateway_factory()
    proc = _cli("status", "--json", env={"GATEWAY_ADMIN": gw.admin})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {**gw.status(), "oldest_pending_seconds": None}


def test_drain_times_out_with_exit_3_and_plain_progress(gateway_factory: Any, bucket: str) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    body = payload(2 << 20, seed="drain-timeout")
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="job/shard", Body=body)
        proc = _cli("drain", "--admin", gw.admin, "--bucket", bucket, "--wait", "--timeout", "2")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == {
        "drained": False,
        "pending_objects": 1,
        "pending_bytes": len(body),
        "failed_objects": 0,
        "held_objects": 0,
        "in_flight_sent_bytes": 0,
    }
    # Not a TTY: plain lines, no carriage returns; the first and the verdict at least.
    progress = proc.stderr.splitlines()
    assert "\r" not in proc.stderr
    assert len(progress) >= 2, proc.stderr
    assert "2.0 MiB left in 1 objects" in progress[0]
    assert "(flusher paused)" in progress[0]
    assert progress[-1].endswith("(timed out)")
    assert progress[-1].startswith("[" + "-" * 30 + "]   0%")


def test_drain_on_a_tty_draws_a_bar_and_exits_0_when_drained(
    gateway_factory: Any, upstream: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    body = payload(300_000, seed="drain-tty")
    s3.put_object(Bucket=bucket, Key="tty/shard", Body=body)
    leader, follower = os.openpty()
    try:
        proc = _cli(
            "drain", "--admin", gw.admin, "--bucket", bucket, "--wait", "--timeout", "60",
            stderr=follower,
        )  # fmt: skip
        os.close(follower)
        tty_output = _read_all(leader)
    finally:
        os.close(leader)
    assert proc.returncode == 0, proc.stdout + tty_output
    assert json.loads(proc.stdout)["drained"] is True
    # On a TTY every line redraws in place and the last one is the verdict.
    assert "\r\x1b[2K[" in tty_output
    assert tty_output.rstrip().endswith("(drained)")
    assert "100%" in tty_output
    got = upstream.get_object(Bucket=bucket, Key="tty/shard")
    assert got["ETag"] == quoted_md5(body)


def test_drain_without_wait_answers_at_once(gateway_factory: Any, bucket: str) -> None:
    gw = gateway_factory()
    with gw.flush_paused():
        gw.client().put_object(Bucket=bucket, Key="nowait/x", Body=b"12345")
        proc = _cli("drain", "--admin", gw.admin, "--bucket", bucket)
    assert proc.returncode == 3
    assert json.loads(proc.stdout)["pending_bytes"] == 5
    assert proc.stderr == ""  # progress only with --wait


def test_drain_stops_waiting_when_only_failed_objects_are_left(
    gateway_factory: Any, upstream: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="ckpt/step_1/shard", Body=b"shard")
        s3.put_object(Bucket=bucket, Key="ckpt/step_1/.metadata", Body=b"marker")
        upstream.delete_bucket(Bucket=bucket)  # NoSuchBucket: retrying cannot cure it
    started = time.monotonic()
    proc = _cli("drain", "--admin", gw.admin, "--bucket", bucket, "--wait", "--timeout", "120")
    assert time.monotonic() - started < 60, "waited for what only an operator can unstick"
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == {
        "drained": False,
        "pending_objects": 2,
        "pending_bytes": len(b"shard") + len(b"marker"),
        "failed_objects": 1,  # the shard
        "held_objects": 1,  # the marker, held back behind it (never uploaded without it)
        "in_flight_sent_bytes": 0,
    }
    assert "(only failed objects are left)" in proc.stderr
    assert "1 of the pending objects failed permanently (1 commit markers" in proc.stderr
    assert "then run `gateway retry`" in proc.stderr
    assert f"POST {gw.admin}/admin/v1/flush/retry" in proc.stderr

    # The operator fixes the cause and retries: the same command then drains.
    upstream.create_bucket(Bucket=bucket)
    gw.admin_post("/admin/v1/flush/retry")
    proc = _cli("drain", "--admin", gw.admin, "--bucket", bucket, "--wait", "--timeout", "60")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert upstream.get_object(Bucket=bucket, Key="ckpt/step_1/.metadata")["Body"].read() == (
        b"marker"
    )


def test_unreachable_admin_exits_1_without_traceback() -> None:
    for command in (["status"], ["drain", "--wait", "--timeout", "1"]):
        proc = _cli(*command, "--admin", "http://127.0.0.1:9")
        assert proc.returncode == 1, command
        assert "cannot reach the admin API" in proc.stderr
        assert "Traceback" not in proc.stderr


def _read_all(fd: int) -> str:
    """Everything written to a pty whose writer has exited (EIO marks the end on Linux)."""
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode(errors="replace")
