"""FlushOrder: the pending rows, ordered in memory per prefix lane, so that a claim costs
what it hands out and never what it skips.

The journal stays the source of truth: the order is loaded from it when the flusher starts
(``Journal.subscribe``) and then follows its committed changes. A claim takes sequence
numbers from here and moves exactly those rows in the journal (``FlushQueue.claim``), which
skips any version superseded in between.

Shapes (all loop-owned):

- per lane, the versions acked in order (``fresh``: seqs with their ack times, appended as
  they come) and the versions that came back (``returned``: a heap of seqs: retries after
  their backoff, released claims, ended holds, markers whose fence cleared), so the lane's
  head is always its oldest pending version;
- a heap of the lanes that may hand out their head, keyed by that head's seq, so claims go
  oldest first across lanes;
- a heap of timers (wall clock): backed-off and held versions, lanes whose head is younger
  than the write-back delay, lanes paused by the upstream;
- lanes whose slots are all taken are *parked* and leave the heap until one of their
  uploads finishes (``on_room``): a full lane costs nothing per claim, however long its
  backlog;
- commit markers wait outside their lane on a ``Fence`` taken at their ack (the figures
  count what is unflushed under their parent prefix) and enter it when the fence clears.

A version that leaves ``pending`` while queued (superseded, deleted) is remembered as dead
and dropped when it comes up, which is cheaper than finding it.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable

from gateway.fleet.view import HoldHandle, MarkerHolds
from gateway.flush.policy import FlushPolicy, Room
from gateway.models import FlushState, parent_prefix
from gateway.store.figures import Fence, Figures, Tally
from gateway.store.journal import FenceCounter
from gateway.store.rows import RowChange, RowImage

_PAUSE_FIRST_S = 0.25  # a paused lane is looked at again after this, doubling ...
_PAUSE_MAX_S = 2.0  # ... up to this, until it has room


class _Parked(enum.Enum):
    SLOTS = "slots"  # until one of its uploads finishes
    TIMER = "timer"  # until its timer fires (young head, paused lane)


class _LaneQueue:
    """One lane's pending versions and its backlog figures (unflushed rows of the lane)."""

    __slots__ = (
        "backlog_bytes",
        "backlog_objects",
        "bucket",
        "fresh_acked",
        "fresh_seqs",
        "ident",
        "parked",
        "pause_s",
        "prefix",
        "ready_seq",
        "returned",
        "sample_key",
    )

    def __init__(self, bucket: str, prefix: str, sample_key: str, ident: int) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.sample_key = sample_key  # any key of the lane, to look the live lane up
        self.ident = ident  # tie-break in heaps (lanes do not compare)
        self.fresh_seqs: deque[int] = deque()
        self.fresh_acked: deque[float] = deque()
        self.returned: list[int] = []
        self.parked: _Parked | None = None
        self.pause_s = _PAUSE_FIRST_S
        self.ready_seq: int | None = None  # the head it is listed under in the ready heap
        self.backlog_objects = 0
        self.backlog_bytes = 0

    def head(self) -> int | None:
        fresh = self.fresh_seqs[0] if self.fresh_seqs else None
        back = self.returned[0] if self.returned else None
        if fresh is None:
            return back
        return fresh if back is None or fresh < back else back

    def pop(self, seq: int) -> None:
        """Remove ``seq``, which MUST be the head."""
        if self.fresh_seqs and self.fresh_seqs[0] == seq:
            self.fresh_seqs.popleft()
            self.fresh_acked.popleft()
        else:
            heapq.heappop(self.returned)

    def push_fresh(self, seq: int, acked_s: float) -> None:
        if self.fresh_seqs and seq < self.fresh_seqs[-1]:
            heapq.heappush(self.returned, seq)  # out of order: no ack time needed
        else:
            self.fresh_seqs.append(seq)
            self.fresh_acked.append(acked_s)

    @property
    def is_idle(self) -> bool:
        return not self.fresh_seqs and not self.returned and self.backlog_objects == 0


class _Gate:
    """A commit marker waiting outside its lane: on its local fence (what this node
    acknowledged before it under its parent) and, in a fleet, on its hold (what every other
    node did)."""

    __slots__ = ("bucket", "fence", "fence_clear", "hold", "key", "lane", "seq")

    def __init__(self, seq: int, lane: _LaneQueue, fence: Fence | None, key: str = "") -> None:
        self.seq = seq
        self.lane = lane
        self.fence = fence
        self.bucket = lane.bucket
        self.key = key
        self.fence_clear = False
        self.hold: HoldHandle | None = None

    @property
    def is_open(self) -> bool:
        return self.fence_clear and (self.hold is None or self.hold.is_released)


