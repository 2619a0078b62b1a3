"""Checkpoint-burst generator: N ranks write their shards at once, as a training job does.

Rank ``R`` writes ``shards`` objects ``ckpt/step_<K>/rank_<R>/shard_<i>`` one after the
other (one thread and one boto3 client per rank, like one process per GPU), either with
``put_object`` or, for multipart profiles, with boto3's ``upload_fileobj`` and a
``TransferConfig`` (parts uploaded by ``part_concurrency`` threads per rank). Every write's
acknowledgement latency is recorded; a write that fails after the SDK's own retries is
recorded as failed, never raised.

Bodies are deterministic (a seeded random block with the key stamped at the front), so the
expected ETag of every object can be recomputed later without keeping the bodies.

Run alone: ``python loadtest/burst.py --endpoint http://127.0.0.1:9000 --access-key K
--secret-key S --bucket demo [--profile quick]``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

KIB = 1024
MIB = 1024 * KIB
_STAMP = 64  # bytes at the front of each body that name the object


@dataclass(frozen=True, slots=True)
class Profile:
    """What one checkpoint looks like."""

    name: str
    ranks: int
    shards: int  # per rank
    shard_size: int
    multipart: bool = False
    part_size: int = 8 * MIB
    part_concurrency: int = 4

    @property
    def objects(self) -> int:
        return self.ranks * self.shards

    @property
    def total_bytes(self) -> int:
        return self.objects * self.shard_size

    @property
    def parts_per_object(self) -> int:
        return max(1, -(-self.shard_size // self.part_size)) if self.multipart else 1

    @property
    def write_requests(self) -> int:
        """Upstream write requests the checkpoint needs at least (no retries)."""
        per_object = self.parts_per_object + 2 if self.multipart else 1
        return self.objects * per_object

    def describe(self) -> str:
        how = f"multipart {self.part_size // MIB} MiB parts" if self.multipart else "put_object"
        return (
            f"{self.name}: {self.ranks} ranks x {self.shards} shards x "
            f"{_size(self.shard_size)} ({how}) = {self.objects} objects, "
            f"{_size(self.total_bytes)}"
        )


PROFILES = {
    # The default of `make bench`: small enough that both legs finish in about a minute.
    "quick": Profile("quick", ranks=16, shards=16, shard_size=256 * KIB),
    # The "many small objects" checkpoint: 16 x 200 x 256 KiB (800 MiB, 3200 PUTs).
    "many-small": Profile("many-small", ranks=16, shards=200, shard_size=256 * KIB),
    # The flow-control cases of BENCHMARKS.md section 2: long enough for a limit that
    # changes mid-run, a storm and a split to matter (~70 s at the bench's limit).
    "medium": Profile("medium", ranks=16, shards=64, shard_size=256 * KIB),
    # One node of a cluster (8 GPUs) with `bench.py --gateways N`.
    "node": Profile("node", ranks=8, shards=32, shard_size=256 * KIB),
    # Large shards written with multipart uploads (3 parts of 8 MiB each).
    "multipart": Profile(
        "multipart", ranks=8, shards=2, shard_size=24 * MIB, multipart=True, part_size=8 * MIB
    ),
}


def shard_key(step: int, rank: int, index: int) -> str:
    return f"ckpt/step_{step}/rank_{rank}/shard_{index:05d}"


class Bodies:
    """Deterministic shard bodies: one seeded random block, the key stamped on each copy."""

    def __init__(self, size: int, seed: int = 4) -> None:
        self.size = size
        self._block = random.Random(seed).randbytes(size)

    def body(self, key: str) -> bytes:
        stamp = key.encode()[:_STAMP].ljust(_STAMP, b"\0")
        return (stamp + self._block[_STAMP:])[: self.size]

    def etag(self, key: str, profile: Profile) -> str:
        body = self.body(key)
        if not profile.multipart or len(body) < profile.part_size:
            # boto3 switches to multipart at multipart_threshold (= part_size here).
            return hashlib.md5(body).hexdigest()
        step = profile.part_size
        digests = [hashlib.md5(body[i : i + step]).digest() for i in range(0, len(body), step)]
        return hashlib.md5(b"".join(digests)).hexdigest() + f"-{len(digests)}"


@dataclass(slots=True)
class Write:
    rank: int
    key: str
    size: int
    start: float  # seconds since the burst started
    end: float
    ok: bool
    error: str | None = None

    @property
    def latency(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class BurstResult:
    profile: Profile
    endpoint: str
    writes: list[Write]
    started_wall: float  # time.time() at the start, to line up with server logs
    stall: float  # seconds until the last write was acknowledged (or given up)
    client_503: int  # 503 answers the SDK saw (retried or not)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(not w.ok for w in self.writes)

    @property
    def acked_bytes(self) -> int:
        return sum(w.size for w in self.writes if w.ok)

    def latency_ms(self, q: float) -> float | None:
        values = sorted(w.latency for w in self.writes if w.ok)
        return percentile(values, q) * 1000 if values else None

    def summary(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "profile": self.profile.describe(),
            "objects": len(self.writes),
            "failed_writes": self.failed,
            "bytes": self.profile.total_bytes,
            "stall_s": round(self.stall, 3),
            "ingest_MBps": round(self.acked_bytes / self.stall / 1e6, 2) if self.stall else None,
            "ack_p50_ms": _round(self.latency_ms(50)),
            "ack_p99_ms": _round(self.latency_ms(99)),
            "ack_max_ms": _round(self.latency_ms(100)),
            "client_503": self.client_503,
            "errors": self.errors,
        }


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(min(rank, len(sorted_values))) - 1]


def make_client(
    endpoint: str,
    access_key: str,
    secret_key: str,
    *,
    total_attempts: int | None = None,
    pool: int = 10,
) -> Any:
    retries: dict[str, Any] = {"mode": "standard"}
    if total_attempts is not None:
        retries["total_max_attempts"] = total_attempts
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(
            retries=retries,
            max_pool_connections=pool,
            s3={"addressing_style": "path"},
            connect_timeout=10,
            read_timeout=300,
        ),
    )


def run_burst(
    endpoint: str,
    bucket: str,
    profile: Profile,
    *,
    access_key: str,
    secret_key: str,
    step: int = 1,
    total_attempts: int | None = None,
    bodies: Bodies | None = None,
    first_rank: int = 0,
) -> BurstResult:
    """Write one checkpoint with ``profile.ranks`` threads (ranks ``first_rank`` on: one
    node's share of a cluster's checkpoint); return when all are done."""
    bodies = bodies or Bodies(profile.shard_size)
    transfer = TransferConfig(
        multipart_threshold=profile.part_size,
        multipart_chunksize=profile.part_size,
        max_concurrency=profile.part_concurrency,
    )
    pool = profile.part_concurrency + 2 if profile.multipart else 2
    clients = [
        make_client(endpoint, access_key, secret_key, total_attempts=total_attempts, pool=pool)
        for _ in range(profile.ranks)
    ]
    lock = threading.Lock()
    seen_503 = [0]
    errors: dict[str, int] = {}

    def count_503(response: Any = None, **_: Any) -> None:
        if response is not None and response[0].status_code == 503:
            with lock:
                seen_503[0] += 1

    for client in clients:
        client.meta.events.register("needs-retry.s3", count_503)
    t0: list[float] = []
    wall: list[float] = []

    def release() -> None:  # runs once, just before all ranks start
        wall.append(time.time())
        t0.append(time.perf_counter())

    barrier = threading.Barrier(profile.ranks, action=release)
    per_rank: list[list[Write]] = [[] for _ in range(profile.ranks)]

    def rank_main(rank: int) -> None:
        client = clients[rank]
        keys = [shard_key(step, first_rank + rank, i) for i in range(profile.shards)]
        barrier.wait()
        for key in keys:
            body = bodies.body(key)
            start = time.perf_counter() - t0[0]
            error = None
            try:
                if profile.multipart:
                    client.upload_fileobj(io.BytesIO(body), bucket, key, Config=transfer)
                else:
                    client.put_object(Bucket=bucket, Key=key, Body=body)
            except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
                error = _error_name(exc)
                with lock:
                    errors[error] = errors.get(error, 0) + 1
            end = time.perf_counter() - t0[0]
            per_rank[rank].append(Write(rank, key, len(body), start, end, error is None, error))

    threads = [
        threading.Thread(target=rank_main, args=(r,), name=f"rank-{r}")
        for r in range(profile.ranks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writes = [w for ws in per_rank for w in ws]
    stall = max((w.end for w in writes), default=0.0)
    return BurstResult(profile, endpoint, writes, wall[0], stall, seen_503[0], errors)


def _error_name(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "ClientError"))
    if isinstance(exc, S3UploadFailedError):
        text = str(exc)
        return "S3UploadFailed(SlowDown)" if "SlowDown" in text else "S3UploadFailed"
    return type(exc).__name__


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} GiB"  # pragma: no cover


def profile_from_args(args: argparse.Namespace) -> Profile:
    profile = PROFILES[args.profile]
    changes: dict[str, Any] = {}
    for name in ("ranks", "shards", "part_concurrency"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.shard_size is not None:
        changes["shard_size"] = int(args.shard_size)
    if args.part_size is not None:
        changes["part_size"] = int(args.part_size)
    if args.multipart:
        changes["multipart"] = True
    if changes:
        changes["name"] = profile.name + "*"
    return replace(profile, **changes)


def add_profile_args(p: argparse.ArgumentParser) -> None:
    from emulator import parse_size  # the sibling module (loadtest/ is on sys.path)

    g = p.add_argument_group("checkpoint shape")
    g.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    g.add_argument("--ranks", type=int, default=None)
    g.add_argument("--shards", type=int, default=None, help="objects per rank")
    g.add_argument("--shard-size", type=parse_size, default=None, help="e.g. 256KiB")
    g.add_argument("--multipart", action="store_true", help="upload_fileobj with parts")
    g.add_argument("--part-size", type=parse_size, default=None, help="e.g. 8MiB")
    g.add_argument("--part-concurrency", type=int, default=None, help="part threads per rank")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write one checkpoint burst and print ack latency.")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--access-key", default="k")
    p.add_argument("--secret-key", default="s")
    p.add_argument("--step", type=int, default=1)
    add_profile_args(p)
    args = p.parse_args(argv)
    profile = profile_from_args(args)
    result = run_burst(
        args.endpoint,
        args.bucket,
        profile,
        access_key=args.access_key,
        secret_key=args.secret_key,
        step=args.step,
    )
    print(json.dumps(result.summary(), indent=2))
    return 1 if result.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
