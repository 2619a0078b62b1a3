"""Per-request cost against the backlog: the same gateway with 0, 10k, 100k and 1M objects
pending, behind a slow upstream, one lane or many lanes, in one run.

For each backlog level (cumulative, same data dir):

1. **Seed** (gateway stopped): pending rows are added through the store layer itself
   (``Journal.upsert`` in large transactions, each with a 256-byte inline body), as a
   gateway would have committed them. Building a million rows through HTTP would take
   most of an hour on this machine; what is measured below goes through HTTP.
2. **Start** ``gateway serve`` on that data dir, upstream = the throttling emulator
   (``emulator.py``, a separate process, 100 ms per request, bodies discarded), and time
   the start (the figures and the flush order are loaded from the journal).
3. **Measure over HTTP while the upstream stalls** (every request takes 20 s: the
   flusher's uploads hang, its lanes are full and the backlog waits, as behind a throttled
   bucket; each PUT used to rescan that backlog): the gateway's CPU with no requests (it
   must sleep: issue 13, item 4), then serial, one connection each: PutObject 4 KiB
   (p50/p99), GetObject of those objects, ``GET /admin/v1/status``, with RSS and CPU.
4. **Claim rate**: the upstream answers again (100 ms per request); objects flushed per
   second with no client load. The upstream's latency bounds it; the backlog must not.
5. **503s**: the upstream refuses nearly everything (SlowDown): the gateway's CPU and the
   requests/s its rate control still sends (its CPU follows them).

Every level is compared with level 0 of the same run (ratios). Layouts: ``one`` lane
(``bulk/obj-N``) and ``many`` lanes (``ckpt/step_1/rank_R/obj-N``, 1000 ranks, lane depth 3).

Run: ``flock /tmp/bench.lock .venv/bin/python loadtest/scale.py`` (default levels
0,10000,100000,1000000; both layouts; ~25 min on 2 cores, most of it seeding).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import http.client
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from awscrt import checksums as crt_checksums

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench import http as http_json  # noqa: E402
from bench import start_emulator, start_gateway  # noqa: E402
from ingest import Client, rss_kib  # noqa: E402

from gateway.models import ObjectMeta  # noqa: E402
from gateway.store.journal import Journal  # noqa: E402

BUCKET = "bench"
SEED_BODY = b"s" * 256
SEED_MD5 = hashlib.md5(SEED_BODY).hexdigest()
SEED_CRC = crt_checksums.crc32c(SEED_BODY)
SEED_BATCH = 20_000


def seed_key(layout: str, i: int, lanes: int) -> str:
    if layout == "one":
        return f"bulk/obj-{i:08d}"
    return f"ckpt/step_1/rank_{i % lanes:04d}/obj-{i:08d}"


async def seed(data_dir: Path, layout: str, start: int, stop: int, lanes: int) -> float:
    """Add pending rows ``start``..``stop`` through the store layer; seconds taken."""
    journal = Journal(data_dir / "journal.db", fsync=False)
    t0 = time.perf_counter()
    await asyncio.to_thread(journal.open)
    try:
        now = time.time() - 60  # past the write-back delay
        for first in range(start, stop, SEED_BATCH):
            keys = [seed_key(layout, i, lanes) for i in range(first, min(stop, first + SEED_BATCH))]

            def op(conn: sqlite3.Connection, keys: list[str] = keys) -> None:
                for key in keys:
                    meta = ObjectMeta(BUCKET, key, len(SEED_BODY), SEED_MD5, now)
                    journal.upsert(
                        conn, meta, None, (), False, now, crc32c=SEED_CRC, body=SEED_BODY
                    )

            await journal.run_write(op)
    finally:
        await asyncio.to_thread(journal.close)
    return time.perf_counter() - t0


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def timed(fn: Any, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def status_of(admin: str) -> dict[str, Any]:
    code, doc = http_json(admin + "/admin/v1/status", timeout=60)
    if code != 200 or not isinstance(doc, dict):
        raise RuntimeError(f"status answered {code}")
    return doc


def post_json(url: str, doc: dict[str, Any]) -> int:
    req = urllib.request.Request(
        url,
        method="POST",
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(resp.status)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(gw_url: str, admin: str, pid: int, level: int, n: int) -> dict[str, Any]:
    client = Client(gw_url)
    body = os.urandom(4096)
    tag = f"probe-{level}"

    def put(i: int) -> None:
        status, _, _ = client.request("PUT", f"/{BUCKET}/{tag}/{i}", body)
        if status != 200:
            raise RuntimeError(f"PUT answered {status}")

    def get(i: int) -> None:
        status, _, payload = client.request("GET", f"/{BUCKET}/{tag}/{i}")
        if status != 200 or payload != body:
            raise RuntimeError(f"GET answered {status}")

    parts = urllib.parse.urlsplit(admin)
    admin_conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)

    def status(_: int) -> None:
        admin_conn.request("GET", "/admin/v1/status")
        resp = admin_conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"status answered {resp.status}")

    before = status_of(admin)
    cpu0, t0 = cpu_s(pid), time.perf_counter()
    puts = timed(put, n)
    gets = timed(get, n)
    statuses = timed(status, max(20, n // 5))
    elapsed = time.perf_counter() - t0
    cpu1 = cpu_s(pid)
    after = status_of(admin)
    flushed = after["flushed_objects"] - before["flushed_objects"]
    rss, hwm = rss_kib(pid)
    return {
        "level": level,
        "pending_at_start": before["pending_objects"],
        "put_p50_ms": statistics.median(puts),
        "put_p99_ms": pct(puts, 0.99),
        "get_p50_ms": statistics.median(gets),
        "get_p99_ms": pct(gets, 0.99),
        "status_p50_ms": statistics.median(statuses),
        "status_p99_ms": pct(statuses, 0.99),
        "flushed_while_measuring": flushed,
        "cpu_pct": 100 * (cpu1 - cpu0) / elapsed,
        "rss_mib": rss / 1024,
        "peak_rss_mib": hwm / 1024,
        "lanes": len(after["lanes"]),
    }


def idle_cpu(pid: int, window_s: float) -> float:
    """The gateway's CPU (% of a core) over a window without client requests."""
    cpu0, t0 = cpu_s(pid), time.perf_counter()
    time.sleep(window_s)
    return 100 * (cpu_s(pid) - cpu0) / (time.perf_counter() - t0)


