"""Restart benchmarks (issue 15): cached reads, cold restore, one fetch per node.

Three legs, each against fresh servers (the emulator and ``python -m gateway serve`` as
subprocesses, work files under ``./.restore-bench-XXXX/``), every figure a ratio against a
limit measured or set in the same run:

``cached``  16 x 64 MiB objects written through the gateway (flushing held back), then read
            by 16 parallel readers, against raw sequential reads of the same body files
            (single thread, 4 MiB preads; measured before and after the gateway's passes
            of each run, the mean is the reference). Before every timed pass the files' pages are
            dropped from the page cache (``posix_fadvise(DONTNEED)``: cold, as after a
            reboot or on a node short of memory). Gateway passes: *first* (a restarted
            gateway whose verify-once memo was emptied: every body file is hashed once
            while it is sent, as on the first read of a checkpoint nobody read yet) and
            *known good* (the memo holds: pure sendfile). The two alternate in order
            from run to run (a pass's place in a run moves it on a virtual disk).
``cold``    A checkpoint (64 shards, 1.5 GiB) in the throttling emulator (latency, total
            bandwidth, and a per-connection bandwidth like S3's): restore time against
            ``bytes / bandwidth``; boto3 ``download_file`` of the same objects (one after
            the other, and 8 at a time) as the comparison; the gateway by ``prefetch`` and
            by 16 readers reading through a cold cache.
``same``    8 readers of one remote 256 MiB object at once: bytes the emulator served
            against the object's size, time against ``size / bandwidth``; the same 8 reads
            straight from the emulator for comparison.

The gateway's peak RSS (``VmHWM``) is reported for every leg. Bodies in the emulator are
zeros (``--discard-bodies``: it keeps sizes and ETags only), so the gateway's checks of its
copies against the ETags are real; the cached leg uses random bytes and checks every
object's MD5 after the timed passes.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import io
import json
import os
import queue
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import BUCKET, GW_KEY, GW_SECRET, BenchError, Proc, start_emulator, start_gateway
from bench import http as admin_http
from emulator import parse_size

MiB = 1 << 20
_READ_BUF = 4 * MiB


# -- clients and measurements -----------------------------------------------------------------


def s3(endpoint: str, key: str = GW_KEY, secret: str = GW_SECRET, *, checksums: bool = True) -> Any:
    """A boto3 client; ``checksums=False``: no x-amz-checksum-* on uploads (MD5 only)."""
    config = Config(
        request_checksum_calculation="when_supported" if checksums else "when_required",
        signature_version="s3v4",
        retries={"max_attempts": 3, "mode": "standard"},
        s3={"addressing_style": "path"},
        max_pool_connections=64,
        read_timeout=300,
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=config,
    )


def read_urls(urls: list[str], readers: int) -> tuple[int, float]:
    """GET every URL with ``readers`` threads (http.client, reused 4 MiB buffer, nothing
    kept); (bytes, seconds). Raises on any status but 200 or a short body."""
    work: queue.Queue[str] = queue.Queue()
    for url in urls:
        work.put(url)
    total = [0] * readers
    errors: list[str] = []

    def reader(i: int) -> None:
        try:
            read_some(i)
        except Exception as exc:  # reported by the caller, not lost in a thread
            errors.append(repr(exc))

    def read_some(i: int) -> None:
        buf = memoryview(bytearray(_READ_BUF))
        while True:
            try:
                url = work.get_nowait()
            except queue.Empty:
                return
            parts = urllib.parse.urlsplit(url)
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=300)
            try:
                conn.request("GET", f"{parts.path}?{parts.query}")
                resp = conn.getresponse()
                want = int(resp.getheader("Content-Length") or -1)
                got = 0
                while n := resp.readinto(buf):
                    got += n
                if resp.status != 200 or got != want:
                    errors.append(f"{parts.path}: HTTP {resp.status}, {got} of {want} bytes")
                total[i] += got
            finally:
                conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    if errors:
        raise BenchError("; ".join(errors[:5]))
    return sum(total), seconds


def together(n: int, fn: Callable[[int], int]) -> tuple[int, float]:
    """``fn(i)`` in ``n`` threads released at once; (sum of results, seconds)."""
    barrier = threading.Barrier(n + 1)
    out = [0] * n

    def run(i: int) -> None:
        barrier.wait()
        out[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return sum(out), time.perf_counter() - started


def drop_cache(paths: list[Path]) -> None:
    """Evict the files' (clean) pages from the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_read(paths: list[Path]) -> tuple[int, float]:
    """Sequential reads of the files, one after the other, 4 MiB at a time."""
    buf = bytearray(_READ_BUF)
    total = 0
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total, time.perf_counter() - started


