"""``ack_latency.py --drain-backlog N``: the same acks while the flusher drains a backlog.

The gateway's upstream is then the throttling emulator in its own process (bodies
discarded, ``--emulator-latency-ms`` per request, no throttle), so the upstream's work is
not counted as the gateway's. After the paused measurement:

1. N objects of 4 KiB are written (4 client connections at once), still paused;
2. flushing resumes, and every size is measured again, interleaved with the floor, while
   the flusher drains them (the run notes if the backlog ran out before the end);
3. once drained: M more objects, paused, then flushing resumes and the gateway's CPU until
   they are drained, divided by M: the flusher's CPU per small object (no client load).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KIB = 1024
HERE = Path(__file__).parent


@dataclass
class DrainResult:
    backlog: int
    sizes: list[Any] = field(default_factory=list)  # SizeResult, measured while draining
    flushed_during: int = 0
    pending_after: int = 0
    cpu_objects: int = 0
    flush_cpu_ms_per_object: float | None = None
    drain_seconds: float | None = None


class Emulator:
    """``emulator.py`` in its own process; ``url`` once it listens."""

    def __init__(self, log_path: Path, bucket: str, latency_ms: float) -> None:
        cmd = [sys.executable, str(HERE / "emulator.py"), "--port", "0", "--discard-bodies"]
        cmd += ["--buckets", bucket, "--latency-ms", str(latency_ms)]
        self._log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            self.proc.kill()
            raise RuntimeError(f"emulator did not start: {line!r}")
        self.url = line.split()[4]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def upstream_env() -> None:
    """The spawned gateway takes upstream credentials from the environment (the emulator
    accepts any): set them, and keep a developer's own AWS config out of the run."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="emulator",
        AWS_SECRET_ACCESS_KEY="emulator-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def seed(make_client: Callable[[], Any], prefix: str, count: int, threads: int = 4) -> None:
    """``count`` objects of 4 KiB, written by ``threads`` connections at once."""
    body = os.urandom(4 * KIB)
    import hashlib

    md5 = hashlib.md5(body).hexdigest()
    errors: list[BaseException] = []

    def work(start: int) -> None:
        client = make_client()
        try:
            for i in range(start, count, threads):
                client.put(f"{prefix}{i:07d}", body, md5)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            client.close()

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def run(
    *,
    pid: int,
    admin: str,
    admin_call: Callable[..., tuple[int, bytes]],
    admin_status: Callable[[str], dict[str, Any] | None],
    make_client: Callable[[], Any],
    measure_sizes: Callable[[], list[Any]],
    backlog: int,
    cpu_objects: int,
    prefix: str,
    say: Callable[[str], None],
) -> DrainResult:
    result = DrainResult(backlog=backlog, cpu_objects=cpu_objects)
    say(f"drain: writing a backlog of {backlog} x 4 KiB (flushing paused) ...")
    seed(make_client, f"{prefix}backlog/", backlog)
    before = admin_status(admin) or {}
    admin_call(admin, "POST", "/admin/v1/flush/resume")
    time.sleep(0.5)  # the flusher is at full speed before the first sample
    say("drain: measuring again while the flusher drains ...")
    result.sizes = measure_sizes()
    after = admin_status(admin) or {}
    result.flushed_during = after.get("flushed_objects", 0) - before.get("flushed_objects", 0)
    result.pending_after = after.get("pending_objects", 0)
    say("drain: waiting for the rest to flush ...")
    admin_call(admin, "GET", "/admin/v1/drain?wait=true&timeout=600", timeout=620)

    say(f"drain: flusher CPU, {cpu_objects} objects with no client load ...")
    admin_call(admin, "POST", "/admin/v1/flush/pause")
    seed(make_client, f"{prefix}cpu/", cpu_objects)
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    admin_call(admin, "POST", "/admin/v1/flush/resume")
    admin_call(admin, "GET", "/admin/v1/drain?wait=true&timeout=600", timeout=620)
    result.drain_seconds = time.monotonic() - t0
    result.flush_cpu_ms_per_object = 1000 * (cpu_seconds(pid) - cpu0) / cpu_objects
    admin_call(admin, "POST", "/admin/v1/flush/pause")
    return result


def render(result: DrainResult, paused: list[Any]) -> list[str]:
    lines = [
        "",
        f"With the flusher draining a backlog ({result.backlog} x 4 KiB; "
        f"{result.flushed_during} flushed while measuring, {result.pending_after} still "
        "pending at the end):",
        "",
        f"{'size':>8} | {'floor p99':>10} | {'paused p99':>10} {'draining p99':>12} "
        f"{'x paused':>8} | {'draining p50':>12} | {'draining/floor p99':>18}",
        "-" * 96,
    ]
    by_size = {r.size: r for r in paused}
    for r in result.sizes:
        base = by_size.get(r.size)
        paused_p99 = base.gateway.p99_ms if base and base.gateway else None
        ratio = r.gateway.p99_ms / paused_p99 if paused_p99 else None
        lines.append(
            f"{r.label:>8} | {r.floor.p99_ms:>10.3f} | "
            f"{(paused_p99 or 0):>10.3f} {r.gateway.p99_ms:>12.3f} "
            f"{(ratio or 0):>7.2f}x | {r.gateway.p50_ms:>12.3f} | "
            f"{r.gateway.p99_ms / r.floor.p99_ms:>17.2f}x"
        )
    if result.pending_after == 0:
        lines.append("  note: the backlog ran out before the measurement ended")
    if result.flush_cpu_ms_per_object is not None:
        lines.append(
            f"Flusher CPU per small object: {result.flush_cpu_ms_per_object:.2f} ms "
            f"({result.cpu_objects} objects drained in {result.drain_seconds:.1f} s, "
            "gateway process CPU, upstream in its own process)"
        )
    return lines
