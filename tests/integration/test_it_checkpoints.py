"""`gateway checkpoints`, `status` and their JSON against real gateway processes: a paused
flusher, a failed object holding a commit marker back, an unreachable upstream, an upload
in flight. Each asserts the printed words and numbers and the exit codes scripts rely on:
0 the newest complete checkpoint is durable, 3 timed out or held, 4 no complete checkpoint,
1 admin API unreachable."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import REPO_ROOT, GatewayProcess, payload, quoted_md5

sys.path.insert(0, str(REPO_ROOT / "loadtest"))

from emulator import EmulatorThread

MiB = 1 << 20


def _cli(gw: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args, "--admin", gw.admin],
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _poll(
    what: str, fetch: Callable[[], Any], done: Callable[[Any], bool], timeout_s: float
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = fetch()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {value}"
        time.sleep(0.05)


def _rows(stdout: str) -> dict[str, str]:
    """Checkpoint rows of the table by name (the first word of an indented row)."""
    return {
        line.split()[0]: line
        for line in stdout.splitlines()
        if line.startswith("  step_") or line.startswith("  ckpt")
    }


def test_a_paused_flusher_is_said_first_and_wait_times_out_then_succeeds(
    gateway_factory: Callable[..., GatewayProcess], upstream: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    shard = payload(3 * MiB, seed="paused-shard")
    gw.pause_flush()
    s3.put_object(Bucket=bucket, Key="ckpt/step_1/shard", Body=shard)
    s3.put_object(Bucket=bucket, Key="ckpt/step_1/.metadata", Body=b"meta")
    s3.put_object(Bucket=bucket, Key="ckpt/step_2/shard", Body=b"x" * 1536)

    listed = _cli(gw, "checkpoints", "--bucket", bucket, "--prefix", "ckpt/")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == (
        "PAUSED  flusher paused: nothing is uploaded until it is resumed -> run `gateway resume`"
    )
    assert lines[1] == "flusher paused, 0 B/s (no ETA: flusher paused: `gateway resume`)"
    assert f"s3://{bucket}/ckpt/" in lines
    rows = _rows(listed.stdout)
    assert list(rows) == ["step_2", "step_1"]  # newest first
    assert rows["step_2"].split() == ["step_2", "1", "object,", "1.5", "KiB", "-", "-", "writing"]
    assert rows["step_1"].split() == [
        "step_1", "2", "objects,", "3.0", "MiB", "-", "-", "complete", "on", "this", "node",
    ]  # fmt: skip

    status = _cli(gw, "status")
    assert status.stdout.splitlines()[0].startswith("PAUSED  flusher paused")
    lane = next(line for line in status.stdout.splitlines() if "ckpt/step_1/" in line)
    # Measured 0 requests/s while paused; the limit (3500/s) in its own column.
    assert lane.split()[-3:] == ["0", "3500", "0"]

    started = time.monotonic()
    waited = _cli(gw, "checkpoints", "--bucket", bucket, "--prefix", "ckpt/", "--wait",
                  "--timeout", "1")  # fmt: skip
    assert waited.returncode == 3, waited.stdout + waited.stderr
    assert time.monotonic() - started < 30
    assert f"timed out: s3://{bucket}/ckpt/step_1/ is complete on this node" in waited.stderr

    resumed = _cli(gw, "resume")
    assert (resumed.returncode, resumed.stdout) == (0, "flusher running\n")
    waited = _cli(gw, "checkpoints", "--bucket", bucket, "--prefix", "ckpt/", "--wait",
                  "--timeout", "60")  # fmt: skip
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert _rows(waited.stdout)["step_1"].endswith("durable in the bucket")
    assert f"s3://{bucket}/ckpt/step_1/: durable in the bucket" in waited.stderr
    got = upstream.get_object(Bucket=bucket, Key="ckpt/step_1/shard")
    assert got["ETag"] == quoted_md5(shard)

    paused = _cli(gw, "pause")
    assert (paused.returncode, paused.stdout) == (0, "flusher paused\n")
    assert gw.status()["flush_state"] == "paused"


def test_a_marker_held_behind_a_failed_shard_says_why_and_how_to_resolve_it(
    gateway_factory: Callable[..., GatewayProcess], upstream: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="ckpt/step_1/shard", Body=b"shard")
        s3.put_object(Bucket=bucket, Key="ckpt/step_1/.metadata", Body=b"meta")
        upstream.delete_bucket(Bucket=bucket)  # NoSuchBucket: retrying cannot cure it
    status = _poll(
        "the shard to fail and hold the marker back",
        gw.status,
        lambda st: st["failed_objects"] == 1 and st["held_objects"] == 1,
        60,
    )
    # Disjoint: the held marker is neither pending nor failed; unflushed is their sum.
    assert (status["pending_objects"], status["pending_bytes"]) == (0, 0)
    assert (status["failed_objects"], status["failed_bytes"]) == (1, len(b"shard"))
    assert (status["held_objects"], status["held_bytes"]) == (1, len(b"meta"))
    assert (status["unflushed_objects"], status["unflushed_bytes"]) == (2, 9)
    assert status["eta_seconds"] is None
    assert status["eta_note"] == "only failed objects are left: fix the cause, then `gateway retry`"
    [failed] = status["attention"]
    assert failed["state"] == "failed" and failed["command"] == "gateway retry"
    assert failed["message"].startswith(
        "1 object failed permanently (1 commit marker held back behind them); "
        f"e.g. {bucket}/ckpt/step_1/shard: NoSuchBucket"
    )
    lanes = {lane["prefix"]: lane for lane in status["lanes"]}
    assert {k: lanes["ckpt/step_1/"][k] for k in ("pending_objects", "failed_objects")} == {
        "pending_objects": 0,
        "failed_objects": 1,
    }
    assert lanes["ckpt/step_1/"]["held_objects"] == 1
    metrics = {
        name: gw.metric(name)
        for name in (
            "gateway_pending_objects",
            "gateway_failed_objects",
            "gateway_held_objects",
            "gateway_unflushed_objects",
            "gateway_unflushed_bytes",
        )
    }
    assert metrics == {
        "gateway_pending_objects": 0,
        "gateway_failed_objects": 1,
        "gateway_held_objects": 1,
        "gateway_unflushed_objects": 2,
        "gateway_unflushed_bytes": 9,
    }

    # The bucket is gone upstream: the table is what this gateway holds, and says so.
    doc = gw.admin_get(f"/admin/v1/checkpoints?bucket={bucket}&prefix=ckpt/")
    [ckpt] = doc["checkpoints"]
    assert doc["upstream_error"].startswith("NoSuchBucket")
    assert {k: ckpt[k] for k in ("state", "complete", "durable", "pending_objects")} == {
        "state": "held",
        "complete": True,
        "durable": False,
        "pending_objects": 0,
    }
    assert (ckpt["failed_objects"], ckpt["held_objects"], ckpt["unflushed_bytes"]) == (1, 1, 9)
    assert ckpt["failures"][0]["key"] == "ckpt/step_1/shard"
    assert ckpt["eta_seconds"] is None and ckpt["eta_note"] == "waits for `gateway retry`"

    started = time.monotonic()
    waited = _cli(gw, "checkpoints", "--bucket", bucket, "--wait", "--timeout", "120")
    assert time.monotonic() - started < 30, "waited for what only an operator can unstick"
    assert waited.returncode == 3, waited.stdout + waited.stderr
    lines = waited.stdout.splitlines()
    assert lines[0].startswith("FAILED  1 object failed permanently")
    assert lines[0].endswith("-> run `gateway retry`")
    row = _rows(waited.stdout)["step_1"]
    assert row.split()[:6] == ["step_1", "-", "1", "object,", "5", "B"]
    assert row.endswith("held: its commit marker waits behind 1 object that failed")
    reason = lines[lines.index(row) + 1].strip()
    assert reason.startswith("failed: ckpt/step_1/shard (NoSuchBucket")
    assert reason.endswith("fix the cause, then `gateway retry`")

    # The operator fixes the cause and retries: the checkpoint becomes durable.
    upstream.create_bucket(Bucket=bucket)
    retried = _cli(gw, "retry")
    assert (retried.returncode, retried.stdout) == (0, "1 failed object is pending again\n")
    waited = _cli(gw, "checkpoints", "--bucket", bucket, "--wait", "--timeout", "60")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert upstream.get_object(Bucket=bucket, Key="ckpt/step_1/.metadata")["Body"].read() == (
        b"meta"
    )


def test_every_bucket_and_root_without_flags_and_no_complete_checkpoint_exits_4(
    gateway_factory: Callable[..., GatewayProcess], upstream: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    other = bucket + "-2"
    upstream.create_bucket(Bucket=other)
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="jobs/a/step_5/.metadata", Body=b"m")
        s3.put_object(Bucket=bucket, Key="jobs/a/step_6/shard", Body=b"s")
        s3.put_object(Bucket=other, Key="run/step_1/shard", Body=b"s")  # no marker yet
        listed = _cli(gw, "checkpoints")
        assert listed.returncode == 0, listed.stderr
        headers = [line for line in listed.stdout.splitlines() if line.startswith("s3://")]
        # The root found from the marker row; a bucket without any marker from its root.
        assert headers == [f"s3://{bucket}/jobs/a/", f"s3://{other}/"]
        assert _rows(listed.stdout)["step_5"].endswith("complete on this node")
        assert "  run  " in listed.stdout and listed.stdout.rstrip().endswith("writing")

        # --prefix without --bucket: that prefix in every bucket holding rows.
        both = _cli(gw, "checkpoints", "--prefix", "jobs/a/")
        headers = [line for line in both.stdout.splitlines() if line.startswith("s3://")]
        assert headers == [f"s3://{bucket}/jobs/a/", f"s3://{other}/jobs/a/"]
        assert both.stdout.rstrip().endswith("no checkpoint directories")
        # The page asks for the newest few only (one marker lookup each).
        newest = gw.admin_get(f"/admin/v1/checkpoints?bucket={bucket}&prefix=jobs/a/&limit=1")
        assert [c["name"] for c in newest["checkpoints"]] == ["step_6"]
        bad = gw.admin_request("GET", f"/admin/v1/checkpoints?bucket={bucket}&limit=x")
        assert bad.status == 400 and bad.json()["error"] == "InvalidArgument"

        none = _cli(gw, "checkpoints", "--bucket", other, "--wait", "--timeout", "30")
        assert none.returncode == 4, none.stdout + none.stderr
        assert none.stderr == "gateway checkpoints: no complete checkpoint\n"


def test_no_eta_while_the_upstream_refuses_every_connection(tmp_path: Path) -> None:
    emu = EmulatorThread(latency_ms=1, buckets=["outage"]).start()
    gw = GatewayProcess(
        tmp_path / "data",
        emu.url,
        extra_args=["--flush-retry-max", "0.5", "--shutdown-drain-timeout", "1"],
    )
    try:
        gw.start()
        s3 = gw.client()
        s3.put_object(Bucket="outage", Key="ckpt/step_1/shard", Body=b"before")
        gw.drained(bucket="outage")
        emu.stop()  # connection refused from now on
        body = payload(300_000, seed="outage")
        s3.put_object(Bucket="outage", Key="ckpt/step_2/shard", Body=body)
        s3.put_object(Bucket="outage", Key="ckpt/step_2/.metadata", Body=b"meta")
        status = _poll(
            "the flusher to be refused",
            gw.status,
            lambda st: st["eta_note"] and st["eta_note"].startswith("waiting for the upstream"),
            30,
        )
        assert status["eta_seconds"] is None
        assert (status["pending_objects"], status["pending_bytes"]) == (2, len(body) + 4)
        assert status["failed_objects"] == 0
        waiting = [a for a in status["attention"] if a["state"] == "waiting"]
        assert waiting and waiting[0]["message"].startswith("waiting for the upstream: ")

        out = _cli(gw, "checkpoints", "--bucket", "outage", "--prefix", "ckpt/")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].startswith("WAITING waiting for the upstream: ")
        assert "(no ETA: waiting for the upstream: " in lines[1]
        assert "the bucket cannot be listed (ServiceUnavailable" in out.stdout
        row = _rows(out.stdout)["step_2"]
        assert row.split()[:5] == ["step_2", "2", "objects,", "293.0", "KiB"]
        assert row.split()[5:7] == ["-", "-"]  # nothing failed; no ETA
        assert row.endswith("complete on this node")
        # step_1 (flushed, no marker) is listed from this gateway's rows too.
        assert _rows(out.stdout)["step_1"].endswith("writing")
    finally:
        gw.stop()
        emu.stop()


def test_bytes_in_flight_count_and_the_rate_decays_to_zero(tmp_path: Path) -> None:
    # 4 MiB/s per request: a 16 MiB object takes about 4 s to send (socket buffers absorb
    # a few MiB at once), long enough to see it move.
    emu = EmulatorThread(latency_ms=1, buckets=["slow"], request_bandwidth=4 * MiB).start()
    gw = GatewayProcess(tmp_path / "data", emu.url, extra_args=["--write-back-delay", "0"])
    size = 16 * MiB
    try:
        gw.start()
        gw.client().put_object(Bucket="slow", Key="ckpt/step_1/big", Body=payload(size, "big"))
        moving = _poll(
            "the upload to be part-way",
            gw.status,
            lambda st: 0 < st["in_flight_sent_bytes"] < size and st["flush_rate_bytes_per_s"] > 0,
            30,
        )
        assert moving["pending_objects"] == 1 and moving["flushing_objects"] == 1
        assert moving["eta_seconds"] is not None and moving["eta_seconds"] > 0
        doc = gw.admin_get("/admin/v1/checkpoints?bucket=slow&prefix=ckpt/")
        [ckpt] = doc["checkpoints"]
        assert 0 < ckpt["sent_bytes"] <= size and ckpt["state"] == "writing"
        assert gw.metric("gateway_flush_in_flight_sent_bytes") > 0
        fence = gw.drain(bucket="slow", prefix="ckpt/", wait=False)  # `gateway drain`'s bar
        assert fence["pending_bytes"] == size and 0 < fence["in_flight_sent_bytes"] <= size

        gw.drained(bucket="slow", timeout=60)
        done_s = time.monotonic()
        idle = _poll("the rate to decay to 0", gw.status,
                     lambda st: st["flush_rate_bytes_per_s"] == 0, 30)  # fmt: skip
        assert time.monotonic() - done_s < 12  # a 10 s window, and nothing after it
        assert idle["in_flight_sent_bytes"] == 0 and idle["eta_seconds"] == 0.0
        assert gw.metric("gateway_flush_rate_bytes_per_second") == 0
    finally:
        gw.stop()
        emu.stop()


def test_unreachable_admin_exits_1() -> None:
    for command in (["checkpoints"], ["checkpoints", "--wait"], ["pause"], ["retry"]):
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", *command, "--admin", "http://127.0.0.1:9"],
            cwd=str(REPO_ROOT),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1, command
        assert "cannot reach the admin API" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib in the CLI must talk to loopback directly."""
    monkeypatch.setenv("NO_PROXY", "*")
