"""A deterministic, fake-clock simulator of S3's request throttling, driving the REAL flow
control of the flusher (``gateway.flush.lanes.Lanes``: the admission, the bucket budgets,
the lanes' gates) for hours of simulated time in a fraction of a second.

The model of S3 (``S3Model``): every request lands in a **partition**, a key prefix at a
depth the clients do not know (``depth``; by default coarser than the gateway's lanes, as
in a fresh bucket), with a token bucket of ``rate_per_s`` and ``burst`` shared by every
client. A partition under sustained load (accepting at least half its rate for
``split_after_s`` seconds in a row) **splits** into the prefixes one level down where its
keys differ, each with the full rate. ``limits`` change the rate at given times
(``(t, factor)``), and during a **storm** (``(start, end)``) every request is answered 503.

The model of a gateway (``SimGateway``) is the flusher's loop with its I/O replaced by
events: claims in acknowledgement order while a lane has room (``concurrency`` per lane,
a bounded number of waiting uploads), each claimed object submitted to ``Lanes`` and
granted by ``Lanes.pump``; a granted request reaches S3 after ``up_s`` (plus jitter),
its answer comes back ``down_s`` later (plus ``body_s`` when accepted); a throttled
object goes back to pending for a full-jitter retry delay (as the flusher's journal
does). Nothing here reimplements a policy: every decision is the real classes'.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.flush.control import RateConfig
from gateway.flush.lanes import LaneConfig, Lanes, Ticket


def prefix_at(key: str, depth: int) -> str:
    """The first ``depth`` directory segments of ``key`` (with the trailing slash)."""
    directories = key.split("/")[:-1][:depth]
    return "/".join(directories) + "/" if directories else ""


class Partition:
    """One token bucket of S3: ``rate_per_s`` (times the current limit factor)."""

    def __init__(self, prefix: str, depth: int, rate_per_s: float, burst: float, now_s: float):
        self.prefix = prefix
        self.depth = depth
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = burst
        self.at_s = now_s
        self.loaded_since_s: float | None = None  # sustained load began (for splits)
        self.window: deque[float] = deque()  # acceptances in the last second

    def take(self, now_s: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now_s - self.at_s) * self.rate_per_s)
        self.at_s = now_s
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            self.window.append(now_s)
            return True
        return False


@dataclass
class S3Model:
    rate_per_s: float  # per partition
    depth: int  # partition depth (key segments)
    burst: float = 0.0  # 0: S3's, about a second's worth (at least 2)
    split_after_s: float | None = None
    limits: Sequence[tuple[float, float]] = ()  # (t, factor of rate_per_s from t on)
    storms: Sequence[tuple[float, float]] = ()  # every request refused in [start, end)
    bandwidth_per_s: float = 0.0  # accepted bodies the bucket takes per second (0: no cap)
    rates: dict[str, float] = field(default_factory=dict)  # partition prefix -> its own rate
    partitions: dict[str, Partition] = field(default_factory=dict)
    splits: dict[str, int] = field(default_factory=dict)  # prefix -> depth of its children
    accepted: list[tuple[float, int]] = field(default_factory=list)  # (t, gateway)
    refused: list[tuple[float, int]] = field(default_factory=list)
    keys_seen: dict[str, set[str]] = field(default_factory=dict)
    link_free_s: float = 0.0  # the shared link is busy with accepted bodies until then

    def body_done_s(self, now_s: float, body_s: float) -> float:
        """When an accepted body that starts arriving now is through: ``body_s`` on an
        idle link, or after the bodies ahead of it when the bandwidth cap is reached."""
        if self.bandwidth_per_s <= 0:
            return now_s + body_s
        self.link_free_s = max(self.link_free_s, now_s) + 1.0 / self.bandwidth_per_s
        return max(self.link_free_s, now_s + body_s)

    def __post_init__(self) -> None:
        if self.burst <= 0:
            self.burst = max(2.0, self.rate_per_s)

    def factor(self, now_s: float) -> float:
        factor = 1.0
        for t, f in self.limits:
            if now_s >= t:
                factor = f
        return factor

    def partition_of(self, key: str, now_s: float) -> Partition:
        depth = self.depth
        prefix = prefix_at(key, depth)
        while prefix in self.splits:
            depth = self.splits[prefix]
            prefix = prefix_at(key, depth)
        part = self.partitions.get(prefix)
        if part is None:
            part = self.partitions[prefix] = Partition(
                prefix, depth, self.rate_per_s, self.burst, now_s
            )
        return part

    def answer(self, key: str, now_s: float, gateway: int) -> bool:
        part = self.partition_of(key, now_s)
        part.rate_per_s = self.rates.get(part.prefix, self.rate_per_s) * self.factor(now_s)
        self.keys_seen.setdefault(part.prefix, set()).add(key)
        in_storm = any(start <= now_s < end for start, end in self.storms)
        ok = not in_storm and part.take(now_s)
        (self.accepted if ok else self.refused).append((now_s, gateway))
        self._maybe_split(part, now_s)
        return ok

    def _maybe_split(self, part: Partition, now_s: float) -> None:
        if self.split_after_s is None:
            return
        while part.window and part.window[0] < now_s - 1.0:
            part.window.popleft()
        if len(part.window) >= 0.5 * part.rate_per_s:
            if part.loaded_since_s is None:
                part.loaded_since_s = now_s
            elif now_s - part.loaded_since_s >= self.split_after_s:
                self._split(part)
        else:
            part.loaded_since_s = None

    def _split(self, part: Partition) -> None:
        keys = self.keys_seen.get(part.prefix, set())
        for depth in range(part.depth + 1, 16):
            if len({prefix_at(k, depth) for k in keys}) > 1:
                self.splits[part.prefix] = depth
                del self.partitions[part.prefix]
                return


@dataclass
class Net:
    """Request timing: to S3 ``up_s``, back ``down_s``, plus ``body_s`` when accepted,
    each with up to ``jitter_s`` more (seeded)."""

    up_s: float = 0.02
    down_s: float = 0.02
    body_s: float = 0.05
    jitter_s: float = 0.01


class Sim:
    """The event loop: ``at(t, fn)`` runs ``fn`` at simulated time ``t``."""

    def __init__(self, seed: int = 1) -> None:
        self.now_s = 0.0
        self.rng = random.Random(seed)
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._n = 0

    def at(self, t_s: float, fn: Callable[[], None]) -> None:
        self._n += 1
        heapq.heappush(self._events, (max(t_s, self.now_s), self._n, fn))

    def run(self, until_s: float, done: Callable[[], bool]) -> None:
        while self._events and not done():
            t_s, _, fn = heapq.heappop(self._events)
            if t_s > until_s:
                break
            self.now_s = t_s
            fn()


class SimGateway:
    """One gateway's flusher: its objects, the real ``Lanes``, events for its I/O."""

    def __init__(
        self,
        ident: int,
        sim: Sim,
        s3: S3Model,
        keys: Sequence[str],
        *,
        lane_depth: int = 3,
        net: Net | None = None,
        flow: RateConfig | None = None,
        concurrency: int = 32,
        lane_concurrency: int = 8,
        start_s: float = 0.0,
        retry_base_s: float = 0.2,
    ) -> None:
        self.ident = ident
        self.sim = sim
        self.s3 = s3
        self.net = net or Net()
        self.lanes = Lanes(
            LaneConfig(depth=lane_depth, concurrency=lane_concurrency), flow, concurrency
        )
        self.pending: list[tuple[float, int, str]] = [(start_s, i, k) for i, k in enumerate(keys)]
        heapq.heapify(self.pending)
        self.tasks = 0
        self.max_tasks = 4 * concurrency
        self.left = len(keys)
        self.finished_s: float | None = None
        self.done_s: dict[str, float] = {}  # key -> when it was accepted upstream
        self.requests = 0
        self.throttled = 0
        self._retry_base_s = retry_base_s
        self._pump_at = math.inf
        sim.at(start_s, self.work)

    def work(self) -> None:
        """Claim what may go (oldest first, lane room), then pump the admission."""
        now = self.sim.now_s
        held: list[tuple[float, int, str]] = []
        while self.pending and self.pending[0][0] <= now and self.tasks < self.max_tasks:
            entry = heapq.heappop(self.pending)
            lane = self.lanes.lane_for("b", entry[2], now)
            if not lane.has_room(now, 0):
                held.append(entry)
                continue
            lane.in_flight += 1
            self.tasks += 1
            ticket = self.lanes.submit(lane, entry[1], 1, 0, now)
            ticket.waker = entry
        for entry in held:
            heapq.heappush(self.pending, entry)
        if self.pending and self.pending[0][0] > now:
            self.sim.at(self.pending[0][0], self.work)
        self.pump()

    def pump(self) -> None:
        """Admit what may go; ask to be called again when ``Lanes.pump`` says (one timer
        at a time, as the flusher keeps one)."""
        granted, next_s = self.lanes.pump(self.sim.now_s)
        for ticket in granted:
            self.send(ticket)
        if next_s < self._pump_at:
            self._pump_at = next_s
            self.sim.at(next_s, lambda: self._timer(next_s))

    def _timer(self, at_s: float) -> None:
        if at_s == self._pump_at:  # else a later or earlier timer replaced this one
            self._pump_at = math.inf
            self.pump()

    def send(self, ticket: Ticket) -> None:
        now = self.sim.now_s
        self.lanes.on_sent(ticket, now)
        self.requests += 1
        jitter = self.sim.rng.uniform(0, self.net.jitter_s)
        self.sim.at(now + self.net.up_s + jitter, lambda: self.arrive(ticket))

    def arrive(self, ticket: Ticket) -> None:
        entry = ticket.waker
        assert isinstance(entry, tuple)
        now = self.sim.now_s
        ok = self.s3.answer(entry[2], now, self.ident)
        done_s = self.s3.body_done_s(now, self.net.body_s) if ok else now
        back_s = self.net.down_s + self.sim.rng.uniform(0, self.net.jitter_s)
        self.sim.at(done_s + back_s, lambda: self.answer(ticket, ok))

    def answer(self, ticket: Ticket, ok: bool) -> None:
        now = self.sim.now_s
        entry = ticket.waker
        assert isinstance(entry, tuple)
        self.lanes.on_answer(ticket, now, throttled=not ok)
        ticket.lane.in_flight -= 1
        self.tasks -= 1
        if ok:
            self.done_s[entry[2]] = now
            self.left -= 1
            if self.left == 0:
                self.finished_s = now
        else:
            self.throttled += 1
            retry_s = now + self.sim.rng.uniform(0, self._retry_base_s)
            heapq.heappush(self.pending, (retry_s, entry[1], entry[2]))
            self.sim.at(retry_s, self.work)
        self.work()


