"""Replicas before the ack and takeover, measured (issue 21): ratios against the same
gateways without replicas in the same run, and the count of acknowledged objects lost over
many random kill-and-wipe points.

Legs (``--legs``, all by default):

- ``ack``: PUT ack latency of 4 KiB, 64 KiB and 1 MiB through a 3-gateway fleet with
  ``--replicas 1`` and through one without replicas, alternated. Target: p99 <= 2.0x.
- ``ingest``: 16 parallel streams of 8 MiB PUTs, MiB/s with and without replicas (both
  copies share this machine's disk and two cores). Target: >= 0.45.
- ``takeover``: objects written through a gateway that is then killed and its disk wiped;
  seconds until the last is in the bucket, against ``--peer-timeout`` plus twice the time
  the same objects take to drain from a live gateway (measured first). Target: within.
- ``rereplicate``: nothing drains; a holder of a gateway's versions is lost (wiped and back
  at once; then, in a second fleet, silent past ``--peer-timeout``): seconds until every
  version is on a live holder again; then the writer is wiped too, and every object must
  be in the bucket with its ETag (target: 0 lost).
- ``killwipe``: ``--points`` times, a burst through all three gateways and, at a random
  moment, one of them killed (``kill -9``) and its disk wiped; then every acknowledged
  object must be in the bucket with its ETag. Prints how many were lost (target: 0).

Run: ``python loadtest/replica_bench.py [--legs ...] [--points 50] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from emulator import EmulatorThread, parse_size  # noqa: E402
from fleetutil import fleet_of, until, wait_joined  # noqa: E402
from harness import GatewayProcess, payload, start_moto, upstream_client  # noqa: E402

PEER_TIMEOUT_S = 4.5
REPLICAS = ("--replicas", "1", "--peer-timeout", str(PEER_TIMEOUT_S))
CONTROL = ".gateway/"
KiB, MiB = 1 << 10, 1 << 20


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def say(text: str) -> None:
    print(text, flush=True)


def data_objects(upstream: Any, bucket: str) -> dict[str, str]:
    out = {}
    for page in upstream.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            if not obj["Key"].startswith(CONTROL):
                out[obj["Key"]] = obj["ETag"]
    return out


def start(gateways: Sequence[GatewayProcess], names: Sequence[str]) -> None:
    for gw in gateways:
        gw.start(timeout=60)
    if len(gateways) > 1:
        wait_joined(gateways, names)


# ------------------------------------------------------------------------------ ack latency


def leg_ack(base: Path, url: str, n: int) -> dict[str, Any]:
    up = upstream_client(url)
    bucket = "rep-ack"
    up.create_bucket(Bucket=bucket)
    alone = GatewayProcess(base / "ack-alone", url)
    fleet = fleet_of(base / "ack", url, ("a", "b", "c"), REPLICAS)
    start([alone], ["alone"])
    start(fleet, ("a", "b", "c"))
    out: dict[str, Any] = {}
    try:
        alone.pause_flush()
        for gw in fleet:
            gw.pause_flush()
        clients = {"local": alone.client(), "replicas": fleet[0].client()}
        for size in (4 * KiB, 64 * KiB, MiB):
            body = payload(size, size)
            times: dict[str, list[float]] = {"local": [], "replicas": []}
            for i in range(n + 10):
                for name, s3 in clients.items():
                    started = time.perf_counter()
                    s3.put_object(Bucket=bucket, Key=f"ack/{size}/{i}", Body=body)
                    times[name].append(time.perf_counter() - started)
            local, rep = times["local"][10:], times["replicas"][10:]
            ratio = pct(rep, 99) / pct(local, 99)
            out[str(size)] = {
                "local_p50_ms": pct(local, 50) * 1000,
                "local_p99_ms": pct(local, 99) * 1000,
                "replicas_p50_ms": pct(rep, 50) * 1000,
                "replicas_p99_ms": pct(rep, 99) * 1000,
                "p99_ratio": ratio,
            }
            say(
                f"ack {size // KiB} KiB: p99 {pct(rep, 99) * 1000:.2f} ms with 1 replica vs "
                f"{pct(local, 99) * 1000:.2f} ms local-only ({ratio:.2f}x; p50 "
                f"{pct(rep, 50) * 1000:.2f} vs {pct(local, 50) * 1000:.2f} ms): target <= 2.0x: "
                f"{'met' if ratio <= 2.0 else 'NOT met'}"
            )
    finally:
        alone.stop()
        for gw in fleet:
            gw.stop()
    return out


# ------------------------------------------------------------------------------ ingest


def _ingest(gw: GatewayProcess, bucket: str, tag: str, streams: int, per_stream: int) -> float:
    body = payload(8 * MiB, tag)
    done = threading.Barrier(streams + 1)

    def stream(s: int) -> None:
        s3 = gw.client()
        done.wait()
        for i in range(per_stream):
            s3.put_object(Bucket=bucket, Key=f"in/{tag}/{s}/{i}", Body=body)

    threads = [threading.Thread(target=stream, args=(s,)) for s in range(streams)]
    for t in threads:
        t.start()
    done.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return streams * per_stream * 8 / (time.perf_counter() - started)


def leg_ingest(base: Path, url: str, rounds: int) -> dict[str, Any]:
    up = upstream_client(url)
    bucket = "rep-ingest"
    up.create_bucket(Bucket=bucket)
    alone = GatewayProcess(base / "in-alone", url)
    fleet = fleet_of(base / "in", url, ("a", "b", "c"), REPLICAS)
    start([alone], ["alone"])
    start(fleet, ("a", "b", "c"))
    local, rep = [], []
    try:
        alone.pause_flush()
        for gw in fleet:
            gw.pause_flush()
        for r in range(rounds):
            local.append(_ingest(alone, bucket, f"l{r}", 16, 2))
            rep.append(_ingest(fleet[0], bucket, f"r{r}", 16, 2))
    finally:
        alone.stop()
        for gw in fleet:
            gw.stop()
    ratio = statistics.median(rep) / statistics.median(local)
    say(
        f"16-stream ingest: {statistics.median(rep):.0f} MiB/s with 1 replica vs "
        f"{statistics.median(local):.0f} MiB/s local-only (medians of {rounds}): {ratio:.2f}, "
        f"target >= 0.45: {'met' if ratio >= 0.45 else 'NOT met'}"
    )
    return {"local_mib_s": local, "replicas_mib_s": rep, "ratio": ratio}


# ------------------------------------------------------------------------------ takeover


def leg_takeover(base: Path, url: str, objects: int, size: int) -> dict[str, Any]:
    up = upstream_client(url)
    bucket = "rep-take"
    up.create_bucket(Bucket=bucket)
    fleet = fleet_of(base / "take", url, ("a", "b", "c"), REPLICAS)
    start(fleet, ("a", "b", "c"))
    a, b, _ = fleet
    try:
        # The transfer time of these objects from a live gateway, first.
        a.pause_flush()
        for i in range(objects):
            a.client().put_object(Bucket=bucket, Key=f"live/{i}", Body=payload(size, i))
        started = time.monotonic()
        a.resume_flush()
        a.drained(bucket=bucket, prefix="live/", timeout=300)
        transfer_s = time.monotonic() - started
        b.pause_flush()
        for i in range(objects):
            b.client().put_object(Bucket=bucket, Key=f"lost/{i}", Body=payload(size, -i))
        b.kill()
        lost_at = time.monotonic()
        shutil.rmtree(b.data_dir)
        until(
            lambda: sum(1 for k in data_objects(up, bucket) if k.startswith("lost/")) == objects,
            300,
        )
        took_s = time.monotonic() - lost_at
    finally:
        for gw in fleet:
            gw.stop()
    bound = PEER_TIMEOUT_S + 2 * transfer_s
    say(
        f"takeover of {objects} x {size // KiB} KiB: all in the bucket {took_s:.1f} s after "
        f"the loss; bound --peer-timeout {PEER_TIMEOUT_S} + 2 x transfer {transfer_s:.1f} s = "
        f"{bound:.1f} s: {'met' if took_s <= bound else 'NOT met'}"
    )
    return {"took_s": took_s, "transfer_s": transfer_s, "bound_s": bound}


# ------------------------------------------------------------------------------ re-replication


def held_for(gws: Sequence[GatewayProcess], writer: str) -> set[str]:
    """Keys the gateways ``gws`` hold replicas of for ``writer`` (their journals, read-only)."""
    out: set[str] = set()
    for gw in gws:
        conn = sqlite3.connect(f"file:{gw.data_dir / 'journal.db'}?mode=ro", uri=True)
        try:
            out |= {
                str(k)
                for (k,) in conn.execute("SELECT key FROM replicas WHERE owner = ?", (writer,))
            }
        finally:
            conn.close()
    return out


def leg_rereplicate(base: Path, url: str, objects: int, *, wipe: bool) -> dict[str, Any]:
    """A holder of a's versions lost (wiped and back at once, or silent), nothing drained
    meanwhile: seconds until every version of a's is on a live holder again; then a lost
    with its disk as well, and every object must land from the new copies."""
    up = upstream_client(url)
    how = "wiped" if wipe else "silent"
    bucket = f"rep-remake-{how}"
    up.create_bucket(Bucket=bucket)
    names = ("a", "b", "c")
    fleet = fleet_of(base / f"remake-{how}", url, names, REPLICAS)
    start(fleet, names)
    a = fleet[0]
    rng = random.Random(7)
    want: dict[str, str] = {}
    try:
        for gw in fleet:
            gw.pause_flush()
        started = time.monotonic()
        s3 = a.client()
        for i in range(objects):
            key = f"rr/{i}"
            body = payload(rng.choice((1000, 20_000, 300_000)), key)
            want[key] = s3.put_object(Bucket=bucket, Key=key, Body=body)["ETag"]
        write_s = time.monotonic() - started
        holder = max(fleet[1:], key=lambda gw: len(held_for([gw], "a")))
        others = [gw for gw in fleet[1:] if gw is not holder]
        on_holder = len(held_for([holder], "a"))
        holder.kill()
        lost_at = time.monotonic()
        if wipe:
            shutil.rmtree(holder.data_dir)
            holder.start(timeout=60)
            live = fleet[1:]
        else:
            live = others
        until(lambda: held_for(live, "a") >= set(want), 300)
        remake_s = time.monotonic() - lost_at
        a.kill()
        shutil.rmtree(a.data_dir)
        for gw in live:
            gw.resume_flush()

        def arrived() -> bool:
            there = data_objects(up, bucket)
            return all(there.get(k) == e for k, e in want.items())

        writer_lost_at = time.monotonic()
        try:
            until(arrived, 900)
            lost = 0
        except AssertionError:
            there = data_objects(up, bucket)
            lost = sum(there.get(k) != e for k, e in want.items())
        takeover_s = time.monotonic() - writer_lost_at
    finally:
        for gw in fleet:
            gw.stop()
    wait = "" if wipe else f" (--peer-timeout {PEER_TIMEOUT_S} s of it)"
    say(
        f"re-replication, holder {how}: {on_holder} of {objects} versions on it, all on live "
        f"holders again {remake_s:.1f} s after its loss{wait} (writing them took "
        f"{write_s:.1f} s); then the writer wiped too: {lost} lost (target 0: "
        f"{'met' if lost == 0 else 'NOT met'}), all in the bucket {takeover_s:.1f} s later"
    )
    return {
        "on_holder": on_holder,
        "objects": objects,
        "remake_s": remake_s,
        "write_s": write_s,
        "lost": lost,
        "takeover_s": takeover_s,
    }


# ------------------------------------------------------------------------------ kill and wipe


def write_until(
    gw: GatewayProcess,
    bucket: str,
    prefix: str,
    stop: threading.Event,
    acked: dict[str, str],
    rng: random.Random,
) -> None:
    """PUT mixed sizes under `prefix` until `stop`; record each acknowledged key's ETag."""
    s3 = gw.client()
    i = 0
    while not stop.is_set():
        key = f"{prefix}/{i}"
        body = payload(rng.choice((1000, 20_000, 300_000)), key)
        try:
            etag = s3.put_object(Bucket=bucket, Key=key, Body=body)["ETag"]
        except Exception:  # the node died under it: not acknowledged
            return
        acked[key] = etag  # one writer per key; dict assignment is atomic
        i += 1


