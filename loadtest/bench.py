"""Checkpoint burst: writing straight to a throttled S3 versus writing through gateways.

One run, three phases, each against fresh servers:

0. **Calibration.** The burst is written into a gateway whose flusher is paused (its
   upstream is an unthrottled emulator), to measure how fast this load generator can write
   on this machine. The emulator's bandwidth for the two legs is set to ``1/15`` of that
   rate (``--bandwidth-divisor``), its latency to 35 ms, and its partitions' request limit
   so that the checkpoint's requests need ``1/0.75`` times as long as its bytes
   (``--prefix-rate-factor``): both limits bind, as they do on real S3 with real nodes.
   The partitions are at ``--partition-depth`` (1: ``ckpt/``, as a fresh bucket throttles),
   independent of the gateways' ``--lane-depth``; ``--limit-change``, ``--storm`` and
   ``--split-after`` make them change during the run.
1. **Direct.** The ranks write to the emulator with boto3 (standard retry mode, default
   attempts). A write that still gets ``503 SlowDown`` after its retries is a failed write.
2. **Gateways.** ``--gateways N`` times ``python -m gateway serve`` with one fresh emulator as
   their upstream (one node each: gateway g gets ranks ``g*ranks ...``); the ranks write
   to their gateway; then ``GET /admin/v1/drain?wait=true`` on each until everything is
   upstream, and every object is checked in the emulator (size and ETag). With
   ``--warm-up`` the gateways first write and drain a checkpoint of the same shape (step 0),
   as a job's earlier checkpoint; ``--restart-after-warm-up`` also stops them (SIGTERM)
   and starts them again on their data dirs before the measured one (step 1), as a
   rolling upgrade does; ``--replace-one-after-warm-up`` starts gateway 0 again on an
   empty data dir while the others run on (a node replaced). Every figure is the measured
   checkpoint's.

Printed: the job's stall for both legs and its ratio, ack p50/p99, the drain time from
the burst's start against the emulator's minimum (loadtest/flowstats.py: the partitions'
bursts, then their rates and the bandwidth over time), 503s (seen by the direct client;
seen by the flusher, overall and after each gateway's first 3 s), when each gateway
finished, Jain's index of their shares, CPU per gateway, and after a storm how soon the
drain was back at 90 % of the limit. ``--json FILE`` writes the same as JSON. The run fails
(exit 1) only when a gateway loses or corrupts an acknowledged write or does not drain.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flowstats
from ack_latency import free_port
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
    workdir: Path, name: str, upstream: str, extra: list[str], port: int | None = None
) -> tuple[Proc, str, str]:
    port, admin = port or free_port(), free_port()
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


def emulator_figures(
    url: str, started_wall: float, log: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    if log is None:
        _, log = http(url + "/_emulator/log", timeout=120)
    ops = Counter(e["op"] for e in log)
    slowdowns = sum(e["code"] == "SlowDown" for e in log)
    writes = [e for e in log if e["op"] in WRITE_OPS]
    ok_writes = [e for e in writes if e["status"] == 200]
    spans: dict[str, list[float]] = {}
    for e in writes:
        spans.setdefault(e["partition"], []).append(e["ts"])
    rates = sorted(len(ts) / (max(ts) - min(ts)) for ts in spans.values() if max(ts) > min(ts))
    return {
        "requests": len(log),
        "write_requests": len(writes),
        # Write requests (incl. rejected ones) per second that one partition received, median.
        "partition_offered_rps_median": round(rates[len(rates) // 2], 3) if rates else None,
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _bursts(
    endpoints: list[str], profile: Profile, bodies: Bodies, step: int = 1
) -> list[BurstResult]:
    """One burst per gateway at once (gateway g writes ranks g*ranks...), in threads."""
    results: list[BurstResult | None] = [None] * len(endpoints)

    def one(g: int) -> None:
        results[g] = run_burst(
            endpoints[g],
            BUCKET,
            profile,
            access_key=GW_KEY,
            secret_key=GW_SECRET,
            bodies=bodies,
            first_rank=g * profile.ranks,
            step=step,
        )

    threads = [threading.Thread(target=one, args=(g,)) for g in range(len(endpoints))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def _drain(admin: str, deadline: float) -> tuple[bool, Any]:
    drained, last = False, None
    while not drained and time.monotonic() < deadline:
        wait = max(1, min(600, int(deadline - time.monotonic())))
        status, last = http(f"{admin}/admin/v1/drain?wait=true&timeout={wait}", timeout=wait + 30)
        if status != 200 or not isinstance(last, dict):
            raise BenchError(f"drain answered {status}: {last}")
        drained = bool(last.get("drained"))
    return drained, last


def _wait_fleet(admins: list[str], timeout_s: float = 60.0) -> None:
    """Until every gateway counts every other as a reachable member."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        views = [http(a + "/admin/v1/fleet")[1] for a in admins]
        if all(
            isinstance(v, dict)
            and sum(1 for m in v.get("members", []) if m.get("lease_trusted")) >= len(admins) - 1
            for v in views
        ):
            return
        time.sleep(0.2)
    raise BenchError(f"the fleet did not form in {timeout_s:.0f} s")