def claim_rate(emu_url: str, admin: str, window_s: float, latency_ms: float) -> float:
    """Objects flushed per second once the upstream answers again (after ``latency_ms``),
    with no client load: bounded by the upstream's latency, never by the backlog."""
    if post_json(emu_url + "/_emulator/config", {"latency_ms": latency_ms}) != 200:
        raise RuntimeError("emulator config refused")
    deadline = time.monotonic() + 60  # the requests that hung finish first
    first = status_of(admin)["flushed_objects"]
    while status_of(admin)["flushed_objects"] < first + 20 and time.monotonic() < deadline:
        time.sleep(0.5)
    flushed0, t0 = status_of(admin)["flushed_objects"], time.perf_counter()
    time.sleep(window_s)
    return (status_of(admin)["flushed_objects"] - flushed0) / (time.perf_counter() - t0)


def throttled_cpu(emu_url: str, admin: str, pid: int, window_s: float) -> dict[str, float]:
    """The upstream refuses nearly everything (503 SlowDown): the gateway's CPU and how many
    requests per second its rate control still sends (the CPU follows them)."""
    config = {"prefix_rate": 0.05, "prefix_burst": 1, "latency_ms": 100}
    if post_json(emu_url + "/_emulator/config", config) != 200:
        raise RuntimeError("emulator config refused")
    time.sleep(window_s)  # the lanes take their 503s and back off
    flushed0 = status_of(admin)["flushed_objects"]
    requests0 = _upstream_requests(emu_url)
    cpu0, t0 = cpu_s(pid), time.perf_counter()
    time.sleep(window_s)
    elapsed = time.perf_counter() - t0
    cpu = 100 * (cpu_s(pid) - cpu0) / elapsed
    flushed = status_of(admin)["flushed_objects"] - flushed0
    requests = _upstream_requests(emu_url) - requests0
    return {
        "throttled_cpu_pct": cpu,
        "throttled_flushed_per_s": flushed / elapsed,
        "throttled_requests_per_s": requests / elapsed,
    }


def _upstream_requests(emu_url: str) -> int:
    code, stats = http_json(emu_url + "/_emulator/stats", timeout=10)
    if code != 200 or not isinstance(stats, dict):
        raise RuntimeError(f"emulator stats answered {code}")
    return int(stats["requests"])


