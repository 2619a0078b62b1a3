"""Checkpoint burst: writing straight to a throttled S3 versus writing through the gateway.

One run, three phases, each against fresh servers:

0. **Calibration.** The burst is written into a gateway whose flusher is paused (its
   upstream is an unthrottled emulator), to measure how fast this load generator can write
   on this machine. The emulator's bandwidth for the two legs is set to ``1/15`` of that
   rate (``--bandwidth-divisor``), its latency to 35 ms, and its per-prefix request limit so
   that the checkpoint's requests need ``1/0.75`` times as long as its bytes
   (``--prefix-rate-factor``): both limits bind, as they do on real S3 with real nodes.
1. **Direct.** The ranks write to the emulator with boto3 (standard retry mode, default
   attempts). A write that still gets ``503 SlowDown`` after its retries is a failed write.
2. **Gateway.** ``python -m gateway serve`` with a fresh emulator as its upstream; the ranks
   write to the gateway; then ``GET /admin/v1/drain?wait=true`` waits until everything is
   upstream, and every object is checked in the emulator (size and ETag).

Printed: the job's stall (time until every write was acknowledged) for both legs and its
ratio, ack p50/p99, the gateway's drain time from the burst's start and from its last ack
against the emulator's minimum (``max(bytes / bandwidth, (requests - burst * prefixes) /
(prefix rate * prefixes))``; the prefix buckets hold ``--prefix-burst`` requests, 2 by
default: see loadtest/README.md), 503s (seen by the direct client; seen by the flusher,
from the emulator's log) and failed writes. ``--json FILE`` writes the same as JSON. The
run fails (exit 1) only when the gateway loses or corrupts an acknowledged write or does
not drain.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from burst import (
    Bodies,
    BurstResult,
    Profile,
    add_profile_args,
    profile_from_args,
    run_burst,
    shard_key,
)
from emulator import parse_size, prefix_of

HERE = Path(__file__).resolve().parent
BUCKET = "bench"
GW_KEY, GW_SECRET = "bench", "bench-secret-key"
WRITE_OPS = {"PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"}


class BenchError(RuntimeError):
    pass


# -- processes ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, method: str = "GET", timeout: float = 30.0) -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.log_file.close()
        return self.popen.returncode

    def tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def start_emulator(workdir: Path, name: str, **opts: Any) -> tuple[Proc, str]:
    cmd = [sys.executable, str(HERE / "emulator.py"), "--port", "0", "--discard-bodies"]
    cmd += ["--buckets", BUCKET]
    for flag, value in opts.items():
        cmd += [f"--{flag.replace('_', '-')}", str(value)]
    log_path = workdir / f"{name}.log"
    log_file = open(log_path, "wb")  # noqa: SIM115
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log_file)
    assert popen.stdout is not None
    line = popen.stdout.readline().decode()  # "S3 emulator listening on http://... {...}"
    if "listening on" not in line:
        popen.kill()
        raise BenchError(f"{name} did not start: {line!r}")
    return Proc(name, popen, log_path, log_file), line.split()[4]


def start_gateway(
    workdir: Path, name: str, upstream: str, extra: list[str]
) -> tuple[Proc, str, str]:
    port, admin = free_port(), free_port()
    cmd = [sys.executable, "-m", "gateway", "serve", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--admin-listen", f"127.0.0.1:{admin}", "--data-dir", str(workdir / f"{name}-data")]
    cmd += ["--upstream-endpoint", upstream, "--access-key", GW_KEY, "--secret-key", GW_SECRET]
    cmd += extra
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GATEWAY_"))}
    env.update(
        AWS_ACCESS_KEY_ID="emulator",
        AWS_SECRET_ACCESS_KEY="emulator-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        NO_PROXY="*",
        PYTHONUNBUFFERED="1",
    )
    log_path = workdir / f"{name}.log"
    log_file = open(log_path, "wb")  # noqa: SIM115
    popen = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    proc = Proc(name, popen, log_path, log_file)
    admin_url = f"http://127.0.0.1:{admin}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            proc.stop()
            raise BenchError(f"{name} exited ({popen.returncode}):\n{proc.tail()}")
        with contextlib.suppress(OSError):
            if http(admin_url + "/readyz", timeout=2)[0] == 200:
                return proc, f"http://127.0.0.1:{port}", admin_url
        time.sleep(0.1)
    proc.stop()
    raise BenchError(f"{name}: /readyz not 200 after 60 s:\n{proc.tail()}")


# -- phases ---------------------------------------------------------------------------------


def calibrate(workdir: Path, profile: Profile, extra: list[str], rounds: int) -> list[BurstResult]:
    """Bursts into a gateway whose flusher is paused: the load generator's own speed."""
    emu, emu_url = start_emulator(workdir, "calibration-emulator", latency_ms=0)
    try:
        gw, endpoint, admin = start_gateway(
            workdir, "calibration-gateway", emu_url, [*extra, "--shutdown-drain-timeout", "1"]
        )
        try:
            status, body = http(admin + "/admin/v1/flush/pause", "POST")
            if status != 200:
                raise BenchError(f"cannot pause flushing: {status} {body}")
            return [
                run_burst(
                    endpoint, BUCKET, profile, access_key=GW_KEY, secret_key=GW_SECRET, step=-i
                )
                for i in range(rounds)
            ]
        finally:
            gw.stop()
    finally:
        emu.stop()


