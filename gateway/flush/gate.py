"""The request gate: every request the flusher sends to the upstream passes here.

One object, built by the composition root and handed to the flusher, to early multipart
uploads and (its ``bandwidth``) to read-through fills, so that everything that decides
*when* a request may go is in one place:

- **admission** (``Lanes``: each bucket's adaptive budget shared by its lanes in fair
  rounds, oldest work first; each lane's own gates: ``lanes.py``, ``admission.py``);
- **slots**: a window of requests in flight that adapts to what ``rate x round trip`` and
  the link need (``window.py``);
- **pacing above the buckets**: ``--flush-rate`` and ``--flush-bandwidth`` (token buckets,
  charged when a request is admitted, so a request held back by its lane spends nothing);
- **every answer reported once**: a ticket is answered exactly once, as accepted,
  throttled or failed (an error that says nothing about the flow, or a cancellation), with
  the time its request left; a throttle goes to its bucket's budget and, when it was a new
  congestion event, to the window.

``Gate`` is the pure core (times passed in, no asyncio): the simulator in tests/sim drives
it directly. ``RequestGate`` is its asyncio shell: a waiting request awaits a future that
the core's ``pump`` resolves, and one timer wakes ``pump`` when the core asks to be called
again (tokens accrue, a pause ends). Nothing polls. It also holds the pause (``pause``,
``resume``) that the flusher's claims and early uploads wait on.
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from gateway import metrics
from gateway.clock import Clock
from gateway.flush.backoff import Backoff
from gateway.flush.control import RateConfig
from gateway.flush.lanes import Lane, LaneConfig, Lanes, Ticket
from gateway.flush.ratelimit import TokenBucket
from gateway.flush.window import Window, WindowConfig
from gateway.upstream.classify import Retryable, Throttled, printable

T = TypeVar("T")
# Claimed uploads waiting for their admission, beyond the window, at most this many times
# the initial window: each holds its open body files (and a small body in memory).
_WAITING_PER_INITIAL_SLOT = 3
# A request not refused after this long is on its way: S3 answers 503 before the body (or
# at once), so a request still out is a large body being sent (``Lanes.on_progress``).
# Only bodies of ``_PROGRESS_BYTES`` or more: a smaller one's answer is a round trip away
# anyway, and counting it early only makes a slow start on a shared link overshoot.
_PROGRESS_AFTER_S = 0.5
_PROGRESS_BYTES = 1 << 20
_TIMER_MIN_S = 0.001  # shortest sleep of the admission timer


@dataclass(frozen=True, slots=True)
class GateConfig:
    """The window of requests in flight, the hard caps above every bucket (0: none; a
    burst of 0 is one second's worth) and the tries of one request (``send_retrying``)."""

    window: WindowConfig = field(default_factory=WindowConfig)
    rate_per_s: float = 0.0
    rate_burst: float = 0.0
    bandwidth_bytes_per_s: int = 0
    bandwidth_burst_bytes: int = 0
    request_tries: int = 8


def build_gate(
    clock: Clock,
    *,
    lanes: LaneConfig | None = None,
    flow: RateConfig | None = None,
    config: GateConfig | None = None,
    backoff: Backoff | None = None,
) -> RequestGate:
    """A request gate over fresh lanes (``flow``: each bucket's adaptive budget)."""
    core = Gate(Lanes(lanes or LaneConfig(), flow), config or GateConfig(), clock.monotonic())
    return RequestGate(core, clock, backoff)


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    THROTTLED = "throttled"
    FAILED = "failed"  # no answer that says anything about the flow (or given up)


@dataclass(frozen=True, slots=True)
class GateStatus:
    window: int  # requests that may be in flight now
    in_flight: int
    is_slow_start: bool  # the window still doubles per round
    accepted: int
    throttled: int
    failed: int


class Gate:
    """The pure core (module docstring). MUST be used from one thread. For every ticket
    it admits, the owner calls ``sent`` when the request leaves and ``answer`` once it is
    over; ``pump`` whenever something changed or the time it asked for has come."""

    def __init__(self, lanes: Lanes, config: GateConfig, now_s: float) -> None:
        self.lanes = lanes
        self.config = config
        self.window = Window(config.window, now_s)
        self.requests = TokenBucket(config.rate_per_s, config.rate_burst, now_s)
        self.bandwidth = TokenBucket(
            config.bandwidth_bytes_per_s,
            float(config.bandwidth_burst_bytes or config.bandwidth_bytes_per_s),
            now_s,
        )
        self.in_flight = 0  # admitted and not answered
        self._sent: deque[Ticket] = deque()  # sent and not answered, oldest first
        self.waiting_claimed = 0  # claimed rows' requests waiting for admission
        self.accepted = self.throttled = self.failed = 0
        self._follow_window()

    # -- requests ---------------------------------------------------------------------

    def lane_for(self, bucket: str, key: str, now_s: float) -> Lane:
        return self.lanes.lane_for(bucket, key, now_s)

    def submit(
        self, lane: Lane, order: int, size_bytes: int, now_s: float, *, claimed: bool = False
    ) -> Ticket:
        """A request waits for admission; ``order`` ranks it in its lane (smaller first);
        ``claimed``: it belongs to a claimed row (see ``claim_room``)."""
        self.waiting_claimed += claimed
        return self.lanes.submit(lane, order, 1, size_bytes, now_s, claimed=claimed)

    def pump(self, now_s: float) -> tuple[list[Ticket], float]:
        """Admit what may go now; the admitted tickets and when to pump again at the latest
        (inf: only when something changes)."""
        progress_s = self._progress(now_s)
        room = self.window.size - self.in_flight
        granted, next_s = self.lanes.pump(now_s, room, self) if room > 0 else ([], math.inf)
        next_s = min(next_s, progress_s)
        self.in_flight += len(granted)
        bound = self.is_window_bound
        for ticket in granted:
            ticket.is_bound = bound
            self.waiting_claimed -= ticket.is_claimed
        return granted, next_s

    @property
    def is_window_bound(self) -> bool:
        """Whether the window is the limit now: full while requests wait."""
        return self.in_flight >= self.window.size and self.lanes.has_waiting

    def sent(self, ticket: Ticket, now_s: float) -> None:
        """The admitted request left now: its answer is judged by when it left."""
        self.lanes.on_sent(ticket, now_s)
        if ticket.size_bytes >= _PROGRESS_BYTES:
            self._sent.append(ticket)

    def _progress(self, now_s: float) -> float:
        """Report the requests out for ``_PROGRESS_AFTER_S`` unanswered as on their way
        (each once); when to look again (inf: none is out)."""
        sent = self._sent
        while sent:
            ticket = sent[0]
            if ticket.is_done:
                sent.popleft()
                continue
            sent_s = ticket.sent_s if ticket.sent_s is not None else now_s
            if sent_s + _PROGRESS_AFTER_S > now_s:
                return sent_s + _PROGRESS_AFTER_S
            self.lanes.on_progress(ticket, now_s)
            self.window.on_progress(bound=ticket.is_bound or self.is_window_bound)
            sent.popleft()
        return math.inf

    def answer(
        self,
        ticket: Ticket,
        now_s: float,
        outcome: Outcome,
        retry_after_s: float | None = None,
    ) -> None:
        """The admitted request is over. Reported once: a second call changes nothing."""
        if ticket.is_done or not ticket.is_granted:
            return
        ticket.is_done = True
        self.in_flight -= 1
        self.lanes.budget(ticket.lane.bucket, now_s).in_flight -= 1
        if outcome is Outcome.THROTTLED:
            self.throttled += 1
            if self.lanes.on_answer(ticket, now_s, throttled=True, retry_after_s=retry_after_s):
                self.window.on_congestion(now_s, bound=ticket.is_bound or self.is_window_bound)
        elif outcome is Outcome.ACCEPTED:
            self.accepted += 1
            self.lanes.on_answer(ticket, now_s, throttled=False)
        else:
            self.failed += 1
        self.window.on_answer(
            now_s, ticket.size_bytes, accepted=outcome is Outcome.ACCEPTED, bound=ticket.is_bound
        )
        self._follow_window()

    def cancel(self, ticket: Ticket, now_s: float) -> None:
        """The waiter gave up: never admitted if it was waiting, else its slot is freed
        (nothing is learnt from it)."""
        if ticket.is_granted:
            self.answer(ticket, now_s, Outcome.FAILED)
        elif not ticket.is_cancelled:
            self.lanes.cancel(ticket)
            self.waiting_claimed -= ticket.is_claimed

    def shares(self, now_s: float) -> dict[str, float]:
        """Per bucket this gateway sends to now, what it got through lately (requests/s):
        its share of the bucket's limit, told to the fleet (``shares.py``)."""
        return {
            bucket: share
            for bucket, budget in self.lanes.budgets_by_name().items()
            if (share := budget.share_per_s(now_s)) is not None
        }

    def take_share(self, bucket: str, extra_per_s: float, now_s: float) -> bool:
        """A fleet peer's freed share of ``bucket`` (``BucketBudget.take_share``); False
        when this gateway does not need it. The owner pumps after a True."""
        budget = self.lanes.budgets_by_name().get(bucket)
        return budget is not None and budget.take_share(now_s, extra_per_s)

    def cuts(self, now_s: float) -> dict[str, tuple[int, float]]:
        """Per bucket sent to now, its budget's own congestion events so far and the
        factor of the last one (``BucketBudget.cut_report``), told to the fleet."""
        budgets = self.lanes.budgets_by_name()
        return {bucket: budgets[bucket].cut_report() for bucket in self.shares(now_s)}

    def follow_cut(self, bucket: str, factor: float, now_s: float) -> bool:
        """A fleet peer's cut of ``bucket``'s rate (``BucketBudget.follow_cut``)."""
        budget = self.lanes.budgets_by_name().get(bucket)
        return budget is not None and budget.follow_cut(now_s, factor)

    def note_senders(self, bucket: str, senders: int) -> None:
        """Fleet members sending to ``bucket`` now (``BucketBudget.note_senders``)."""
        budget = self.lanes.budgets_by_name().get(bucket)
        if budget is not None:
            budget.note_senders(senders)

    def note_fair_share(self, bucket: str, fair_per_s: float, senders: int) -> None:
        """The fleet's fair share of ``bucket`` (``BucketBudget.note_fair_share``)."""
        budget = self.lanes.budgets_by_name().get(bucket)
        if budget is not None:
            budget.note_fair_share(fair_per_s, senders)

    def claim_room(self, tasks: int) -> int:
        """How many more rows to claim, with ``tasks`` uploads running: free slots, where a
        task waiting for admission holds none, plus a quarter of the window for uploads
        preparing their request (opening, checking a body) or recording its answer (so
        that the window itself can be full, and be seen to be the limit), within a bound
        on the tasks: the window and a fixed number waiting (open files and small bodies
        in memory stay bounded however large the window grows)."""
        size = self.window.size
        active = tasks - self.waiting_claimed
        waiting = _WAITING_PER_INITIAL_SLOT * self.config.window.initial
        return min(size + max(2, size // 4) - active, size + waiting - tasks)

    def _follow_window(self) -> None:
        self.lanes.lane_concurrency = self.lanes.config.concurrency or self.window.size

    # -- Caps (admission.Caps): the hard caps above every bucket ------------------------

    def wait_s(self, ticket: Ticket, now_s: float) -> float:
        return max(
            self.requests.wait_s(ticket.requests, now_s),
            self.bandwidth.wait_s(ticket.size_bytes, now_s),
        )

    def take(self, ticket: Ticket, now_s: float) -> None:
        self.requests.take(ticket.requests, now_s)
        self.bandwidth.take(ticket.size_bytes, now_s)

    def status(self) -> GateStatus:
        return GateStatus(
            self.window.size,
            self.in_flight,
            self.window.is_slow_start,
            self.accepted,
            self.throttled,
            self.failed,
        )


class RequestGate:
    """The gate's asyncio shell (module docstring). Use from the event loop only."""

    def __init__(self, core: Gate, clock: Clock, backoff: Backoff | None = None) -> None:
        self.core = core
        self._clock = clock
        self._backoff = backoff or Backoff()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self.room = asyncio.Event()  # set when claim room may have appeared
        self.retries = 0  # requests tried again by ``send_retrying``
        # Told of every accepted request (bucket, lane prefix) and every retried failure
        # (its error): the flusher's progress figures.
        self.on_accepted: Callable[[str, str], None] | None = None
        self.on_retry: Callable[[str], None] | None = None
        self._timer: asyncio.Task[None] | None = None  # wakes _pump when the core asks
        self._timer_s = math.inf
        self._window_size = core.window.size

    @property
    def lanes(self) -> Lanes:
        return self.core.lanes

    @property
    def bandwidth(self) -> TokenBucket:
        """The global bytes/s bucket (``--flush-bandwidth``); read-through fills draw on
        it too (``core.fill.BandwidthBudget``)."""
        return self.core.bandwidth

    # -- pause ------------------------------------------------------------------------

    def pause(self) -> None:
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    # -- the fleet's shares (``shares.ShareGate``) --------------------------------------

    def shares(self) -> dict[str, float]:
        return self.core.shares(self._clock.monotonic())

    def take_share(self, bucket: str, extra_per_s: float) -> bool:
        taken = self.core.take_share(bucket, extra_per_s, self._clock.monotonic())
        if taken:
            self._pump()
        return taken

    def note_fair_share(self, bucket: str, fair_per_s: float, senders: int) -> None:
        self.core.note_fair_share(bucket, fair_per_s, senders)

    def cuts(self) -> dict[str, tuple[int, float]]:
        return self.core.cuts(self._clock.monotonic())

    def follow_cut(self, bucket: str, factor: float) -> bool:
        return self.core.follow_cut(bucket, factor, self._clock.monotonic())

    def note_senders(self, bucket: str, senders: int) -> None:
        self.core.note_senders(bucket, senders)

    @property
    def is_paused(self) -> bool:
        return not self._resumed.is_set()

    async def resumed(self) -> None:
        await self._resumed.wait()

    # -- sending ----------------------------------------------------------------------

    async def send(
        self,
        lane: Lane,
        order: int,
        size_bytes: int,
        call: Callable[[], Awaitable[T]],
        *,
        claimed: bool = False,
    ) -> T:
        """Wait for admission, then ``call()`` (one request); its answer is reported once:
        a result is an acceptance, ``Throttled`` a throttle, anything else a failure that
        says nothing about the flow."""
        ticket = await self._admitted(lane, order, size_bytes, claimed)
        self.core.sent(ticket, self._clock.monotonic())
        outcome, retry_after_s = Outcome.FAILED, None
        try:
            result = await call()
            outcome = Outcome.ACCEPTED
            if self.on_accepted is not None:
                self.on_accepted(lane.bucket, lane.prefix)
            return result
        except Throttled as exc:
            outcome, retry_after_s = Outcome.THROTTLED, exc.retry_after_s
            metrics.FLUSH_THROTTLES.labels(lane.bucket, lane.prefix).inc()
            raise
        finally:
            self.core.answer(ticket, self._clock.monotonic(), outcome, retry_after_s)
            self._pump()

    async def send_retrying(
        self,
        lane: Lane,
        order: int,
        size_bytes: int,
        call: Callable[[], Awaitable[T]],
        *,
        claimed: bool = False,
    ) -> T:
        """``send`` up to ``request_tries`` times, with backoff after a throttle or a
        transient error, so that one 503 costs one retried part, not a restarted upload.
        Raises the last error when it gives up."""
        tries = self.core.config.request_tries
        for attempt in range(tries):
            try:
                return await self.send(lane, order, size_bytes, call, claimed=claimed)
            except (Throttled, Retryable) as exc:
                if attempt + 1 == tries:
                    raise
                self.retries += 1
                metrics.FLUSH_RETRIES.inc()
                if self.on_retry is not None:
                    self.on_retry(printable(str(exc)))
                await asyncio.sleep(self._backoff.delay_s(attempt, exc.retry_after_s))
        raise AssertionError("unreachable")

    async def early_request(
        self, bucket: str, key: str, order: int, size_bytes: int, send: Callable[[], Awaitable[T]]
    ) -> T:
        """``early.RequestGate``: a request of no claimed row (an early multipart upload's):
        after a pause, in the key's lane at ``order``, with retries."""
        await self._resumed.wait()
        lane = self.core.lane_for(bucket, key, self._clock.monotonic())
        return await self.send_retrying(lane, order, size_bytes, send)

    async def _admitted(self, lane: Lane, order: int, size_bytes: int, claimed: bool) -> Ticket:
        """Wait until the core admits a request; a claimed row's request holds no slot
        while it waits (``Gate.claim_room``)."""
        core = self.core
        ticket = core.submit(lane, order, size_bytes, self._clock.monotonic(), claimed=claimed)
        if claimed:
            self.room.set()
        try:
            while not ticket.is_granted:
                waker: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                ticket.waker = waker
                self._pump()
                if not ticket.is_granted:
                    await waker
        except BaseException:
            core.cancel(ticket, self._clock.monotonic())
            self._pump()
            raise
        return ticket

    def _pump(self) -> None:
        """Admit what may go now (wake its waiters) and arm the timer for the next time the
        core wants to be asked. Called whenever something changed."""
        granted, next_s = self.core.pump(self._clock.monotonic())
        for ticket in granted:
            waker = ticket.waker
            if isinstance(waker, asyncio.Future) and not waker.done():
                waker.set_result(None)
        if self.core.window.size > self._window_size:  # more uploads may be claimed
            self.room.set()
        self._window_size = self.core.window.size
        if next_s == math.inf:
            if self._timer is not None and not self.core.lanes.has_waiting:
                self._timer.cancel()  # nothing waits: no reason to wake
                self._timer, self._timer_s = None, math.inf
        elif next_s < self._timer_s:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_s = next_s
            self._timer = asyncio.create_task(self._wake_at(next_s), name="flush admission")

    async def _wake_at(self, at_s: float) -> None:
        # At least a millisecond: a wait the clock cannot resolve must not spin the loop.
        await asyncio.sleep(max(_TIMER_MIN_S, at_s - self._clock.monotonic()))
        if self._timer_s == at_s:
            self._timer, self._timer_s = None, math.inf
        self._pump()
