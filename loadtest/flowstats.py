"""What a burst bench run says about flow control, from the emulator's request log alone
(pure functions; tests/loadtest/test_flowstats.py checks them on small logs).

- ``minimum_s``: the least time any client needs for the checkpoint's write requests
  against the emulator's throttles: every partition's burst at once, then the partitions'
  rates together, capped by the bandwidth, following the limit schedule, a storm and a
  split (of a client that keeps every partition busy from the limiter's first request).
- ``flow_figures``: per gateway (a gateway owns a range of ranks), the 503 share overall
  and after its first 3 s, when its last write finished, Jain's fairness index of the
  gateways' accepted rates while all were draining, and how long after a storm the
  accepted rate was back at 90 % of the limit.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from throttle import prefix_of

WRITE_OPS = {"PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"}
ADAPT_S = 3.0  # "after the first 3 s of a burst", per gateway


@dataclass(frozen=True, slots=True)
class Throttles:
    """The emulator's throttles as the bench set them (times after the limiter's t0)."""

    rate_per_s: float  # per partition
    depth: int
    burst: float
    bandwidth: float  # bytes/s (0: none)
    schedule: tuple[tuple[float, float], ...] = ()
    storm: tuple[float, float] | None = None
    split_after: float | None = None

    def factor(self, t_s: float) -> float:
        factor = 1.0
        for at, f in self.schedule:
            if t_s >= at:
                factor = f
        return factor


def split_children(keys: Sequence[str], prefix: str, depth: int) -> int:
    """How many partitions ``prefix`` splits into: the next depth where its keys differ."""
    mine = [k for k in keys if k.startswith(prefix)]
    for d in range(depth + 1, depth + 16):
        n = len({prefix_of(k, d) for k in mine})
        if n > 1:
            return n
    return 1


def minimum_s(throttles: Throttles, keys: Sequence[str], request_bytes: int) -> float:
    """Seconds from the first request until the last of ``len(keys)`` write requests (one
    per key, ``request_bytes`` each) can be through, at best (see the module docstring)."""
    t = throttles
    partitions = {prefix_of(k, t.depth) for k in keys}
    children = sum(split_children(keys, p, t.depth) for p in partitions)
    marks = {0.0, *(at for at, _ in t.schedule)}
    if t.storm is not None:
        marks |= set(t.storm)
    if t.split_after is not None:
        marks.add(t.split_after)
    needed = max(0.0, len(keys) - t.burst * len(partitions))
    # The partitions' bursts let requests go at once, never their bytes.
    bytes_s = len(keys) * request_bytes / t.bandwidth if t.bandwidth > 0 else 0.0
    for start, end in itertools.pairwise([*sorted(marks), math.inf]):
        split = t.split_after is not None and start >= t.split_after
        storm = t.storm is not None and t.storm[0] <= start < t.storm[1]
        capacity = 0.0 if storm else t.rate_per_s * t.factor(start)
        capacity *= children if split else len(partitions)
        if t.bandwidth > 0:
            capacity = min(capacity, t.bandwidth / request_bytes)
        if capacity > 0 and capacity * (end - start) >= needed:
            return max(start + needed / capacity, bytes_s)
        needed -= capacity * (end - start)
    raise AssertionError("unreachable: the last segment is infinite")


def gateway_of(key: str, ranks_per_gateway: int) -> int:
    """The gateway that wrote ``key`` (``ckpt/step_K/rank_R/...``: R // ranks)."""
    rank = key.split("/")[2]
    return int(rank.removeprefix("rank_")) // ranks_per_gateway


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one has everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def flow_figures(
    log: Sequence[dict[str, Any]],
    *,
    gateways: int,
    ranks_per_gateway: int,
    started_wall: float,
    limit_per_s: float | None = None,
    storm_wall: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The figures of one gateway leg (times in seconds from the burst's start)."""
    writes = [e for e in log if e["op"] in WRITE_OPS and e["key"].startswith("ckpt/")]
    per_gw: dict[int, list[dict[str, Any]]] = {g: [] for g in range(gateways)}
    for e in writes:
        per_gw[gateway_of(e["key"], ranks_per_gateway)].append(e)
    out: dict[str, Any] = {"gateways": []}
    after_requests = after_503 = 0
    finish: list[float] = []
    for g, entries in per_gw.items():
        first = min((e["ts"] for e in entries), default=started_wall)
        late = [e for e in entries if e["ts"] >= first + ADAPT_S]
        if storm_wall is not None:  # 503s during a storm are the storm's, not the controller's
            late = [e for e in late if not storm_wall[0] <= e["ts"] < storm_wall[1]]
        refused = sum(e["code"] == "SlowDown" for e in entries)
        late_refused = sum(e["code"] == "SlowDown" for e in late)
        done = max((e["ts_end"] for e in entries if e["status"] == 200), default=first)
        finish.append(done - started_wall)
        after_requests += len(late)
        after_503 += late_refused
        out["gateways"].append(
            {
                "gateway": g,
                "requests": len(entries),
                "slowdown_503": refused,
                "after_3s_requests": len(late),
                "after_3s_503": late_refused,
                "finished_s": round(done - started_wall, 3),
            }
        )
    slowdowns = sum(e["code"] == "SlowDown" for e in writes)
    out["requests"] = len(writes)
    out["slowdown_503"] = slowdowns
    out["slowdown_fraction"] = round(slowdowns / len(writes), 4) if writes else 0.0
    out["after_3s_requests"] = after_requests
    out["after_3s_503"] = after_503
    out["after_3s_fraction"] = round(after_503 / after_requests, 4) if after_requests else 0.0
    out["finish_spread"] = round(max(finish) / min(finish), 3) if min(finish, default=0) else None
    common_end = started_wall + min(finish, default=0.0)
    accepted = Counter(
        gateway_of(e["key"], ranks_per_gateway)
        for e in writes
        if e["status"] == 200 and e["ts_end"] <= common_end
    )
    out["jain"] = round(jain([float(accepted[g]) for g in range(gateways)]), 4)
    if storm_wall is not None and limit_per_s:
        out["storm_recovery_s"] = recovery_s(writes, storm_wall[1], limit_per_s)
    return out


def recovery_s(
    writes: Sequence[dict[str, Any]], storm_end_wall: float, limit: float
) -> float | None:
    """Seconds after the storm's end until a one-second window (stepping by 0.25 s)
    accepted at least 90 % of ``limit`` (None if it never did within 60 s)."""
    accepted = sorted(e["ts"] for e in writes if e["status"] == 200 and e["ts"] >= storm_end_wall)
    for i in range(240):
        start = storm_end_wall + i * 0.25
        n = sum(1 for t in accepted if start <= t < start + 1.0)
        if n >= 0.9 * limit:
            return round(i * 0.25 + 1.0, 2)
    return None