def _gateway_args(extra: list[str], g: int, ports: list[int], fleet: bool) -> list[str]:
    """Gateway g's serve flags: with ``fleet``, its node id and every gateway as a peer."""
    if not fleet:
        return extra
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    return [*extra, "--node-id", f"gateway{g}", "--peers", peers]


def _start_gateways(
    workdir: Path, url: str, extra: list[str], ports: list[int], fleet: bool
) -> list[tuple[Proc, str, str]]:
    """Gateway g on ``ports[g]`` with its data dir ``gateway<g>-data`` (kept across a
    restart); with ``fleet`` each has every other as a peer and the fleet has formed."""
    started: list[tuple[Proc, str, str]] = []
    try:
        for g, port in enumerate(ports):
            args = _gateway_args(extra, g, ports, fleet)
            started.append(start_gateway(workdir, f"gateway{g}", url, args, port))
        if fleet:
            _wait_fleet([admin for _, _, admin in started])
    except BaseException:
        for proc, _, _ in started:
            proc.stop()
        raise
    return started


def _warm_up(
    started: list[tuple[Proc, str, str]], profile: Profile, bodies: Bodies, deadline: float
) -> dict[str, Any]:
    """An earlier checkpoint (step 0) through the same gateways, drained."""
    t0 = time.monotonic()
    results = _bursts([e for _, e, _ in started], profile, bodies, step=0)
    if any(r.failed for r in results):
        raise BenchError(f"the warm-up had failed writes: {[r.errors for r in results]}")
    if not all(_drain(admin, deadline)[0] for _, _, admin in started):
        raise BenchError("the warm-up checkpoint did not drain")
    budgets = [http(admin + "/admin/v1/status")[1].get("flow_budgets") for _, _, admin in started]
    return {"drained_s": round(time.monotonic() - t0, 3), "flow_budgets": budgets}


