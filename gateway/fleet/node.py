"""Fleet: this gateway as a member of a fleet (docs/fleet.md). Built by the composition
root only when peers are configured.

It owns the membership, this node's directory, the fleet fence and their background work,
answers what peers ask of it (``on_*``, called by the peer API) and is what the services
and the flusher see through ``view.FleetView`` and ``view.MarkerHolds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway import metrics
from gateway.clock import Clock
from gateway.fleet.client import REPLICA_HEADER
from gateway.fleet.condlock import ConditionalLocks
from gateway.fleet.directory import LocalDirectory, WriteIntent
from gateway.fleet.fence import FleetFence, Hold, NodeDrain
from gateway.fleet.membership import Discovery, Member, Membership, MemberStore
from gateway.fleet.ordering import UploadOrder
from gateway.fleet.replication import ReplicaPolicy, Replication, ReplicaWrite, rank
from gateway.fleet.rereplication import Rereplication
from gateway.fleet.takeover import DeleteNotes, Takeover, UploadClaims
from gateway.fleet.transport import (
    AttributesPage,
    PeerHead,
    PeerRead,
    PeerTransport,
    PeerUnavailable,
)
from gateway.fleet.view import HoldHandle
from gateway.fleet.wire import Dir, DirChange, LeaseGrant, LeaseRequest, NodeInfo, PeerRow
from gateway.models import parent_prefix

log = logging.getLogger(__name__)
_TICK_S = 1.0  # how often announced directories are checked for withdrawal


class ShareReports(Protocol):
    """The flusher's side of the fleet's shares of buckets (``flush/shares.py``)."""

    def on_report(
        self,
        peer: str,
        shares: Mapping[str, float],
        cuts: Mapping[str, tuple[int, float]] | None = None,
    ) -> None: ...

    def forget(self, peer: str) -> None: ...

    def status(self) -> dict[str, object]: ...


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Timing of the fleet protocol (docs/fleet.md)."""

    port: int  # this node's S3 port (peers reach it there)
    lease_s: float = 3.0
    refresh_s: float = 10.0  # discovery is asked again this often
    timeout_s: float = 2.0  # hello, announcements, goodbyes
    read_timeout_s: float = 2.0  # a peer read's answer (its head)
    self_address: str | None = None  # this node's S3 listener, as it can reach it itself
    replicas: int = 0  # --replicas: holders an acknowledgement needs (0: none)
    replica_strict: bool = True  # --replica-policy strict (else degrade)
    peer_timeout_s: float = 30.0  # a member silent this long is lost (its replicas taken over)