def leg_killwipe(base: Path, url: str, points: int, seed: int) -> dict[str, Any]:
    up = upstream_client(url)
    bucket = "rep-kill"
    up.create_bucket(Bucket=bucket)
    rng = random.Random(seed)
    names = ("a", "b", "c")
    fleet = fleet_of(base / "kill", url, names, REPLICAS)
    start(fleet, names)
    acked: dict[str, str] = {}  # key -> ETag the client was told
    lost_total = 0
    try:
        for point in range(points):
            victim = rng.randrange(3)
            stop = threading.Event()
            threads = [
                threading.Thread(
                    target=write_until,
                    args=(gw, bucket, f"p{point}/{n}", stop, acked, random.Random(rng.random())),
                )
                for gw, n in zip(fleet, names, strict=True)
            ]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.2, 1.5))
            fleet[victim].kill()
            shutil.rmtree(fleet[victim].data_dir)
            time.sleep(0.3)
            stop.set()
            for t in threads:
                t.join()
            want = {k: e for k, e in acked.items() if k.startswith(f"p{point}/")}

            def arrived(want: dict[str, str] = want) -> bool:
                there = data_objects(up, bucket)
                return all(there.get(k) == e for k, e in want.items())

            try:
                until(arrived, 120)
                outcome = "all in the bucket"
            except AssertionError:
                there = data_objects(up, bucket)
                lost = [k for k, e in want.items() if there.get(k) != e]
                lost_total += len(lost)
                outcome = f"LOST {len(lost)}: {lost[:5]}"
            fleet[victim].start(timeout=60)  # back with an empty disk
            wait_joined(fleet, names)
            say(f"point {point}: {len(want)} acknowledged, victim {names[victim]}, {outcome}")
    finally:
        for gw in fleet:
            gw.stop()
    say(
        f"kill-and-wipe: {points} points, {len(acked)} acknowledged objects, {lost_total} lost "
        f"(target 0: {'met' if lost_total == 0 else 'NOT met'})"
    )
    return {"points": points, "acknowledged": len(acked), "lost": lost_total}