def gateway_leg(
    workdir: Path,
    profile: Profile,
    throttles: dict[str, Any],
    bodies: Bodies,
    extra: list[str],
    drain_timeout: float,
    gateways: int = 1,
    limit_per_s: float | None = None,
    paused_ingest: bool = False,
    fleet: bool = False,
    warm_up: bool = False,
    restart: bool = False,
    replace_one: bool = False,
) -> dict[str, Any]:
    emu, url = start_emulator(workdir, "gateway-emulator", **throttles)
    procs: list[Proc] = []
    warm: dict[str, Any] | None = None
    try:
        ports = [free_port() for _ in range(gateways)]
        started = _start_gateways(workdir, url, extra, ports, fleet)
        procs = [p for p, _, _ in started]
        if warm_up:
            warm = _warm_up(started, profile, bodies, time.monotonic() + drain_timeout)
            if restart:
                warm["exit_codes"] = [p.stop() for p in procs]
                procs = []
                started = _start_gateways(workdir, url, extra, ports, fleet)
                procs = [p for p, _, _ in started]
            elif replace_one:  # gateway 0's node replaced: a fresh disk, the others run on
                warm["exit_codes"] = [procs[0].stop()]
                shutil.rmtree(workdir / "gateway0-data")
                args = _gateway_args(extra, 0, ports, fleet)
                started[0] = start_gateway(workdir, "gateway0", url, args, ports[0])
                procs[0] = started[0][0]
                if fleet:
                    _wait_fleet([admin for _, _, admin in started])
        if paused_ingest:  # the whole burst first: the flushers then start together
            for _, _, admin in started:
                http(admin + "/admin/v1/flush/pause", "POST")
        cpu0 = [cpu_seconds(p.popen.pid) for p in procs]
        wall0 = time.monotonic()
        results = _bursts([e for _, e, _ in started], profile, bodies)
        started_wall = min(r.started_wall for r in results)
        if paused_ingest:  # times count from the resume
            started_wall = time.time()
            for _, _, admin in started:
                http(admin + "/admin/v1/flush/resume", "POST")
        deadline = time.monotonic() + drain_timeout
        drains = [_drain(admin, deadline) for _, _, admin in started]
        drained_at = time.time() - started_wall
        cpu = [
            round((cpu_seconds(p.popen.pid) - c0) / (time.monotonic() - wall0), 3)
            for p, c0 in zip(procs, cpu0, strict=True)
        ]
        statuses = [http(admin + "/admin/v1/status")[1] for _, _, admin in started]
        _, stats = http(url + "/_emulator/stats")
        _, log = http(url + "/_emulator/log", timeout=120)
        if warm_up:  # the measured checkpoint's requests only
            log = [e for e in log if e["ts"] >= started_wall]
        (workdir / "gateway-emulator-requests.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in log)
        )
        t0 = stats["limiter"]["t0_wall"]
        storm = throttles.get("storm")
        storm_wall = None
        if storm and t0 is not None:
            begin, end = (float(x) for x in str(storm).split(":"))
            storm_wall = (t0 + begin, t0 + end)
        stall = max(r.stall for r in results)
        out = {
            "burst": _merged(results, profile),
            "drained": all(d for d, _ in drains),
            "drain_answer": [last for _, last in drains],
            "drain_from_start_s": round(drained_at, 3),
            "drain_from_last_ack_s": round(drained_at - stall, 3),
            "limiter_t0_from_start_s": None if t0 is None else round(t0 - started_wall, 3),
            "gateway_status": statuses,
            "gateway_cpu_cores": cpu,
            "emulator": emulator_figures(url, started_wall, log=log),
            "flow": flowstats.flow_figures(
                log,
                gateways=gateways,
                ranks_per_gateway=profile.ranks,
                started_wall=started_wall,
                limit_per_s=limit_per_s,
                storm_wall=storm_wall,
            ),
            "splits": stats["limiter"]["splits"],
            "warm_up": warm,
            "verify": _verify_all(url, results, bodies),
        }
    finally:
        codes = [p.stop() for p in procs]
        emu.stop()
    out["gateway_exit_code"] = max((c or 0 for c in codes), default=0)
    return out


def _merged(results: list[BurstResult], profile: Profile) -> dict[str, Any]:
    """The gateways' bursts as one (stall: the last ack of any)."""
    if len(results) == 1:
        return results[0].summary()
    summaries = [r.summary() for r in results]
    return {
        "profile": f"{len(results)} x {profile.describe()}",
        "objects": sum(s["objects"] for s in summaries),
        "failed_writes": sum(s["failed_writes"] for s in summaries),
        "stall_s": max(s["stall_s"] for s in summaries),
        "ack_p50_ms": max(s["ack_p50_ms"] or 0 for s in summaries),
        "ack_p99_ms": max(s["ack_p99_ms"] or 0 for s in summaries),
        "client_503": sum(s["client_503"] for s in summaries),
        "per_gateway": summaries,
    }


