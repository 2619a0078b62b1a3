"""Upstream outage: the real bucket stops answering (connection refused) for a while.

Writes keep being acknowledged up to the capacity (then 503 SlowDown, reads still served),
status shows the backlog and the last error, and when the upstream returns on the same
port everything drains with nothing lost or duplicated: exactly one successful PUT per
object version in the upstream's request log, bytes and ETags as acknowledged."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    REPO_ROOT,
    GatewayProcess,
    error_code,
    md5_hex,
    payload,
    quoted_md5,
    read_body,
)

sys.path.insert(0, str(REPO_ROOT / "loadtest"))

from emulator import EmulatorThread

BUCKET = "outage"
KiB = 1024


def _wait(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_upstream_outage_acks_up_to_capacity_then_drains_exactly_once(tmp_path: Path) -> None:
    emu = EmulatorThread(latency_ms=1, buckets=[BUCKET]).start()
    port = emu.port
    gw = GatewayProcess(
        tmp_path / "data",
        emu.url,
        extra_args=[
            "--capacity",
            str(1024 * KiB),
            "--flush-retry-max",
            "0.5",
            "--write-back-delay",
            "0",
            "--shutdown-drain-timeout",
            "1",
        ],
    )
    try:
        gw.start()
        s3 = gw.client()
        before = payload(100 * KiB, seed="before")
        s3.put_object(Bucket=BUCKET, Key="out/before", Body=before)
        gw.drained(bucket=BUCKET)
        state = emu.call(lambda: emu.emulator.buckets)
        emu.stop()  # the upstream is gone: connection refused

        acked = {f"out/k{i}": payload(150 * KiB, seed=f"k{i}") for i in range(5)}
        for key, body in acked.items():
            assert s3.put_object(Bucket=BUCKET, Key=key, Body=body)["ETag"] == quoted_md5(body)
        acked["out/k0"] = payload(150 * KiB, seed="k0-v2")  # an overwrite during the outage
        s3.put_object(Bucket=BUCKET, Key="out/k0", Body=acked["out/k0"])
        # 750 KiB unflushed: a 300 KiB write does not fit in 1 MiB; reads keep working.
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket=BUCKET, Key="out/big", Body=payload(300 * KiB, seed="big"))
        assert error_code(exc.value) == "SlowDown"
        assert read_body(s3.get_object(Bucket=BUCKET, Key="out/k3")) == acked["out/k3"]
        _wait(lambda: gw.status()["last_error"] is not None, "a flush error in status")
        status = gw.status()
        assert status["pending_objects"] == 5
        assert status["pending_bytes"] == 5 * 150 * KiB
        assert status["retries"] > 0
        assert not gw.drain(bucket=BUCKET, wait=False)["drained"]

        back = EmulatorThread(latency_ms=1, port=port).start()  # the same endpoint returns
        emu = back
        back.call(lambda: back.emulator.buckets.update(state))
        gw.drained(bucket=BUCKET)
        big = payload(300 * KiB, seed="big")
        s3.put_object(Bucket=BUCKET, Key="out/big", Body=big)  # room again
        acked["out/big"] = big
        gw.drained(bucket=BUCKET)

        stored = back.call(lambda: back.emulator.objects(BUCKET, "out/"))
        assert sorted(stored) == sorted([*acked, "out/before"])
        for key, body in acked.items():
            assert stored[key]["etag"] == md5_hex(body), key
            got = back.call(lambda k=key: bytes(back.emulator.buckets[BUCKET].objects[k].blob.body))
            assert got == body, key
        puts = [
            e["key"]
            for e in back.log
            if e["op"] == "PutObject" and e["bucket"] == BUCKET and e["status"] == 200
        ]
        assert sorted(puts) == sorted(acked)  # one successful PUT per key, newest version
        assert gw.status()["pending_objects"] == 0
    finally:
        gw.stop()
        emu.stop()