def start_upstream(args: argparse.Namespace) -> tuple[Any, str]:
    """(server with ``stop()``, url): moto, or the throttling emulator (every prefix one
    partition when ``--prefix-rate`` is set)."""
    if args.upstream == "moto":
        return start_moto()
    emu = EmulatorThread(latency_ms=args.latency_ms, prefix_rate=args.prefix_rate).start()
    say(f"upstream: emulator, {args.latency_ms:g} ms, prefix limit {args.prefix_rate:g}/s")
    return emu, emu.url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--legs", default="ack,ingest,takeover,rereplicate,killwipe")
    parser.add_argument("--objects", type=int, default=400, help="versions (rereplicate)")
    parser.add_argument("-n", type=int, default=300, help="PUTs per size and gateway (ack)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--upstream",
        choices=("moto", "emulator"),
        default="moto",
        help="moto, or the throttling emulator (indexed LISTs, latency, a prefix limit)",
    )
    parser.add_argument("--latency-ms", type=float, default=20.0, help="emulator only")
    parser.add_argument("--prefix-rate", type=float, default=0.0, help="emulator only; 0: none")
    parser.add_argument("--take-objects", type=int, default=20, help="versions (takeover)")
    parser.add_argument(
        "--take-size", type=lambda t: int(parse_size(t)), default=2 * MiB, help="(takeover)"
    )
    args = parser.parse_args(argv)
    legs = set(args.legs.split(","))
    report: dict[str, Any] = {}
    server, url = start_upstream(args)
    try:
        with TemporaryDirectory(prefix="replica-bench-") as tmp:
            base = Path(tmp)
            if "ack" in legs:
                report["ack"] = leg_ack(base, url, args.n)
            if "ingest" in legs:
                report["ingest"] = leg_ingest(base, url, args.rounds)
            if "takeover" in legs:
                report["takeover"] = leg_takeover(base, url, args.take_objects, args.take_size)
            if "rereplicate" in legs:
                report["rereplicate"] = {
                    how: leg_rereplicate(base, url, args.objects, wipe=how == "wiped")
                    for how in ("wiped", "silent")
                }
            if "killwipe" in legs:
                report["killwipe"] = leg_killwipe(base, url, args.points, args.seed)
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
