"""Upstream outage: the real bucket stops answering (connection refused) or answers 500s
for a while.

Writes keep being acknowledged up to the capacity (then 503 SlowDown, reads still served),
status shows the backlog and the last error, and when the upstream returns on the same
port everything drains with nothing lost or duplicated: exactly one successful PUT per
object version in the upstream's request log, bytes and ETags as acknowledged."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
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
        counts = Counter(puts)  # the newest version of each is what is stored (above)
        assert set(counts) == set(acked)
        assert all(n == 1 for k, n in counts.items() if k != "out/k0"), counts
        # k0 had two acknowledged versions: the older one's request may be waiting in the
        # request gate (the outage's pacing) when the overwrite comes, and goes up first
        # once the upstream is back, the newer one after it; at most one PUT per version
        # (seen under CPU load: a fresh-clone CI run of 3fec474).
        assert counts["out/k0"] <= 2, counts
        assert gw.status()["pending_objects"] == 0
    finally:
        gw.stop()
        emu.stop()


class FaultProxy:
    """An HTTP proxy in front of the emulator that answers ``500 InternalError`` (S3 XML)
    to everything while ``is_failing``, without forwarding: the upstream stores nothing."""

    def __init__(self, target_url: str) -> None:
        self.target_url = target_url
        self.is_failing = False
        self.failed_requests = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.is_failing:
            self.failed_requests += 1
            body = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
            return web.Response(status=500, body=body, content_type="application/xml")
        data = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with self._session.request(
            request.method, self.target_url + request.path_qs, headers=headers, data=data
        ) as resp:
            payload_bytes = await resp.read()
            out = {
                k: v
                for k, v in resp.headers.items()
                if k.lower() not in ("transfer-encoding", "content-length", "connection")
            }
            return web.Response(status=resp.status, body=payload_bytes, headers=out)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        async def close() -> None:
            await self._session.close()
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def test_upstream_answering_500s_then_recovering_drains_exactly_once(tmp_path: Path) -> None:
    emu = EmulatorThread(latency_ms=1, buckets=[BUCKET]).start()
    proxy = FaultProxy(emu.url).start()
    gw = GatewayProcess(
        tmp_path / "data",
        proxy.url,
        extra_args=["--flush-retry-max", "0.5", "--write-back-delay", "0"],
    )
    try:
        gw.start()
        s3 = gw.client()
        s3.put_object(Bucket=BUCKET, Key="err/first", Body=b"first")  # the bucket is known
        gw.drained(bucket=BUCKET)
        proxy.is_failing = True
        acked = {f"err/k{i}": payload(64 * KiB, seed=f"e{i}") for i in range(4)}
        for key, body in acked.items():
            assert s3.put_object(Bucket=BUCKET, Key=key, Body=body)["ETag"] == quoted_md5(body)
        _wait(lambda: "InternalError" in (gw.status()["last_error"] or ""), "a 500 in status")
        status = gw.status()
        assert status["pending_objects"] == 4 and status["failed_objects"] == 0
        assert read_body(s3.get_object(Bucket=BUCKET, Key="err/k1")) == acked["err/k1"]
        assert proxy.failed_requests > 0

        proxy.is_failing = False
        gw.drained(bucket=BUCKET)
        stored = emu.call(lambda: emu.emulator.objects(BUCKET, "err/"))
        acked["err/first"] = b"first"
        assert {k: v["etag"] for k, v in stored.items()} == {
            k: md5_hex(b) for k, b in acked.items()
        }
        puts = [
            e["key"]
            for e in emu.log
            if e["op"] == "PutObject" and e["bucket"] == BUCKET and e["status"] == 200
        ]
        assert sorted(puts) == sorted(acked)
    finally:
        gw.stop()
        proxy.stop()
        emu.stop()
