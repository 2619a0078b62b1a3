"""The fleet's directory: which node holds unflushed versions under which directory, kept
coherent by leases (docs/fleet.md, "Reads across nodes").

``LocalDirectory`` is this node's side as the *grantor*: the directories it announced, the
peers holding a lease on them, and the announce-before-ack rule. ``RemoteDirectory`` is
this node's copy of one peer's directory, as a *holder*: trusted only until its lease runs
out by this node's clock.

Both are loop-bound. Timing comes from the injected clock's ``monotonic()``; the lease
arithmetic needs no synchronised clocks, only clocks that run at about the same rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from gateway.clock import Clock
from gateway.fleet.wire import Dir, DirChange, LeaseGrant, LeaseRequest, NodeInfo
from gateway.models import parent_prefix

log = logging.getLogger(__name__)

# A holder stops trusting a copy this long before its lease ends by its own clock: slack
# for clocks that run at slightly different rates.
TRUST_MARGIN_S = 0.1
# A directory with nothing unflushed under it is withdrawn after this long (a checkpoint
# step that writes again soon keeps its announcement).
WITHDRAW_AFTER_S = 2.0

HolderKey = tuple[str, tuple[str, float]]  # (node id, incarnation)
# Directories whose last change a peer's copy remembers (``RemoteDirectory.stale_since``);
# past it the older half is forgotten and counts as a change of every directory then.
MAX_CHANGES = 4096


# Sends one directory change to a holder at an address, within a timeout (the peer client,
# or the simulator's network); raises when it is not confirmed.
SendChange = Callable[[str, DirChange, float], Awaitable[None]]


class ChangeTimes:
    """When each directory last changed (this node's monotonic clock), for the last
    ``MAX_CHANGES`` directories; past it the older half is forgotten and counts as a
    change of every directory then (``floor_s``)."""

    def __init__(self) -> None:
        self.floor_s = float("-inf")
        self._at: dict[Dir, float] = {}  # (insertion order: oldest first)

    def note(self, ident: Dir, now_s: float) -> None:
        at = self._at
        at.pop(ident, None)
        at[ident] = now_s
        if len(at) > MAX_CHANGES:
            for old in list(at)[: MAX_CHANGES // 2]:
                self.floor_s = max(self.floor_s, at.pop(old))

    def since(self, ident: Dir) -> float:
        return max(self.floor_s, self._at.get(ident, float("-inf")))

    def __len__(self) -> int:
        return len(self._at)


@dataclass(slots=True)
class _Holder:
    node_id: str
    incarnation: tuple[str, float]
    address: str
    expires_s: float  # this node's monotonic clock

    @property
    def key(self) -> HolderKey:
        return (self.node_id, self.incarnation)


@dataclass(slots=True)
class _Entry:
    version: int
    known_by: set[HolderKey] = field(default_factory=set)
    writers: int = 0  # writes between their announcement and their commit
    empty_since_s: float | None = None
    round: asyncio.Task[None] | None = None  # an announcement in progress


class LocalDirectory:
    """This node as a grantor. Contract:

    - ``writing(bucket, key)`` MUST be entered before a write of ``key`` is committed and
      left after; ``ready()`` of what it yields MUST be awaited before the commit. Once it
      returns, every peer that holds a lease on this node's directory knows the key's
      directory, or its lease has run out.
    - A directory is withdrawn only when nothing is unflushed under it, no write is between
      its announcement and its commit, and ``WITHDRAW_AFTER_S`` passed.
    """

    def __init__(
        self,
        me: NodeInfo,
        clock: Clock,
        send: SendChange,
        *,
        lease_s: float,
    ) -> None:
        self.me = me
        self._clock = clock
        self._send = send
        self.lease_s = lease_s
        self.version = 0
        self._entries: dict[Dir, _Entry] = {}
        self._holders: dict[str, _Holder] = {}
        # Holders an announcement could not reach, until when they get no lease (they then
        # ask this node on each read instead of trusting a copy it cannot keep current).
        self._refused: dict[str, float] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._taking_over: dict[Dir, int] = {}  # takeover uploads on their way, per dir
        self._taken_over = ChangeTimes()  # when the last one of each dir ended

    # -- leases -----------------------------------------------------------------------------

    def grant(self, request: LeaseRequest, address: str) -> LeaseGrant:
        """A lease for ``request.holder`` (reachable at ``address``), with this node's whole
        directory when the holder's copy is not current. No await: the snapshot and the
        record of who knows it are taken together."""
        now_s = self._clock.monotonic()
        if self._refused.get(request.holder.node_id, now_s) > now_s:
            return LeaseGrant(self.me, 0.0, self.version, None)
        holder = _Holder(
            request.holder.node_id, request.holder.incarnation, address, now_s + self.lease_s
        )
        self._holders[holder.node_id] = holder
        current = (
            request.known_incarnation == self.me.incarnation
            and request.known_version == self.version
        )
        snapshot: tuple[Dir, ...] | None = None
        if not current:
            snapshot = tuple(self._entries)
            for entry in self._entries.values():
                entry.known_by.add(holder.key)
        return LeaseGrant(self.me, self.lease_s, self.version, snapshot)

    def holders(self) -> list[str]:
        """Node ids holding an unexpired lease."""
        now_s = self._clock.monotonic()
        return [h.node_id for h in self._holders.values() if h.expires_s > now_s]

    def forget_holder(self, node_id: str) -> None:
        """A peer that said goodbye holds no lease any more."""
        self._holders.pop(node_id, None)

    # -- announcing -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def writing(self, bucket: str, key: str) -> AsyncIterator[WriteIntent]:
        """Around one write of ``key`` (see the class contract)."""
        ident = (bucket, parent_prefix(key))
        entry = self._entries.get(ident)
        if entry is None:
            self.version += 1
            entry = self._entries[ident] = _Entry(self.version)
        entry.writers += 1
        entry.empty_since_s = None
        try:
            yield WriteIntent(self, ident, entry)
        finally:
            entry.writers -= 1

    @contextlib.asynccontextmanager
    async def taking_over(self, bucket: str, key: str) -> AsyncIterator[None]:
        """Around a takeover's upload of ``key`` (a lost writer's version, from its
        replica): announced as a write is, so that the peers holding a lease check their
        copies of the key while it lasts and once more after its withdrawal; and this
        node's own copies there count as changed (``taken_over_since``)."""
        ident = (bucket, parent_prefix(key))
        self._taking_over[ident] = self._taking_over.get(ident, 0) + 1
        try:
            async with self.writing(bucket, key) as intent:
                await intent.ready()
                yield
        finally:
            left = self._taking_over.pop(ident) - 1
            if left:
                self._taking_over[ident] = left
            self._taken_over.note(ident, self._clock.monotonic())

    def taken_over_since(self, ident: Dir) -> float:
        """The last moment this node's takeover may have changed the bucket under
        ``ident`` (now, while one is on its way): its own copies there checked before
        may be stale (``core/freshness.py``)."""
        if ident in self._taking_over:
            return self._clock.monotonic()
        return self._taken_over.since(ident)

    def restore(self, dirs: Iterable[Dir]) -> None:
        """Before this node grants its first lease: the directories of what it still holds
        unflushed from before a restart (its disk kept). Peers learn them from their first
        snapshot, as if announced; without it they read the bucket instead (a 404, or an
        older version) until each was flushed."""
        for ident in dirs:
            if ident not in self._entries:
                self.version += 1
                self._entries[ident] = _Entry(self.version)

    def _missing(self, entry: _Entry) -> list[_Holder]:
        now_s = self._clock.monotonic()
        return [
            h for h in self._holders.values() if h.expires_s > now_s and h.key not in entry.known_by
        ]

    async def _announce(self, ident: Dir, entry: _Entry) -> None:
        """Until every live holder knows ``ident``: tell each, or outwait its lease."""
        while missing := self._missing(entry):
            if entry.round is None or entry.round.done():
                entry.round = asyncio.create_task(self._round(ident, entry, missing))
            await asyncio.shield(entry.round)

    async def _round(self, ident: Dir, entry: _Entry, holders: list[_Holder]) -> None:
        change = DirChange(
            self.me.node_id, self.me.incarnation, ident[0], ident[1], entry.version, True
        )
        await asyncio.gather(*(self._tell(h, change, entry) for h in holders))

    async def _tell(self, holder: _Holder, change: DirChange, entry: _Entry) -> None:
        left_s = holder.expires_s - self._clock.monotonic()
        try:
            await asyncio.wait_for(self._deliver(holder.address, change, left_s), left_s)
        except Exception as exc:  # any failure: the holder's lease is outwaited instead
            log.info(
                "peer %s did not confirm %s/%s (%s): waiting out its lease",
                holder.node_id,
                change.bucket,
                change.prefix,
                exc or type(exc).__name__,
            )
            # Renewals may reach this node while announcements cannot reach the holder:
            # no lease for it for a while, or every write would outwait it again.
            self._refused[holder.node_id] = holder.expires_s + 2 * self.lease_s
            left_s = holder.expires_s - self._clock.monotonic()
            if left_s > 0:
                await asyncio.sleep(left_s)
            if self._holders.get(holder.node_id) is holder:
                del self._holders[holder.node_id]
            return
        entry.known_by.add(holder.key)

    async def _deliver(self, address: str, change: DirChange, timeout_s: float) -> None:
        await self._send(address, change, timeout_s)

    # -- withdrawing ------------------------------------------------------------------------

    def tick(self, has_unflushed: Callable[[str, str], bool]) -> None:
        """Withdraw directories with nothing unflushed (see the class contract) and drop
        expired holders. Called periodically; O(announced directories)."""
        now_s = self._clock.monotonic()
        for node_id in [n for n, h in self._holders.items() if h.expires_s <= now_s]:
            del self._holders[node_id]
        for node_id in [n for n, until_s in self._refused.items() if until_s <= now_s]:
            del self._refused[node_id]
        for ident, entry in list(self._entries.items()):
            if entry.writers or has_unflushed(*ident):
                entry.empty_since_s = None
                continue
            if entry.empty_since_s is None:
                entry.empty_since_s = now_s
            elif now_s - entry.empty_since_s >= WITHDRAW_AFTER_S:
                self._withdraw(ident)

    def _withdraw(self, ident: Dir) -> None:
        del self._entries[ident]
        self.version += 1
        change = DirChange(
            self.me.node_id, self.me.incarnation, ident[0], ident[1], self.version, False
        )
        now_s = self._clock.monotonic()
        for holder in self._holders.values():
            if holder.expires_s > now_s:
                task = asyncio.create_task(self._withdraw_from(holder, change))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _withdraw_from(self, holder: _Holder, change: DirChange) -> None:
        """Best effort: a holder that misses it asks this node needlessly until its next
        snapshot (its version no longer matches)."""
        with contextlib.suppress(Exception):
            await self._deliver(holder.address, change, self.lease_s)

    def announced(self) -> list[Dir]:
        return list(self._entries)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        for entry in self._entries.values():
            if entry.round is not None:
                entry.round.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


