"""The flush engine against a throttling upstream: the gateway as a subprocess, the S3
emulator of ``loadtest/emulator.py`` as its real bucket.

Every assertion is read from what the upstream saw (the emulator's request log: operation,
key, status, arrival order) and what it stores (bytes, ETags), plus the gateway's admin
figures. Nothing asserts a duration; the throttles make the outcomes deterministic by
capacity (a prefix allowed N requests cannot have N + 1 successes).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness import (
    REPO_ROOT,
    GatewayProcess,
    md5_hex,
    payload,
    quoted_md5,
    s3_client,
)

sys.path.insert(0, str(REPO_ROOT / "loadtest"))

from emulator import EmulatorThread

# Rates and budgets measured against the clock: make test runs them alone, after the rest.
pytestmark = pytest.mark.exclusive

BUCKET = "flush-engine"
LANE_CEILING = 3500.0  # --lane-rate default: a lane's rate never exceeds it
# Every gateway here: quick shutdown (some tests leave a lane throttled for good).
BASE_ARGS = ["--shutdown-drain-timeout", "1"]
Entry = dict[str, Any]


@dataclass
class Rig:
    """One emulator (the upstream, bucket ``BUCKET`` precreated) and one gateway on it."""

    emu: EmulatorThread
    gw: GatewayProcess

    @property
    def s3(self) -> Any:
        return self.gw.client()

    def log(self) -> list[Entry]:
        """The upstream's object-level requests for ``BUCKET``, in arrival order."""
        return [e for e in self.emu.log if e["bucket"] == BUCKET and e["key"]]

    def stored(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        """key -> {size, etag, parts} of what the upstream holds (no request is logged)."""
        emulator = self.emu.emulator
        return dict(self.emu.call(lambda: emulator.objects(BUCKET, prefix)))

    def body(self, key: str) -> bytes:
        emulator = self.emu.emulator

        def read() -> bytes:
            body = emulator.buckets[BUCKET].objects[key].blob.body
            assert body is not None
            return bytes(body)

        return bytes(self.emu.call(read))

    def throttle(self, **changes: Any) -> None:
        """Change the emulator's throttles (its limiter restarts with full buckets)."""
        emulator = self.emu.emulator
        self.emu.call(lambda: emulator.configure(**changes))

    def lanes(self) -> dict[str, dict[str, Any]]:
        """prefix -> lane figures of ``BUCKET`` from /admin/v1/status."""
        return {
            lane["prefix"]: lane for lane in self.gw.status()["lanes"] if lane["bucket"] == BUCKET
        }

    def assert_stored(self, expected: dict[str, bytes]) -> None:
        stored = self.stored()
        for key, body in expected.items():
            assert key in stored, f"{key} not upstream"
            assert stored[key]["etag"] == md5_hex(body), key
            assert self.body(key) == body, key


def _stop(rig: Rig) -> None:
    gw = rig.gw
    crashed = gw.crashed
    gw.stop()
    rig.emu.stop()
    if crashed:
        pytest.fail(f"gateway died during the test:\n{gw.log_tail()}", pytrace=False)


def _start(base: Path, gateway_args: list[str], emulator_opts: dict[str, Any]) -> Rig:
    opts: dict[str, Any] = {"latency_ms": 5, "buckets": [BUCKET], **emulator_opts}
    emu = EmulatorThread(**opts).start()
    gw = GatewayProcess(base / "data", emu.url, extra_args=[*BASE_ARGS, *gateway_args])
    try:
        gw.start()
    except BaseException:
        emu.stop()
        raise
    return Rig(emu, gw)


@pytest.fixture
def rig_factory(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    """``rig_factory(gateway_args=[...], **emulator_opts)``: a fresh emulator and gateway."""
    rigs: list[Rig] = []

    def make(gateway_args: list[str] | tuple[str, ...] = (), **emulator_opts: Any) -> Rig:
        rig = _start(tmp_path / f"rig{len(rigs)}", list(gateway_args), emulator_opts)
        rigs.append(rig)
        return rig

    try:
        yield make
    finally:
        for rig in rigs:
            _stop(rig)


@pytest.fixture(scope="module")
def coalescing_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """Unthrottled upstream; temp names held 5 s (longer than the 0.5 s write-back delay,
    so a rename that comes after the delay is still coalesced by the hold alone)."""
    rig = _start(tmp_path_factory.mktemp("coalescing"), ["--temp-hold", "5"], {})
    try:
        yield rig
    finally:
        _stop(rig)


def _creations(log: list[Entry], key: str) -> list[Entry]:
    """Successful requests that (re)create ``key`` upstream."""
    return [
        e
        for e in log
        if e["key"] == key
        and e["status"] == 200
        and e["op"] in ("PutObject", "CompleteMultipartUpload", "CopyObject")
    ]


def _max_in_window(times: list[float], width: float) -> int:
    """The most events in any half-open window ``[t, t + width)`` (one starting at each)."""
    times = sorted(times)
    best, j = 0, 0
    for i, start in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] < start + width:
            j += 1
        best = max(best, j - i)
    return best


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    """Poll a state (never a duration) until it holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- 1. 503 storm ----------------------------------------------------------------------------


def test_503_storm_every_ack_lands_once(rig_factory: Callable[..., Rig]) -> None:
    """Three rank prefixes, each allowed 5 requests/s (burst 5) by the upstream, get 20
    objects each at once. Clients never see the throttle; every object lands exactly once
    with its bytes; the lanes slowed down (503s counted, rate cut below the ceiling).

    ``--flush-retry-max 2`` caps the full-jitter backoff (default 30 s) only to keep the test
    short: an object unlucky five or six times would otherwise wait up to half a minute."""
    rig = rig_factory(
        ["--lane-depth", "3", "--flush-retry-max", "2"], prefix_rate=5, prefix_depth=3
    )
    s3 = rig.s3
    bodies = {
        f"storm/step_1/rank_{r}/shard_{i:02d}": payload(1000 + 37 * i + r, seed=f"storm{r}-{i}")
        for r in range(3)
        for i in range(20)
    }
    with rig.gw.flush_paused():  # all 60 eligible at once: a burst at every prefix
        for key, body in bodies.items():
            assert s3.put_object(Bucket=BUCKET, Key=key, Body=body)["ETag"] == quoted_md5(body)

    rig.gw.drained(bucket=BUCKET, timeout=120)
    assert sorted(rig.stored("storm/")) == sorted(bodies)
    rig.assert_stored(bodies)

    puts = [e for e in rig.log() if e["op"] == "PutObject"]
    assert {(e["status"], e["code"]) for e in puts} <= {(200, None), (503, "SlowDown")}
    assert Counter(e["key"] for e in puts if e["status"] == 200) == Counter(list(bodies))
    throttled = Counter(e["prefix"] for e in puts if e["status"] == 503)
    assert sum(throttled.values()) > 0, "the upstream never answered SlowDown: no storm"
    attempts = Counter(e["key"] for e in puts)
    assert max(attempts.values()) <= 30, attempts.most_common(3)

    status = rig.gw.status()
    assert status["failed_objects"] == 0
    assert status["throttled"] == sum(throttled.values())
    lanes = rig.lanes()
    for prefix, n in throttled.items():
        lane = lanes[prefix]
        assert lane["throttled_503"] == n, (prefix, lane)
        assert lane["rate_limit_per_s"] < LANE_CEILING, (prefix, lane)
        assert lane["pending_objects"] == 0
    print(
        f"storm: {len(puts)} PUT attempts for {len(bodies)} objects, 503s per prefix "
        f"{dict(throttled)}, lane rates "
        f"{ {p: lanes[p]['rate_limit_per_s'] for p in throttled} }"
    )


def test_budget_converges_near_a_limit_its_lanes_share(rig_factory: Callable[..., Rig]) -> None:
    """One upstream partition (``conv/``, 10 requests/s, a second's burst, as a fresh S3
    bucket throttles) shared by three rank lanes with 40 objects each. The bucket's budget
    slow-starts, is cut at the first 503s, then runs near the limit: few 503s after the
    first 3 s, the accepted rate near 10/s, the reported budget near 10/s. Margins for a
    busy machine: the bench (loadtest/bench.py) is where the figures are measured."""
    limit = 10.0
    rig = rig_factory(["--lane-depth", "3"], prefix_rate=limit, prefix_burst=limit, prefix_depth=1)
    s3 = rig.s3
    bodies = {
        f"conv/step_1/rank_{r}/shard_{i:02d}": payload(2048, seed=f"conv{r}-{i}")
        for i in range(40)
        for r in range(3)
    }
    with rig.gw.flush_paused():
        for key, body in bodies.items():
            s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    rig.gw.drained(bucket=BUCKET, timeout=120)
    rig.assert_stored(bodies)

    puts = [e for e in rig.log() if e["op"] == "PutObject"]
    assert {e["prefix"] for e in puts} == {"conv/"}
    first_s = min(e["t"] for e in puts)
    later = [e for e in puts if e["t"] >= first_s + 3.0]
    refused = sum(1 for e in later if e["status"] == 503)
    assert refused <= max(2, len(later) // 20), (refused, len(later))
    accepted = sorted(e["t"] for e in later if e["status"] == 200)
    span_s = accepted[-1] - accepted[0]
    assert len(accepted) / span_s >= 0.7 * limit, (len(accepted), span_s)
    lanes = rig.lanes()
    assert {lane["bucket_rate_per_s"] for lane in lanes.values()} != {None}
    for lane in lanes.values():
        assert 0.5 * limit <= lane["bucket_rate_per_s"] <= 1.6 * limit, lane
        assert not lane["isolated"]
    print(
        f"shared limit {limit}/s: {refused} of {len(later)} PUTs refused after 3 s, "
        f"{len(accepted) / span_s:.2f}/s accepted, budget {lanes}"
    )


# -- 2. lane isolation -------------------------------------------------------------------------


def test_throttled_lane_does_not_hold_back_another(rig_factory: Callable[..., Rig]) -> None:
    """Every prefix may send a burst of 5, then 1 request every 2 s. The hot prefix gets 30
    objects (it cannot finish before ~50 s: 5 + 0.5/s); once it is being throttled, the
    cold prefix gets 5 (its burst). The cold fence returns drained while the hot lane still
    holds a backlog, and no cold object was ever throttled."""
    rig = rig_factory(["--lane-depth", "3"], prefix_rate=0.5, prefix_burst=5, prefix_depth=3)
    s3 = rig.s3
    hot = {f"iso/hot/r0/obj-{i:02d}": payload(4096, seed=f"hot{i}") for i in range(30)}
    cold = {f"iso/cold/r0/obj-{i}": payload(4096, seed=f"cold{i}") for i in range(5)}
    for key, body in hot.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    _wait_for(
        "the hot lane to be throttled",
        lambda: rig.lanes().get("iso/hot/r0/", {}).get("throttled_503", 0) > 0,
    )
    for key, body in cold.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)

    fence = rig.gw.drain(bucket=BUCKET, prefix="iso/cold/", timeout=40)
    hot_now = rig.gw.drain(bucket=BUCKET, prefix="iso/hot/", wait=False)
    assert fence == {
        "drained": True,
        "pending_objects": 0,
        "pending_bytes": 0,
        "failed_objects": 0,
        "held_objects": 0,
        "in_flight_sent_bytes": 0,
    }
    assert hot_now["drained"] is False
    assert hot_now["pending_objects"] > 0
    rig.assert_stored(cold)
    hot_upstream = list(rig.stored("iso/hot/"))
    assert len(hot_upstream) < len(hot)

    log = rig.log()
    cold_log = [e for e in log if e["key"] in cold]
    assert sorted(e["key"] for e in cold_log) == sorted(cold)  # one request each...
    assert {(e["op"], e["status"]) for e in cold_log} == {("PutObject", 200)}  # ...a 200 PUT
    hot_503 = sum(1 for e in log if e["key"] in hot and e["status"] == 503)
    assert hot_503 > 0
    lanes = rig.lanes()
    assert lanes["iso/hot/r0/"]["throttled_503"] >= 1
    assert lanes["iso/hot/r0/"]["rate_limit_per_s"] < LANE_CEILING
    assert lanes.get("iso/cold/r0/", {"throttled_503": 0})["throttled_503"] == 0
    print(
        f"isolation: hot lane {lanes['iso/hot/r0/']}, hot upstream {len(hot_upstream)}/30 "
        f"when the cold fence returned, hot 503s so far {hot_503}"
    )


# -- 3. global token bucket ----------------------------------------------------------------


def test_global_request_rate_caps_every_window(rig_factory: Callable[..., Rig]) -> None:
    """``--flush-rate 5 --flush-rate-burst 1``: 40 objects, all eligible at once, reach an
    unthrottled upstream at most 5*2 + 1 (+2 slack) in any 2-second window of arrivals."""
    rig = rig_factory(["--flush-rate", "5", "--flush-rate-burst", "1"])
    s3 = rig.s3
    bodies = {f"rate/r{i % 4}/x/obj-{i:02d}": payload(512, seed=f"rate{i}") for i in range(40)}
    with rig.gw.flush_paused():
        for key, body in bodies.items():
            s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    rig.gw.drained(bucket=BUCKET, timeout=60)
    rig.assert_stored(bodies)

    log = rig.log()
    assert all(e["op"] == "PutObject" and e["status"] == 200 for e in log), log
    assert Counter(e["key"] for e in log) == Counter(list(bodies))
    busiest = _max_in_window([e["t"] for e in log], 2.0)
    assert busiest <= 5 * 2 + 1 + 2, busiest
    print(f"token bucket: busiest 2 s window held {busiest} of {len(log)} PUTs")


# -- 4. coalescing -------------------------------------------------------------------------


def test_overwrites_while_paused_upload_once(coalescing_rig: Rig) -> None:
    rig = coalescing_rig
    s3 = rig.s3
    key = "co/over/k"
    versions = [payload(2000 + i, seed=f"over{i}") for i in range(5)]
    with rig.gw.flush_paused():
        for body in versions:
            s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    rig.gw.drained(bucket=BUCKET, prefix="co/over/")
    requests = [e for e in rig.log() if e["key"] == key]
    assert [(e["op"], e["status"]) for e in requests] == [("PutObject", 200)]
    assert requests[0]["bytes_in"] == len(versions[-1])
    rig.assert_stored({key: versions[-1]})


def test_delete_of_a_never_flushed_key_uploads_nothing(coalescing_rig: Rig) -> None:
    rig = coalescing_rig
    s3 = rig.s3
    key = "co/gone/k"
    with rig.gw.flush_paused():
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"short-lived")
        s3.delete_object(Bucket=BUCKET, Key=key)
    rig.gw.drained(bucket=BUCKET, prefix="co/gone/")
    requests = [e for e in rig.log() if e["key"] == key]
    # A non-temp key may exist upstream from elsewhere: a DELETE is allowed, a PUT is not.
    assert {e["op"] for e in requests} <= {"DeleteObject"}, requests
    assert key not in rig.stored("co/gone/")


def test_rename_of_a_temp_key_uploads_the_final_key_once(coalescing_rig: Rig) -> None:
    """PUT ``x.tmp``; wait past the write-back delay (the temp hold alone keeps it back);
    CopyObject to ``x``; DELETE ``x.tmp``: one PUT of ``x``, nothing for ``x.tmp``."""
    rig = coalescing_rig
    s3 = rig.s3
    body = payload(3000, seed="rename")
    s3.put_object(Bucket=BUCKET, Key="a/x.tmp", Body=body)
    time.sleep(1.0)  # > --write-back-delay 0.5, < --temp-hold 5
    assert rig.gw.object_state(BUCKET, "a/x.tmp")["state"] == "pending"
    copied = s3.copy_object(
        Bucket=BUCKET, Key="a/x", CopySource={"Bucket": BUCKET, "Key": "a/x.tmp"}
    )
    assert copied["CopyObjectResult"]["ETag"] == quoted_md5(body)
    s3.delete_object(Bucket=BUCKET, Key="a/x.tmp")
    rig.gw.drained(bucket=BUCKET, prefix="a/")

    log = rig.log()
    assert not [e for e in log if "a/x.tmp" in e["key"]]
    assert not [e for e in log if e["op"] == "CopyObject"]
    assert [(e["op"], e["status"]) for e in log if e["key"] == "a/x"] == [("PutObject", 200)]
    assert sorted(rig.stored("a/")) == ["a/x"]
    rig.assert_stored({"a/x": body})


# -- 5. drain fence ------------------------------------------------------------------------


def test_drain_fence_ignores_writes_after_the_call(rig_factory: Callable[..., Rig]) -> None:
    """A fence over fence/p1/ returns drained once the objects acknowledged before the call
    are upstream, while writers keep adding to fence/p1/ and fence/p2/ after the call.

    Deterministic by capacity: each upstream prefix may take 3 requests in the whole test
    (burst 3, rate 0.001/s). The early objects are 3 per prefix; the prefixes the later
    writers use are exhausted beforehand, so their objects can never become durable: a
    fence that waited for them would time out."""
    rig = rig_factory(["--lane-depth", "3"], prefix_depth=3)
    rig.throttle(prefix_rate=0.001, prefix_burst=3)
    late_p1, late_p2 = "fence/p1/late/", "fence/p2/w/"
    direct = s3_client(rig.emu.url, access_key="k", secret_key="s")
    for prefix in (late_p1, late_p2):
        for _ in range(3):  # use up the prefix's budget (404s: the keys do not exist)
            try:
                direct.head_object(Bucket=BUCKET, Key=prefix + "probe")
            except Exception as exc:
                assert "404" in str(exc), exc
    early = {
        f"fence/p1/e{j}/obj-{i}": payload(3000, seed=f"early{j}{i}")
        for j in (0, 1)
        for i in (0, 1, 2)
    }
    s3 = rig.s3
    rig.gw.pause_flush()
    for key, body in early.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    before = rig.gw.drain(bucket=BUCKET, prefix="fence/p1/", wait=False)
    assert before["pending_objects"] == len(early)

    result: dict[str, Any] = {}

    def fence() -> None:
        result.update(rig.gw.drain(bucket=BUCKET, prefix="fence/p1/", timeout=60))
        result["returned_at"] = time.time()

    fence_thread = threading.Thread(target=fence)
    fence_thread.start()
    time.sleep(0.5)  # ordering only: the admin handler takes its fence on arrival

    acked: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        client = rig.gw.client()
        n = 0
        try:
            while not stop.is_set() or n < 10:
                for prefix in (late_p1, late_p2):
                    key = f"{prefix}obj-{n:03d}"
                    client.put_object(Bucket=BUCKET, Key=key, Body=payload(1000, seed=key))
                    acked.append(key)
                n += 1
        except BaseException as exc:
            errors.append(exc)

    writer_thread = threading.Thread(target=writer)
    writer_thread.start()
    _wait_for("the later writers' first acks", lambda: len(acked) >= 4 or bool(errors))
    rig.gw.resume_flush()
    fence_thread.join(90)
    stop.set()
    writer_thread.join(60)
    assert not errors, errors
    assert not fence_thread.is_alive()

    assert (result["drained"], result["pending_objects"]) == (True, 0), result
    rig.assert_stored(early)
    log = rig.log()
    for key in early:
        (put,) = _creations(log, key)
        assert put["ts_end"] <= result["returned_at"]
    late_p1_keys = [k for k in acked if k.startswith(late_p1)]
    assert len(late_p1_keys) >= 10
    assert not rig.stored(late_p1)  # nothing written after the call reached the upstream...
    after = rig.gw.drain(bucket=BUCKET, prefix="fence/p1/", wait=False)
    assert after["drained"] is False  # ...and fence/p1/ still has pending objects
    assert after["pending_objects"] == len(late_p1_keys)


# -- fixed bugs: drain fence over an overwrite, global rate and slots vs slow lanes ---------


def test_drain_fence_covers_a_key_overwritten_after_the_call(
    rig_factory: Callable[..., Rig],
) -> None:
    """Flusher paused throughout: nothing can be durable, so the fence must not say drained."""
    rig = rig_factory()
    s3 = rig.s3
    rig.gw.pause_flush()
    s3.put_object(Bucket=BUCKET, Key="ow/p/k", Body=b"v1: acknowledged before the call")
    result: dict[str, Any] = {}
    fence = threading.Thread(
        target=lambda: result.update(rig.gw.drain(bucket=BUCKET, prefix="ow/p/", timeout=3))
    )
    fence.start()
    time.sleep(0.5)  # ordering only: the admin handler takes its fence on arrival
    s3.put_object(Bucket=BUCKET, Key="ow/p/k", Body=b"v2: acknowledged after the call")
    fence.join(30)
    assert not rig.log()  # paused: the upstream got no object request at all
    assert not rig.stored("ow/")
    assert result["drained"] is False, result


def test_global_request_rate_holds_when_lanes_are_slower(
    rig_factory: Callable[..., Rig],
) -> None:
    """``--flush-rate 5 --flush-rate-burst 1`` with lanes paced at 0.5/s (``--lane-rate``;
    an AIMD-cut lane behaves the same): 8 slow lanes of 3 objects, then 16 one-object lanes.
    Observed: 17 PUTs in a 2-second window (the bucket allows 11), 12 in one second."""
    rig = rig_factory(["--flush-rate", "5", "--flush-rate-burst", "1", "--lane-rate", "0.5"])
    s3 = rig.s3
    keys = [f"gr/slow{lane}/x/obj-{i}" for lane in range(8) for i in range(3)]
    keys += [f"gr/fast{i:02d}/x/obj" for i in range(16)]
    with rig.gw.flush_paused():
        for key in keys:
            s3.put_object(Bucket=BUCKET, Key=key, Body=payload(200, seed=key))
    rig.gw.drained(bucket=BUCKET, timeout=60)
    log = rig.log()
    assert Counter(e["key"] for e in log if e["status"] == 200) == Counter(keys)
    busiest = _max_in_window([e["t"] for e in log], 2.0)
    assert busiest <= 5 * 2 + 1 + 2, busiest


def test_slow_lanes_do_not_take_every_global_slot(rig_factory: Callable[..., Rig]) -> None:
    """Default concurrency (a window of 32 requests in flight; a lane may claim as many
    uploads) and ``--lane-bandwidth 32KiB``: four lanes of 16 objects of 32 KiB go at one
    object per second each, most of their objects claimed and waiting for their lane;
    a lane of three tiny objects written once they are busy should not wait for them.
    Observed before the admission took no slot for a waiting upload: ~32 slow uploads
    reached the upstream before the first tiny one (about 8 s later)."""
    rig = rig_factory(["--lane-bandwidth", "32KiB"])
    s3 = rig.s3
    slow_lanes = [f"bw/slow{lane}/x/" for lane in range(4)]
    for prefix in slow_lanes:
        for i in range(16):
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}obj-{i:02d}", Body=payload(32 * 1024, i))
    _wait_for(
        "the slow lanes to fill their slots",
        lambda: all(rig.lanes().get(p, {}).get("in_flight", 0) >= 8 for p in slow_lanes),
    )
    fast = {f"bw/fast/x/obj-{i}": payload(100, seed=f"fast{i}") for i in range(3)}
    for key, body in fast.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    rig.gw.drained(bucket=BUCKET, prefix="bw/fast/", timeout=60)
    rig.assert_stored(fast)
    log = rig.log()
    first_fast = min(e["t"] for e in log if e["key"] in fast)
    slow_before = sum(1 for e in log if e["key"].startswith("bw/slow") and e["t"] < first_fast)
    # Each slow lane sends one object per second (burst one): with the fast lane served as
    # soon as it is eligible (0.5 s after its ack) that is a handful per lane, not its backlog.
    assert slow_before <= 4 * 4, slow_before
