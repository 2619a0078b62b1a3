"""PUT acknowledgement latency of the gateway, next to the disk's own floor.

What it measures, in one run and on one filesystem
--------------------------------------------------
1. **Disk floor.**  The minimum work a durable PUT needs on local disk: create a new file,
   write N bytes, ``fsync`` it, ``rename`` it into place and ``fsync`` the directory.  It is
   timed in a temporary directory *inside* the gateway's data directory, so it exercises the
   same filesystem, mount options and device as the gateway.
2. **Gateway ack.**  The latency a client sees for ``PutObject`` of the same sizes: from the
   first byte sent to the complete response received.  Each request is built and
   SigV4-signed with botocore (``x-amz-content-sha256: UNSIGNED-PAYLOAD``) *before* the
   timer starts, then sent on one persistent ``http.client.HTTPConnection``, so the figure
   is the server's and not the SDK's.  Every response must be ``200`` with an ETag equal to
   the MD5 of the body; anything else aborts the run.
3. **Side figures** (clearly labelled, not part of the ratio): boto3's own ``put_object``
   for 4 KiB (SDK overhead included: checksum calculation, signing, retries machinery), and
   the 4 KiB floor *plus* one SQLite WAL commit with ``synchronous=FULL`` -- roughly the
   least a gateway that also journals metadata durably must pay.

By default the script starts the gateway itself (``python -m gateway serve`` with an
embedded moto upstream and bucket ``demo``), pauses background flushing so it does not
compete with the measurement, deletes what it wrote (so nothing is ever uploaded), resumes
flushing and stops the gateway with SIGTERM.  With ``--gateway-endpoint``/``--admin`` it
measures an already-running gateway instead; ``--data-dir`` must then name that gateway's
data directory.  ``--floor-only`` measures the disk floor alone.

Floor and gateway samples are interleaved: each size is measured in ``--rounds`` blocks that
alternate floor and gateway iterations, so a slow phase of a shared machine hits both
columns rather than one.  The first ``--warmup`` iterations of every size are discarded.

Caveats
-------
* A shared or virtualised machine is noisy: neighbours' I/O shows up in p99 of both columns.
  Compare the ratio, not the absolute numbers, and rerun before drawing conclusions.
* Client and server share the machine and talk over loopback.  The gateway figure includes
  loopback TCP, the client's own send of the body (a few hundred microseconds for 4 MiB)
  and Python's HTTP parsing on the client side.
* One client, one connection, one request at a time: this is *serial latency*, not
  throughput.  Group commit and overlapping I/O in the gateway do not help here; they help
  under concurrency, which this benchmark does not exercise.
* Percentiles are nearest-rank over the kept samples; with 50 samples p99 is the maximum.
* The floor is a lower bound for one object, not a target: the gateway must also commit
  metadata (a second fsync, of the journal) unless it batches it cleverly.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import math
import os
import platform
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ack_drain
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

KIB = 1024
MIB = 1024 * KIB
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# Tells botocore's S3 signer not to hash the body even though the URL is plain http.
_UNSIGNED_CLIENT_CONFIG = Config(s3={"payload_signing_enabled": False})


class BenchError(RuntimeError):
    """The benchmark cannot produce a trustworthy number (bad response, gateway died...)."""


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    n: int
    p50_ms: float
    p99_ms: float
    min_ms: float
    mean_ms: float
    max_ms: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> Stats:
        if not samples_ns:
            raise BenchError("no samples")
        ordered = sorted(samples_ns)

        def rank(q: float) -> float:
            # Nearest-rank percentile: the smallest sample >= q of all samples.
            return ordered[max(0, math.ceil(q * len(ordered)) - 1)] / 1e6

        return cls(
            n=len(ordered),
            p50_ms=rank(0.50),
            p99_ms=rank(0.99),
            min_ms=ordered[0] / 1e6,
            mean_ms=sum(ordered) / len(ordered) / 1e6,
            max_ms=ordered[-1] / 1e6,
        )


@dataclass
class SizeResult:
    size: int
    label: str
    floor: Stats | None = None
    gateway: Stats | None = None
    gateway_reconnects: int = 0

    def ratio(self, attr: str) -> float | None:
        if self.floor is None or self.gateway is None:
            return None
        base = getattr(self.floor, attr)
        return getattr(self.gateway, attr) / base if base > 0 else None


@dataclass
class Report:
    machine: dict[str, Any]
    config: dict[str, Any]
    sizes: list[SizeResult] = field(default_factory=list)
    side: dict[str, Stats] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def size_label(size: int) -> str:
    if size % MIB == 0:
        return f"{size // MIB} MiB"
    if size % KIB == 0:
        return f"{size // KIB} KiB"
    return f"{size} B"


def parse_size(text: str) -> int:
    t = text.strip().lower().replace(" ", "")
    for suffix, mult in (("kib", KIB), ("mib", MIB), ("k", KIB), ("m", MIB), ("b", 1)):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


# --------------------------------------------------------------------------------------------
# Bodies
# --------------------------------------------------------------------------------------------


class Bodies:
    """Distinct bodies of one size without paying os.urandom(4 MiB) per iteration.

    One random base buffer; every body gets a unique 16-byte prefix, so every object (and
    every ETag) differs.  MD5 is computed before any timer starts.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._base = bytearray(os.urandom(size))
        self._seq = 0

    def next(self) -> tuple[bytes, str]:
        self._seq += 1
        stamp = self._seq.to_bytes(8, "big") + os.urandom(8)
        n = min(len(stamp), self.size)
        self._base[:n] = stamp[:n]
        body = bytes(self._base)
        return body, hashlib.md5(body).hexdigest()


