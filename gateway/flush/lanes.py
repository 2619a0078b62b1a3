"""Prefix lanes: pending objects partitioned by bucket and key prefix.

A lane keeps what belongs to one prefix: the order of its waiting requests (oldest work
first), its concurrency, a pause after ``Retry-After``, its hard caps (``--lane-rate``,
``--lane-bandwidth``) and, only once S3 is seen throttling that prefix on its own, an
adaptive rate of its own (``isolation``). Every other lane of a bucket shares the bucket's
adaptive budget (``admission.py``): S3 does not show how it partitions a bucket, so the
lanes are for ordering, fairness and isolation, not for guessing limits.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.flush.admission import BucketBudget, BudgetStatus, Caps
from gateway.flush.control import AdaptiveRate, Answers, RateConfig
from gateway.flush.ratelimit import Pacer, TokenBucket

log = logging.getLogger(__name__)

_MAX_IDLE_LANES = 4096  # idle lanes are forgotten beyond this (a new step makes new lanes)
_THROTTLE_MEMORY_S = 300.0  # a throttled lane's state is kept at least this long


def lane_prefix(key: str, depth: int) -> str:
    """The lane of ``key``: its first ``depth`` directory segments, with the trailing ``/``.

    The file name is never part of it, so the ranks of a checkpoint laid out as
    ``ckpt/step_K/rank_R/shard`` spread over lanes at depth 3; keys without a directory
    share the bucket's root lane ``""``.
    """
    directories = key.split("/")[:-1]
    chosen = directories[: max(depth, 0)]
    return "/".join(chosen) + "/" if chosen else ""


@dataclass(frozen=True, slots=True)
class LaneConfig:
    depth: int = 3
    rate_per_s: float = 3500.0  # hard cap per lane; S3's documented per-prefix write limit
    min_rate_per_s: float = 0.1  # floor of an isolated lane's adaptive rate
    bandwidth_bytes_per_s: int = 0  # 0: unlimited
    concurrency: int = 0  # uploads of one lane claimed at once; 0: the gate's window


@dataclass(frozen=True, slots=True)
class LaneStatus:
    bucket: str
    prefix: str
    rate_limit_per_s: float  # what this lane may send now: its own rate, or the bucket's
    in_flight: int
    throttles: int
    paused_until_s: float | None
    is_isolated: bool = False  # throttled on its own: paced by its own adaptive rate
    waiting_requests: int = 0  # requests waiting for admission


@dataclass(eq=False, slots=True)
class Ticket:
    """One request waiting for admission, then in flight (identity matters, not value)."""

    lane: Lane
    order: int  # smaller goes first: the object's acknowledgement sequence
    requests: int
    size_bytes: int
    serial: int = 0  # ties within one order (the parts of one upload) go in arrival order
    is_claimed: bool = False  # a claimed row's request (it holds no slot while it waits)
    granted_s: float | None = None
    sent_s: float | None = None
    is_bound: bool = False  # admitted while the window of requests in flight was the limit
    is_progressed: bool = False  # reported on its way (a slow body) before its answer
    is_cancelled: bool = False
    is_done: bool = False  # answered (or given up after admission): reported once
    waker: object = field(default=None, repr=False)  # the async shell's handle

    @property
    def is_granted(self) -> bool:
        return self.granted_s is not None


class Lane:
    """One prefix lane's state (mutated only on the event loop, read by the claim policy).

    ``in_flight`` (uploads claimed and not finished) and ``paused_until_s`` are what the
    claim side uses; the rest belongs to the admission (``admission.BucketBudget``).
    """

    def __init__(self, bucket: str, prefix: str, config: LaneConfig, now_s: float) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.config = config
        self.in_flight = 0
        self.throttles = 0
        self.paused_until_s = 0.0
        self.round = 0.0  # start-time fair queueing: the round its next request is in
        self.last_used_s = now_s
        self.last_throttle_s: float | None = None
        self.isolation: AdaptiveRate | None = None
        self.answers = Answers()  # its own, to start an isolated rate from
        self.heap_key: tuple[float, int, int] | None = None  # its entry in the bucket's heap
        self._waiting: list[tuple[int, int, Ticket]] = []
        self._hard_cap = TokenBucket(config.rate_per_s, max(config.rate_per_s, 1.0), now_s)
        self._bandwidth = TokenBucket(
            config.bandwidth_bytes_per_s, config.bandwidth_bytes_per_s, now_s
        )
        self._isolation_pacer: Pacer | None = None
        self._own_binding = False
        self.alone = False  # isolated, and the only lane of its bucket with work waiting
        self._serials = itertools.count()

    def is_paused(self, now_s: float) -> bool:
        """Held by a ``Retry-After`` pause: no upload of the lane should start now."""
        return now_s < self.paused_until_s

    # -- waiting requests (oldest work first) --------------------------------------------

    def add(self, ticket: Ticket) -> None:
        ticket.serial = next(self._serials)
        heapq.heappush(self._waiting, (ticket.order, ticket.serial, ticket))

    def head(self) -> Ticket | None:
        """The oldest waiting request (cancelled ones are dropped on the way)."""
        while self._waiting and self._waiting[0][2].is_cancelled:
            heapq.heappop(self._waiting)
        return self._waiting[0][2] if self._waiting else None

    def head_key(self) -> tuple[int, int] | None:
        ticket = self.head()
        return None if ticket is None else (ticket.order, ticket.serial)

    @property
    def waiting(self) -> int:
        return sum(1 for entry in self._waiting if not entry[2].is_cancelled)

    # -- gates of the lane itself --------------------------------------------------------

    def wait_s(self, ticket: Ticket, now_s: float) -> float:
        """Seconds before the lane itself lets ``ticket`` go (0: now): the Retry-After
        pause, the hard caps, and the isolated lane's own adaptive rate."""
        wait_s = max(
            self.paused_until_s - now_s,
            self._hard_cap.wait_s(ticket.requests, now_s),
            self._bandwidth.wait_s(ticket.size_bytes, now_s),
        )
        if self.isolation is not None and self._isolation_pacer is not None:
            self.isolation.tick(now_s, self._own_binding)
            self.repace(now_s)
            own_s = self._isolation_pacer.wait_s(ticket.requests, now_s)
            self._own_binding = own_s > 0 and wait_s <= 0  # its own rate holds it back
            wait_s = max(wait_s, own_s)
        return max(0.0, wait_s)

    def grant(self, ticket: Ticket, now_s: float) -> None:
        """Take the lane's tokens for ``ticket`` (its head) and remove it from the queue."""
        heapq.heappop(self._waiting)
        ticket.granted_s = now_s
        self.last_used_s = now_s
        self._hard_cap.take(ticket.requests, now_s)
        self._bandwidth.take(ticket.size_bytes, now_s)
        if self._isolation_pacer is not None:
            self._isolation_pacer.take(ticket.requests, now_s)
            self._own_binding = bool(self._waiting)  # what is left waits for its own rate

    # -- isolation: an adaptive rate of its own ------------------------------------------

    def isolate(self, rate: RateConfig, sent_s: float, now_s: float) -> None:
        """S3 throttles this prefix on its own: from now on the lane is paced by a rate of
        its own, started from what S3 accepted of it lately and cut for this throttle."""
        floor = min(self.config.min_rate_per_s, rate.floor_per_s)
        ceiling = min(rate.ceiling_per_s, self.config.rate_per_s)
        config = dataclasses.replace(rate, floor_per_s=floor, ceiling_per_s=ceiling)
        sending = max(self.answers.accepted_per_s(now_s), floor)
        self.isolation = AdaptiveRate(config, now_s, w_max_per_s=sending, answers=self.answers)
        self.alone = False
        self.isolation.on_throttle(sent_s, now_s)
        own = self.isolation.rate_per_s
        self._isolation_pacer = Pacer(own, now_s)
        self._isolation_pacer.follow(own, now_s, cut=True)
        log.info(
            "lane %s/%s is throttled on its own: paced at %.3f/s (%.3f/s got through)",
            self.bucket,
            self.prefix,
            own,
            sending,
        )

    def end_isolation(self) -> None:
        log.info("lane %s/%s shares its bucket's budget again", self.bucket, self.prefix)
        self.isolation = None
        self._isolation_pacer = None

    def repace(self, now_s: float, *, drain: bool = False) -> None:
        """Follow the isolated rate's latest value (after an outcome or a tick); ``drain``
        after a cut (the prefix's bucket is empty: the next request waits an interval)."""
        if self.isolation is not None and self._isolation_pacer is not None:
            self._isolation_pacer.follow(self.isolation.rate_per_s, now_s, cut=drain)

    def status(self, now_s: float, bucket_rate_per_s: float) -> LaneStatus:
        own = self.isolation.rate_per_s if self.isolation is not None else bucket_rate_per_s
        return LaneStatus(
            self.bucket,
            self.prefix,
            round(min(own, self.config.rate_per_s), 3),
            self.in_flight,
            self.throttles,
            self.paused_until_s if self.paused_until_s > now_s else None,
            self.isolation is not None,
            self.waiting,
        )