def _verify_all(url: str, results: list[BurstResult], bodies: Bodies) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for r in results:
        counts.update(verify(url, r, bodies, acked_only=True))
    return {"ok": counts["ok"], "missing": counts["missing"], "wrong": counts["wrong"]}


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
    print(f"profile      {res['profile']} x {res['gateways']} gateway(s)")
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
    extras = {k: t[k] for k in ("limit_schedule", "storm", "split_after") if k in t}
    print(
        f"emulator     latency {t['latency_ms']:g} ms, bandwidth {t['bandwidth'] / 1e6:.3f} MB/s "
        f"({source}), per request {t.get('request_bandwidth', 0) / 1e6:.3f} MB/s,\n"
        f"             limit {t['prefix_rate']:.3f} req/s per partition, "
        f"burst {t['prefix_burst']:g}, partitions at depth {t['prefix_depth']} "
        f"({m['partitions']} partitions, {'given' if res.get('prefix_rate_given') else 'auto'})"
        f"{', ' + json.dumps(extras) if extras else ''}"
    )
    print(f"gateways     lanes at depth {res['lane_depth']}; extra args {res['gateway_args']}")
    if g and g.get("warm_up"):
        restarted = {"restart": " then restarted,", "replace one": " gateway 0 replaced,"}.get(
            res["warm_up"], ""
        )
        print(
            f"warm-up      a checkpoint of the same shape drained in "
            f"{g['warm_up']['drained_s']} s,{restarted} before the measured one"
        )
    print(f"minimum      {m['seconds']:.1f} s from the first request ({m['how']})")
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
    row("ack p50 (ms)", _ms(ds.get("ack_p50_ms")), _ms(gs.get("ack_p50_ms")))
    row("ack p99 (ms)", _ms(ds.get("ack_p99_ms")), _ms(gs.get("ack_p99_ms")))
    row("failed writes", ds.get("failed_writes"), gs.get("failed_writes"))
    row("503 seen by client", ds.get("client_503"), gs.get("client_503"))
    if g:
        f = g["flow"]
        row(
            "503 seen by flusher",
            None,
            f"{f['slowdown_503']} of {f['requests']} ({f['slowdown_fraction'] * 100:.1f}%)",
        )
        row(
            "503 after 3 s/gateway",
            None,
            f"{f['after_3s_503']} of {f['after_3s_requests']} "
            f"({f['after_3s_fraction'] * 100:.1f}%)",
        )
        row(
            "drain from resume (s)" if res.get("paused_ingest") else "drain from start (s)",
            None,
            g["drain_from_start_s"],
            f"{g['drain_from_start_s'] / m['seconds']:.2f}x min",
        )
        row("drain from last ack (s)", None, g["drain_from_last_ack_s"])
        row("first upstream request (s)", None, g["limiter_t0_from_start_s"])
        row("gateways finished (s)", None, " ".join(str(x["finished_s"]) for x in f["gateways"]))
        row("finish last/first", None, f["finish_spread"])
        row("Jain's index", None, f["jain"])
        row("gateway CPU (cores)", None, " ".join(f"{c:.3f}" for c in g["gateway_cpu_cores"]))
        if "storm_recovery_s" in f:
            row("back at 90% after storm (s)", None, f["storm_recovery_s"])
        if g.get("splits"):
            row("partition splits", None, json.dumps(g["splits"]))
        sim = res.get("simulator")
        if sim and "ratio" in sim:
            bench = g["drain_from_start_s"] / m["seconds"]
            row(
                "simulator drain / min",
                None,
                " ".join(f"{r:.2f}x" for r in sim["ratios"]),
                f"bench/sim {bench / sim['ratio']:.2f}",
            )
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
        print(f"gateway drained: {g['drained']}, exit code after SIGTERM {g['gateway_exit_code']}")


def _throttles(
    args: argparse.Namespace, profile: Profile, bandwidth: float, keys: list[str]
) -> tuple[dict[str, Any], flowstats.Throttles, float]:
    """The emulator's options, the same as ``flowstats.Throttles``, and the checkpoint's
    own limit (requests/s all partitions allow together, within the bandwidth)."""
    partitions = len({prefix_of(k, args.partition_depth) for k in keys})
    write_requests = profile.write_requests * args.gateways
    total_bytes = profile.total_bytes * args.gateways
    req_rate_for_bytes = bandwidth * write_requests / total_bytes / partitions
    prefix_rate = args.prefix_rate or round(args.prefix_rate_factor * req_rate_for_bytes, 3)
    burst = args.prefix_burst if args.prefix_burst > 0 else max(2.0, prefix_rate)
    options: dict[str, Any] = {
        "latency_ms": args.latency_ms,
        "bandwidth": round(bandwidth),
        "request_bandwidth": round(args.request_bandwidth),
        "prefix_rate": prefix_rate,
        "prefix_depth": args.partition_depth,
        "prefix_burst": burst,
    }
    if args.limit_change:
        options["limit_schedule"] = ",".join(f"{t:g}:{f:g}" for t, f in args.limit_change)
    if args.storm:
        options["storm"] = f"{args.storm[0]:g}:{args.storm[1]:g}"
    if args.split_after:
        options["split_after"] = args.split_after
    model = flowstats.Throttles(
        rate_per_s=prefix_rate,
        depth=args.partition_depth,
        burst=burst,
        bandwidth=bandwidth,
        schedule=tuple(args.limit_change),
        storm=tuple(args.storm) if args.storm else None,
        split_after=args.split_after,
    )
    limit = min(prefix_rate * partitions, bandwidth / profile.shard_size)
    return options, model, limit