# Lanes adapt during their first seconds; the 503 target is for the traffic after that.
ADAPT_S = 3.0


def emulator_figures(url: str, started_wall: float, log_path: Path | None = None) -> dict[str, Any]:
    _, log = http(url + "/_emulator/log", timeout=120)
    if log_path is not None:  # kept with --keep: per-prefix timelines for analysis
        log_path.write_text("".join(json.dumps(e) + "\n" for e in log))
    ops = Counter(e["op"] for e in log)
    slowdowns = sum(e["code"] == "SlowDown" for e in log)
    writes = [e for e in log if e["op"] in WRITE_OPS]
    ok_writes = [e for e in writes if e["status"] == 200]
    spans: dict[str, list[float]] = {}
    for e in writes:
        spans.setdefault(e["prefix"], []).append(e["ts"])
    rates = sorted(len(ts) / (max(ts) - min(ts)) for ts in spans.values() if max(ts) > min(ts))
    # "Once lanes have adapted": requests a prefix received ADAPT_S after its first one.
    adapted = [e for e in writes if e["ts"] >= min(spans[e["prefix"]]) + ADAPT_S]
    adapted_503 = sum(e["code"] == "SlowDown" for e in adapted)
    return {
        "adapted_requests": len(adapted),
        "adapted_503": adapted_503,
        "adapted_503_fraction": round(adapted_503 / len(adapted), 4) if adapted else 0.0,
        "requests": len(log),
        "write_requests": len(writes),
        # Write requests (incl. rejected ones) per second that one prefix received, median.
        "prefix_offered_rps_median": round(rates[len(rates) // 2], 3) if rates else None,
        "requests_by_op": dict(ops),
        "slowdown_503": slowdowns,
        "slowdown_fraction": round(slowdowns / len(log), 4) if log else 0.0,
        "first_write_s": _rel(min((e["ts"] for e in writes), default=None), started_wall),
        "last_write_done_s": _rel(
            max((e["ts_end"] for e in ok_writes), default=None), started_wall
        ),
    }


def verify(url: str, result: BurstResult, bodies: Bodies, *, acked_only: bool) -> dict[str, int]:
    _, stored = http(f"{url}/_emulator/objects?bucket={BUCKET}&prefix=ckpt/", timeout=120)
    counts = Counter[str]()
    for w in result.writes:
        if acked_only and not w.ok:
            continue
        got = stored.get(w.key)
        if got is None:
            counts["missing"] += 1
        elif got["size"] != w.size or got["etag"] != bodies.etag(w.key, result.profile):
            counts["wrong"] += 1
        else:
            counts["ok"] += 1
    return {"ok": counts["ok"], "missing": counts["missing"], "wrong": counts["wrong"]}


def direct_leg(
    workdir: Path, profile: Profile, throttles: dict[str, Any], bodies: Bodies
) -> dict[str, Any]:
    emu, url = start_emulator(workdir, "direct-emulator", **throttles)
    try:
        result = run_burst(url, BUCKET, profile, access_key="k", secret_key="s", bodies=bodies)
        return {
            "burst": result,
            "emulator": emulator_figures(url, result.started_wall),
            "verify": verify(url, result, bodies, acked_only=True),
        }
    finally:
        emu.stop()


def gateway_leg(
    workdir: Path,
    profile: Profile,
    throttles: dict[str, Any],
    bodies: Bodies,
    extra: list[str],
    drain_timeout: float,
) -> dict[str, Any]:
    emu, url = start_emulator(workdir, "gateway-emulator", **throttles)
    try:
        gw, endpoint, admin = start_gateway(workdir, "gateway", url, extra)
        try:
            result = run_burst(
                endpoint, BUCKET, profile, access_key=GW_KEY, secret_key=GW_SECRET, bodies=bodies
            )
            drained, last = False, None
            deadline = time.monotonic() + drain_timeout
            while not drained and time.monotonic() < deadline:
                wait = max(1, min(600, int(deadline - time.monotonic())))
                status, last = http(
                    f"{admin}/admin/v1/drain?wait=true&timeout={wait}", timeout=wait + 30
                )
                if status != 200 or not isinstance(last, dict):
                    raise BenchError(f"drain answered {status}: {last}")
                drained = bool(last.get("drained"))
            drained_at = time.time() - result.started_wall
            _, status_doc = http(admin + "/admin/v1/status")
            out = {
                "burst": result,
                "drained": drained,
                "drain_answer": last,
                "drain_from_start_s": round(drained_at, 3),
                "drain_from_last_ack_s": round(drained_at - result.stall, 3),
                "gateway_status": status_doc,
                "emulator": emulator_figures(
                    url, result.started_wall, workdir / "gateway-emulator-requests.jsonl"
                ),
                "verify": verify(url, result, bodies, acked_only=True),
            }
        finally:
            exit_code = gw.stop()
        out["gateway_exit_code"] = exit_code  # after SIGTERM; 0 is a clean shutdown
        return out
    finally:
        emu.stop()


# -- report ---------------------------------------------------------------------------------


def _rel(ts: float | None, base: float) -> float | None:
    return None if ts is None else round(ts - base, 3)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def report(res: dict[str, Any]) -> None:
    d, g, m = res.get("direct"), res.get("gateway"), res["minimum"]
    print()
    print(f"profile      {res['profile']}")
    c, t = res["calibration"], res["throttles"]
    if c.get("ingest_MBps") is None:
        print("calibration  skipped (--bandwidth given)")
        source = "given"
    else:
        print(
            f"calibration  load generator -> paused gateway: {c['ingest_MBps']} MB/s "
            f"in {c['stall_s']} s (fastest of {c.get('rounds_MBps')} MB/s)"
        )
        source = f"1/{res['bandwidth_divisor']:g} of calibration"
    print(
        f"emulator     latency {t['latency_ms']:g} ms, bandwidth {t['bandwidth'] / 1e6:.3f} MB/s "
        f"({source}),\n             prefix limit {t['prefix_rate']:.3f} req/s per prefix, "
        f"burst {t.get('prefix_burst', 'max(1, rate)')} "
        f"(depth {t['prefix_depth']}, {m['prefixes']} prefixes, "
        f"{'given' if res.get('prefix_rate_given') else 'auto'})"
    )
    print(
        f"minimum      {m['seconds']:.1f} s = max(bytes/bandwidth {m['bytes_s']:.1f} s, "
        f"(write requests - burst*prefixes)/(rate*prefixes) {m['requests_s']:.1f} s)"
    )
    print()
    rows = [("", "direct", "gateway", "ratio")]
    ds = d["burst"] if d else {}
    gs = g["burst"] if g else {}

    def row(label: str, a: Any, b: Any, ratio: str = "") -> None:
        rows.append((label, "-" if a is None else str(a), "-" if b is None else str(b), ratio))

    row(
        "GPU stall (s)",
        ds.get("stall_s"),
        gs.get("stall_s"),
        _ratio(ds.get("stall_s"), gs.get("stall_s")),
    )
    row(
        "ack p50 (ms)",
        _ms(ds.get("ack_p50_ms")),
        _ms(gs.get("ack_p50_ms")),
        _ratio(ds.get("ack_p50_ms"), gs.get("ack_p50_ms")),
    )
    row(
        "ack p99 (ms)",
        _ms(ds.get("ack_p99_ms")),
        _ms(gs.get("ack_p99_ms")),
        _ratio(ds.get("ack_p99_ms"), gs.get("ack_p99_ms")),
    )
    row("failed writes", ds.get("failed_writes"), gs.get("failed_writes"))
    row("503 seen by client", ds.get("client_503"), gs.get("client_503"))
    if g:
        e = g["emulator"]
        row(
            "503 seen by flusher",
            None,
            f"{e['slowdown_503']} of {e['requests']} ({e['slowdown_fraction'] * 100:.1f}%)",
        )
        row(
            f"503 after {ADAPT_S:g} s/lane",
            None,
            f"{e['adapted_503']} of {e['adapted_requests']} "
            f"({e['adapted_503_fraction'] * 100:.1f}%)",
        )
        row(
            "drain from start (s)",
            None,
            g["drain_from_start_s"],
            f"{g['drain_from_start_s'] / m['seconds']:.2f}x min",
        )
        row("drain from last ack (s)", None, g["drain_from_last_ack_s"])
        row(
            "req/s offered per prefix",
            d["emulator"]["prefix_offered_rps_median"] if d else None,
            e["prefix_offered_rps_median"],
            f"limit {res['throttles']['prefix_rate']:g}",
        )
        row("upstream last write (s)", None, e["last_write_done_s"])
    if d:
        e = d["emulator"]
        row("emulator requests", e["requests"], g["emulator"]["requests"] if g else None)
        row("direct stall vs minimum", f"{ds['stall_s'] / m['seconds']:.2f}x", None)
    width = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print(
            "  ".join(c.ljust(width[i]) if i == 0 else c.rjust(width[i]) for i, c in enumerate(r))
        )
    print()
    for leg in ("direct", "gateway"):
        if res.get(leg):
            v = res[leg]["verify"]
            print(
                f"verify {leg:8} acked objects in the emulator: {v['ok']} right, "
                f"{v['missing']} missing, {v['wrong']} wrong size/ETag"
            )
    if g:
        print(
            f"gateway drained: {g['drained']} {g['drain_answer']}, "
            f"exit code after SIGTERM {g['gateway_exit_code']}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_profile_args(p)
    t = p.add_argument_group("emulator")
    t.add_argument("--latency-ms", type=float, default=35.0)
    t.add_argument("--bandwidth", type=parse_size, default=None, help="skip calibration")
    t.add_argument("--bandwidth-divisor", type=float, default=15.0)
    t.add_argument("--calibration-rounds", type=int, default=2, help="the fastest one is used")
    t.add_argument("--prefix-rate", type=float, default=None, help="req/s per prefix")
    t.add_argument("--prefix-rate-factor", type=float, default=0.75)
    t.add_argument("--prefix-depth", type=int, default=3)
    t.add_argument(
        "--prefix-burst",
        type=float,
        default=2.0,
        help="requests a prefix's bucket holds (0: the emulator's default, max(1, rate))",
    )
    p.add_argument("--gateway-arg", action="append", default=[], help="extra serve flag")
    p.add_argument("--legs", default="direct,gateway", help="direct,gateway or one of them")
    p.add_argument("--drain-timeout", type=float, default=600.0)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    args = p.parse_args(argv)
    profile = profile_from_args(args)
    legs = set(args.legs.split(","))
    extra = [f"--lane-depth={args.prefix_depth}", *args.gateway_arg]
    workdir = Path.cwd() / f".burst-bench-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    bodies = Bodies(profile.shard_size)
    res: dict[str, Any] = {
        "profile": profile.describe(),
        "bandwidth_divisor": args.bandwidth_divisor,
    }
    ok = False
    try:
        print(f"burst bench: {profile.describe()}; work dir {workdir}", flush=True)
        if args.bandwidth is None:
            print("calibrating: burst into a gateway with flushing paused ...", flush=True)
            rounds = calibrate(workdir, profile, extra, args.calibration_rounds)
            for cal in rounds:
                if cal.failed:
                    raise BenchError(f"calibration had {cal.failed} failed writes: {cal.errors}")
            best = min(rounds, key=lambda r: r.stall)
            res["calibration"] = {
                **best.summary(),
                "rounds_MBps": [r.summary()["ingest_MBps"] for r in rounds],
            }
            bandwidth = best.acked_bytes / best.stall / args.bandwidth_divisor
        else:
            res["calibration"] = {"ingest_MBps": None, "stall_s": None}
            bandwidth = float(args.bandwidth)
        keys = [shard_key(1, r, i) for r in range(profile.ranks) for i in range(profile.shards)]
        prefixes = len({prefix_of(k, args.prefix_depth) for k in keys})
        req_rate_for_bytes = bandwidth * profile.write_requests / profile.total_bytes / prefixes
        prefix_rate = args.prefix_rate or round(args.prefix_rate_factor * req_rate_for_bytes, 3)
        res["prefix_rate_given"] = bool(args.prefix_rate)
        throttles = {
            "latency_ms": args.latency_ms,
            "bandwidth": round(bandwidth),
            "prefix_rate": prefix_rate,
            "prefix_depth": args.prefix_depth,
        }
        if args.prefix_burst > 0:
            throttles["prefix_burst"] = args.prefix_burst
        burst = args.prefix_burst if args.prefix_burst > 0 else max(1.0, prefix_rate)
        res["throttles"] = throttles
        bytes_s = profile.total_bytes / bandwidth
        # Each prefix's bucket starts full: its first `burst` requests need no time.
        requests_s = max(0.0, profile.write_requests - burst * prefixes) / (prefix_rate * prefixes)
        res["minimum"] = {
            "seconds": max(bytes_s, requests_s),
            "bytes_s": bytes_s,
            "requests_s": requests_s,
            "prefixes": prefixes,
            "write_requests": profile.write_requests,
        }
        print(
            f"throttles: {throttles}; emulator minimum {max(bytes_s, requests_s):.1f} s", flush=True
        )
        if "direct" in legs:
            print("direct: ranks -> emulator ...", flush=True)
            d = direct_leg(workdir, profile, throttles, bodies)
            res["direct"] = {**d, "burst": d["burst"].summary()}
        if "gateway" in legs:
            print("gateway: ranks -> gateway -> emulator ...", flush=True)
            g = gateway_leg(workdir, profile, throttles, bodies, extra, args.drain_timeout)
            res["gateway"] = {**g, "burst": g["burst"].summary()}
        report(res)
        gw = res.get("gateway")
        ok = gw is None or (
            gw["drained"]
            and gw["verify"]["missing"] == 0
            and gw["verify"]["wrong"] == 0
            and gw["burst"]["failed_writes"] == 0
        )
        if not ok:
            print("FAILED: the gateway did not drain, or lost/corrupted an acknowledged write")
    except BenchError as exc:
        print(f"bench error: {exc}", file=sys.stderr)
        res["error"] = str(exc)
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2, default=str))
        if args.keep or not ok:
            print(f"work dir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
