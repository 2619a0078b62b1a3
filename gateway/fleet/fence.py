"""The fleet fence: commit markers held until every member drained their directory, and
drain questions answered for the fleet (docs/fleet.md, "Commit order across nodes").

A ``Hold`` is taken when a marker is acknowledged (or found pending at start). It asks every
active member ``drain(bucket, parent, exclude_markers)`` as a long poll and is released once
each has answered drained (or left the fleet, or was forgotten by an operator). With
replicas, it then waits until no member holds a replica under the directory of a writer
that no member runs any more (a node wiped and back before the hold began). A member
that does not answer, or answers from a new data dir, keeps the marker held: nothing here
releases a marker because time passed. Members that join while a hold waits are waited on
too (the set only grows).

Loop-bound; timing from the injected clock and ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from gateway.clock import Clock
from gateway.fleet.membership import Member, Membership
from gateway.fleet.transport import PeerTransport, PeerUnavailable
from gateway.fleet.wire import ANY_LOST_WRITER, DrainAnswer, DrainRequest
from gateway.models import parent_prefix

log = logging.getLogger(__name__)

LONG_POLL_S = 10.0  # one drain question waits this long on the member before answering
_RPC_MARGIN_S = 5.0  # ... and its answer this much longer on the network
_RETRY_FIRST_S = 0.5  # a member that does not answer is asked again after this, doubling
_RETRY_MAX_S = 5.0  # ... up to this
_STUCK_RETRY_S = 2.0  # a member whose rows failed is asked again after this
_EARLIER_WRITERS = "(lost writers)"  # a hold's last wait, on replicas of no member's


@dataclass(slots=True)
class Waiting:
    """One member a hold waits on, and why it still does."""

    node_id: str
    expected_datadir: str | None
    state: str = "asking"  # asking | pending | failed | unreachable | lost-data | done
    detail: str = ""
    since_s: float = 0.0
    answered_datadir: str | None = None  # the data dir its last answer came from

    def describe(self, now_s: float) -> str:
        if self.state == "unreachable":
            return f"{self.node_id}: unreachable for {now_s - self.since_s:.0f}s ({self.detail})"
        if self.state == "lost-data":
            return f"{self.node_id}: came back with a new data dir; what it held is lost"
        if self.state in ("pending", "failed"):
            return f"{self.node_id}: {self.detail}"
        return f"{self.node_id}: asking"


@dataclass(slots=True)
class Hold:
    """A marker held until the fleet drained its directory."""

    bucket: str
    key: str
    seq: int
    on_release: Callable[[], None]
    waiting: dict[str, Waiting] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    is_released: bool = False
    released_by: str | None = None  # "fleet" or "operator"

    @property
    def prefix(self) -> str:
        return parent_prefix(self.key)

    @property
    def is_stuck(self) -> bool:
        outstanding = self.outstanding()
        return bool(outstanding) and all(
            w.state in ("unreachable", "lost-data") for w in outstanding
        )

    def outstanding(self) -> list[Waiting]:
        return [w for w in self.waiting.values() if w.state != "done"]

    def reason(self, now_s: float) -> str:
        """Which nodes it waits on and why, in one line (the held-by header)."""
        return "; ".join(w.describe(now_s) for w in self.outstanding())


@dataclass(frozen=True, slots=True)
class NodeDrain:
    """One member's part of a fleet drain: its answer, or why there is none."""

    node_id: str
    answer: DrainAnswer | None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        a = self.answer
        return {
            "node": self.node_id,
            "drained": bool(a and a.drained),
            "pending_objects": a.pending_objects if a else None,
            "pending_bytes": a.pending_bytes if a else None,
            "failed_objects": a.failed_objects if a else None,
            "held_objects": a.held_objects if a else None,
            "error": self.error,
        }


LocalDrain = Callable[[DrainRequest], Awaitable[DrainAnswer]]