def _pair(text: str) -> tuple[float, float]:
    first, _, second = text.partition(":")
    try:
        return float(first), float(second)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not A:B: {text!r}") from exc


def _arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_profile_args(p)
    t = p.add_argument_group("emulator")
    t.add_argument("--latency-ms", type=float, default=35.0)
    t.add_argument("--bandwidth", type=parse_size, default=None, help="skip calibration")
    t.add_argument("--bandwidth-divisor", type=float, default=15.0)
    t.add_argument(
        "--request-bandwidth",
        type=parse_size,
        default=0.0,
        help="bytes/s of one request (one connection: S3 serves ~85-90 MB/s), 0 = none",
    )
    t.add_argument("--calibration-rounds", type=int, default=2, help="the fastest one is used")
    t.add_argument("--prefix-rate", type=float, default=None, help="req/s per partition")
    t.add_argument("--prefix-rate-factor", type=float, default=0.75)
    t.add_argument(
        "--partition-depth",
        type=int,
        default=1,
        help="key segments of the emulator's partitions (1: ckpt/, a fresh bucket; 3: a rank's)",
    )
    t.add_argument(
        "--prefix-burst",
        type=float,
        default=0.0,
        help="requests a partition's bucket holds (0: a second's worth, at least 2)",
    )
    t.add_argument(
        "--limit-change", type=_pair, action="append", default=[], help="T:FACTOR, repeatable"
    )
    t.add_argument("--storm", type=_pair, default=None, help="START:END: every request 503")
    t.add_argument("--split-after", type=float, default=None, help="s of load before a split")
    p.add_argument("--gateways", type=int, default=1, help="gateways sharing the emulator")
    p.add_argument(
        "--fleet",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="several gateways are one fleet, as deployed (--peers: each tells the others "
        "its shares of the bucket); --no-fleet: independent gateways",
    )
    p.add_argument("--lane-depth", type=int, default=3, help="the gateways' --lane-depth")
    p.add_argument("--gateway-arg", action="append", default=[], help="extra serve flag")
    p.add_argument(
        "--warm-up",
        action="store_true",
        help="first write and drain a checkpoint of the same shape through the gateways",
    )
    p.add_argument(
        "--restart-after-warm-up",
        action="store_true",
        help="restart the gateways (SIGTERM, same data dirs) after the warm-up",
    )
    p.add_argument(
        "--replace-one-after-warm-up",
        action="store_true",
        help="after the warm-up, gateway 0 starts again on an empty data dir (a node "
        "replaced); the others keep running",
    )
    p.add_argument("--legs", default="direct,gateway", help="direct,gateway or one of them")
    p.add_argument("--drain-timeout", type=float, default=600.0)
    p.add_argument(
        "--paused-ingest",
        action="store_true",
        help="flush only once the whole burst is acknowledged; drain counted from then",
    )
    p.add_argument(
        "--sim",
        default="",
        help="SEEDS: also run the case in the simulator (tests/sim), e.g. 1,2,3",
    )
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _arguments()
    args = parser.parse_args(argv)
    if args.restart_after_warm_up and args.replace_one_after_warm_up:
        parser.error("--restart-after-warm-up or --replace-one-after-warm-up, not both")
    if args.restart_after_warm_up or args.replace_one_after_warm_up:
        args.warm_up = True
    if args.warm_up and (args.limit_change or args.storm or args.split_after):
        parser.error("--warm-up: the limit's changes count from the first request")
    profile = profile_from_args(args)
    legs = set(args.legs.split(","))
    extra = [f"--lane-depth={args.lane_depth}", *args.gateway_arg]
    workdir = Path.cwd() / f".burst-bench-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    bodies = Bodies(profile.shard_size)
    res: dict[str, Any] = {
        "profile": profile.describe(),
        "gateways": args.gateways,
        "lane_depth": args.lane_depth,
        "gateway_args": args.gateway_arg,
        "bandwidth_divisor": args.bandwidth_divisor,
        "paused_ingest": args.paused_ingest,
        "warm_up": "restart"
        if args.restart_after_warm_up
        else "replace one"
        if args.replace_one_after_warm_up
        else args.warm_up,
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
        ranks = profile.ranks * args.gateways
        keys = [shard_key(1, r, i) for r in range(ranks) for i in range(profile.shards)]
        throttles, model, limit = _throttles(args, profile, bandwidth, keys)
        res["prefix_rate_given"] = bool(args.prefix_rate)
        res["throttles"] = throttles
        res["limit_per_s"] = round(limit, 3)
        res["minimum"] = _minimum(model, profile, keys, bandwidth)
        print(f"throttles: {throttles}; minimum {res['minimum']['seconds']:.1f} s", flush=True)
        if "direct" in legs:
            print("direct: ranks -> emulator ...", flush=True)
            direct_profile = dataclasses.replace(profile, ranks=ranks)
            d = direct_leg(workdir, direct_profile, throttles, bodies)
            res["direct"] = {**d, "burst": d["burst"].summary()}
        if "gateway" in legs:
            print(f"gateway: ranks -> {args.gateways} gateway(s) -> emulator ...", flush=True)
            res["gateway"] = gateway_leg(
                workdir,
                profile,
                throttles,
                bodies,
                extra,
                args.drain_timeout,
                gateways=args.gateways,
                limit_per_s=limit,
                paused_ingest=args.paused_ingest,
                fleet=args.fleet and args.gateways > 1,
                warm_up=args.warm_up,
                restart=args.restart_after_warm_up,
                replace_one=args.replace_one_after_warm_up,
            )
        if args.sim and res.get("gateway"):
            res["simulator"] = _simulated(args, profile, throttles, res["gateway"])
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


def _simulated(
    args: argparse.Namespace, profile: Profile, throttles: dict[str, Any], gateway: dict[str, Any]
) -> dict[str, Any]:
    """The simulator's figures for this case (``simcase.py``): its drain / minimum per
    seed, against the bench's."""
    import simcase  # the sibling module (loadtest/ is on sys.path); it loads tests/sim

    if profile.multipart:
        return {"error": "multipart profiles are not simulated"}
    figures = simcase.simulate(
        throttles,
        gateways=args.gateways,
        ranks=profile.ranks,
        shards=profile.shards,
        size_bytes=profile.shard_size,
        ingest_s=float(gateway["burst"]["stall_s"]),
        paused_ingest=args.paused_ingest,
        seeds=[int(s) for s in args.sim.split(",")],
        fleet=args.fleet and args.gateways > 1,
        warm_up=gateway.get("warm_up") is not None
        and ("replace one" if args.replace_one_after_warm_up else True),
    )
    return {
        "ratios": figures.ratios,
        "ratio": figures.ratio,
        "share_503_max": round(figures.share_503, 4),
        "finish_spread_max": round(figures.finish_spread, 3),
    }


def _minimum(
    model: flowstats.Throttles, profile: Profile, keys: list[str], bandwidth: float
) -> dict[str, Any]:
    partitions = len({prefix_of(k, model.depth) for k in keys})
    if not profile.multipart:
        seconds = flowstats.minimum_s(model, keys, profile.shard_size)
        how = "partitions' bursts, then their rates and the bandwidth, over time"
    else:  # several requests per object: requests and bytes bound separately
        objects = len(keys)
        requests = objects * (profile.parts_per_object + 2)
        bytes_s = objects * profile.shard_size / bandwidth
        requests_s = max(0.0, requests - model.burst * partitions) / (model.rate_per_s * partitions)
        seconds = max(bytes_s, requests_s)
        how = f"max(bytes {bytes_s:.1f} s, requests {requests_s:.1f} s)"
    return {"seconds": seconds, "how": how, "partitions": partitions, "objects": len(keys)}


if __name__ == "__main__":
    sys.exit(main())