# --------------------------------------------------------------------------------------------
# Disk floor
# --------------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class DiskFloor:
    """create + write + fsync + rename + fsync(dir), timed, in a private temp directory."""

    def __init__(self, parent: Path) -> None:
        parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=".ack-latency-floor-", dir=parent))
        self._dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        self._seq = 0
        self._written: list[Path] = []

    def once(self, body: bytes) -> int:
        self._seq += 1
        tmp = self.dir / f"{self._seq:08d}.tmp"
        final = self.dir / f"{self._seq:08d}.obj"
        t0 = time.perf_counter_ns()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, final)
        os.fsync(self._dir_fd)
        elapsed = time.perf_counter_ns() - t0
        self._written.append(final)
        return elapsed

    def clear(self) -> None:
        """Delete what was written (outside any timer), like a flushed cache would."""
        for path in self._written:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._written.clear()

    def with_journal(self, bodies: Bodies, iterations: int, warmup: int) -> Stats:
        """Side figure: the floor plus one SQLite WAL commit (synchronous=FULL) per object."""
        db = sqlite3.connect(self.dir / "journal.sqlite3", isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("CREATE TABLE objects (k TEXT PRIMARY KEY, size INT, etag TEXT)")
            samples: list[int] = []
            for i in range(warmup + iterations):
                body, etag = bodies.next()
                t0 = time.perf_counter_ns()
                self.once(body)
                db.execute("BEGIN IMMEDIATE")
                db.execute(
                    "INSERT INTO objects VALUES (?, ?, ?)", (f"k{self._seq}", len(body), etag)
                )
                db.execute("COMMIT")
                elapsed = time.perf_counter_ns() - t0
                if i >= warmup:
                    samples.append(elapsed)
            return Stats.of(samples)
        finally:
            db.close()
            self.clear()

    def close(self) -> None:
        os.close(self._dir_fd)
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Gateway client (lean: botocore only for signing)
# --------------------------------------------------------------------------------------------


class LeanPutClient:
    """Pre-signed PUTs on one persistent HTTP/1.1 connection; times send -> full response."""

    def __init__(
        self, endpoint: str, bucket: str, access_key: str, secret_key: str, region: str
    ) -> None:
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme != "http" or not parts.hostname:
            raise BenchError(f"--gateway-endpoint must be http://HOST:PORT, got {endpoint!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.netloc = parts.netloc
        self.endpoint = f"http://{self.netloc}"
        self.bucket = bucket
        self.signer = S3SigV4Auth(Credentials(access_key, secret_key), "s3", region)
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        self.reconnects = 0
        self.keys: list[str] = []

    def _signed_headers(self, path: str, length: int) -> dict[str, str]:
        request = AWSRequest(
            method="PUT",
            url=self.endpoint + path,
            headers={
                "Host": self.netloc,
                "Content-Length": str(length),
                "x-amz-content-sha256": UNSIGNED_PAYLOAD,
            },
        )
        request.context["client_config"] = _UNSIGNED_CLIENT_CONFIG
        self.signer.add_auth(request)
        headers = dict(request.headers.items())
        if headers.get("X-Amz-Content-SHA256") != UNSIGNED_PAYLOAD:
            raise BenchError(f"botocore did not sign with UNSIGNED-PAYLOAD: {headers}")
        return headers

    def put(self, key: str, body: bytes, md5_hex: str) -> int:
        path = "/" + urllib.parse.quote(f"{self.bucket}/{key}", safe="/~")
        headers = self._signed_headers(path, len(body))
        for attempt in (1, 2):
            if self.conn.sock is None:
                # Connect outside the timer; count it, as the connection is meant to persist.
                if self.keys:
                    self.reconnects += 1
                self.conn.connect()
            try:
                t0 = time.perf_counter_ns()
                self.conn.request("PUT", path, body=body, headers=headers)
                response = self.conn.getresponse()
                payload = response.read()
                elapsed = time.perf_counter_ns() - t0
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # An idle keep-alive connection the server had already closed: redo the
                # request once on a fresh connection (PUT is idempotent), timing it anew.
                self.conn.close()
                if attempt == 2:
                    raise
        self.keys.append(key)
        etag = (response.getheader("ETag") or "").strip('"')
        if response.status != 200 or etag != md5_hex:
            raise BenchError(
                f"PUT {path} ({len(body)} bytes): status {response.status}, ETag {etag!r}, "
                f"expected 200 and {md5_hex!r}; body: {payload[:500]!r}"
            )
        return elapsed

    def close(self) -> None:
        self.conn.close()


def boto3_client(endpoint: str, access_key: str, secret_key: str, region: str) -> Any:
    import boto3  # Imported lazily: the floor-only mode does not need it.

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=region,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1},  # A 503 must fail the run, not be hidden.
        ),
    )


