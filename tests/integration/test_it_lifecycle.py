"""Process lifecycle and backpressure: cache capacity -> 503 SlowDown (reads keep working),
SIGTERM -> not ready, writes refused with SlowDown, the rest kept on disk for the next
start; a second signal -> an exit at once, nothing lost."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    GatewayProcess,
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


class Blackhole:
    """A TCP relay to an upstream, that can go silent: while silent, what clients send is
    dropped and nothing comes back, on open connections and new ones alike (a blackholed
    path: connections are accepted, requests never answered). ``speak()`` ends the
    silence and resets the connections whose bytes it dropped, as a broken path would."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.is_silent = False
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._lock = threading.Lock()
        self._tainted: list[socket.socket] = []
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def speak(self) -> None:
        with self._lock:
            self.is_silent = False
            for conn in self._tainted:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._tainted.clear()

    def close(self) -> None:
        self._server.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            target = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._open += [client, target]
            threading.Thread(target=self._pump, args=(client, target, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(target, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, is_request: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(1 << 16):
                with self._lock:
                    if is_request and self.is_silent:
                        self._tainted.append(source)
                        continue
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _wait_for(predicate: Any, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_second_signal_stops_at_once_and_loses_nothing(
    moto_server: str, upstream: Any, bucket: str, tmp_path: Path
) -> None:
    """SIGTERM (Kubernetes' path, after the preStop drain) keeps draining up to its
    deadline; a second signal (Ctrl-C) stops at once, with uploads in flight to an upstream
    that stopped answering, and says what stays on disk. The next start, with the upstream
    still silent, serves and warns; once it answers everything reaches it."""
    hole = Blackhole(int(moto_server.rsplit(":", 1)[1]))
    gw = GatewayProcess(
        tmp_path / "data",
        hole.url,
        extra_args=[
            "--shutdown-drain-timeout", "120", "--write-back-delay", "0",
            "--flush-retry-max", "1",
        ],
    )  # fmt: skip
    try:
        gw.start()
        s3 = gw.client()
        bodies = {"halt/warmup": payload(1000, seed="warm")}
        s3.put_object(Bucket=bucket, Key="halt/warmup", Body=bodies["halt/warmup"])
        gw.drained(bucket=bucket)  # the bucket is known: writes are acked while silent
        hole.is_silent = True
        late = {f"halt/{i}": payload(8 * KiB, seed=f"halt{i}") for i in range(3)}
        for key, body in late.items():
            assert s3.put_object(Bucket=bucket, Key=key, Body=body)["ETag"] == quoted_md5(body)
        bodies.update(late)
        _wait_for(lambda: gw.object_state(bucket, "halt/0")["state"] == "flushing", "an upload")

        gw.send_signal(signal.SIGTERM)
        gw.logged("draining 3 objects")
        with pytest.raises(subprocess.TimeoutExpired):
            gw.proc.wait(timeout=1)  # type: ignore[union-attr]  # draining, deadline 120 s
        started = time.monotonic()
        gw.send_signal(signal.SIGINT)
        assert gw.wait_exit(timeout=30) == 0
        assert time.monotonic() - started < 15, "a second signal must not wait for the drain"
        run = gw.log_path.read_text()
        assert (
            "draining 3 objects (24.0 KiB) for up to 120s; a second SIGINT or SIGTERM stops at "
            "once and keeps what is left on disk" in run
        )
        assert (
            "SIGINT during the shutdown: stopping at once, without waiting for the drain; what "
            "is not flushed stays on disk, safe, for the next start" in run
        )
        assert (
            f"exiting with 3 objects (24.0 KiB) not yet flushed; they are safe on disk in "
            f"{gw.data_dir} and flush at the next start on it with --upstream-endpoint "
            f"{hole.url}" in run
        )

        gw.start()  # the upstream still does not answer: a warning, not a refusal
        warned = gw.logged("flush once it answers", after="===== start #2")
        assert f"WARNING gateway [-]: upstream {hole.url}: no answer within 3 s;" in warned
        during = payload(2000, seed="during")
        assert s3.put_object(Bucket=bucket, Key="halt/during", Body=during)["ETag"] == (
            quoted_md5(during)
        )
        bodies["halt/during"] = during
        hole.speak()
        gw.drained(bucket=bucket)
        stored = upstream_objects(upstream, bucket)
        assert sorted(stored) == sorted(bodies)
        for key, body in bodies.items():
            got = upstream.get_object(Bucket=bucket, Key=key)
            assert (got["ETag"], read_body(got)) == (quoted_md5(body), body)
    finally:
        gw.stop()
        hole.close()