def run_layout(args: argparse.Namespace, layout: str, work: Path) -> list[dict[str, Any]]:
    data = work / f"{layout}-data"
    data.mkdir(parents=True)
    results = []
    seeded = 0
    for level in args.levels:
        seed_s = (
            asyncio.run(seed(data, layout, seeded, level, args.lanes)) if level > seeded else 0.0
        )
        seeded = max(seeded, level)
        # The upstream stalls while requests are measured: the flusher's uploads hang, its
        # lanes are full, and the backlog waits, as behind a throttled bucket. Every PUT
        # would have rescanned that backlog before; now it must cost the same at any size.
        emu, emu_url = start_emulator(work, f"{layout}-{level}-emulator", latency_ms=20_000)
        extra = [
            "--data-dir", str(data),
            "--flush-concurrency", str(args.flush_concurrency),
            "--write-back-delay", "0",
            "--lane-concurrency", "8",
        ]  # fmt: skip
        t0 = time.perf_counter()
        gw, gw_url, admin = start_gateway(work, f"{layout}-{level}", emu_url, extra)
        start_s = time.perf_counter() - t0
        try:
            pid = gw.popen.pid
            time.sleep(1.0)  # the first uploads leave and hang
            stalled = idle_cpu(pid, args.quiet_s)
            measure(gw_url, admin, pid, level, 30)  # warm up
            row = measure(gw_url, admin, pid, level, args.requests)
            row.update(layout=layout, seed_s=seed_s, start_s=start_s, stalled_cpu_pct=stalled)
            row["claims_per_s"] = claim_rate(emu_url, admin, args.quiet_s, args.latency_ms)
            row.update(throttled_cpu(emu_url, admin, pid, args.quiet_s))
            results.append(row)
            print(json.dumps(row), flush=True)
        finally:
            gw.stop()
            emu.stop()
    return results


def render(rows: list[dict[str, Any]]) -> str:
    out = []
    for layout in sorted({r["layout"] for r in rows}):
        mine = [r for r in rows if r["layout"] == layout]
        base = mine[0]
        out.append(f"\nlayout: {layout} (ratios against level {base['level']} of this run)")
        out.append(
            f"{'pending':>9} | {'PUT p50':>8} {'p99':>7} {'x':>5} | {'GET p50':>8} {'p99':>7} "
            f"{'x':>5} | {'status p50':>10} {'p99':>7} {'x':>5} | {'claims/s':>8} | "
            f"{'start s':>7} | {'RSS MiB':>7} {'peak':>5} | {'stalled CPU%':>12} | "
            f"{'503 CPU% (req/s)':>16}"
        )
        for r in mine:
            out.append(
                f"{r['pending_at_start']:>9} | {r['put_p50_ms']:>8.2f} {r['put_p99_ms']:>7.2f} "
                f"{r['put_p99_ms'] / base['put_p99_ms']:>5.2f} | {r['get_p50_ms']:>8.2f} "
                f"{r['get_p99_ms']:>7.2f} {r['get_p99_ms'] / base['get_p99_ms']:>5.2f} | "
                f"{r['status_p50_ms']:>10.2f} {r['status_p99_ms']:>7.2f} "
                f"{r['status_p99_ms'] / base['status_p99_ms']:>5.2f} | {r['claims_per_s']:>8.1f} | "
                f"{r['start_s']:>7.1f} | {r['rss_mib']:>7.0f} {r['peak_rss_mib']:>5.0f} | "
                f"{r['stalled_cpu_pct']:>12.1f} | "
                f"{r['throttled_cpu_pct']:>7.1f} ({r['throttled_requests_per_s']:>6.1f})"
            )
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="0,10000,100000,1000000")
    p.add_argument("--layouts", default="one,many")
    p.add_argument("--lanes", type=int, default=1000, help="ranks (lanes) of the many layout")
    p.add_argument("--requests", type=int, default=300, help="PUTs and GETs per level")
    p.add_argument("--latency-ms", type=float, default=100.0, help="emulator latency")
    p.add_argument("--flush-concurrency", type=int, default=16)
    p.add_argument("--quiet-s", type=float, default=4.0, help="throttled CPU window")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    args.levels = sorted(int(x) for x in args.levels.split(","))
    work = Path(tempfile.mkdtemp(prefix=".scale-", dir=Path.cwd()))
    rows: list[dict[str, Any]] = []
    try:
        for layout in args.layouts.split(","):
            rows += run_layout(args, layout, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