def measure_boto3(
    client: Any, bucket: str, prefix: str, size: int, iterations: int, warmup: int
) -> tuple[Stats, list[str]]:
    bodies = Bodies(size)
    samples: list[int] = []
    keys: list[str] = []
    for i in range(warmup + iterations):
        body, md5_hex = bodies.next()
        key = f"{prefix}boto3-{size_label(size).replace(' ', '')}/{i:06d}"
        t0 = time.perf_counter_ns()
        response = client.put_object(Bucket=bucket, Key=key, Body=body)
        elapsed = time.perf_counter_ns() - t0
        keys.append(key)
        etag = str(response.get("ETag", "")).strip('"')
        if etag != md5_hex:
            raise BenchError(f"boto3 put_object {key}: ETag {etag!r}, expected {md5_hex!r}")
        if i >= warmup:
            samples.append(elapsed)
    return Stats.of(samples), keys


def delete_keys(client: Any, bucket: str, keys: Sequence[str]) -> tuple[int, str]:
    """Delete what the benchmark wrote, so pending objects are superseded, never uploaded.

    DeleteObjects in batches; if the gateway refuses it, one DeleteObject per key.
    Returns (keys not deleted, how).
    """
    from botocore.exceptions import ClientError

    try:
        failed = 0
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            response = client.delete_objects(
                Bucket=bucket, Delete={"Objects": batch, "Quiet": True}
            )
            failed += len(response.get("Errors", []))
        return failed, "DeleteObjects"
    except ClientError as exc:
        how = f"DeleteObject per key (DeleteObjects failed: {exc.response['Error']['Code']})"
    failed = 0
    for key in keys:
        try:
            client.delete_object(Bucket=bucket, Key=key)
        except ClientError:
            failed += 1
    return failed, how


# --------------------------------------------------------------------------------------------
# Gateway process and admin API
# --------------------------------------------------------------------------------------------


_HANDED_PORTS: set[int] = set()