def peak_rss_mib(proc: Proc) -> float | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


def cpu_seconds(proc: Proc) -> float:
    """User + system CPU time the process used so far."""
    fields = Path(f"/proc/{proc.popen.pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric(admin: str, name: str) -> float:
    _, text = admin_http(admin + "/metrics")
    for line in str(text).splitlines():
        sample, _, value = line.rpartition(" ")
        if sample in (name, name + "_total"):
            return float(value)
    return 0.0


def emulator_bytes_out(url: str) -> int:
    return int(admin_http(url + "/_emulator/stats")[1]["bytes_out"])


def configure(url: str, **settings: float) -> None:
    req = urllib.request.Request(
        url + "/_emulator/config", data=json.dumps(settings).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def blob_paths(data_dir: Path) -> list[Path]:
    """Every body file the journal references (read-only)."""
    conn = sqlite3.connect(f"file:{data_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT blob_id, parts FROM objects WHERE is_delete = 0").fetchall()
    finally:
        conn.close()
    ids = [b for b, parts in rows if b] + [
        p[0] for _, parts in rows if parts for p in json.loads(parts)
    ]
    return [data_dir / "blobs" / i[:2] / i for i in ids]


def forget_verified(data_dir: Path) -> None:
    """Empty the stopped gateway's verify-once memo (``store/verified.py``)."""
    conn = sqlite3.connect(data_dir / "journal.db")
    try:
        with conn:
            conn.execute("DELETE FROM verified_files")
    finally:
        conn.close()


def rate(n_bytes: int, seconds: float) -> float:
    return n_bytes / seconds / MiB if seconds > 0 else 0.0


# -- legs ---------------------------------------------------------------------------------------


def cached_leg(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    emu, emu_url = start_emulator(workdir, "cached-emulator", latency_ms=0)
    hold = ["--write-back-delay", "86400"]  # nothing flushes while we measure
    gw, endpoint, admin = start_gateway(workdir, "cached-gateway", emu_url, hold)
    try:
        client = s3(endpoint, checksums=args.checksum != "none")
        extra = {"ChecksumAlgorithm": args.checksum.upper()} if args.checksum != "none" else {}
        md5s: dict[str, str] = {}
        for i in range(args.objects):
            body = os.urandom(args.object_size)
            key = f"ckpt/step_1/shard_{i:02d}"
            client.put_object(Bucket=BUCKET, Key=key, Body=body, **extra)
            md5s[key] = hashlib.md5(body).hexdigest()
            del body
        data_dir = workdir / "cached-gateway-data"
        paths = blob_paths(data_dir)
        runs = []

        def restart(*, forget: bool) -> tuple[Any, list[str]]:
            nonlocal gw, admin
            gw.stop()
            if forget:  # the verify-once memo outlives restarts: clear it for a first read
                forget_verified(data_dir)
            gw, endpoint, admin = start_gateway(workdir, "cached-gateway", emu_url, hold)
            reader = s3(endpoint)
            urls = [
                reader.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": k})
                for k in md5s
            ]
            return reader, urls

        def timed(urls: list[str]) -> tuple[tuple[int, float], float]:
            """One pass from a cold guest page cache; the bytes the gateway hashed in it."""
            hashed = metric(admin, "gateway_read_verified_bytes")
            drop_cache(paths)
            result = read_urls(urls, args.readers)
            return result, metric(admin, "gateway_read_verified_bytes") - hashed

        for i in range(args.repeat):
            # The two passes alternate in order: on this virtual disk a pass's place in
            # the run moves its figure by more than the verification does.
            first_goes_first = i % 2 == 0
            client, urls = restart(forget=first_goes_first)
            drop_cache(paths)
            raw_before = raw_read(paths)
            if first_goes_first:
                first, hashed_first = timed(urls)
                second, hashed_second = timed(urls)
            else:
                second, hashed_second = timed(urls)
                client, urls = restart(forget=True)
                first, hashed_first = timed(urls)
            drop_cache(paths)
            raw_after = raw_read(paths)  # raw brackets the gateway's passes (disk drift)
            raw = (raw_before[0] + raw_after[0], raw_before[1] + raw_after[1])
            runs.append(
                {
                    "order": "first, known good" if first_goes_first else "known good, first",
                    "raw_mib_s": rate(*raw),
                    "raw_before_after_mib_s": [rate(*raw_before), rate(*raw_after)],
                    "first_mib_s": rate(*first),
                    "known_good_mib_s": rate(*second),
                    "first_ratio": rate(*first) / rate(*raw),
                    "known_good_ratio": rate(*second) / rate(*raw),
                    "hashed_first_mib": hashed_first / MiB,
                    "hashed_known_good_mib": hashed_second / MiB,
                    "sendfile_mib": metric(admin, 'gateway_get_body_bytes_total{how="sendfile"}')
                    / MiB,
                    "peak_rss_mib": peak_rss_mib(gw),
                }
            )
        warm_raw = raw_read(paths)
        for key, want in md5s.items():  # untimed: every byte right
            got = hashlib.md5(client.get_object(Bucket=BUCKET, Key=key)["Body"].read()).hexdigest()
            if got != want:
                raise BenchError(f"{key}: MD5 {got}, wrote {want}")
        return {
            "runs": runs,
            "warm_raw_mib_s": rate(*warm_raw),
            "bytes": sum(p.stat().st_size for p in paths),
        }
    finally:
        gw.stop()
        emu.stop()


def _upload_checkpoint(url: str, keys: list[str], size: int) -> None:
    client = s3(url, "k", "s")
    zeros = bytes(size)
    config = TransferConfig()  # multipart, 8 MiB parts: what SDKs and s3fs upload

    def put(key: str) -> None:
        client.upload_fileobj(io.BytesIO(zeros), BUCKET, key, Config=config)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, keys))


def cold_leg(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    emu, url = start_emulator(workdir, "cold-emulator", latency_ms=0)
    keys = [f"ckpt/step_100/__{i}_0.distcp" for i in range(args.shards)]
    total = args.shards * args.shard_size
    try:
        _upload_checkpoint(url, keys, args.shard_size)
        throttles = {
            "latency_ms": args.latency_ms,
            "bandwidth": args.bandwidth,
            "request_bandwidth": args.bandwidth / args.connection_divisor,
        }
        configure(url, **throttles)
        floor_s = total / args.bandwidth
        out: dict[str, Any] = {"bytes": total, "floor_s": floor_s, "throttles": throttles}
        out["direct_sequential"] = _direct_downloads(url, keys, workdir, 1)
        out["direct_8_at_a_time"] = _direct_downloads(url, keys, workdir, 8)
        out["gateway_prefetch"] = _gateway_restore(args, workdir, url, keys, prefetch=True)
        out["gateway_cold_reads"] = _gateway_restore(args, workdir, url, keys, prefetch=False)
        for leg in (
            "direct_sequential",
            "direct_8_at_a_time",
            "gateway_prefetch",
            "gateway_cold_reads",
        ):
            out[leg]["bandwidth_ratio"] = floor_s / out[leg]["seconds"]
        return out
    finally:
        emu.stop()


def _direct_downloads(url: str, keys: list[str], workdir: Path, at_once: int) -> dict[str, Any]:
    client = s3(url, "k", "s")
    target = workdir / "downloads"
    target.mkdir(exist_ok=True)
    before = emulator_bytes_out(url)

    def get(key: str) -> None:
        client.download_file(BUCKET, key, str(target / key.replace("/", "_")))

    started = time.perf_counter()
    with ThreadPoolExecutor(at_once) as pool:
        list(pool.map(get, keys))
    seconds = time.perf_counter() - started
    shutil.rmtree(target)
    return {"seconds": seconds, "upstream_bytes": emulator_bytes_out(url) - before}


def _gateway_restore(
    args: argparse.Namespace, workdir: Path, url: str, keys: list[str], *, prefetch: bool
) -> dict[str, Any]:
    name = f"gw-{'prefetch' if prefetch else 'cold'}"
    gw, endpoint, admin = start_gateway(workdir, name, url, [])
    try:
        client = s3(endpoint)
        urls = [
            client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": k})
            for k in keys
        ]
        before = emulator_bytes_out(url)
        cpu_before = cpu_seconds(gw)
        started = time.perf_counter()
        out: dict[str, Any] = {}
        if prefetch:
            query = urllib.parse.urlencode({"bucket": BUCKET, "prefix": "ckpt/step_100/"})
            status, job = admin_http(f"{admin}/admin/v1/prefetch?{query}", "POST")
            if status != 202:
                raise BenchError(f"prefetch: {status} {job}")
            while not job["done"]:
                time.sleep(0.05)
                job = admin_http(f"{admin}/admin/v1/prefetch?{query}")[1]
            out["seconds"] = time.perf_counter() - started
            out["gateway_cpu_s"] = cpu_seconds(gw) - cpu_before
            if job["state"] != "done":
                raise BenchError(f"prefetch: {job}")
            local = read_urls(urls, args.readers)  # then the job reads it from the cache
            out["local_read_seconds"] = local[1]
        else:
            got, out["seconds"] = read_urls(urls, args.readers)
            out["gateway_cpu_s"] = cpu_seconds(gw) - cpu_before
            if got != len(keys) * args.shard_size:
                raise BenchError(f"read {got} bytes")
        out["upstream_bytes"] = emulator_bytes_out(url) - before
        time.sleep(0.5)  # let the last copies commit
        out["cached_objects"] = metric(admin, "gateway_readthrough_cached_objects")
        out["peak_rss_mib"] = peak_rss_mib(gw)
        return out
    finally:
        gw.stop()
        shutil.rmtree(workdir / f"{name}-data", ignore_errors=True)


def same_object_leg(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    emu, url = start_emulator(workdir, "same-emulator", latency_ms=0)
    key, size = "ckpt/step_7/__0_0.distcp", args.same_size
    try:
        _upload_checkpoint(url, [key], size)
        configure(
            url,
            latency_ms=args.latency_ms,
            bandwidth=args.bandwidth,
            request_bandwidth=args.bandwidth / args.connection_divisor,
        )
        out: dict[str, Any] = {"bytes": size, "floor_s": size / args.bandwidth}
        gw, endpoint, _ = start_gateway(workdir, "same-gateway", url, [])
        try:
            signed = s3(endpoint).generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": key}
            )
            before = emulator_bytes_out(url)
            admin_http(url + "/_emulator/log", "DELETE")
            started_wall = time.time()
            got, seconds = together(args.same_readers, lambda i: read_urls([signed], 1)[0])
            log = admin_http(url + "/_emulator/log")[1]
            out["gateway"] = {
                "seconds": seconds,
                "bytes_read": got,
                "upstream_bytes": emulator_bytes_out(url) - before,
                "upstream_requests": len(log),
                # When the emulator sent the object's last byte (the rest is delivery).
                "upstream_done_s": max(e["ts_end"] for e in log) - started_wall,
                "peak_rss_mib": peak_rss_mib(gw),
            }
        finally:
            gw.stop()
        direct = [s3(url, "k", "s") for _ in range(args.same_readers)]
        before = emulator_bytes_out(url)
        got, seconds = together(args.same_readers, lambda i: _drain(direct[i], key))
        out["direct"] = {
            "seconds": seconds,
            "bytes_read": got,
            "upstream_bytes": emulator_bytes_out(url) - before,
        }
        for leg in ("gateway", "direct"):
            out[leg]["upstream_x_object"] = out[leg]["upstream_bytes"] / size
            out[leg]["bandwidth_ratio"] = out["floor_s"] / out[leg]["seconds"]
        return out
    finally:
        emu.stop()


def _drain(client: Any, key: str) -> int:
    """GET ``key`` with boto3 and read it with ``readinto`` (no Python copies kept)."""
    raw = client.get_object(Bucket=BUCKET, Key=key)["Body"]._raw_stream
    buf = memoryview(bytearray(_READ_BUF))
    n = 0
    while got := raw.readinto(buf):
        n += got
    return n


# -- report -------------------------------------------------------------------------------------


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def report(res: dict[str, Any]) -> None:
    if "cached" in res:
        c = res["cached"]
        runs = c["runs"]
        print(
            f"\n== cached: {args_line(res)} {c['bytes'] / MiB:.0f} MiB in body files, "
            f"written with checksum {res['args']['checksum']}"
        )
        print(
            "run  raw MiB/s  first MiB/s (x raw)  known-good MiB/s (x raw)"
            "  hashed first/known-good MiB  peak RSS MiB  order"
        )
        for i, r in enumerate(runs, 1):
            print(
                f"{i:3d}  {r['raw_mib_s']:9.0f}  {r['first_mib_s']:11.0f} ({r['first_ratio']:.2f})"
                f"  {r['known_good_mib_s']:16.0f} ({r['known_good_ratio']:.2f})"
                f"  {r['hashed_first_mib']:8.0f} / {r['hashed_known_good_mib']:.0f}"
                f"  {r['peak_rss_mib'] or 0:12.0f}  {r['order']}"
            )
        print(
            f"first read x raw: {_spread([r['first_ratio'] for r in runs])}; "
            f"known good x raw: {_spread([r['known_good_ratio'] for r in runs])}; "
            f"warm raw {c['warm_raw_mib_s']:.0f} MiB/s"
        )
    if "cold" in res:
        c = res["cold"]
        print(
            f"\n== cold restore: {c['bytes'] / MiB:.0f} MiB, "
            f"floor {c['floor_s']:.2f} s at {c['throttles']}"
        )
        for leg in (
            "direct_sequential",
            "direct_8_at_a_time",
            "gateway_prefetch",
            "gateway_cold_reads",
        ):
            r = c[leg]
            extra = (
                f", then local read {r['local_read_seconds']:.2f} s"
                if "local_read_seconds" in r
                else ""
            )
            if "gateway_cpu_s" in r:
                extra += f", gateway CPU {r['gateway_cpu_s']:.1f} s"
            rss = f", peak RSS {r['peak_rss_mib']:.0f} MiB" if r.get("peak_rss_mib") else ""
            print(
                f"{leg:20s} {r['seconds']:7.2f} s  {r['bandwidth_ratio']:.2f} x bandwidth  "
                f"upstream {r['upstream_bytes'] / c['bytes']:.2f} x bytes{extra}{rss}"
            )
    if "same" in res:
        c = res["same"]
        print(f"\n== same object: {c['bytes'] / MiB:.0f} MiB, floor {c['floor_s']:.2f} s")
        for leg in ("gateway", "direct"):
            r = c[leg]
            rss = f", peak RSS {r['peak_rss_mib']:.0f} MiB" if r.get("peak_rss_mib") else ""
            if "upstream_done_s" in r:
                rss += (
                    f", {r['upstream_requests']} upstream requests, last upstream byte at "
                    f"{r['upstream_done_s']:.2f} s ({c['floor_s'] / r['upstream_done_s']:.2f} x)"
                )
            print(
                f"{leg:8s} {r['seconds']:7.2f} s  {r['bandwidth_ratio']:.2f} x bandwidth  "
                f"upstream {r['upstream_x_object']:.3f} x object{rss}"
            )


def args_line(res: dict[str, Any]) -> str:
    a = res["args"]
    size = a["object_size"] // MiB
    return f"{a['objects']} x {size} MiB, {a['readers']} readers, {a['repeat']} runs;"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--legs", default="cached,cold,same")
    p.add_argument("--objects", type=int, default=16)
    p.add_argument("--object-size", type=parse_size, default=64 * MiB)
    p.add_argument("--readers", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3, help="cached leg: timed runs")
    p.add_argument(
        "--checksum",
        choices=("crc32", "crc32c", "none"),
        default="crc32",
        help="cached leg: x-amz-checksum the objects are written with (crc32: boto3's "
        "default; none: only the MD5 ETag is recorded), which the first read verifies",
    )
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--shard-size", type=parse_size, default=24 * MiB)
    p.add_argument("--same-size", type=parse_size, default=256 * MiB)
    p.add_argument("--same-readers", type=int, default=8)
    p.add_argument("--bandwidth", type=parse_size, default=160 * MiB, help="emulator bytes/s")
    p.add_argument(
        "--connection-divisor", type=float, default=8.0, help="one connection gets bandwidth / this"
    )
    p.add_argument("--latency-ms", type=float, default=35.0)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    args = p.parse_args(argv)
    args.object_size, args.shard_size, args.same_size = (
        int(args.object_size),
        int(args.shard_size),
        int(args.same_size),
    )
    workdir = Path(tempfile.mkdtemp(prefix=".restore-bench-", dir="."))
    res: dict[str, Any] = {"args": {k: v for k, v in vars(args).items()}}
    ok = False
    try:
        legs = args.legs.split(",")
        if "cached" in legs:
            res["cached"] = cached_leg(args, workdir)
        if "cold" in legs:
            res["cold"] = cold_leg(args, workdir)
        if "same" in legs:
            res["same"] = same_object_leg(args, workdir)
        ok = True
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2))
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work dir kept: {workdir}", file=sys.stderr)
    report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