class FlushOrder:
    """In-memory order of the pending rows (see the module docstring).

    Contract: ``take`` returns each pending version at most once until it comes back
    (``apply`` of a change that makes it pending again, or ``restore``); versions of one
    lane come oldest first; a commit marker is never returned while a row acknowledged
    before it under its parent prefix is unflushed. ``wakeup`` is set whenever ``take``
    may find something it did not find before; ``next_due_s`` says when time alone will.
    """

    def __init__(
        self, policy: FlushPolicy, figures: Figures, holds: MarkerHolds | None = None
    ) -> None:
        self._policy = policy
        self._figures = figures
        self._holds = holds
        self._lanes: dict[tuple[str, str], _LaneQueue] = {}
        self._ids = itertools.count()
        self._ready: list[tuple[int, int, _LaneQueue]] = []
        self._timers: list[tuple[float, int, _LaneQueue, int | None]] = []
        self._dead: set[int] = set()
        self._claiming: dict[int, _LaneQueue] = {}
        self._gates: dict[int, _Gate] = {}
        self._loaded_gates: list[tuple[_Gate, RowImage, Tally]] = []
        self._parked_now: list[_LaneQueue] = []
        self.wakeup = asyncio.Event()

    # -- following the journal ---------------------------------------------------------------

    def load(self, image: RowImage, count_fence: FenceCounter) -> None:
        """From the journal's writer while subscribing: one unflushed row, in seq order."""
        lane = self._lane_of(image.bucket, image.key)
        lane.backlog_objects += 1
        lane.backlog_bytes += image.size_bytes
        if image.state is not FlushState.PENDING:
            return
        if image.not_before_s <= 0 and self._policy.is_marker(image.key):
            parent = parent_prefix(image.key)
            tally = count_fence(image.bucket, parent, image.seq, image.key)
            if not tally.is_empty or self._holds is not None:
                gate = _Gate(image.seq, lane, None, image.key)
                self._loaded_gates.append((gate, image, tally))
                return
        self._queue(lane, image, is_new=True, gate=False, wake=False)

    def attach(self) -> None:
        """On the loop, once loaded: fences for the markers found waiting, lanes listed."""
        for gate, image, tally in self._loaded_gates:
            self._gates[gate.seq] = gate
            gate.fence = self._figures.register(
                image.bucket,
                parent_prefix(image.key),
                image.seq,
                tally,
                image.key,
                self._opener(gate),
            )
            self._hold(gate)
            if tally.is_empty:
                self._fence_cleared(gate)
        self._loaded_gates = []
        for lane in self._lanes.values():
            self._activate(lane)

    def apply(self, change: RowChange) -> None:
        """A committed change (on the loop, in commit order)."""
        old, new = change.old, change.new
        if old is not None and old.is_unflushed:
            self._count(old, -1)
        if new is not None and new.is_unflushed:
            self._count(new, 1)
        same = old is not None and new is not None and old.seq == new.seq
        was_pending = old is not None and old.state is FlushState.PENDING
        is_pending = new is not None and new.state is FlushState.PENDING
        if was_pending and not (same and is_pending):
            assert old is not None
            self._leave(old)
        if is_pending and not (same and was_pending):
            assert new is not None
            lane = self._lane_of(new.bucket, new.key)
            self._queue(lane, new, is_new=not same, gate=True, wake=True)
            self._activate(lane)

    def _count(self, image: RowImage, sign: int) -> None:
        lane = self._lane_of(image.bucket, image.key)
        lane.backlog_objects += sign
        lane.backlog_bytes += sign * image.size_bytes
        self._forget_if_idle(lane)

    def _forget_if_idle(self, lane: _LaneQueue) -> None:
        """Drop a lane with nothing queued and nothing unflushed (lanes come and go with
        checkpoint steps). Stale heap entries naming it are ignored when they come up."""
        if lane.is_idle and self._lanes.get((lane.bucket, lane.prefix)) is lane:
            del self._lanes[(lane.bucket, lane.prefix)]

    def _leave(self, image: RowImage) -> None:
        """A pending version left pending: claimed, superseded or deleted."""
        if self._claiming.pop(image.seq, None) is not None:
            return  # taken by a claim: the claim confirms or skips it
        gate = self._gates.pop(image.seq, None)
        if gate is not None:
            self._close_gate(gate)
            return
        self._dead.add(image.seq)  # still queued somewhere: dropped when it comes up

    def _queue(
        self, lane: _LaneQueue, image: RowImage, *, is_new: bool, gate: bool, wake: bool
    ) -> None:
        """Queue a pending version: held on a timer, behind a marker's fence, or in its lane.
        ``wake``: a timer earlier than any before wakes the flusher to re-time its sleep."""
        policy = self._policy
        if image.not_before_s > 0:
            self._timer(image.not_before_s, lane, image.seq, wake=wake)
            return
        if is_new:
            held_s = policy.held_until_s(image.key, image.is_delete, image.acked_s)
            if held_s is not None:
                self._timer(held_s, lane, image.seq, wake=wake)
                return
            if gate and policy.is_marker(image.key):
                waiting = _Gate(image.seq, lane, None, image.key)
                self._gates[image.seq] = waiting
                waiting.fence = self._figures.fence(
                    image.bucket,
                    parent_prefix(image.key),
                    exclude=image,
                    on_clear=self._opener(waiting),
                )
                self._hold(waiting)
                if waiting.fence.tally.is_empty:
                    waiting.fence_clear = True
                if not waiting.is_open:
                    return
                del self._gates[image.seq]
                self._close_gate(waiting)
            lane.push_fresh(image.seq, image.acked_s)
        else:
            heapq.heappush(lane.returned, image.seq)

    def _opener(self, gate: _Gate) -> Callable[[Fence], None]:
        return lambda _: self._fence_cleared(gate)

    def _hold(self, gate: _Gate) -> None:
        """In a fleet, the marker also waits until every other node drained its directory."""
        if self._holds is not None:
            gate.hold = self._holds.hold(
                gate.bucket, gate.key, gate.seq, lambda: self._open_gate(gate)
            )

    def _fence_cleared(self, gate: _Gate) -> None:
        gate.fence_clear = True
        self._open_gate(gate)

    def _open_gate(self, gate: _Gate, *, force: bool = False) -> None:
        """A marker's fence cleared, or its hold was released: once both, it joins its lane,
        in its place (``force``: an operator releases it now)."""
        if not (force or gate.is_open) or self._gates.get(gate.seq) is not gate:
            return
        del self._gates[gate.seq]
        self._close_gate(gate)
        heapq.heappush(gate.lane.returned, gate.seq)  # pending: its lane is still listed
        self._activate(gate.lane)

    def _close_gate(self, gate: _Gate) -> None:
        if gate.fence is not None:
            gate.fence.close()
        if gate.hold is not None and self._holds is not None and not gate.hold.is_released:
            self._holds.cancel(gate.hold)

    def release_marker(self, bucket: str, key: str) -> bool:
        """An operator releases a held commit marker: it flushes without waiting any longer
        (on this node's objects or the fleet's). False if no such marker is held."""
        for gate in list(self._gates.values()):
            if gate.bucket == bucket and gate.key == key:
                self._open_gate(gate, force=True)
                return True
        return False

    def fleet_stuck(self, bucket: str | None, prefix: str) -> int:
        """Markers under bucket/prefix whose own directory is flushed here and whose fleet
        hold waits only on nodes that cannot answer (``stuck.FleetHeld``)."""
        return sum(
            1
            for g in self._gates.values()
            if g.fence_clear
            and g.hold is not None
            and g.hold.is_stuck
            and (bucket is None or g.bucket == bucket)
            and g.key.startswith(prefix)
        )

    # -- handing work out -------------------------------------------------------------------

    def take(self, limit: int, now_s: float, monotonic_s: float) -> list[int]:
        """Up to ``limit`` pending versions to claim now, oldest first, within their lanes'
        room (``now_s`` wall clock for holds, ``monotonic_s`` for the lanes)."""
        self._advance(now_s)
        out: list[int] = []
        taken: dict[int, int] = {}
        while len(out) < limit and self._ready:
            seq, _, lane = heapq.heappop(self._ready)
            if lane.ready_seq != seq or lane.parked is not None:
                continue  # a stale listing: the lane is listed again under its new head
            lane.ready_seq = None
            head = self._live_head(lane, now_s)
            if head is None:
                self._forget_if_idle(lane)
                continue
            n = taken.get(lane.ident, 0)
            room = self._policy.room(lane.bucket, lane.sample_key, monotonic_s, n)
            if room is not Room.FREE:
                self._park(lane, room, now_s)
                continue
            lane.pop(head)
            lane.pause_s = _PAUSE_FIRST_S
            out.append(head)
            self._claiming[head] = lane
            taken[lane.ident] = n + 1
            self._activate(lane, wake=False)
        return out

    def _live_head(self, lane: _LaneQueue, now_s: float) -> int | None:
        """The lane's head once dead versions are dropped; None when it is empty or its
        head is too young (the lane is then parked until it is not)."""
        while (head := lane.head()) is not None:
            if head in self._dead:
                self._dead.discard(head)
                lane.pop(head)
                continue
            if lane.fresh_seqs and lane.fresh_seqs[0] == head:
                ready_s = self._policy.ready_s(lane.fresh_acked[0])
                if ready_s is not None and ready_s > now_s:
                    lane.parked = _Parked.TIMER
                    self._timer(ready_s, lane, None)
                    return None
            return head
        return None

    def _park(self, lane: _LaneQueue, room: Room, now_s: float) -> None:
        if room is Room.SLOTS:
            lane.parked = _Parked.SLOTS
            self._parked_now.append(lane)
        else:
            lane.parked = _Parked.TIMER
            self._timer(now_s + lane.pause_s, lane, None)
            lane.pause_s = min(lane.pause_s * 2, _PAUSE_MAX_S)

    def claimed(self, seqs: Iterable[int]) -> None:
        """A claim of ``seqs`` returned: versions it skipped (superseded) are forgotten."""
        for seq in seqs:
            self._claiming.pop(seq, None)

    def restore(self, seqs: Iterable[int]) -> None:
        """A claim of ``seqs`` failed (nothing changed in the journal): queue them again."""
        for seq in seqs:
            lane = self._claiming.pop(seq, None)
            if lane is not None:  # still pending in the journal, so its lane is listed
                heapq.heappush(lane.returned, seq)
                self._activate(lane)

    def settle(self, monotonic_s: float) -> None:
        """After a claim's uploads started: lanes parked for slots in that round that still
        have one (versions of theirs were skipped as superseded) are listed again."""
        for lane in self._parked_now:
            if lane.parked is _Parked.SLOTS and (
                self._policy.room(lane.bucket, lane.sample_key, monotonic_s, 0) is not Room.SLOTS
            ):
                lane.parked = None
                self._activate(lane)
        self._parked_now.clear()

    def on_room(self, bucket: str, key: str) -> None:
        """An upload of ``key``'s lane finished: a lane parked for its slots has one again
        (a lane waiting on time, e.g. a Retry-After pause, keeps waiting for its timer)."""
        lane = self._lanes.get((bucket, self._policy.lanes.prefix_of(key)))
        if lane is not None and lane.parked is _Parked.SLOTS:
            lane.parked = None
            self._activate(lane)
            self._forget_if_idle(lane)

    # -- time -----------------------------------------------------------------------------

    def next_due_s(self) -> float | None:
        """When the next timer fires (wall clock), if any."""
        return self._timers[0][0] if self._timers else None

    def _timer(
        self, due_s: float, lane: _LaneQueue, seq: int | None, *, wake: bool = False
    ) -> None:
        if wake and (not self._timers or due_s < self._timers[0][0]):
            self.wakeup.set()  # the flusher sleeps until the old first timer: re-time it
        heapq.heappush(self._timers, (due_s, next(self._ids), lane, seq))

    def _advance(self, now_s: float) -> None:
        """Fire the timers due by ``now_s``: held versions join their lanes, parked lanes
        are looked at again."""
        while self._timers and self._timers[0][0] <= now_s:
            _, _, lane, seq = heapq.heappop(self._timers)
            if seq is None:
                if lane.parked is _Parked.TIMER:
                    lane.parked = None
                    self._activate(lane, wake=False)
            elif seq in self._dead:
                self._dead.discard(seq)
            else:
                # A held version is pending, so its lane is counted and still listed.
                heapq.heappush(lane.returned, seq)
                self._activate(lane, wake=False)

    def _activate(self, lane: _LaneQueue, *, wake: bool = True) -> None:
        """List the lane under its current head, unless it is parked or already listed
        under that head (or an older one)."""
        if lane.parked is not None:
            return
        head = lane.head()
        if head is None or (lane.ready_seq is not None and lane.ready_seq <= head):
            return
        lane.ready_seq = head
        heapq.heappush(self._ready, (head, lane.ident, lane))
        if wake:
            self.wakeup.set()

    def _lane_of(self, bucket: str, key: str) -> _LaneQueue:
        prefix = self._policy.lanes.prefix_of(key)
        lane = self._lanes.get((bucket, prefix))
        if lane is None:
            lane = self._lanes[(bucket, prefix)] = _LaneQueue(bucket, prefix, key, next(self._ids))
        return lane

    # -- figures ----------------------------------------------------------------------------

    def held_markers(self) -> list[tuple[str, str]]:
        """(bucket, key) of the commit markers held back behind failed objects (their fence
        has nothing left but failed rows) or, in a fleet, for nodes that cannot answer: only
        an operator lets them go. O(markers waiting)."""
        return [
            (gate.fence.bucket or "", gate.fence.exclude_key or "")
            for gate in self._gates.values()
            if gate.fence is not None
            and (
                (
                    gate.fence.tally.objects > 0
                    and gate.fence.tally.objects == gate.fence.tally.failed_objects
                )
                or (gate.fence_clear and gate.hold is not None and gate.hold.is_stuck)
            )
        ]

    def backlog(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Unflushed objects and bytes per (bucket, lane prefix), lanes with any only."""
        return {
            ident: (lane.backlog_objects, lane.backlog_bytes)
            for ident, lane in self._lanes.items()
            if lane.backlog_objects
        }
