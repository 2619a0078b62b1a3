"""A deterministic, fake-clock simulator of S3's request throttling and of the network, for
the flusher's REAL request gate (``gateway.flush.gate.Gate``: the window of requests in
flight, each bucket's adaptive budget shared by its lanes, the lanes' gates, the caps),
run for hours of simulated time in seconds.

The model of S3 (``S3Model``): every request lands in a **partition**, a key prefix at a
depth the clients do not know (``depth``; by default coarser than the gateway's lanes, as
in a fresh bucket), with a token bucket of ``rate_per_s`` and ``burst`` shared by every
client (by default a second's worth, at least 2). A partition under sustained load
(accepting at least half its rate for ``split_after_s`` seconds in a row) **splits** into
the prefixes one level down where its keys differ, each with the full rate. ``limits``
change the rate at given times (``(t, factor)``), and during a **storm** (``(start,
end)``) every request is answered 503.

The network (``Net``): a request reaches S3 ``up_s`` after it leaves (plus up to
``jitter_s``), its answer comes back ``down_s`` later (plus jitter); an accepted body is
transferred in between over a **link** (``link_bytes_per_s``), each connection at most
``conn_bytes_per_s`` (S3 serves ~85-90 MB/s per connection): bodies in flight share the
link equally (processor sharing), as TCP flows do; 0 is no limit. The link is each node's
own (``link_per_gateway``), or one for all the gateways, as the bench's emulator has.

The gateway (``sim_gateway.SimGateway``) is the flusher's loop with its I/O replaced by
events; every flow decision is the real ``Gate``'s. ``run`` writes a checkpoint into one or
several gateways at t=0 and reports the drain against ``minimum_s``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def prefix_at(key: str, depth: int) -> str:
    """The first ``depth`` directory segments of ``key`` (with the trailing slash)."""
    directories = key.split("/")[:-1][:depth]
    return "/".join(directories) + "/" if directories else ""


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
    rates: dict[str, float] = field(default_factory=dict)  # partition prefix -> its own rate
    partitions: dict[str, Partition] = field(default_factory=dict)
    splits: dict[str, int] = field(default_factory=dict)  # prefix -> depth of its children
    accepted: list[tuple[float, int]] = field(default_factory=list)  # (t, gateway)
    refused: list[tuple[float, int]] = field(default_factory=list)
    keys_seen: dict[str, set[str]] = field(default_factory=dict)

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
        if self.split_after_s is not None:
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
    """Request timing (see the module docstring); 0 bytes/s is no limit."""

    up_s: float = 0.02
    down_s: float = 0.02
    jitter_s: float = 0.01
    conn_bytes_per_s: float = 0.0
    link_bytes_per_s: float = 0.0
    link_per_gateway: bool = False  # each node its own link; else one for all (the bench's)


class Link:
    """Bodies in flight sharing one link equally, each at most ``conn`` bytes/s
    (processor sharing, with a virtual clock: every body is served at the same rate, so
    one heap of finish marks in served bytes finds the next one)."""

    def __init__(self, sim: Sim, net: Net) -> None:
        self._sim = sim
        self._conn = net.conn_bytes_per_s or math.inf
        self._link = net.link_bytes_per_s or math.inf
        self._served = 0.0  # bytes served to each body in flight, since the start
        self._at_s = 0.0
        self._bodies: list[tuple[float, int, Callable[[], None]]] = []
        self._n = itertools.count()
        self._version = 0
        self.bytes_done = 0.0

    @property
    def unlimited(self) -> bool:
        return self._conn == math.inf and self._link == math.inf

    def send(self, size_bytes: int, done: Callable[[], None]) -> None:
        """Transfer ``size_bytes``; ``done()`` when they are through."""
        if size_bytes <= 0 or self.unlimited:
            done()
            return
        self._advance()
        heapq.heappush(self._bodies, (self._served + size_bytes, next(self._n), done))
        self.bytes_done += size_bytes
        self._schedule()

    def _rate(self) -> float:
        return min(self._conn, self._link / max(1, len(self._bodies)))

    def _advance(self) -> None:
        now_s = self._sim.now_s
        if self._bodies:
            self._served += (now_s - self._at_s) * self._rate()
        self._at_s = now_s

    def _schedule(self) -> None:
        self._version += 1
        if not self._bodies:
            return
        version = self._version
        finish_s = self._sim.now_s + (self._bodies[0][0] - self._served) / self._rate()
        self._sim.at(finish_s, lambda: self._finish(version))

    def _finish(self, version: int) -> None:
        if version != self._version:
            return  # the bodies changed since: a newer event stands
        self._advance()
        done: list[Callable[[], None]] = []
        while self._bodies and self._bodies[0][0] <= self._served + 1e-6:
            done.append(heapq.heappop(self._bodies)[2])
        self._schedule()
        for fn in done:
            fn()


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
    windows: list[int] = field(default_factory=list)  # each gateway's window at the end
    # Each gateway's learnt rates at the end (``Lanes.known_rates``): what its restart
    # would start from (``known_rates=`` of the next run).
    known_rates: list[dict[str, float]] = field(default_factory=list)

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


REPORT_S = 1.0  # a fleet member's lease renewals: every lease_s / 3 (3 s by default)


def _report(sim: Sim, g: Any, gws: Sequence[Any]) -> None:
    """``g`` tells every other gateway its shares (a one-way trip later), and again in a
    second while it has work left."""
    report = dict(g.shares.report())
    cuts = {bucket: (events, factor) for bucket, events, factor in g.shares.report_cuts()}
    for h in gws:
        if h is not g:
            sim.at(sim.now_s + 0.001, lambda h=h: h.shares.on_report(str(g.ident), report, cuts))
    if g.finished_s is None or report:
        sim.at(sim.now_s + REPORT_S, lambda: _report(sim, g, gws))


def run(
    s3: S3Model,
    *,
    gateways: int = 1,
    ranks: int = 16,
    shards: int = 16,
    seed: int = 1,
    net: Net | None = None,
    after_s: float = 3.0,
    until_s: float = 36000.0,
    fleet_shares: bool = True,
    known_rates: Sequence[Mapping[str, float]] = (),
    **gateway_opts: object,
) -> Result:
    """Every gateway writes its checkpoint at t=0 and flushes until done
    (``gateway_opts``: ``sim_gateway.SimGateway``'s). The drain counts from t=0, the
    minimum from the first request (the bench's figures: ``loadtest/bench.py``). Several
    gateways are a fleet (``fleet_shares``): each tells the others its shares once a
    second, at its own phase, as its lease renewals do (``flush/shares.py``). Gateway g
    starts from ``known_rates[g]`` if given: a restart after a run that learnt them
    (``flush/memory.py``)."""
    from sim_gateway import SimGateway  # the gateway model builds on this module

    sim = Sim(seed)
    link_net = net or Net()
    shared = None if link_net.link_per_gateway else Link(sim, link_net)
    gws = [
        SimGateway(
            g,
            sim,
            s3,
            checkpoint_keys(g, ranks, shards),
            net=link_net,
            link=shared,
            **gateway_opts,  # type: ignore[arg-type]
        )
        for g in range(gateways)
    ]
    for g, known in zip(gws, known_rates, strict=False):
        g.lanes.remember(known)
    if fleet_shares and gateways > 1:
        phases = random.Random(seed + 7919)  # not the simulation's own draws
        for g in gws:
            sim.at(phases.uniform(0, REPORT_S), lambda g=g: _report(sim, g, gws))
    sim.run(until_s, lambda: all(g.finished_s is not None for g in gws))
    finish = [g.finished_s if g.finished_s is not None else math.inf for g in gws]
    keys = [k for g in range(gateways) for k in checkpoint_keys(g, ranks, shards)]
    common_s = min(finish)
    shares = Counter(gw for t, gw in s3.accepted if t < common_s)
    size = gws[0].size_bytes
    return Result(
        finish_s=finish,
        requests=sum(g.requests for g in gws),
        throttled=sum(g.throttled for g in gws),
        throttled_after=sum(1 for t, _ in s3.refused if t >= after_s),
        requests_after=sum(1 for t, _ in s3.accepted + s3.refused if t >= after_s),
        minimum_s=minimum_s(s3, keys, gws[0].requests_per_object, size, link_net, ranks * shards),
        jain=jain([shares[g] / common_s for g in range(gateways)]),
        accepted=s3.accepted,
        windows=[g.gate.window.size for g in gws],
        known_rates=[g.lanes.known_rates() for g in gws],
    )


def minimum_s(
    s3: S3Model,
    keys: Sequence[str],
    requests_per_key: int,
    size_bytes: int,
    net: Net,
    keys_per_link: int = 1,
) -> float:
    """The least time any client needs, from its first request, for ``requests_per_key``
    requests per key carrying ``size_bytes`` per key: the partitions' bursts at once, then
    their rates together, capped by what the link carries, following the limit changes,
    storms and the split of a client that keeps every partition busy from t=0 (split at
    ``split_after_s``). The work is assumed even over the partitions (and over the links,
    ``keys_per_link`` each, when each gateway has its own)."""
    partitions = {prefix_at(k, s3.depth) for k in keys}
    children = sum(_children_after_split(p, keys, s3.depth) for p in partitions)
    marks = {0.0, *(t for t, _ in s3.limits), *(t for span in s3.storms for t in span)}
    if s3.split_after_s is not None:
        marks.add(s3.split_after_s)
    times = [*sorted(marks), math.inf]
    needed = max(0.0, len(keys) * requests_per_key - s3.burst * len(partitions))
    link = math.inf  # requests/s the link carries (their bodies in even shares)
    bytes_s = 0.0  # a partition's burst sends requests at once, never their bytes
    if net.link_bytes_per_s and size_bytes:
        links = len(keys) // keys_per_link if net.link_per_gateway else 1
        link = links * net.link_bytes_per_s * requests_per_key / size_bytes
        bytes_s = len(keys) * requests_per_key / link
    for start, end in itertools.pairwise(times):
        split = s3.split_after_s is not None and start >= s3.split_after_s
        storm = any(a <= start < b for a, b in s3.storms)
        capacity = 0.0 if storm else s3.rate_per_s * s3.factor(start)
        capacity = min(capacity * (children if split else len(partitions)), link)
        if capacity > 0 and capacity * (end - start) >= needed:
            return max(start + needed / capacity, bytes_s)
        needed -= capacity * (end - start)
    raise AssertionError("unreachable: the last segment is infinite")


def _children_after_split(prefix: str, keys: Sequence[str], depth: int) -> int:
    mine = [k for k in keys if k.startswith(prefix)]
    for d in range(depth + 1, 16):
        n = len({prefix_at(k, d) for k in mine})
        if n > 1:
            return n
    return 1