@dataclass(frozen=True, slots=True)
class LostWriters:
    """With replicas under the strict policy (docs/fleet.md, "Takeover"): how a lost
    member's part of a directory is known once its replicas are taken over.

    ``is_lost(node, datadir)``: lost by this node's view; ``local_replicas``: this node's
    own answer about a lost writer's replicas; ``local_drain``: this node's own rows."""

    is_lost: Callable[[str, str | None], bool]
    local_replicas: LocalDrain
    local_drain: LocalDrain


class FleetFence:
    """Holds and fleet drains (see the module docstring)."""

    def __init__(
        self,
        membership: Membership,
        transport: PeerTransport,
        clock: Clock,
        lost: LostWriters | None = None,
    ) -> None:
        self._membership = membership
        self._transport = transport
        self._clock = clock
        self.lost = lost  # set by the composition root when replicas are on (strict)
        self._holds: dict[tuple[str, str], Hold] = {}
        membership.on_join.append(self._joined)

    # -- holds ------------------------------------------------------------------------------

    def hold(self, bucket: str, key: str, seq: int, on_release: Callable[[], None]) -> Hold:
        """Hold the marker ``key`` (version ``seq``) until the fleet drained its directory;
        ``on_release`` runs once, on the loop, when it may flush."""
        previous = self._holds.pop((bucket, key), None)
        if previous is not None:
            self._stop(previous)
        hold = Hold(bucket, key, seq, on_release)
        self._holds[(bucket, key)] = hold
        for member in self._membership.active():
            self._wait_on(hold, member)
        self._settle(hold)
        return hold

    def cancel(self, hold: Hold) -> None:
        """The marker left pending (superseded, deleted): stop asking for it."""
        if self._holds.get((hold.bucket, hold.key)) is hold:
            del self._holds[(hold.bucket, hold.key)]
        self._stop(hold)

    def release(self, bucket: str, key: str) -> Hold | None:
        """An operator publishes a held marker now. None if no hold of ``key`` waits."""
        hold = self._holds.get((bucket, key))
        if hold is None or hold.is_released:
            return None
        log.warning(
            "commit marker %s/%s released by an operator while waiting on: %s",
            bucket,
            key,
            hold.reason(self._clock.monotonic()) or "nothing",
        )
        self._finish(hold, "operator")
        return hold

    def holds(self) -> list[Hold]:
        return [h for h in self._holds.values() if not h.is_released]

    def held_by(self, bucket: str, key: str) -> str | None:
        """Why ``key`` is held, if it is (for HEAD/GET and status)."""
        hold = self._holds.get((bucket, key))
        if hold is None or hold.is_released:
            return None
        return hold.reason(self._clock.monotonic()) or "asking the fleet"

    def stuck_reason(self, bucket: str, key: str) -> str | None:
        """Why ``key`` is held, only when it waits on nothing but nodes that cannot answer
        (time alone will not release it: an operator's decision or the node's return)."""
        hold = self._holds.get((bucket, key))
        if hold is None or hold.is_released or not hold.is_stuck:
            return None
        return hold.reason(self._clock.monotonic())

    def _joined(self, member: Member) -> None:
        for hold in self.holds():
            if member.node_id not in hold.waiting:
                self._wait_on(hold, member)

    def _wait_on(self, hold: Hold, member: Member) -> None:
        datadir = member.info.datadir_id if member.info else None
        hold.waiting[member.node_id] = Waiting(member.node_id, datadir)
        task = asyncio.create_task(self._ask(hold, member.node_id), name=f"fence {hold.key}")
        hold.tasks.add(task)
        task.add_done_callback(hold.tasks.discard)

    async def _ask(self, hold: Hold, node_id: str) -> None:
        """Ask one member until it answers drained (or leaves); see the module docstring."""
        waiting = hold.waiting[node_id]
        backoff_s = _RETRY_FIRST_S
        came_back_empty = False
        while not hold.is_released:
            member = self._membership.get(node_id)
            if member is None or member.has_left:
                break  # forgotten by an operator, or left with nothing unflushed
            if self.lost is not None and (
                came_back_empty or self.lost.is_lost(node_id, waiting.expected_datadir)
            ):
                # Its replicas are taken over: done once every holder uploaded them.
                request = DrainRequest(
                    hold.bucket, hold.prefix, 0.0, True, node_id, waiting.expected_datadir
                )
                if await self.owner_drained(request):
                    break
                waiting.state, waiting.detail = "pending", "lost: its replicas are being uploaded"
                await asyncio.sleep(_STUCK_RETRY_S)
                continue
            # The first question is answered at once (its figures say what the hold waits
            # for); the next ones are long polls.
            wait_s = 0.0 if waiting.state == "asking" else LONG_POLL_S
            request = DrainRequest(hold.bucket, hold.prefix, wait_s, exclude_markers=True)
            try:
                answer = await self._transport.drain(
                    member.address, request, wait_s + _RPC_MARGIN_S
                )
            except PeerUnavailable as exc:
                if waiting.state != "unreachable":
                    waiting.state, waiting.since_s = "unreachable", self._clock.monotonic()
                waiting.detail = str(exc) or type(exc).__name__
                await asyncio.sleep(backoff_s)
                backoff_s = min(_RETRY_MAX_S, backoff_s * 2)
                continue
            backoff_s = _RETRY_FIRST_S
            waiting.answered_datadir = answer.node.datadir_id
            if waiting.expected_datadir is None:
                waiting.expected_datadir = answer.node.datadir_id
            if answer.node.datadir_id != waiting.expected_datadir and self.lost is not None:
                came_back_empty = True  # what it held lives on in its replicas
                continue
            if answer.node.datadir_id != waiting.expected_datadir:
                waiting.state, waiting.detail = "lost-data", answer.node.datadir_id
                log.warning(
                    "commit marker %s/%s stays held: %s came back with a new data dir",
                    hold.bucket,
                    hold.key,
                    node_id,
                )
                return  # held until an operator decides
            if answer.drained:
                break
            waiting.state = "failed" if answer.is_stuck else "pending"
            waiting.detail = _figures(answer)
            if answer.is_stuck:
                await asyncio.sleep(_STUCK_RETRY_S)
        waiting.state = "done"
        self._settle(hold)

    def _settle(self, hold: Hold) -> None:
        if hold.is_released or hold.outstanding():
            return
        if self.lost is None or _EARLIER_WRITERS in hold.waiting:
            self._finish(hold, "fleet")
            return
        # Every member answered for its data dir of now. A member wiped and back before the
        # hold began (its earlier data dir is no member's) left its writes in replicas
        # only: they go up first.
        hold.waiting[_EARLIER_WRITERS] = Waiting(_EARLIER_WRITERS, None, "pending")
        task = asyncio.create_task(self._ask_earlier(hold), name=f"fence {hold.key} (lost)")
        hold.tasks.add(task)
        task.add_done_callback(hold.tasks.discard)

    async def _ask_earlier(self, hold: Hold) -> None:
        """Until no member that answered the hold holds a replica under the directory of
        a writer none of them runs, then settle the hold again."""
        waiting = hold.waiting[_EARLIER_WRITERS]
        while not await self._earlier_drained(hold):
            waiting.detail = "replicas of lost writers are being uploaded"
            await asyncio.sleep(_RETRY_FIRST_S)
        waiting.state = "done"
        self._settle(hold)

    async def _earlier_drained(self, hold: Hold) -> bool:
        """The lost-writers question, asked of the members that answered the hold from a
        data dir not lost since (a lost one's part was its replicas, already waited for)."""
        assert self.lost is not None
        me = self._membership.me
        live, members = [f"{me.node_id}/{me.datadir_id}"], []
        for w in hold.waiting.values():
            member = self._membership.get(w.node_id)
            if w.answered_datadir is None or member is None or member.has_left:
                continue
            if self.lost.is_lost(w.node_id, w.answered_datadir):
                continue
            live.append(f"{w.node_id}/{w.answered_datadir}")
            members.append(member)
        return await self._orphans_drained(hold.bucket, hold.prefix, live, members)

    async def _orphans_drained(
        self, bucket: str, prefix: str, live: Sequence[str], members: Sequence[Member]
    ) -> bool:
        """Is every replica under ``prefix`` of a writer not in ``live`` ("node/data dir")
        uploaded, here and on each of ``members``?"""
        assert self.lost is not None
        orphans = DrainRequest(bucket, prefix, 0.0, True, ANY_LOST_WRITER, live_writers=tuple(live))
        answers = await asyncio.gather(
            self.lost.local_replicas(orphans), *(self._try_drain(m, orphans) for m in members)
        )
        return all(a is not None and a.drained for a in answers)

    def _finish(self, hold: Hold, by: str) -> None:
        hold.is_released, hold.released_by = True, by
        if self._holds.get((hold.bucket, hold.key)) is hold:
            del self._holds[(hold.bucket, hold.key)]
        self._stop(hold)
        hold.on_release()

    def _stop(self, hold: Hold) -> None:
        current = asyncio.current_task()
        for task in list(hold.tasks):
            if task is not current:
                task.cancel()

    async def owner_drained(self, request: DrainRequest) -> bool:
        """Is every replica of the lost writer ``request.owner`` under the prefix uploaded,
        here and on every other member that answers? (One that does not answer: no.)"""
        assert self.lost is not None and request.owner is not None
        others = [m for m in self._membership.active() if m.node_id != request.owner]
        answers = await asyncio.gather(
            self.lost.local_replicas(request),
            *(self._try_drain(m, request) for m in others),
        )
        return all(a is not None and a.drained for a in answers)

    async def drained_everywhere(self, bucket: str, prefix: str, me: str) -> bool:
        """For a taken-over commit marker: is everything under ``prefix`` (markers aside)
        durable here and on every member that is not lost, and is every replica under it
        of any other writer (a lost member, an earlier data dir of a member back with an
        empty disk) uploaded, here and on every member that is not lost? ``me``: this
        node's "node/data dir"."""
        assert self.lost is not None
        request = DrainRequest(bucket, prefix, 0.0, exclude_markers=True)
        if not (await self.lost.local_drain(request)).drained:
            return False
        live, asked = [me], []
        for member in self._membership.active():
            datadir = member.info.datadir_id if member.info else None
            if self.lost.is_lost(member.node_id, datadir):
                continue  # its writes: covered by its replicas, asked of the others below
            answer = await self._try_drain(member, request)
            if answer is None or not answer.drained:
                return False
            live.append(f"{member.node_id}/{answer.node.datadir_id}")
            asked.append(member)
        return await self._orphans_drained(bucket, prefix, live, asked)

    async def _try_drain(self, member: Member, request: DrainRequest) -> DrainAnswer | None:
        try:
            return await self._transport.drain(
                member.address, request, request.wait_s + _RPC_MARGIN_S
            )
        except PeerUnavailable:
            return None

    # -- fleet drain ------------------------------------------------------------------------

    async def drain(self, bucket: str | None, prefix: str, wait_s: float) -> list[NodeDrain]:
        """Every active member's answer to the same drain (markers count), in parallel."""
        request = DrainRequest(bucket, prefix, wait_s)
        members = self._membership.active()
        return list(await asyncio.gather(*(self._drain_one(m, request) for m in members)))

    async def _drain_one(self, member: Member, request: DrainRequest) -> NodeDrain:
        try:
            answer = await self._transport.drain(
                member.address, request, request.wait_s + _RPC_MARGIN_S
            )
        except PeerUnavailable as exc:
            return NodeDrain(member.node_id, None, str(exc) or type(exc).__name__)
        expected = member.info.datadir_id if member.info else answer.node.datadir_id
        if answer.node.datadir_id != expected:
            return NodeDrain(member.node_id, answer, "came back with a new data dir")
        return NodeDrain(member.node_id, answer)

    async def close(self) -> None:
        tasks = [t for h in self._holds.values() for t in h.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _figures(answer: DrainAnswer) -> str:
    text = f"{answer.pending_objects} objects ({answer.pending_bytes} bytes) not yet durable"
    if answer.failed_objects:
        text += f", {answer.failed_objects} failed (retry them on {answer.node.node_id})"
    return text
