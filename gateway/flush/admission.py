"""One bucket's adaptive budget, shared by its lanes (pure, clock-injected).

S3 throttles per partition, and does not say how a bucket is partitioned: a fresh bucket
may throttle everything under ``ckpt/`` together, later split a hot prefix, and every
gateway of a cluster writes into the same bucket. So the flusher does not guess a limit
per lane. Everything it sends to one bucket is paced by one ``AdaptiveRate`` (AIMD with
CUBIC growth: ``control.py``), and the budget is handed out in **fair rounds, oldest work
first within a round**: a heap of the bucket's lanes keyed by (round, the lane's oldest
waiting request), start-time fair queueing (Goyal et al., 1996). Each lane with work gets
one request per round, so a lane with a deep backlog or a retried old object never takes
every token while the others wait (with S3's partitions per rank that would refuse it
again and again), and a lane's requests leave evenly spaced. A lane that empties simply
leaves the heap, so the rate it used goes to the others at once; a lane that joins late
joins the current round (no credit for its idle time); a lane held by its own gates (a
``Retry-After`` pause, ``--lane-rate``, ``--lane-bandwidth``, its own rate) steps aside
and the next lane goes, so no lane blocks another.

**Isolation.** A prefix S3 throttles on its own must not drag the bucket's budget down for
everyone. When the budget's last ``_ISOLATE_AFTER`` throttles all came from one lane, over
more than one congestion event, while other lanes of the bucket were busy, **and** S3
refused that lane's recent requests far more often than the others' (the others' share
of refusals under ``_OTHERS_REFUSED`` of the lane's, and so many of the refusals on that
lane that an even spread would put them there with a chance under ``_CHANCE``: a one-sided
binomial test over the lane's share of the requests, on at least ``_ISOLATE_AFTER`` of
its recent answers refused: a busy partition's rare 503s, seconds apart, come up two of
two on one of eight lanes one time in 64, and did among hundreds), that lane gets an
adaptive rate of its own (``Lane.isolate``, measured from the lane's recent answers),
its throttles no longer cut the budget, and the budget forgets the limit that lane
taught it (slow start finds the others' again). Under a limit the
lanes share, every lane's requests are refused alike: at hundreds of 503s a second three
in a row from one lane are common (one in 64 triples with 8 lanes), and at a few a second
three of four refusals on one of three lanes happen one time in nine; but the refusal
shares stay even, and small counts prove nothing, so nobody is isolated. The isolation
ends when the lane's own rate has grown to the whole budget's.

**A start after idle.** A budget idle for ``_RESTART_IDLE_S`` (nothing waiting or in
flight: between two checkpoints) starts again when work comes: a fresh ``AdaptiveRate``
that slow-starts, doubling per round trip, to the share of the limit it learnt
(``known_per_s``: its own, at least the fleet's fair share), as a restarted gateway does
(``memory.py``). Kept as it was, the rate carried the shares of fleet peers that had
finished the last checkpoint before it into the next one, which they start too (TCP
restarts after idle for the same reason, RFC 5681 4.1).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.flush.control import AdaptiveRate, Answers, RateConfig
from gateway.flush.ratelimit import Pacer

if TYPE_CHECKING:
    from gateway.flush.lanes import Lane, Ticket

_ISOLATE_AFTER = 3  # consecutive throttles of one lane (over 2+ events) that isolate it
_OTHERS_REFUSED = 0.25  # the other lanes' share of refusals under this times the lane's
_CHANCE = 0.02  # how likely an even spread of the refusals may be to load them on one lane
_RESTART_IDLE_S = 5.0  # a budget idle this long starts again (module docstring)
# A peer's cut is followed only by a budget throttled itself this recently: evidence that
# the two share a partition (S3 does not say; peers on others would cut for nothing).
_FOLLOW_MEMORY_S = 60.0
# A body this large (S3's usual part size) is bounded by the slow start's rate in flight,
# not per second, until the bucket first refuses something (``BucketBudget._is_unpaced``).
LARGE_BODY_BYTES = 8 << 20


class Caps(Protocol):
    """Limits above every bucket (``--flush-rate``, ``--flush-bandwidth``): asked before a
    request is admitted, charged when it is."""

    def wait_s(self, ticket: Ticket, now_s: float) -> float:
        """Seconds before ``ticket`` may go (0: now)."""
        ...

    def take(self, ticket: Ticket, now_s: float) -> None:
        """``ticket`` was admitted: charge it."""
        ...


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    bucket: str
    rate_per_s: float  # what the bucket's lanes may send together now
    w_max_per_s: float | None  # the rate last throttled at (None: never throttled)
    own_per_s: float | None  # w_max less the fleet peers' shares taken over
    is_slow_start: bool
    events: int  # congestion events (cuts) so far
    throttles: int  # throttles that counted against the budget
    isolated_lanes: int


class BucketBudget:
    """The budget of one bucket and the heap of its lanes with waiting requests.

    MUST be used from one thread (the event loop). ``grant`` is the only place requests
    are admitted; ``on_throttle`` decides whether a throttle is the bucket's or a lane's.
    """

    def __init__(
        self, bucket: str, config: RateConfig, now_s: float, known_per_s: float | None = None
    ):
        """``known_per_s``: the bucket's rate a previous run learnt (``AdaptiveRate``)."""
        self.bucket = bucket
        self.config = config
        self.rate = AdaptiveRate(config, now_s, known_per_s=known_per_s)
        self._pacer = Pacer(self.rate.rate_per_s, now_s)
        self._heap: list[tuple[tuple[float, int, int], int, Lane]] = []
        self._round = 0.0  # start-time fair queueing's virtual time
        self._lanes: set[Lane] = set()  # every lane that has asked (until forgotten)
        self._queued: set[Lane] = set()  # lanes with waiting requests
        self._isolated: set[Lane] = set()
        self._recent: deque[tuple[Lane, int, bool]] = deque(maxlen=_ISOLATE_AFTER)
        self._pushes = 0
        self._binding = False
        self.throttles = 0
        self.answers = Answers()  # the bucket's recent answers, every lane's
        self.in_flight = 0  # admitted here, not answered yet (``Gate.answer`` counts those)
        self._active_s = now_s  # the last grant or answer
        self._fair: tuple[int, float] = (0, 0.0)  # (senders, fair share): ``note_fair_share``
        self._throttled_s = -math.inf  # the last throttle that counted against the budget
        self._fair_now = 0.0  # the fleet's fair share of the bucket, as last reported
        self.followed = 0  # fleet peers' cuts followed (``follow_cut``)

    # -- queue -------------------------------------------------------------------------

    def enqueue(self, lane: Lane, now_s: float) -> None:
        """``lane`` got a new waiting request: (re)queue it if its oldest one changed."""
        if (
            self.in_flight <= 0
            and not self.has_waiting
            and now_s - self._active_s >= _RESTART_IDLE_S
            and self.rate.w_max_per_s is not None
        ):  # work after idle: start again (module docstring)
            senders = self.rate.senders
            self.rate = AdaptiveRate(self.config, now_s, known_per_s=self.known_per_s)
            self.rate.senders = senders
            self._pacer.follow(self.rate.rate_per_s, now_s)
            self._fair = (0, 0.0)  # the next checkpoint's fleet measures its own
            self._fair_now = 0.0
        self._active_s = now_s
        self._lanes.add(lane)
        key = self._key(lane)
        if key is not None and (lane.heap_key is None or key < lane.heap_key):
            self._push(lane, key)

    def _key(self, lane: Lane) -> tuple[float, int, int] | None:
        """A lane's place: its round (a lane that had nothing waiting joins the current
        one, it earns no credit while idle or held), then its oldest waiting request."""
        head = lane.head_key()
        return None if head is None else (max(lane.round, self._round), *head)

    def _push(self, lane: Lane, key: tuple[float, int, int]) -> None:
        lane.heap_key = key
        self._pushes += 1
        heapq.heappush(self._heap, (key, self._pushes, lane))
        self._queued.add(lane)

    def _requeue(self, lane: Lane) -> None:
        key = self._key(lane)
        if key is None:
            lane.heap_key = None
            self._queued.discard(lane)
        else:
            self._push(lane, key)

    @property
    def top_key(self) -> tuple[float, int, int] | None:
        while self._heap and self._heap[0][0] != self._heap[0][2].heap_key:
            heapq.heappop(self._heap)  # stale: the lane was requeued with another key
        return self._heap[0][0] if self._heap else None

    @property
    def has_waiting(self) -> bool:
        return self.top_key is not None

    # -- admission ---------------------------------------------------------------------

    def grant(
        self, now_s: float, room: int, caps: Caps | None = None
    ) -> tuple[list[Ticket], float]:
        """Admit what may go now, at most ``room`` requests (the free global slots), in
        fair rounds over the lanes, oldest work first within a round (see the module
        docstring), within ``caps``. Returns the tickets admitted and when to call again
        (inf: only when something changes: a new request, an answer, a slot freed)."""
        self._repace(now_s)
        granted: list[Ticket] = []
        held: list[Lane] = []
        next_s = math.inf
        binding = False
        while room > 0 and self.top_key is not None:
            lane = self._heap[0][2]
            ticket = lane.head()
            heapq.heappop(self._heap)
            if ticket is None:
                lane.heap_key = None
                self._queued.discard(lane)
                continue
            self._check_isolation(lane)
            wait_s = lane.wait_s(ticket, now_s)
            if wait_s > 0:  # held by its own gates (pause, caps, its own rate)
                held.append(lane)
                next_s = min(next_s, now_s + wait_s)
                continue
            unpaced = self._is_unpaced(ticket)
            wait_s = 0.0 if unpaced else self._pacer.wait_s(ticket.requests, now_s)
            if wait_s > 0:
                held.append(lane)
                binding = True
                next_s = min(next_s, now_s + wait_s)
                break
            wait_s = caps.wait_s(ticket, now_s) if caps is not None else 0.0
            if wait_s > 0:  # held above the bucket: the budget is not what holds it
                held.append(lane)
                next_s = min(next_s, now_s + wait_s)
                break
            if caps is not None:
                caps.take(ticket, now_s)
            if not unpaced:
                self._pacer.take(ticket.requests, now_s)
            lane.grant(ticket, now_s)
            self.in_flight += 1
            self._active_s = now_s
            # Start-time fair queueing: the round of this request becomes the bucket's
            # virtual time; the lane's next request belongs to the next round.
            self._round = max(self._round, lane.round)
            lane.round = max(lane.round, self._round) + ticket.requests
            granted.append(ticket)
            room -= 1
            self._requeue(lane)
        for lane in held:
            self._requeue(lane)
        self.rate.tick(now_s, binding)  # from now on: holding work back or not
        return granted, next_s

    def _is_unpaced(self, ticket: Ticket) -> bool:
        """A large body before the bucket has refused anything: the slow start's rate
        bounds such requests *in flight*, not per second. One takes seconds on its
        connection, so the rate that fills a node's link with them is a few requests a
        second, far under any partition's limit, while a rate that doubles per second
        from ``initial_per_s`` needs seconds to put the link's worth of them in flight:
        96 single PUTs of 16 MiB through a link that needs 50 connections drained in
        1.25x bytes / link in the bench, 1.16x bounded in flight (1.08x not bounded at
        all, but then a partition of 5/s refused 27 of the first 32: BENCHMARKS.md
        7.4). Each one on its way grows the rate by one (``on_progress``), so the bound
        doubles about every half second. The first 503 gives the bucket a limit and
        paces every request from then on; S3 answers it before the body is sent
        (``Expect: 100-continue``)."""
        return (
            ticket.size_bytes >= LARGE_BODY_BYTES
            and self.rate.w_max_per_s is None
            and self.in_flight < self.rate.rate_per_s
        )

    def _repace(self, now_s: float) -> None:
        self.rate.tick(now_s, self._binding)
        self._binding = False
        self._pacer.follow(self.rate.rate_per_s, now_s)

    # -- the fleet's shares (``shares.py``) --------------------------------------------

    def share_per_s(self, now_s: float) -> float | None:
        """What this gateway got through to the bucket lately (requests/s) while it sends
        to it (requests waiting or in flight); None when it is idle."""
        if self.in_flight <= 0 and not self.has_waiting:
            return None
        return self.answers.accepted_per_s(now_s)

    @property
    def known_per_s(self) -> float | None:
        """The rate the next start aims for: this gateway's own share of the limit learnt
        (``AdaptiveRate.own_per_s``), at least the fleet's fair share of it."""
        own = self.rate.own_per_s
        return None if own is None else max(own, self._fair[1])

    def note_fair_share(self, fair_per_s: float, senders: int) -> None:
        """The fleet's total through the bucket divided by its ``senders`` (``shares.py``):
        kept if measured with at least as many senders as the one kept."""
        if senders >= self._fair[0]:
            self._fair = (senders, fair_per_s)
        self._fair_now = fair_per_s

    def note_senders(self, senders: int) -> None:
        """How many fleet members send to the bucket now, this one too (``shares.py``)."""
        self.rate.senders = max(1, senders)

    def take_share(self, now_s: float, extra_per_s: float) -> bool:
        """A fleet peer's freed share of the bucket: the budget's rate grows by
        ``extra_per_s`` if work waits for it (else there is nothing to take)."""
        if not self.has_waiting:
            return False
        self.rate.take_share(now_s, extra_per_s)
        self._pacer.follow(self.rate.rate_per_s, now_s)
        return True

    def follow_cut(self, now_s: float, factor: float) -> bool:
        """A fleet peer sending to this bucket cut its rate to ``factor`` of it on a throttle
        of its own (``AdaptiveRate.follow_cut``): followed if this budget was throttled
        itself within ``_FOLLOW_MEMORY_S``, and gets at least the fleet's fair share of
        the bucket through (what the senders get together, divided by them). Cut alike,
        the senders kept the shares they came out of their slow starts with (among 64
        gateways at 60/s, 1 to 4 requests/s each, and shares even among 3 or 6 at 6/s
        no more: tests/sim/test_sim_flow.py); those under the fair share grow towards it
        while the others give way. True if the rate was cut."""
        if (
            now_s - self._throttled_s > _FOLLOW_MEMORY_S
            or self.answers.accepted_per_s(now_s) < self._fair_now
            or not self.rate.follow_cut(now_s, factor)
        ):
            return False
        self.followed += 1
        self._pacer.follow(self.rate.rate_per_s, now_s, cut=True)
        return True

    def cut_report(self) -> tuple[int, float]:
        """What peers follow (``follow_cut``): this budget's own congestion events so far
        and the factor the last one left of its rate."""
        return self.rate.own_events, self.rate.last_cut_factor

    def _check_isolation(self, lane: Lane) -> None:
        """An isolated lane whose own rate has grown to the whole budget's is held back by
        nothing of its own any more: it shares again. One left alone with work (no other
        lane of the bucket waits) finds its limit again by slow start: the rate the others
        used may be its own (a lane isolated by chance shares their partition, and its own
        rate, a share of it, would hold the end of the drain)."""
        if lane.isolation is None:
            return
        if lane.isolation.rate_per_s >= self.rate.rate_per_s:
            lane.end_isolation()
            self._isolated.discard(lane)
            return
        alone = len(self._queued) <= (lane in self._queued)
        if alone and not lane.alone:
            lane.isolation.forget_limit()
        lane.alone = alone

    # -- outcomes ----------------------------------------------------------------------

    def on_success(self, lane: Lane, sent_s: float, now_s: float, *, grown: bool = False) -> None:
        lane.answers.add(now_s, True)
        self.answers.add(now_s, True)
        self._active_s = now_s
        if lane.isolation is not None:
            lane.isolation.on_success(sent_s, now_s, grown=grown)
            lane.repace(now_s)
        self.rate.on_success(sent_s, now_s, grown=grown)

    def on_progress(self, lane: Lane, sent_s: float, now_s: float) -> None:
        """A request of ``lane`` is on its way, not refused (``AdaptiveRate.on_progress``)."""
        if lane.isolation is not None:
            lane.isolation.on_progress(sent_s, now_s)
            lane.repace(now_s)
        self.rate.on_progress(sent_s, now_s)

    def on_throttle(self, lane: Lane, sent_s: float, now_s: float) -> None:
        """A request of ``lane`` sent at ``sent_s`` was throttled: cut the lane's own rate
        if it has one, isolate it if it is the one lane S3 keeps refusing (see the module
        docstring), else cut the bucket's budget (once per congestion event)."""
        lane.answers.add(now_s, False)
        self.answers.add(now_s, False)
        self._active_s = now_s
        if lane.isolation is not None:
            if lane.isolation.on_throttle(sent_s, now_s):
                lane.repace(now_s, drain=True)
            return
        self.throttles += 1
        self._throttled_s = now_s
        others_busy = any(o is not lane and (o.in_flight or o in self._queued) for o in self._lanes)
        self._recent.append((lane, self.rate.event_of(sent_s), others_busy))
        if self._isolates(lane, now_s):
            lane.isolate(self.config, sent_s, now_s)
            self._isolated.add(lane)
            self._recent.clear()
            # The cuts that lane drove measured its prefix's limit, not the bucket's:
            # the others find theirs again by slow start (seconds, not a cubic's tens).
            self.rate.forget_limit()
            return
        if self.rate.on_throttle(sent_s, now_s):
            self._pacer.follow(self.rate.rate_per_s, now_s, cut=True)

    def _isolates(self, lane: Lane, now_s: float) -> bool:
        recent = self._recent
        if not (
            len(recent) == _ISOLATE_AFTER
            and all(entry[0] is lane and entry[2] for entry in recent)
            and recent[0][1] != recent[-1][1]
        ):
            return False
        mine_ok, mine_refused = lane.answers.counts(now_s)
        all_ok, all_refused = self.answers.counts(now_s)
        others_ok, others_refused = max(0, all_ok - mine_ok), max(0, all_refused - mine_refused)
        mine = mine_refused / max(1, mine_ok + mine_refused)
        others = others_refused / max(1, others_ok + others_refused)
        share = (mine_ok + mine_refused) / max(1, all_ok + all_refused)
        return (
            mine_refused >= _ISOLATE_AFTER  # (sparse 503s, seconds apart, prove nothing)
            and others < _OTHERS_REFUSED * mine
            and _chance_of_at_least(mine_refused, all_refused, share) < _CHANCE
        )

    def forget(self, lane: Lane) -> None:
        """``lane`` (idle, nothing waiting) is being dropped by its owner."""
        self._lanes.discard(lane)
        self._queued.discard(lane)
        self._isolated.discard(lane)

    def status(self) -> BudgetStatus:
        return BudgetStatus(
            self.bucket,
            round(self.rate.rate_per_s, 3),
            None if self.rate.w_max_per_s is None else round(self.rate.w_max_per_s, 3),
            None if (own := self.rate.own_per_s) is None else round(own, 3),
            self.rate.is_slow_start,
            self.rate.events,
            self.throttles,
            len(self._isolated),
        )


def _chance_of_at_least(hits: int, trials: int, share: float) -> float:
    """P(X >= ``hits``) for X ~ Binomial(``trials``, ``share``): how likely ``hits`` of the
    bucket's ``trials`` refusals fall on a lane that sent ``share`` of its requests, were S3
    refusing every request alike. Summed in log space (``trials`` may be tens of
    thousands); the terms fall fast past the mean, so the sum stops when they vanish."""
    if hits <= 0:
        return 1.0
    if share >= 1.0 or hits > trials:
        return 1.0 if share >= 1.0 else 0.0
    log_q, log_p = math.log(share), math.log1p(-share)
    log_n = math.lgamma(trials + 1)
    total = 0.0
    for i in range(hits, trials + 1):
        log_ways = log_n - math.lgamma(i + 1) - math.lgamma(trials - i + 1)
        term = math.exp(log_ways + i * log_q + (trials - i) * log_p)
        total += term
        if i > trials * share and term < 1e-12 * total:
            break
    return min(1.0, total)