class WriteIntent:
    """One write's hold on its directory's announcement."""

    def __init__(self, directory: LocalDirectory, ident: Dir, entry: _Entry) -> None:
        self._directory = directory
        self._ident = ident
        self._entry = entry

    def is_ready(self) -> bool:
        return not self._directory._missing(self._entry)

    async def ready(self) -> None:
        """Return once every live lease holder knows the directory (or its lease ran out)."""
        if self._directory._missing(self._entry):
            await self._directory._announce(self._ident, self._entry)


class RemoteDirectory:
    """This node's copy of one peer's directory (as a lease holder). Contract: ``lists``
    answers only while the lease is valid (``is_trusted``); otherwise the caller does not
    know what the peer holds and must ask it or do without it."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.incarnation: tuple[str, float] | None = None
        self.version = 0  # the version this copy is complete up to
        self.dirs: dict[Dir, int] = {}  # directory -> version it was announced at
        self.trusted_until_s = float("-inf")
        # When a write of the peer may have gone unseen here (``stale_since``): the
        # lease gained after a time without (this node's start too), or a snapshot ...
        self.gap_s = float("-inf")
        # ... or, per directory, its last announcement or withdrawal.
        self.changes = ChangeTimes()

    def request(
        self,
        me: NodeInfo,
        port: int,
        shares: tuple[tuple[str, float], ...] = (),
        cuts: tuple[tuple[str, int, float], ...] = (),
    ) -> LeaseRequest:
        return LeaseRequest(me, port, self.version, self.incarnation, shares, cuts)

    def apply_grant(self, grant: LeaseGrant, sent_s: float) -> None:
        """A lease granted to a request sent at ``sent_s`` (this node's monotonic clock)."""
        if grant.node.incarnation != self.incarnation:
            self._reset(grant.node.incarnation)
        if grant.snapshot is not None or not self.is_trusted(sent_s):
            self.gap_s = max(self.gap_s, sent_s)
        if grant.snapshot is not None:
            listed = set(grant.snapshot)
            for ident in [d for d, v in self.dirs.items() if v <= grant.version]:
                if ident not in listed:
                    del self.dirs[ident]
            for ident in listed:
                self.dirs.setdefault(ident, grant.version)
            self.version = max(self.version, grant.version)
        self.trusted_until_s = sent_s + grant.lease_s - TRUST_MARGIN_S

    def apply_change(self, change: DirChange, now_s: float) -> None:
        """An announcement is always applied; a withdrawal only over an older announcement;
        a change of another incarnation voids the copy (it is then untrusted). ``now_s``:
        when it came (this node's monotonic clock)."""
        if change.incarnation != self.incarnation:
            self._reset(change.incarnation)
        ident = (change.bucket, change.prefix)
        self.changes.note(ident, now_s)
        if change.added:
            self.dirs[ident] = max(self.dirs.get(ident, 0), change.version)
        elif self.dirs.get(ident, change.version) < change.version:
            del self.dirs[ident]
        if change.version == self.version + 1:
            self.version = change.version  # complete up to it; a gap waits for a snapshot

    def _reset(self, incarnation: tuple[str, float]) -> None:
        self.incarnation = incarnation
        self.version = 0
        self.dirs.clear()
        self.trusted_until_s = float("-inf")

    def is_trusted(self, now_s: float) -> bool:
        return now_s < self.trusted_until_s

    def stale_since(self, ident: Dir) -> float:
        """The last moment a version the peer holds under ``ident`` may have changed
        unseen by this node: a copy of a key there that this node checked against the
        bucket before it may be out of date (``core/freshness.py``)."""
        return max(self.gap_s, self.changes.since(ident))

    def lists_key(self, bucket: str, key: str) -> bool:
        return (bucket, parent_prefix(key)) in self.dirs

    def lists_prefix(self, bucket: str, prefix: str) -> bool:
        """Could a key under ``prefix`` be under one of the listed directories?"""
        return any(
            b == bucket and (d.startswith(prefix) or prefix.startswith(d)) for b, d in self.dirs
        )

    def untrust(self) -> None:
        self.trusted_until_s = float("-inf")
