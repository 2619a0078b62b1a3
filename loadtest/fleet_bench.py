"""The fleet's costs and promises measured (issue 20), each leg a ratio against a limit
measured in the same run on this machine.

Legs (``--legs``, all by default):

- ``marker``: 4 gateways on the throttling emulator, 16 ranks (4 per gateway) writing one
  shard each per checkpoint, the marker through gateway 0 after the job's barrier; per
  checkpoint, when the emulator created the marker minus when it created the last shard
  (its request log). Target: p99 <= 1 s.
- ``crossread``: a 64 MiB object pending on gateway b, read whole through b (a local,
  sendfile GET) and through a (a cross-node GET, streamed from b), alternated. Target: the
  cross-node throughput >= 0.5 of the local one.
- ``miss``: a gateway with 64 simulated members (fake_peers.py) and one without, GETs of
  objects only the bucket holds (a local miss each), alternated; and the round trip to one
  member (a signed lease request). Target: p99 added by the fleet <= one round trip. Also
  a miss under a directory one member announced (one candidate: one round trip, by design).
- ``put``: the same two gateways, 4 KiB PUTs into a directory already announced, alternated.
  Target: PUT p99 with peers <= 1.1x without. Also the first PUT of a new directory (it is
  announced to the 64 holders first).

Run: ``python loadtest/fleet_bench.py [--legs marker,crossread,miss,put] [--replicas N]
[--json FILE]`` (``--replicas``: the marker leg's gateways with replicas on).
The gateways are real processes (tests/harness.py's GatewayProcess); the bucket is moto's
ThreadedMotoServer, or the emulator for ``marker``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "loadtest"))

from emulator import EmulatorThread  # noqa: E402
from fake_peers import FakePeers  # noqa: E402
from fleetutil import fleet_of, until, wait_joined  # noqa: E402
from harness import (  # noqa: E402
    GatewayProcess,
    free_port,
    payload,
    quoted_md5,
    sign_request,
    start_moto,
    upstream_client,
)

from gateway.clock import SystemClock  # noqa: E402
from gateway.fleet.client import PeerClient  # noqa: E402
from gateway.fleet.wire import LeaseRequest, NodeInfo  # noqa: E402

SECRET = "bench-fleet-secret"
MiB = 1 << 20


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p99": pct(values, 99),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def say(text: str) -> None:
    print(text, flush=True)


# ------------------------------------------------------------------------------ marker


def leg_marker(base: Path, checkpoints: int, replicas: int = 0) -> dict[str, Any]:
    bucket = "fleet-bench"
    extra = ("--replicas", str(replicas)) if replicas else ()
    with EmulatorThread(latency_ms=5, buckets=[bucket]) as emu:
        gateways = fleet_of(base / "marker", emu.url, ("g0", "g1", "g2", "g3"), extra)
        for gw in gateways:
            gw.start()
        try:
            wait_joined(gateways, ("g0", "g1", "g2", "g3"))
            clients = [gw.client() for gw in gateways for _ in range(4)]  # 16 ranks
            shard = payload(256 * 1024, "shard")
            delays = []
            for step in range(checkpoints):
                prefix = f"ckpt/step_{step:04d}/"

                def rank(r: int, prefix: str = prefix) -> None:
                    clients[r].put_object(Bucket=bucket, Key=f"{prefix}__{r}_0.distcp", Body=shard)

                threads = [threading.Thread(target=rank, args=(r,)) for r in range(16)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()  # the job's barrier
                clients[0].put_object(Bucket=bucket, Key=prefix + ".metadata", Body=b"meta")
            gateways[0].drained(bucket=bucket, timeout=300)
            log = emu.log
        finally:
            for gw in gateways:
                gw.stop()
    created: dict[str, float] = {}
    for entry in log:
        if entry["op"] in ("PutObject", "CompleteMultipartUpload") and entry["status"] == 200:
            created[entry["key"]] = entry["ts_end"]
    for step in range(checkpoints):
        prefix = f"ckpt/step_{step:04d}/"
        shards = [created[f"{prefix}__{r}_0.distcp"] for r in range(16)]
        marker = created[prefix + ".metadata"]
        assert marker >= max(shards), f"{prefix}: marker before its shards"
        delays.append(marker - max(shards))
    stats = summary(delays)
    say(
        f"marker after the fleet's last shard: p50 {stats['p50'] * 1000:.0f} ms, "
        f"p99 {stats['p99'] * 1000:.0f} ms, max {stats['max'] * 1000:.0f} ms over "
        f"{checkpoints} checkpoints (16 ranks, 4 gateways, --replicas {replicas}): "
        "target p99 <= 1 s: "
        f"{'met' if stats['p99'] <= 1.0 else 'NOT met'}"
    )
    return {"delay_s": stats, "met": stats["p99"] <= 1.0}


# ------------------------------------------------------------------------------ cross-node read


def _timed_get(gw: GatewayProcess, bucket: str, key: str, size: int) -> float:
    """Seconds to read the whole object through ``gw`` (raw HTTP, signed, 1 MiB reads)."""
    url = f"{gw.endpoint}/{bucket}/{urllib.parse.quote(key)}"
    signed = sign_request("GET", url, content_sha256="UNSIGNED-PAYLOAD")
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    started = time.perf_counter()
    conn.request("GET", parts.path, headers=signed.headers)
    resp = conn.getresponse()
    got = 0
    while chunk := resp.read(MiB):
        got += len(chunk)
    took = time.perf_counter() - started
    conn.close()
    assert resp.status == 200 and got == size, (resp.status, got)
    return took


def leg_crossread(base: Path, moto_url: str, rounds: int) -> dict[str, Any]:
    up = upstream_client(moto_url)
    bucket = "fleet-read"
    up.create_bucket(Bucket=bucket)
    a, b = fleet_of(base / "read", moto_url, ("a", "b"))
    a.start()
    b.start()
    try:
        wait_joined([a, b], ("a", "b"))
        size = 64 * MiB
        data = payload(size, "cross")
        b.pause_flush()
        b.client().put_object(Bucket=bucket, Key="big/obj", Body=data)
        assert a.client().head_object(Bucket=bucket, Key="big/obj")["ETag"] == quoted_md5(data)
        local, cross = [], []
        for i in range(rounds):
            order = ((b, local), (a, cross)) if i % 2 == 0 else ((a, cross), (b, local))
            for gw, into in order:
                into.append(size / _timed_get(gw, bucket, "big/obj", size) / MiB)
        b.resume_flush()
    finally:
        a.stop()
        b.stop()
    ratio = statistics.median(cross) / statistics.median(local)
    say(
        f"64 MiB GET: local {statistics.median(local):.0f} MiB/s, cross-node "
        f"{statistics.median(cross):.0f} MiB/s (medians of {rounds}): ratio {ratio:.2f}, "
        f"target >= 0.5: {'met' if ratio >= 0.5 else 'NOT met'}"
    )
    return {"local_mib_s": local, "cross_mib_s": cross, "ratio": ratio, "met": ratio >= 0.5}


# ------------------------------------------------------------------------------ 64 members


def _with_members(base: Path, upstream_url: str, members: int) -> tuple[Any, Any, FakePeers]:
    """A gateway alone and one with ``members`` simulated members holding its lease."""
    ports = [free_port() for _ in range(members)]
    alone = GatewayProcess(base / "alone", upstream_url)
    port = free_port()
    peers = ",".join([f"127.0.0.1:{port}", *(f"127.0.0.1:{p}" for p in ports)])
    fleet = GatewayProcess(
        base / "fleet",
        upstream_url,
        port=port,
        extra_args=["--node-id", "g", "--peers", peers, "--peer-secret", SECRET],
    )
    fakes = FakePeers(members, ports, SECRET.encode()).start(f"127.0.0.1:{port}")
    alone.start()
    fleet.start(timeout=60)
    until(lambda: len(fleet.admin_get("/admin/v1/fleet")["members"]) == members, 60)
    return alone, fleet, fakes


def _time(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _rtt(members: FakePeers, n: int) -> list[float]:
    """Round trips to one simulated member: a signed lease request, as the gateway sends."""
    import asyncio

    async def run() -> list[float]:
        client = PeerClient("bench", SECRET.encode(), SystemClock())
        me = NodeInfo("bench", "x", 0.0)
        out = []
        try:
            for _ in range(n):
                started = time.perf_counter()
                await client.lease(members.addresses[0], LeaseRequest(me, 1, 0, None), 5.0)
                out.append(time.perf_counter() - started)
        finally:
            await client.close()
        return out

    return asyncio.run(run())[10:]


def leg_miss_and_put(base: Path, members: int, n: int) -> dict[str, Any]:
    # The emulator answers at once (no added latency): a miss is then mostly the gateway's
    # own work, and what the fleet adds to it is not lost in moto's noise.
    bucket = "fleet-miss"
    with EmulatorThread(latency_ms=0, buckets=[bucket]) as emu:
        return _miss_and_put(base, emu.url, bucket, members, n)


def _miss_and_put(base: Path, url: str, bucket: str, members: int, n: int) -> dict[str, Any]:
    up = upstream_client(url)
    for i in range(2 * n + 40):
        up.put_object(Bucket=bucket, Key=f"data/{i:05d}", Body=b"x" * 1024)
    alone, fleet, fakes = _with_members(base, url, members)
    try:
        sa, sf = alone.client(), fleet.client()
        misses: dict[str, list[float]] = {"alone": [], "fleet": []}
        for i in range(n + 20):  # each key read once through each: a local miss every time
            for name, s3, key in (
                ("alone", sa, f"data/{2 * i:05d}"),
                ("fleet", sf, f"data/{2 * i + 1:05d}"),
            ):
                misses[name].append(
                    _time(
                        lambda s3=s3, key=key: s3.get_object(Bucket=bucket, Key=key)["Body"].read()
                    )
                )
        misses = {k: v[20:] for k, v in misses.items()}
        fakes.announce(f"127.0.0.1:{fleet.port}", bucket, "held/")
        up.put_object(Bucket=bucket, Key="held/k", Body=b"x")
        candidate = [
            _time(lambda: sf.head_object(Bucket=bucket, Key="held/k")) for _ in range(n // 4)
        ]
        rtt = _rtt(fakes, n)
        body = b"y" * 4096
        puts: dict[str, list[float]] = {"alone": [], "fleet": []}
        sa.put_object(Bucket=bucket, Key="ckpt/w/first", Body=body)
        first_dir = [_time(lambda: sf.put_object(Bucket=bucket, Key="ckpt/w/first", Body=body))]
        for j in range(5):
            first_dir.append(
                _time(lambda j=j: sf.put_object(Bucket=bucket, Key=f"ckpt/new{j}/k", Body=body))
            )
        alone.pause_flush()  # the acks are measured, not the flush (it would compete)
        fleet.pause_flush()
        for i in range(n + 20):
            for name, s3 in (("alone", sa), ("fleet", sf)):
                puts[name].append(
                    _time(
                        lambda s3=s3, i=i: s3.put_object(
                            Bucket=bucket, Key=f"ckpt/w/{i}", Body=body
                        )
                    )
                )
        puts = {k: v[20:] for k, v in puts.items()}
    finally:
        fakes.stop()
        alone.stop()
        fleet.stop()
    miss_a, miss_f, trip = summary(misses["alone"]), summary(misses["fleet"]), summary(rtt)
    added = miss_f["p99"] - miss_a["p99"]
    put_ratio = summary(puts["fleet"])["p99"] / summary(puts["alone"])["p99"]
    say(
        f"local miss, {members} members: p99 {miss_f['p99'] * 1000:.2f} ms vs alone "
        f"{miss_a['p99'] * 1000:.2f} ms: added {added * 1000:+.2f} ms; one round trip to one "
        f"member p50 {trip['p50'] * 1000:.2f} ms p99 {trip['p99'] * 1000:.2f} ms: target added "
        f"<= 1 round trip: {'met' if added <= trip['p99'] else 'NOT met'}"
    )
    cand = summary(candidate)
    say(
        f"miss under a directory one member announced (asks it once): p50 "
        f"{cand['p50'] * 1000:.2f} ms p99 {cand['p99'] * 1000:.2f} ms"
    )
    say(
        f"PUT 4 KiB p99 with {members} members {summary(puts['fleet'])['p99'] * 1000:.2f} ms vs "
        f"alone {summary(puts['alone'])['p99'] * 1000:.2f} ms: {put_ratio:.2f}x, target <= 1.1x: "
        f"{'met' if put_ratio <= 1.1 else 'NOT met'}; first PUT of a new directory (announced "
        f"to {members} holders): {statistics.median(first_dir) * 1000:.1f} ms median"
    )
    return {
        "miss_alone_s": miss_a,
        "miss_fleet_s": miss_f,
        "round_trip_s": trip,
        "miss_added_p99_s": added,
        "miss_met": added <= trip["p99"],
        "miss_with_candidate_s": cand,
        "put_alone_s": summary(puts["alone"]),
        "put_fleet_s": summary(puts["fleet"]),
        "put_p99_ratio": put_ratio,
        "put_met": put_ratio <= 1.1,
        "first_put_of_a_directory_s": first_dir,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--legs", default="marker,crossread,miss,put")
    parser.add_argument("--checkpoints", type=int, default=30)
    parser.add_argument("--replicas", type=int, default=0, help="marker: --replicas N")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--members", type=int, default=64)
    parser.add_argument("-n", type=int, default=400, help="requests per gateway (miss, put)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    legs = set(args.legs.split(","))
    report: dict[str, Any] = {}
    server, moto_url = start_moto()
    try:
        with TemporaryDirectory(prefix="fleet-bench-") as tmp:
            base = Path(tmp)
            if "marker" in legs:
                report["marker"] = leg_marker(base, args.checkpoints, args.replicas)
            if "crossread" in legs:
                report["crossread"] = leg_crossread(base, moto_url, args.rounds)
            if legs & {"miss", "put"}:
                report["miss_put"] = leg_miss_and_put(base, args.members, args.n)
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