class Lanes:
    """The lanes (created on first use) and each bucket's budget: the admission of every
    request the flusher sends. Pure: the request gate (``gate.py``) calls ``submit``, then
    ``pump`` whenever something changed (a request waits, an answer came, a slot was
    freed, or the time ``pump`` asked to be called again has come), and reports every
    granted request's send (``on_sent``) and answer (``on_answer``).

    ``lane_concurrency`` is how many uploads of one lane may be claimed at once: the
    configured figure, else the gate's window of requests in flight (one lane alone can
    fill it, and a lane whose uploads wait for their admission takes at most that share
    of the claimed uploads: the others are claimed meanwhile).
    """

    def __init__(self, config: LaneConfig, flow: RateConfig | None = None) -> None:
        self.config = config
        self.flow = flow or RateConfig()
        self.lane_concurrency = config.concurrency or 8
        self._lanes: dict[tuple[str, str], Lane] = {}
        self._budgets: dict[str, BucketBudget] = {}
        self._known: dict[str, float] = {}  # bucket -> rate learnt before (``remember``)

    def prefix_of(self, key: str) -> str:
        return lane_prefix(key, self.config.depth)

    def lane_for(self, bucket: str, key: str, now_s: float) -> Lane:
        ident = (bucket, self.prefix_of(key))
        lane = self._lanes.get(ident)
        if lane is None:
            if len(self._lanes) >= _MAX_IDLE_LANES:
                self._forget_idle(now_s)
            lane = self._lanes[ident] = Lane(bucket, ident[1], self.config, now_s)
        return lane

    def peek(self, bucket: str, key: str) -> Lane | None:
        """The lane of a key if it exists (no side effects: safe from the journal thread)."""
        return self._lanes.get((bucket, self.prefix_of(key)))

    def budgets_by_name(self) -> dict[str, BucketBudget]:
        """Every bucket's budget made so far (read only)."""
        return self._budgets

    def budget(self, bucket: str, now_s: float) -> BucketBudget:
        budget = self._budgets.get(bucket)
        if budget is None:
            known = self._known.get(bucket)
            budget = self._budgets[bucket] = BucketBudget(bucket, self.flow, now_s, known)
        return budget

    def remember(self, rates: Mapping[str, float]) -> None:
        """Rates learnt of buckets before (a previous run's ``known_rates``): a bucket's
        budget made from now on slow-starts to its rate quickly (``AdaptiveRate``)."""
        self._known.update(
            (bucket, rate) for bucket, rate in rates.items() if 0 < rate < math.inf
        )  # (a figure that says nothing, or no bound at all, is not a rate to aim for)

    def known_rates(self) -> dict[str, float]:
        """Per bucket sent to since the start, this gateway's share of the limit its
        budget learnt (``BucketBudget.known_per_s``; the remembered one until it learns
        better)."""
        return {
            bucket: known
            for bucket, budget in self._budgets.items()
            if (known := budget.known_per_s) is not None
        }

    # -- admission -------------------------------------------------------------------------

    def submit(
        self,
        lane: Lane,
        order: int,
        requests: int,
        size_bytes: int,
        now_s: float,
        *,
        claimed: bool = False,
    ) -> Ticket:
        """A request of ``lane`` waits for admission; ``order`` ranks it (smaller first)."""
        ticket = Ticket(lane, order, requests, size_bytes, is_claimed=claimed)
        lane.add(ticket)
        lane.last_used_s = now_s
        self.budget(lane.bucket, now_s).enqueue(lane, now_s)
        return ticket

    @property
    def has_waiting(self) -> bool:
        """Whether any request waits for admission."""
        return any(budget.has_waiting for budget in self._budgets.values())

    def cancel(self, ticket: Ticket) -> None:
        """The waiter gave up before its admission: it is never admitted."""
        ticket.is_cancelled = True

    def pump(
        self, now_s: float, room: int = 1 << 30, caps: Caps | None = None
    ) -> tuple[list[Ticket], float]:
        """Admit what may go now, at most ``room`` requests, within ``caps`` (every bucket,
        oldest work first within each); returns the admitted tickets and when to pump
        again at the latest (inf: not needed until something changes)."""
        granted: list[Ticket] = []
        next_s = math.inf
        waiting = [b for b in self._budgets.values() if b.top_key is not None]
        for budget in sorted(waiting, key=lambda b: b.top_key or (0, 0)):
            if room <= 0:
                break
            admitted, wake_s = budget.grant(now_s, room, caps)
            room -= len(admitted)
            granted += admitted
            next_s = min(next_s, wake_s)
        return granted, next_s

    def on_sent(self, ticket: Ticket, sent_s: float) -> None:
        """The admitted request left at ``sent_s``: its answer is judged by when it left
        (a throttle of a request sent before the last cut is part of that event)."""
        ticket.sent_s = sent_s

    def on_progress(self, ticket: Ticket, now_s: float) -> None:
        """The request is on its way and was not refused when a refusal would have come
        back (``Gate``): a slow start may count it as accepted."""
        if ticket.sent_s is not None and not ticket.is_progressed:
            ticket.is_progressed = True
            self.budget(ticket.lane.bucket, now_s).on_progress(ticket.lane, ticket.sent_s, now_s)

    def on_answer(
        self, ticket: Ticket, now_s: float, *, throttled: bool, retry_after_s: float | None = None
    ) -> bool:
        """The upstream accepted (``throttled`` False) or throttled the request. True if a
        throttle was a new congestion event of the bucket's budget (it was cut)."""
        lane, sent_s = ticket.lane, ticket.sent_s if ticket.sent_s is not None else now_s
        budget = self.budget(lane.bucket, now_s)
        if not throttled:
            budget.on_success(lane, sent_s, now_s, grown=ticket.is_progressed)
            return False
        lane.throttles += 1
        lane.last_throttle_s = now_s
        if retry_after_s:
            lane.paused_until_s = max(lane.paused_until_s, now_s + retry_after_s)
        events = budget.rate.events
        budget.on_throttle(lane, sent_s, now_s)
        return budget.rate.events != events

    # -- status ----------------------------------------------------------------------------

    def _forget_idle(self, now_s: float) -> None:
        """Forget the least recently used idle lanes, down to half the cap. A lane paused by
        Retry-After, or throttled within the last minutes, keeps its state."""

        def forgettable(lane: Lane) -> bool:
            recent = lane.last_throttle_s is not None and (
                now_s - lane.last_throttle_s <= _THROTTLE_MEMORY_S
            )
            return (
                lane.in_flight == 0
                and lane.heap_key is None
                and lane.paused_until_s <= now_s
                and not recent
            )

        idle = sorted(
            (lane.last_used_s, ident) for ident, lane in self._lanes.items() if forgettable(lane)
        )
        for _, ident in idle[: max(0, len(self._lanes) - _MAX_IDLE_LANES // 2)]:
            lane = self._lanes.pop(ident)
            self.budget(lane.bucket, now_s).forget(lane)

    def status(self, now_s: float) -> list[LaneStatus]:
        return [
            lane.status(now_s, self.budget(lane.bucket, now_s).rate.rate_per_s)
            for lane in self._lanes.values()
        ]

    def budgets(self) -> list[BudgetStatus]:
        return [budget.status() for budget in self._budgets.values()]
