"""One simulated gateway: the flusher's loop with its I/O replaced by events of ``s3sim``.

Claims follow the flusher: rows in acknowledgement order per lane, a lane with no room
(``FlushPolicy.room``: its claimed uploads at the lanes' concurrency, or a ``Retry-After``
pause) waits for one of its uploads to finish, and as many rows are claimed as the gate's
``claim_room`` allows. Each request is submitted to the REAL ``Gate`` (``claimed``) and
sent when its ``pump`` admits it, with one timer at a time for the time ``pump`` asks for
(the asyncio shell's ``RequestGate._pump``); each answer goes back through
``Gate.answer``. A single PUT that is throttled goes back to its lane after a full-jitter
delay of at most ``retry_base_s`` (the flusher's row retry); a multipart upload's requests
(create, every part at once, complete) are retried in place after a backoff (the gate's
``send_retrying``). Nothing here decides what the gate decides.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from s3sim import Link, Net, S3Model, Sim

from gateway.flush.control import RateConfig
from gateway.flush.gate import Gate, GateConfig, Outcome
from gateway.flush.lanes import Lane, LaneConfig, Lanes, Ticket
from gateway.flush.policy import FlushPolicy, PolicyConfig, Room
from gateway.flush.shares import FleetShares
from gateway.flush.window import WindowConfig

_PAUSED_LANE_S = 0.25  # a paused lane is looked at again after this (FlushOrder's first)
_BACKOFF_CAP_S = 30.0


@dataclass(eq=False)
class _Upload:
    seq: int
    key: str
    lane: Lane
    parts: int  # 0: a single PUT
    parts_left: int = 0
    attempts: dict[str, int] = field(default_factory=dict)  # request kind -> failed tries


class SimGateway:
    """One gateway's flusher: its objects, the real ``Gate``, events for its I/O."""

    def __init__(
        self,
        ident: int,
        sim: Sim,
        s3: S3Model,
        keys: Sequence[str],
        *,
        net: Net,
        link: Link | None = None,
        lane_depth: int = 3,
        flow: RateConfig | None = None,
        concurrency: int = 32,
        max_concurrency: int = 1024,
        lane_concurrency: int = 0,
        size_bytes: int = 0,
        part_bytes: int = 0,
        start_s: float = 0.0,
        write_back_s: float = 0.0,
        ingest_s: float = 0.0,
        retry_base_s: float = 0.2,
    ) -> None:
        self.ident = ident
        self.sim = sim
        self.s3 = s3
        self.net = net
        self.link = link or Link(sim, net)  # each node its own, unless one is shared
        self.lanes = Lanes(LaneConfig(depth=lane_depth, concurrency=lane_concurrency), flow)
        window = WindowConfig(initial=concurrency, max_size=max_concurrency)
        self.gate = Gate(self.lanes, GateConfig(window=window), start_s)
        self.policy = FlushPolicy(PolicyConfig(write_back_delay_s=0.0), self.lanes)
        self.size_bytes = size_bytes
        self.parts = -(-size_bytes // part_bytes) if part_bytes else 0
        self.requests_per_object = self.parts + 2 if self.parts else 1
        self._part_bytes = part_bytes
        self._retry_base_s = retry_base_s
        n = len(keys)
        self._timers: list[tuple[float, int, str]] = [
            (start_s + ingest_s * i / max(1, n) + write_back_s, i, k) for i, k in enumerate(keys)
        ]
        heapq.heapify(self._timers)
        self._queues: dict[str, list[tuple[int, str]]] = {}  # lane prefix -> ready rows
        self._active: list[tuple[int, str]] = []  # (head seq, lane prefix): may claim
        self._parked: set[str] = set()  # lanes waiting for one of their uploads to end
        self.tasks = 0
        self.left = n
        self.done_s: dict[str, float] = {}  # key -> when it was in the bucket
        self.finished_s: float | None = None
        self.first_sent_s = math.inf
        self.requests = 0
        # The fleet's shares (the REAL ``FleetShares``; ``s3sim.run`` carries the reports).
        self.shares = FleetShares(_ShareGate(self), lambda: sim.now_s)
        self.throttled = 0
        self._pump_at = math.inf
        self._due_at = math.inf
        sim.at(start_s, self.work)

    # -- claims ------------------------------------------------------------------------

    def work(self) -> None:
        """Claim what may go (oldest first per lane, lanes with room), then pump."""
        now = self.sim.now_s
        while self._timers and self._timers[0][0] <= now:
            _, seq, key = heapq.heappop(self._timers)
            self._ready(seq, key)
        while self._active and self.gate.claim_room(self.tasks) > 0:
            head, prefix = heapq.heappop(self._active)
            queue = self._queues.get(prefix)
            if not queue or queue[0][0] != head:
                continue  # stale: the lane is listed under its new head
            room = self.policy.room("b", queue[0][1], now, 0)
            if room is Room.SLOTS:
                self._parked.add(prefix)
                continue
            if room is Room.LATER:
                self.sim.at(now + _PAUSED_LANE_S, lambda p=prefix: self._activate(p))
                continue
            seq, key = heapq.heappop(queue)
            self._activate(prefix)
            self._start(seq, key)
        if self._timers and self._timers[0][0] < self._due_at:
            self._due_at = self._timers[0][0]
            self.sim.at(self._due_at, self._due)
        self.pump()

    def _due(self) -> None:
        self._due_at = math.inf
        self.work()

    def _ready(self, seq: int, key: str) -> None:
        prefix = self.lanes.prefix_of(key)
        heapq.heappush(self._queues.setdefault(prefix, []), (seq, key))
        self._activate(prefix)

    def _activate(self, prefix: str) -> None:
        queue = self._queues.get(prefix)
        if queue and prefix not in self._parked:
            heapq.heappush(self._active, (queue[0][0], prefix))

    def _start(self, seq: int, key: str) -> None:
        lane = self.gate.lane_for("b", key, self.sim.now_s)
        lane.in_flight += 1
        self.tasks += 1
        upload = _Upload(seq, key, lane, self.parts)
        self._submit(upload, "create" if upload.parts else "put")

    def _end(self, upload: _Upload) -> None:
        """The upload's task is over (done, or its row goes back to pending)."""
        upload.lane.in_flight -= 1
        self.tasks -= 1
        prefix = upload.lane.prefix
        if prefix in self._parked:
            self._parked.discard(prefix)
            self._activate(prefix)

    # -- requests ----------------------------------------------------------------------

    def _submit(self, upload: _Upload, kind: str) -> None:
        size = self._part_bytes if kind == "part" else self.size_bytes if kind == "put" else 0
        ticket = self.gate.submit(upload.lane, upload.seq, size, self.sim.now_s, claimed=True)
        ticket.waker = (upload, kind)

    def pump(self) -> None:
        """Admit what may go; ask to be called again when the gate says (one timer)."""
        granted, next_s = self.gate.pump(self.sim.now_s)
        for ticket in granted:
            self._send(ticket)
        if next_s < self._pump_at:
            self._pump_at = next_s
            self.sim.at(next_s, lambda: self._timer(next_s))

    def _timer(self, at_s: float) -> None:
        if at_s == self._pump_at:  # else a later or earlier timer replaced this one
            self._pump_at = math.inf
            self.pump()

    def _send(self, ticket: Ticket) -> None:
        now = self.sim.now_s
        self.gate.sent(ticket, now)
        self.requests += 1
        self.first_sent_s = min(self.first_sent_s, now)
        jitter = self.sim.rng.uniform(0, self.net.jitter_s)
        self.sim.at(now + self.net.up_s + jitter, lambda: self._arrive(ticket))

    def _arrive(self, ticket: Ticket) -> None:
        upload, _ = ticket.waker  # type: ignore[misc]
        ok = self.s3.answer(upload.key, self.sim.now_s, self.ident)
        if ok:
            self.link.send(ticket.size_bytes, lambda: self._back(ticket, ok))
        else:
            self._back(ticket, ok)

    def _back(self, ticket: Ticket, ok: bool) -> None:
        delay = self.net.down_s + self.sim.rng.uniform(0, self.net.jitter_s)
        self.sim.at(self.sim.now_s + delay, lambda: self._answer(ticket, ok))

    def _answer(self, ticket: Ticket, ok: bool) -> None:
        now = self.sim.now_s
        upload, kind = ticket.waker  # type: ignore[misc]
        self.gate.answer(ticket, now, Outcome.ACCEPTED if ok else Outcome.THROTTLED)
        if ok:
            self._accepted(upload, kind)
        else:
            self.throttled += 1
            self._refused(upload, kind)
        self.work()

    def _accepted(self, upload: _Upload, kind: str) -> None:
        if kind == "create":
            upload.parts_left = upload.parts
            for _ in range(upload.parts):
                self._submit(upload, "part")
        elif kind == "part":
            upload.parts_left -= 1
            if upload.parts_left == 0:
                self._submit(upload, "complete")
        else:  # put, complete: the object is in the bucket
            self._end(upload)
            self.done_s[upload.key] = self.sim.now_s
            self.left -= 1
            if self.left == 0:
                self.finished_s = self.sim.now_s

    def _refused(self, upload: _Upload, kind: str) -> None:
        now = self.sim.now_s
        if kind == "put":  # the row goes back to pending after a full-jitter delay
            self._end(upload)
            retry_s = now + self.sim.rng.uniform(0, self._retry_base_s)
            heapq.heappush(self._timers, (retry_s, upload.seq, upload.key))
            return
        attempt = upload.attempts.get(kind, 0)  # retried in place (send_retrying)
        upload.attempts[kind] = attempt + 1
        ceiling = min(_BACKOFF_CAP_S, self._retry_base_s * 2**attempt)
        delay = self.sim.rng.uniform(0, ceiling)
        self.sim.at(now + delay, lambda: (self._submit(upload, kind), self.pump()))


class _ShareGate:
    """``shares.ShareGate`` over a simulated gateway's core gate (``RequestGate``'s)."""

    def __init__(self, gw: SimGateway) -> None:
        self._gw = gw

    def shares(self) -> dict[str, float]:
        return self._gw.gate.shares(self._gw.sim.now_s)

    def take_share(self, bucket: str, extra_per_s: float) -> bool:
        taken = self._gw.gate.take_share(bucket, extra_per_s, self._gw.sim.now_s)
        if taken:
            self._gw.pump()
        return taken

    def note_fair_share(self, bucket: str, fair_per_s: float, senders: int) -> None:
        self._gw.gate.note_fair_share(bucket, fair_per_s, senders)

    def note_senders(self, bucket: str, senders: int) -> None:
        self._gw.gate.note_senders(bucket, senders)

    def cuts(self) -> dict[str, tuple[int, float]]:
        return self._gw.gate.cuts(self._gw.sim.now_s)

    def follow_cut(self, bucket: str, factor: float) -> bool:
        cut = self._gw.gate.follow_cut(bucket, factor, self._gw.sim.now_s)
        if cut:
            self._gw.pump()
        return cut