def free_port() -> int:
    """A loopback port free a moment ago and never handed out before by this process.

    The kernel may hand the same ephemeral port to two binds in a row, and a gateway
    refuses one port for both listeners."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _HANDED_PORTS:
            _HANDED_PORTS.add(port)
            return port


def admin_call(admin: str, method: str, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    request = urllib.request.Request(admin.rstrip("/") + path, method=method, data=None)
    if method == "POST":
        request.data = b""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def admin_status(admin: str) -> dict[str, Any] | None:
    with contextlib.suppress(Exception):
        status, body = admin_call(admin, "GET", "/admin/v1/status")
        if status == 200:
            parsed: dict[str, Any] = json.loads(body)
            return parsed
    return None


class GatewayProcess:
    """`python -m gateway serve` on free loopback ports, with its output in a log file."""

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        access_key: str,
        secret_key: str,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"
        self.log_path = log_path
        self.argv = [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--admin-listen",
            f"127.0.0.1:{self.admin_port}",
            "--data-dir",
            str(data_dir),
            "--access-key",
            access_key,
            "--secret-key",
            secret_key,
            *extra_args,
        ]
        self._log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def wait_ready(self, timeout: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise BenchError(
                    f"gateway exited with code {self.proc.returncode} before /readyz was 200"
                )
            with contextlib.suppress(OSError):
                status, _ = admin_call(self.admin, "GET", "/readyz", timeout=2.0)
                if status == 200:
                    return time.monotonic() - t0
            time.sleep(0.1)
        raise BenchError(f"gateway /readyz not 200 after {timeout:.0f} s")

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of the gateway's output, access-log lines left out."""
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace").splitlines()
            kept = [line for line in text if "gateway.access" not in line]
            return "\n".join(kept[-lines:])
        return "(no log)"

    def stop(self, timeout: float) -> tuple[int | None, float]:
        """SIGTERM, wait for a clean exit; SIGKILL only if it does not come."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._log.close()
                return None, time.monotonic() - t0
        self._log.close()
        return self.proc.returncode, time.monotonic() - t0


# --------------------------------------------------------------------------------------------
# Machine facts
# --------------------------------------------------------------------------------------------


def _mount_of(path: Path) -> dict[str, str]:
    real = str(path.resolve())
    best: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) < 4:
                continue
            mount_point = fields[1].replace("\\040", " ")
            inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best.get("mount_point", "")):
                best = {
                    "device": fields[0],
                    "mount_point": mount_point,
                    "fstype": fields[2],
                    "options": fields[3],
                }
    return best


def _df_t(path: Path) -> str | None:
    with contextlib.suppress(Exception):
        out = subprocess.run(
            ["df", "-T", str(path)], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        return out.splitlines()[-1] if out else None
    return None


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def _rotational(device: str) -> str | None:
    name = os.path.basename(device)
    for candidate in (name, name.rstrip("0123456789"), name.rsplit("p", 1)[0]):
        path = Path("/sys/block") / candidate / "queue" / "rotational"
        with contextlib.suppress(OSError):
            return "yes" if path.read_text().strip() == "1" else "no"
    return None


def machine_facts(data_dir: Path) -> dict[str, Any]:
    mount = _mount_of(data_dir)
    vfs = os.statvfs(data_dir)
    facts: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "loadavg_start": os.getloadavg(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "data_dir": str(data_dir.resolve()),
        "filesystem": mount.get("fstype"),
        "device": mount.get("device"),
        "mount_point": mount.get("mount_point"),
        "mount_options": mount.get("options"),
        "rotational": _rotational(mount["device"]) if mount.get("device") else None,
        "fs_block_size": vfs.f_bsize,
        "fs_free_bytes": vfs.f_bavail * vfs.f_frsize,
        "df_T": _df_t(data_dir),
    }
    return facts


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def blocks(total: int, rounds: int) -> Iterator[int]:
    """Split `total` iterations into `rounds` blocks as evenly as possible."""
    rounds = max(1, min(rounds, total))
    for r in range(rounds):
        yield total // rounds + (1 if r < total % rounds else 0)


def run_size(
    size: int,
    iterations: int,
    warmup: int,
    rounds: int,
    floor: DiskFloor,
    client: LeanPutClient | None,
    prefix: str,
) -> SizeResult:
    result = SizeResult(size=size, label=size_label(size))
    bodies = Bodies(size)
    floor_ns: list[int] = []
    gateway_ns: list[int] = []
    reconnects_before = client.reconnects if client else 0
    key_base = f"{prefix}{result.label.replace(' ', '')}/"
    seq = 0

    def gateway_once() -> int:
        nonlocal seq
        assert client is not None
        body, md5_hex = bodies.next()
        seq += 1
        return client.put(f"{key_base}{seq:06d}", body, md5_hex)

    for _ in range(warmup):
        floor.once(bodies.next()[0])
        if client is not None:
            gateway_once()
    for block in blocks(iterations, rounds):
        for _ in range(block):
            floor_ns.append(floor.once(bodies.next()[0]))
        if client is not None:
            for _ in range(block):
                gateway_ns.append(gateway_once())
    floor.clear()
    result.floor = Stats.of(floor_ns)
    if client is not None:
        result.gateway = Stats.of(gateway_ns)
        result.gateway_reconnects = client.reconnects - reconnects_before
    return result


def _fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.3f}{unit}"


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render(report: Report) -> str:
    m = report.machine
    lines = [
        "",
        "PUT ack latency vs. disk floor (serial, one client connection; ms)",
        "",
        f"{'size':>8} {'n':>5} | {'floor p50':>10} {'floor p99':>10} | "
        f"{'gw ack p50':>10} {'gw ack p99':>10} | {'ratio p50':>9} {'ratio p99':>9}",
        "-" * 90,
    ]
    for r in report.sizes:
        assert r.floor is not None
        lines.append(
            f"{r.label:>8} {r.floor.n:>5} | {_fmt(r.floor.p50_ms):>10} {_fmt(r.floor.p99_ms):>10}"
            f" | {_fmt(r.gateway.p50_ms if r.gateway else None):>10}"
            f" {_fmt(r.gateway.p99_ms if r.gateway else None):>10}"
            f" | {_fmt_ratio(r.ratio('p50_ms')):>9} {_fmt_ratio(r.ratio('p99_ms')):>9}"
        )
    lines.append("")
    lines.append("min / mean / max (ms):")
    for r in report.sizes:
        assert r.floor is not None
        text = (
            f"  {r.label:>8}  floor {r.floor.min_ms:.3f} / {r.floor.mean_ms:.3f} / "
            f"{r.floor.max_ms:.3f}"
        )
        if r.gateway:
            text += (
                f"   gateway {r.gateway.min_ms:.3f} / {r.gateway.mean_ms:.3f} / "
                f"{r.gateway.max_ms:.3f}"
            )
        lines.append(text)
    if report.side:
        lines.append("")
        lines.append("Side figures (not in the ratio):")
        for name, stats in report.side.items():
            lines.append(
                f"  {name}: p50 {stats.p50_ms:.3f} ms, p99 {stats.p99_ms:.3f} ms (n={stats.n})"
            )
    lines += [
        "",
        "Machine:",
        f"  nproc {m['nproc']} (usable {m['cpus_usable']}), cpu {m['cpu_model']}",
        f"  python {m['python']} ({m['python_implementation']}), {m['platform']}",
        f"  data dir {m['data_dir']}",
        f"  filesystem {m['filesystem']} on {m['device']} at {m['mount_point']}"
        f" ({m['mount_options']}), rotational={m['rotational']}",
        f"  df -T: {m['df_T']}",
        f"  loadavg start {m['loadavg_start']}, end {m.get('loadavg_end')}",
    ]
    c = report.config
    if c.get("mode") != "floor-only":
        lines += [
            "",
            "Run:",
            f"  mode {c.get('mode')}, gateway {c.get('gateway_endpoint')}, "
            f"flush_state during run {c.get('flush_state_during_run')!r}",
        ]
        if "gateway_argv" in c:
            lines.append(f"  gateway argv: {' '.join(c['gateway_argv'])}")
            lines.append(
                f"  ready after {c.get('gateway_ready_seconds')} s; SIGTERM -> exit code "
                f"{c.get('gateway_exit_code')} after {c.get('gateway_stop_seconds')} s"
            )
        lines.append(
            f"  objects written {c.get('objects_written')}; status before cleanup: "
            f"{c.get('status_after_measurement')}; flushed while paused: "
            f"{c.get('flushed_objects_during_run')}"
        )
        lines.append(
            f"  cleanup: {c.get('cleanup', 'none')}; status after resume: "
            f"{c.get('status_after_run')}"
        )
    if report.notes:
        lines.append("")
        lines.append("Notes:")
        lines += [f"  - {note}" for note in report.notes]
    return "\n".join(lines)


def to_json(report: Report) -> dict[str, Any]:
    sizes = []
    for r in report.sizes:
        entry = asdict(r)
        entry["ratio_p50"] = r.ratio("p50_ms")
        entry["ratio_p99"] = r.ratio("p99_ms")
        sizes.append(entry)
    return {
        "benchmark": "ack_latency",
        "units": "milliseconds",
        "machine": report.machine,
        "config": report.config,
        "sizes": sizes,
        "side": {name: asdict(stats) for name, stats in report.side.items()},
        "notes": report.notes,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Gateway PUT ack latency vs. the disk's write+fsync+rename floor.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--sizes", default="4KiB,64KiB,256KiB,1MiB", help="comma-separated object sizes (KiB/MiB)"
    )
    p.add_argument(
        "--iterations",
        default="200,200,200,50",
        help="measured iterations per size (one value, or one per size)",
    )
    p.add_argument("--warmup", type=int, default=5, help="discarded iterations per size")
    p.add_argument(
        "--rounds", type=int, default=5, help="alternating floor/gateway blocks per size"
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        help="the gateway's data dir; the floor runs in a temp dir inside it. Default: a "
        "fresh dir under the current directory (not /tmp, which may be tmpfs), removed after",
    )
    p.add_argument("--floor-only", action="store_true", help="measure the disk floor only")
    p.add_argument("--gateway-endpoint", help="measure this running gateway (http://HOST:PORT)")
    p.add_argument("--admin", help="admin URL of the running gateway (with --gateway-endpoint)")
    p.add_argument("--bucket", default="demo", help="bucket to PUT into")
    p.add_argument("--access-key", default="bench", help="client access key for SigV4")
    p.add_argument("--secret-key", default="bench-secret-key", help="client secret key")
    p.add_argument("--region", default="us-east-1", help="SigV4 signing region")
    p.add_argument(
        "--boto3-iterations",
        type=int,
        default=200,
        help="boto3 put_object 4 KiB side figure iterations; 0 disables it",
    )
    p.add_argument(
        "--journal-iterations",
        type=int,
        default=200,
        help="floor+SQLite side figure iterations; 0 disables it",
    )
    p.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the spawned `gateway serve`, repeatable; write it as "
        "--gateway-arg=--durability=none",
    )
    p.add_argument("--ready-timeout", type=float, default=90.0, help="seconds to wait for /readyz")
    p.add_argument(
        "--stop-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the spawned gateway to exit after SIGTERM (then SIGKILL)",
    )
    p.add_argument(
        "--no-cleanup",
        action="store_true",
        help="keep the benchmark's objects (by default they are deleted before flushing "
        "resumes, so they never reach the upstream bucket)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work dir (data and log)")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument(
        "--drain-backlog",
        type=int,
        default=0,
        help="also measure while the flusher drains this many 4 KiB objects (ack_drain.py; "
        "the upstream is then the emulator in its own process)",
    )
    p.add_argument("--drain-cpu-objects", type=int, default=2000, help="see ack_drain.py")
    p.add_argument("--emulator-latency-ms", type=float, default=5.0, help="with --drain-backlog")
    args = p.parse_args(argv)
    if args.gateway_endpoint and not args.admin:
        p.error("--gateway-endpoint needs --admin")
    if args.gateway_endpoint and not args.data_dir and not args.floor_only:
        p.error("--gateway-endpoint needs --data-dir (the running gateway's data directory)")
    return args


def _size_plan(args: argparse.Namespace) -> list[tuple[int, int]]:
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    counts = [int(c) for c in str(args.iterations).split(",") if c.strip()]
    if len(counts) == 1:
        counts *= len(sizes)
    if len(counts) != len(sizes):
        raise SystemExit("--iterations needs one value or one per size")
    if any(s <= 0 for s in sizes) or any(c <= 0 for c in counts):
        raise SystemExit("sizes and iterations must be positive")
    return list(zip(sizes, counts, strict=True))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = _size_plan(args)
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    prefix = f"ack-latency/{run_id}/"

    own_gateway = not args.floor_only and not args.gateway_endpoint
    # The work dir holds the spawned gateway's log and, unless --data-dir is given, the data
    # dir. It lives under the current directory, not /tmp (often tmpfs: fsync would be free).
    work_dir: Path | None = None
    if own_gateway or args.data_dir is None:
        work_dir = Path(tempfile.mkdtemp(prefix=".ack-latency-", dir=Path.cwd()))
    if args.data_dir is not None:
        data_dir: Path = args.data_dir
        if own_gateway and data_dir.exists() and any(data_dir.iterdir()):
            if work_dir is not None:
                shutil.rmtree(work_dir, ignore_errors=True)
            raise SystemExit(f"--data-dir {data_dir} is not empty; give a fresh one")
    else:
        assert work_dir is not None
        data_dir = work_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)

    report = Report(
        machine=machine_facts(data_dir),
        config={
            "mode": "floor-only"
            if args.floor_only
            else ("external-gateway" if args.gateway_endpoint else "spawned-gateway"),
            "sizes": [s for s, _ in plan],
            "iterations": [n for _, n in plan],
            "warmup": args.warmup,
            "rounds": args.rounds,
            "run_id": run_id,
            "bucket": args.bucket,
            "key_prefix": prefix,
        },
    )

    gateway: GatewayProcess | None = None
    client: LeanPutClient | None = None
    floor: DiskFloor | None = None
    admin: str | None = None
    paused = False
    failed = False
    before: dict[str, Any] = {}
    emulator: ack_drain.Emulator | None = None
    drained: ack_drain.DrainResult | None = None
    try:
        if own_gateway:
            assert work_dir is not None
            gateway_args = list(args.gateway_arg)
            if args.drain_backlog > 0:
                emulator = ack_drain.Emulator(
                    work_dir / "emulator.log", args.bucket, args.emulator_latency_ms
                )
                ack_drain.upstream_env()
                gateway_args += ["--upstream-endpoint", emulator.url]
            gateway = GatewayProcess(
                data_dir,
                work_dir / "gateway.log",
                args.access_key,
                args.secret_key,
                gateway_args,
            )
            report.config["gateway_argv"] = gateway.argv[1:]
            _say(f"starting gateway: {' '.join(gateway.argv)}")
            waited = gateway.wait_ready(args.ready_timeout)
            _say(f"gateway ready after {waited:.1f} s ({gateway.endpoint}, admin {gateway.admin})")
            report.config["gateway_ready_seconds"] = round(waited, 2)
            endpoint, admin = gateway.endpoint, gateway.admin
        elif args.gateway_endpoint:
            endpoint, admin = args.gateway_endpoint, args.admin
            status, _ = admin_call(admin, "GET", "/readyz")
            if status != 200:
                raise BenchError(f"{admin}/readyz answered {status}")
        if admin is not None:
            status, body = admin_call(admin, "POST", "/admin/v1/flush/pause")
            if status not in (200, 204):
                raise BenchError(f"flush/pause answered {status}: {body[:300]!r}")
            paused = True
            before = admin_status(admin) or {}
            state = before.get("flush_state")
            report.config["flush_state_during_run"] = state
            if state != "paused":
                report.notes.append(f"flush_state after pause was {state!r}, not 'paused'")
            client = LeanPutClient(
                endpoint, args.bucket, args.access_key, args.secret_key, args.region
            )
            report.config["gateway_endpoint"] = endpoint

        floor = DiskFloor(data_dir)
        report.config["floor_dir"] = str(floor.dir)
        for size, iterations in plan:
            _say(f"measuring {size_label(size)} x {iterations} ...")
            report.sizes.append(
                run_size(size, iterations, args.warmup, args.rounds, floor, client, prefix)
            )

        if args.drain_backlog > 0 and gateway is not None and client is not None:
            assert admin is not None
            drain_client = client

            def measure_again() -> list[SizeResult]:
                assert floor is not None
                return [
                    run_size(s, n, args.warmup, args.rounds, floor, drain_client, prefix + "d/")
                    for s, n in plan
                ]

            drained = ack_drain.run(
                pid=gateway.proc.pid,
                admin=admin,
                admin_call=admin_call,
                admin_status=admin_status,
                make_client=lambda: LeanPutClient(
                    endpoint, args.bucket, args.access_key, args.secret_key, args.region
                ),
                measure_sizes=measure_again,
                backlog=args.drain_backlog,
                cpu_objects=args.drain_cpu_objects,
                prefix=prefix,
                say=_say,
            )
            report.config["flushed_objects_during_run"] = 0  # flushing was on by design

        if args.journal_iterations > 0:
            _say("side figure: 4 KiB floor + SQLite WAL commit ...")
            report.side["disk floor + SQLite WAL commit (synchronous=FULL), 4 KiB"] = (
                floor.with_journal(Bodies(4 * KIB), args.journal_iterations, args.warmup)
            )

        if client is not None and admin is not None:
            s3 = boto3_client(endpoint, args.access_key, args.secret_key, args.region)
            if args.boto3_iterations > 0:
                _say("side figure: boto3 put_object 4 KiB ...")
                stats, boto_keys = measure_boto3(
                    s3, args.bucket, prefix, 4 * KIB, args.boto3_iterations, args.warmup
                )
                report.side["boto3 put_object 4 KiB (client overhead included)"] = stats
                client.keys.extend(boto_keys)
            # Pausing must have held: nothing may have been uploaded while we measured.
            during = admin_status(admin) or {}
            uploaded = (during.get("flushed_objects") or 0) - (before.get("flushed_objects") or 0)
            report.config["flushed_objects_during_run"] = uploaded
            report.config["status_after_measurement"] = {
                k: during.get(k) for k in ("pending_objects", "pending_bytes", "cache_used_bytes")
            }
            if uploaded and args.drain_backlog == 0:
                report.notes.append(
                    f"{uploaded} objects were flushed upstream while flushing was paused"
                )
            for r in report.sizes:
                if r.gateway_reconnects:
                    report.notes.append(
                        f"{r.label}: the server closed the connection {r.gateway_reconnects} "
                        "times (reconnects happened outside the timer)"
                    )
            report.config["objects_written"] = len(client.keys)
            if not args.no_cleanup:
                _say(f"deleting the {len(client.keys)} benchmark objects ...")
                try:
                    errors, how = delete_keys(s3, args.bucket, client.keys)
                    report.config["cleanup"] = how
                    if errors:
                        report.notes.append(f"cleanup: {errors} keys could not be deleted")
                except Exception as exc:  # Cleanup must not hide the measurement.
                    report.notes.append(f"cleanup failed: {type(exc).__name__}: {exc}")
    except Exception as exc:  # Anything (bad response, dead gateway, SDK error) fails loudly.
        failed = True
        _say(f"BENCHMARK FAILED: {type(exc).__name__}: {exc}")
    finally:
        if client is not None:
            client.close()
        if floor is not None:
            floor.close()
        if admin is not None and paused:
            with contextlib.suppress(Exception):
                status, _ = admin_call(admin, "POST", "/admin/v1/flush/resume")
                if status not in (200, 204):
                    report.notes.append(f"flush/resume answered {status}")
            after = admin_status(admin)
            if after is not None:
                report.config["status_after_run"] = {
                    k: after.get(k)
                    for k in ("pending_objects", "pending_bytes", "cache_used_bytes")
                }
        if gateway is not None:
            code, took = gateway.stop(args.stop_timeout)
            if emulator is not None:
                emulator.stop()
            report.config["gateway_exit_code"] = code
            report.config["gateway_stop_seconds"] = round(took, 2)
            if code is None:
                report.notes.append(
                    f"gateway did not exit within {args.stop_timeout:.0f} s of SIGTERM; killed"
                )
            elif code != 0:
                report.notes.append(f"gateway exited with code {code} after SIGTERM")
            if failed or code != 0:
                _say(f"--- gateway log tail ({gateway.log_path}) ---\n{gateway.log_tail()}")
        report.machine["loadavg_end"] = os.getloadavg()
        if work_dir is not None:
            if args.keep or failed:
                _say(f"work dir kept: {work_dir}")
            else:
                shutil.rmtree(work_dir, ignore_errors=True)

    if failed:
        return 1
    print(render(report))
    if drained is not None:
        print("\n".join(ack_drain.render(drained, report.sizes)))
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(report), indent=2) + "\n")
        _say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