class Fleet:
    """See the module docstring. Loop-bound."""

    def __init__(
        self,
        me: NodeInfo,
        config: FleetConfig,
        discovery: Discovery,
        transport: PeerTransport,
        store: MemberStore,
        clock: Clock,
        has_unflushed: Callable[[str, str], bool],
    ) -> None:
        self.me = me
        self.config = config
        self._transport = transport
        self._clock = clock
        self._has_unflushed = has_unflushed
        self.membership = Membership(
            me,
            config.port,
            discovery,
            transport,
            store,
            clock,
            lease_s=config.lease_s,
            refresh_s=config.refresh_s,
            timeout_s=config.timeout_s,
        )
        self.directory = LocalDirectory(me, clock, transport.announce, lease_s=config.lease_s)
        self.fence = FleetFence(self.membership, transport, clock)
        # One key through two nodes: older versions on peers go first (ordering.py).
        self.upload_order = UploadOrder(
            me.node_id, self.candidates, self.membership, transport, config.read_timeout_s
        )
        self.replication: Replication | None = None
        # With replicas (set by the composition root): the holders' loop, the flusher's
        # claims.
        self.takeover: Takeover | None = None
        self.claims: UploadClaims | None = None
        self.deletes: DeleteNotes | None = None  # every fleet (set by the composition root)
        self.conditional: ConditionalLocks | None = None  # every fleet (idem)
        self.rereplication: Rereplication | None = None
        self.shares: ShareReports | None = None  # set with the flusher's gate
        if config.replicas > 0:
            policy = ReplicaPolicy(config.replicas, config.replica_strict)
            self.replication = Replication(me, self.membership, transport, policy)
        self._tasks: list[asyncio.Task[None]] = []
        self._is_stopped = False
        self.read_fallbacks = 0

    # -- lifecycle --------------------------------------------------------------------------

    async def load(self, unflushed_dirs: Iterable[Dir] = ()) -> None:
        """The remembered members: before the flusher loads its held markers; and the
        directories of this node's unflushed rows (``LocalDirectory.restore``): before the
        S3 listener (and so the peer API) is up."""
        await self.membership.load()
        self.directory.restore(unflushed_dirs)
        if self.replication is not None and self.replication.short is not None:
            await self.replication.short.load()

    async def start(self) -> None:
        """A first discovery and a first lease from every member that answers, before the
        gateway serves (so its first reads can trust the copies); then the background
        work. The S3 listener MUST be up (peers ask it back)."""
        await self.membership.discover()
        await self.membership.renew_now()
        self._tasks = [
            asyncio.create_task(self.membership.run(), name="fleet membership"),
            asyncio.create_task(self._tick(), name="fleet directory"),
        ]
        if self.takeover is not None:
            self._tasks.append(asyncio.create_task(self.takeover.run(), name="fleet takeover"))
        if self.rereplication is not None:
            self._tasks.append(
                asyncio.create_task(self.rereplication.run(), name="fleet re-replication")
            )

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            self.directory.tick(self._has_unflushed)
            self._gauges()

    def _gauges(self) -> None:
        states = [_member_state(m) for m in self.membership.members.values()]
        for state in ("reachable", "unreachable", "unknown", "left"):
            metrics.FLEET_MEMBERS.labels(state).set(states.count(state))
        metrics.FLEET_HELD_MARKERS.set(len(self.fence.holds()))

    async def stop(self, *, say_bye: bool) -> None:
        """Stop the background work; ``say_bye`` when nothing is left unflushed here (the
        members then stop waiting on this node). Idempotent."""
        if self._is_stopped:
            return
        self._is_stopped = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if say_bye:
            await self.membership.say_bye()
        await self.fence.close()
        await self.directory.close()
        await self.membership.close()

    # -- what peers ask (the peer API calls these) -----------------------------------------

    def on_lease(self, request: LeaseRequest, host: str) -> LeaseGrant:
        address = f"[{host}]:{request.port}" if ":" in host else f"{host}:{request.port}"
        lost = self._lost_datadir(request.holder)
        if request.holder.node_id != self.me.node_id:
            self.membership.admit(request.holder, address)
            if self.shares is not None:
                self.shares.on_report(
                    request.holder.node_id,
                    dict(request.shares),
                    {bucket: (events, factor) for bucket, events, factor in request.cuts},
                )
        return dataclasses.replace(self.directory.grant(request, address), your_lost_datadir=lost)

    def _lost_datadir(self, holder: NodeInfo) -> str | None:
        """The data dir ``holder`` had before its current one, if this node saw it change
        within the window reads ask replica holders in (``replica_candidates``); the
        holder's own reads then ask them too (``Membership.own_datadir_lost_s``)."""
        member = self.membership.get(holder.node_id)
        if member is None or member.info is None:
            return None
        if member.info.datadir_id != holder.datadir_id:
            return member.info.datadir_id  # told by this very request
        if member.old_datadir_id is None or member.new_datadir_s is None:
            return None
        recent = member.new_datadir_s >= self._clock.monotonic() - self._lost_window_s()
        return member.old_datadir_id if recent else None

    def someone_unheard(self) -> bool:
        """Whether a member of the fleet cannot be asked now (unreachable, or not heard
        from yet): a delete flushed now is noted (``DeleteNotes``)."""
        return any(m.is_reachable is not True for m in self.membership.active())

    def _lost_window_s(self) -> float:
        """How long a member back with a new data dir counts as lost for reads: its old
        one's replicas are taken over within a few takeover rounds; generously, a few
        peer timeouts."""
        return max(60.0, 4 * self.config.peer_timeout_s)

    def on_change(self, change: DirChange) -> None:
        member = self.membership.get(change.node_id)
        if member is not None:
            member.remote.apply_change(change, self._clock.monotonic())

    def on_bye(self, node: NodeInfo) -> None:
        self.membership.leave(node.node_id)
        self.directory.forget_holder(node.node_id)
        if self.shares is not None:
            self.shares.forget(node.node_id)

    # -- FleetView ------------------------------------------------------------------------

    def replicate(
        self,
        bucket: str,
        key: str,
        upload: tuple[str, int] | None = None,
        size_hint: int | None = None,
    ) -> ReplicaWrite | None:
        if self.replication is None:
            return None
        return self.replication.start(bucket, key, upload=upload, size_hint=size_hint)

    def writing(self, bucket: str, key: str) -> contextlib.AbstractAsyncContextManager[WriteIntent]:
        return self.directory.writing(bucket, key)

    async def unflushed_elsewhere(self, bucket: str) -> bool | None:
        answers = await self.fence.drain(bucket, "", 0.0)
        if any(a.answer is None for a in answers):
            return None
        return any(a.answer is not None and not a.answer.drained for a in answers)

    def deciding(self, bucket: str, key: str) -> contextlib.AbstractAsyncContextManager[None]:
        if self.conditional is None:
            return contextlib.nullcontext()
        return self.conditional.held(bucket, key)

    def _may_hold(self, member: Member, lists: Callable[[Member], bool], now_s: float) -> bool:
        if member.remote.is_trusted(now_s):
            return lists(member)
        return member.is_reachable is not False  # unknown: ask it (unreachable: do without)

    def candidates(self, bucket: str, key: str) -> Sequence[str]:
        now_s = self._clock.monotonic()
        return [
            m.node_id
            for m in self.membership.active()
            if self._may_hold(m, lambda m: m.remote.lists_key(bucket, key), now_s)
        ]

    def copies_stale_since(self, bucket: str, key: str) -> float:
        ident = (bucket, parent_prefix(key))
        members = self.membership.members.values()
        peers_s = max((m.remote.stale_since(ident) for m in members), default=float("-inf"))
        return max(peers_s, self.directory.taken_over_since(ident))

    def prefix_candidates(self, bucket: str, prefix: str) -> Sequence[str]:
        now_s = self._clock.monotonic()
        return [
            m.node_id
            for m in self.membership.active()
            if self._may_hold(m, lambda m: m.remote.lists_prefix(bucket, prefix), now_s)
        ]

    async def heads(
        self,
        nodes: Sequence[str],
        bucket: str,
        key: str,
        *,
        replica: bool = False,
        attributes: AttributesPage | None = None,
    ) -> list[PeerHead]:
        found = await asyncio.gather(
            *(self._version(n, bucket, key, replica, attributes) for n in nodes)
        )
        return [h for h in found if h is not None]

    async def _version(
        self,
        node: str,
        bucket: str,
        key: str,
        replica: bool = False,
        attributes: AttributesPage | None = None,
    ) -> PeerHead | None:
        address = self._address(node, replica)
        if address is None:
            return None
        try:
            return await self._transport.version(
                address,
                bucket,
                key,
                self.config.read_timeout_s,
                replica=replica,
                attributes=attributes,
            )
        except PeerUnavailable as exc:
            self._fell_back(node, f"{bucket}/{key}", exc)
            return None

    def replica_candidates(self, bucket: str, key: str) -> Sequence[str]:
        if self.replication is None:
            return []
        # A member back with a new data dir lost what its old one held: its replicas hold
        # it until taken over (``_lost_window_s``).
        since_s = self._clock.monotonic() - self._lost_window_s()
        if (self.membership.own_datadir_lost_s or -math.inf) < since_s and all(
            m.is_reachable is not False and (m.new_datadir_s or -math.inf) < since_s
            for m in self.membership.active()
        ):
            return []  # every writer answers for itself (this node too: its disk is its)
        # The holders its writer chose: rendezvous over who is reachable, this node
        # included (it may hold the replica itself), one more for a membership that moved.
        ranked = sorted(
            [self.me.node_id, *(m.node_id for m in self.membership.active() if m.is_reachable)],
            key=lambda n: rank(n, bucket, key),
            reverse=True,
        )
        return ranked[: self.replication.policy.copies + 1]

    async def read(
        self,
        node: str,
        bucket: str,
        key: str,
        method: str,
        headers: Mapping[str, str],
        *,
        replica: bool = False,
        zero_copy: bool = False,
    ) -> PeerRead | None:
        address = self._address(node, replica)
        if address is None:
            return None
        if replica:
            headers = {**headers, REPLICA_HEADER: "1"}
        try:
            return await self._transport.read(
                address,
                bucket,
                key,
                method=method,
                headers=headers,
                timeout_s=self.config.read_timeout_s,
                zero_copy=zero_copy,
            )
        except PeerUnavailable as exc:
            self._fell_back(node, f"{bucket}/{key}", exc)
            return None

    def _address(self, node: str, replica: bool) -> str | None:
        if node == self.me.node_id and replica:
            return self.config.self_address  # a replica held here: asked like a peer's
        member = self.membership.get(node)
        return member.address if member is not None else None

    async def rows(
        self, nodes: Sequence[str], bucket: str, prefix: str, after: str, limit: int
    ) -> tuple[list[PeerRow], str | None]:
        pages = await asyncio.gather(*(self._rows(n, bucket, prefix, after, limit) for n in nodes))
        bound: str | None = None  # every row up to here is known (None: to the end)
        for rows, truncated in pages:
            if truncated and rows and (bound is None or rows[-1].key < bound):
                bound = rows[-1].key
        newest: dict[str, PeerRow] = {}
        for rows, _ in pages:
            for row in rows:
                if bound is not None and row.key > bound:
                    break
                seen = newest.get(row.key)
                if seen is None or row.acked_s > seen.acked_s:
                    newest[row.key] = row
        return sorted(newest.values(), key=lambda r: r.key), bound

    async def _rows(
        self, node: str, bucket: str, prefix: str, after: str, limit: int
    ) -> tuple[list[PeerRow], bool]:
        member = self.membership.get(node)
        if member is None:
            return [], False
        try:
            return await self._transport.list_rows(
                member.address, bucket, prefix, after, limit, self.config.read_timeout_s
            )
        except PeerUnavailable as exc:
            self._fell_back(node, f"{bucket}/{prefix}*", exc)
            return [], False

    def _fell_back(self, node: str, what: str, exc: Exception) -> None:
        member = self.membership.get(node)
        if member is not None:  # it did not answer: unreachable until a renewal says else
            member.note_failure(self._clock.monotonic(), str(exc))
        self.read_fallbacks += 1
        metrics.PEER_READ_FALLBACKS.inc()
        log.warning("peer %s did not answer a read of %s (%s): left out", node, what, exc)

    def held_by(self, bucket: str, key: str) -> str | None:
        return self.fence.held_by(bucket, key)

    def replicas_short(self, bucket: str, key: str, seq: int) -> str | None:
        short = None if self.replication is None else self.replication.short
        found = None if short is None else short.of(bucket, key, seq)
        return None if found is None else f"{found[0]}/{found[1]}"

    def stuck_reason(self, bucket: str, key: str) -> str | None:
        return self.fence.stuck_reason(bucket, key)

    async def figures(
        self, bucket: str, paths: Sequence[str]
    ) -> list[tuple[str, dict[str, dict[str, Any]] | None, str | None]]:
        async def ask(member: Member) -> tuple[str, dict[str, dict[str, Any]] | None, str | None]:
            try:
                by_path = await self._transport.figures(
                    member.address, bucket, paths, self.config.read_timeout_s * 5
                )
            except PeerUnavailable as exc:
                return member.node_id, None, str(exc) or type(exc).__name__
            return member.node_id, by_path, None

        return list(await asyncio.gather(*(ask(m) for m in self.membership.active())))

    # -- MarkerHolds ----------------------------------------------------------------------

    def hold(self, bucket: str, key: str, seq: int, on_release: Callable[[], None]) -> Hold:
        return self.fence.hold(bucket, key, seq, on_release)

    def cancel(self, handle: HoldHandle) -> None:
        assert isinstance(handle, Hold)
        self.fence.cancel(handle)

    # -- status and operations -------------------------------------------------------------

    async def drain(self, bucket: str | None, prefix: str, wait_s: float) -> list[NodeDrain]:
        return await self.fence.drain(bucket, prefix, wait_s)

    def release(self, bucket: str, key: str) -> bool:
        return self.fence.release(bucket, key) is not None

    async def forget(self, node_id: str) -> bool:
        return await self.membership.forget(node_id)

    def status(self) -> dict[str, Any]:
        """The fleet as this node sees it (admin status, status page, CLI)."""
        now_s = self._clock.monotonic()
        holders = set(self.directory.holders())
        members = []
        for m in sorted(self.membership.members.values(), key=lambda m: m.node_id):
            members.append(
                {
                    "node": m.node_id,
                    "address": m.address,
                    "state": _member_state(m),
                    "unreachable_seconds": (
                        None if m.unreachable_since_s is None else now_s - m.unreachable_since_s
                    ),
                    "last_error": m.last_error,
                    "lease_trusted": m.remote.is_trusted(now_s),
                    "holds_our_lease": m.node_id in holders,
                    "directories": len(m.remote.dirs),
                }
            )
        return {
            "node": self.me.node_id,
            "datadir_id": self.me.datadir_id,
            "members": members,
            "announced_directories": len(self.directory.announced()),
            "held_markers": [
                {"bucket": h.bucket, "key": h.key, "waiting_on": h.reason(now_s)}
                for h in self.fence.holds()
            ],
            "read_fallbacks": self.read_fallbacks,
            "shares": None if self.shares is None else self.shares.status(),
            "replicas": None
            if self.replication is None
            else {
                "copies": self.replication.policy.copies,
                "policy": "strict" if self.replication.policy.is_strict else "degrade",
                "held_for": self.takeover.held if self.takeover is not None else [],
                "remaking": [] if self.rereplication is None else self.rereplication.status(),
            },
        }


def _member_state(member: Member) -> str:
    if member.has_left:
        return "left"
    if member.is_reachable is None:
        return "unknown"
    return "reachable" if member.is_reachable else "unreachable"