@dataclass
class Result:
    finish_s: list[float]
    requests: int
    throttled: int
    throttled_after: int  # answered 503 for requests sent after the first ``after_s``
    requests_after: int
    minimum_s: float
    jain: float
    accepted: list[tuple[float, int]]

    @property
    def drain_s(self) -> float:
        return max(self.finish_s)

    @property
    def ratio(self) -> float:
        return self.drain_s / self.minimum_s

    @property
    def share_503(self) -> float:
        return self.throttled / self.requests

    @property
    def share_503_after(self) -> float:
        return self.throttled_after / max(1, self.requests_after)

    @property
    def finish_spread(self) -> float:
        return max(self.finish_s) / min(self.finish_s)

    def rate_between(self, start_s: float, end_s: float) -> float:
        return sum(1 for t, _ in self.accepted if start_s <= t < end_s) / (end_s - start_s)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one has everything."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if values else 1.0


def checkpoint_keys(gateway: int, ranks: int, shards: int, step: int = 1) -> list[str]:
    """The keys one node writes: its ranks' shards, interleaved in ack order as the ranks
    write them (shard 0 of every rank, then shard 1, ...)."""
    first = gateway * ranks
    return [
        f"ckpt/step_{step}/rank_{first + r}/shard_{i:05d}"
        for i in range(shards)
        for r in range(ranks)
    ]


def run(
    s3: S3Model,
    *,
    gateways: int = 1,
    ranks: int = 16,
    shards: int = 16,
    seed: int = 1,
    after_s: float = 3.0,
    until_s: float = 3600.0,
    **gateway_opts: object,
) -> Result:
    """Every gateway writes its checkpoint at t=0 and flushes until done."""
    sim = Sim(seed)
    gws = [
        SimGateway(g, sim, s3, checkpoint_keys(g, ranks, shards), **gateway_opts)  # type: ignore[arg-type]
        for g in range(gateways)
    ]
    sim.run(until_s, lambda: all(g.finished_s is not None for g in gws))
    finish = [g.finished_s if g.finished_s is not None else math.inf for g in gws]
    keys = [k for g in range(gateways) for k in checkpoint_keys(g, ranks, shards)]
    common_s = min(finish)
    shares = Counter(gw for t, gw in s3.accepted if t < common_s)
    return Result(
        finish_s=finish,
        requests=sum(g.requests for g in gws),
        throttled=sum(g.throttled for g in gws),
        throttled_after=sum(1 for t, _ in s3.refused if t >= after_s),
        requests_after=sum(1 for t, _ in s3.accepted + s3.refused if t >= after_s),
        minimum_s=minimum_s(s3, keys),
        jain=jain([shares[g] / common_s for g in range(gateways)]),
        accepted=s3.accepted,
    )


def minimum_s(s3: S3Model, keys: Sequence[str]) -> float:
    """The least time any client needs for one request per key: the partitions' bursts at
    once, then their rates together (capped by the bandwidth), following the limit
    changes, storms and the split of a client that keeps every partition busy from t=0
    (split at ``split_after_s``). The work is assumed even over the partitions."""
    partitions = {prefix_at(k, s3.depth) for k in keys}
    children = sum(_children_after_split(p, keys, s3.depth) for p in partitions)
    marks = {0.0, *(t for t, _ in s3.limits), *(t for span in s3.storms for t in span)}
    if s3.split_after_s is not None:
        marks.add(s3.split_after_s)
    times = [*sorted(marks), math.inf]
    needed = max(0.0, len(keys) - s3.burst * len(partitions))
    for start, end in itertools.pairwise(times):
        split = s3.split_after_s is not None and start >= s3.split_after_s
        storm = any(a <= start < b for a, b in s3.storms)
        capacity = 0.0 if storm else s3.rate_per_s * s3.factor(start)
        capacity *= children if split else len(partitions)
        if s3.bandwidth_per_s > 0:
            capacity = min(capacity, s3.bandwidth_per_s)
        if capacity > 0 and capacity * (end - start) >= needed:
            return start + needed / capacity
        needed -= capacity * (end - start)
    raise AssertionError("unreachable: the last segment is infinite")


def _children_after_split(prefix: str, keys: Sequence[str], depth: int) -> int:
    mine = [k for k in keys if k.startswith(prefix)]
    for d in range(depth + 1, 16):
        n = len({prefix_at(k, d) for k in mine})
        if n > 1:
            return n
    return 1
