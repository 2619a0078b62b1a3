"""Membership: who the other gateways of the fleet are, and whether they answer.

Addresses come from discovery (a static list, or every address a DNS name resolves to: a
Kubernetes headless Service); ``hello`` turns an address into a node id. Members are
remembered (``MemberStore``: the journal) so a restart or a node that leaves DNS does not
make the fleet forget a node that may hold acknowledged writes; a member leaves only by
saying goodbye (``bye``) or by an operator (``forget``). The lease renewals of the
directory (``directory.py``) are the liveness check: a member whose renewal fails is
unreachable from then until one succeeds.

Loop-bound; intervals from the injected clock.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.clock import Clock
from gateway.fleet.directory import RemoteDirectory
from gateway.fleet.transport import PeerTransport, PeerUnavailable
from gateway.fleet.wire import LeaseGrant, NodeInfo
from gateway.store.members import MemberRecord

log = logging.getLogger(__name__)


class MemberStore(Protocol):
    async def load_members(self) -> list[MemberRecord]: ...

    async def save_member(self, record: MemberRecord) -> None: ...

    async def delete_member(self, node_id: str) -> None: ...


class Discovery(Protocol):
    async def addresses(self) -> list[str]:
        """``host:port`` of every gateway discovery knows now (this one may be among them)."""
        ...


@dataclass(frozen=True, slots=True)
class StaticPeers:
    """``--peers a:9000,b:9000``: the same list on every node."""

    peers: tuple[str, ...]

    async def addresses(self) -> list[str]:
        return list(self.peers)


@dataclass(frozen=True, slots=True)
class DnsPeers:
    """``--peers dns:NAME:PORT``: every address NAME resolves to (a headless Service)."""

    name: str
    port: int

    async def addresses(self) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self.name, self.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            log.warning("peers: cannot resolve %s: %s", self.name, exc)
            return []
        hosts = sorted({str(info[4][0]) for info in infos})
        return [f"[{h}]:{self.port}" if ":" in h else f"{h}:{self.port}" for h in hosts]


def parse_peers(value: str) -> Discovery:
    """``a:9000,http://b:9000`` or ``dns:NAME:PORT``; raises ValueError on anything else."""
    value = value.strip()
    if value.startswith("dns:"):
        name, _, port = value[4:].rpartition(":")
        if not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected dns:NAME:PORT, got {value!r}")
        return DnsPeers(name, int(port))
    peers = []
    for item in value.split(","):
        item = item.strip().removeprefix("http://").removeprefix("https://").rstrip("/")
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected HOST:PORT, got {item!r}")
        peers.append(item)
    if not peers:
        raise ValueError("no peers given")
    return StaticPeers(tuple(peers))


@dataclass(slots=True)
class Member:
    """One other gateway of the fleet as this node sees it."""

    node_id: str
    address: str
    info: NodeInfo | None = None
    has_left: bool = False
    remote: RemoteDirectory = field(init=False)
    is_reachable: bool | None = None  # None: not asked yet
    unreachable_since_s: float | None = None
    last_error: str | None = None
    heard_s: float | None = None  # when it last asked this node something (its lease)
    # When it came back with a new data dir: what its old one held unflushed lives only in
    # replicas until taken over (reads ask their holders meanwhile).
    new_datadir_s: float | None = None
    old_datadir_id: str | None = None  # the one it had before (told to it: ``Fleet.on_lease``)

    def __post_init__(self) -> None:
        self.remote = RemoteDirectory(self.node_id)

    def record(self) -> MemberRecord:
        datadir = self.info.datadir_id if self.info else None
        return MemberRecord(self.node_id, self.address, datadir, self.has_left)

    def note_ok(self) -> None:
        self.is_reachable, self.unreachable_since_s, self.last_error = True, None, None

    def note_failure(self, now_s: float, error: str) -> None:
        if self.is_reachable is not False:
            self.unreachable_since_s = now_s
        self.is_reachable, self.last_error = False, error


class Membership:
    """The members (see the module docstring). ``on_join`` is told of every member that is
    added (the fence widens its wait to it)."""

    def __init__(
        self,
        me: NodeInfo,
        port: int,
        discovery: Discovery,
        transport: PeerTransport,
        store: MemberStore,
        clock: Clock,
        *,
        lease_s: float,
        refresh_s: float,
        timeout_s: float,
    ) -> None:
        self.me = me
        self.port = port
        self._discovery = discovery
        self._transport = transport
        self._store = store
        self._clock = clock
        self.lease_s = lease_s
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self.members: dict[str, Member] = {}
        self._self_addresses: set[str] = set()
        self.on_join: list[Callable[[Member], None]] = []
        # Called with the member and its old data-dir id when it answers from a new one.
        self.on_new_datadir: list[Callable[[Member, str], None]] = []
        self._saves: set[asyncio.Task[None]] = set()
        self._renewing: dict[str, asyncio.Task[LeaseGrant | None]] = {}
        # When a member first told this node it had another data dir before (``renew``).
        self.own_datadir_lost_s: float | None = None
        self._due: dict[str, float] = {}  # node id -> when its next renewal starts
        # What each renewal tells the member of this node's shares of buckets
        # (``flush/shares.py``; the composition root sets it when the node flushes).
        self.shares: Callable[[], tuple[tuple[str, float], ...]] = tuple
        self.cuts: Callable[[], tuple[tuple[str, int, float], ...]] = tuple

    # -- what others see --------------------------------------------------------------------

    def active(self) -> list[Member]:
        """Members that have not left: the ones a fence waits on."""
        return [m for m in self.members.values() if not m.has_left]

    def get(self, node_id: str) -> Member | None:
        return self.members.get(node_id)

    # -- running ----------------------------------------------------------------------------

    async def load(self) -> None:
        """The remembered members (before anything asks about them)."""
        for record in await self._store.load_members():
            if record.node_id == self.me.node_id:
                continue
            member = Member(record.node_id, record.address, has_left=record.has_left)
            if record.datadir_id is not None:
                member.info = NodeInfo(record.node_id, record.datadir_id, 0.0)
            self.members[member.node_id] = member

    async def run(self) -> None:
        """Discover now and every ``refresh_s``; renew each member's lease every
        ``lease_s / 3``, the members spread evenly over that period (by a hash of their
        ids) so that a large fleet's renewals never arrive in one burst."""
        period_s = self.lease_s / 3
        next_refresh_s = self._clock.monotonic()
        while True:
            now_s = self._clock.monotonic()
            try:
                if now_s >= next_refresh_s:
                    next_refresh_s = now_s + self.refresh_s
                    await self.discover()
                self._renew_due(self._clock.monotonic(), period_s)
            except Exception:  # the worker loop: a failed round is logged, the next one runs
                log.exception("peers: membership round failed")
            wake_s = min([next_refresh_s, *self._due.values()], default=next_refresh_s)
            await asyncio.sleep(max(0.005, wake_s - self._clock.monotonic()))

    def _renew_due(self, now_s: float, period_s: float) -> None:
        """Start the renewals that are due; a new member's first one is due at its phase."""
        for member in self.active():
            due_s = self._due.get(member.node_id)
            if due_s is None:
                phase = zlib.crc32(member.node_id.encode()) / 2**32
                due_s = self._due[member.node_id] = now_s + phase * period_s
            if due_s <= now_s:
                self._due[member.node_id] = max(due_s + period_s, now_s + period_s / 2)
                self._renew_in_background(member)
        for node_id in [n for n in self._due if n not in self.members or self.members[n].has_left]:
            del self._due[node_id]

    async def discover(self) -> None:
        """Ask ``hello`` of every discovered address not known to be a member (or us)."""
        known = {m.address for m in self.members.values() if not m.has_left}
        addresses = [
            a for a in await self._discovery.addresses() if a not in known | self._self_addresses
        ]
        await asyncio.gather(*(self._hello(a) for a in addresses))

    async def _hello(self, address: str) -> None:
        try:
            info = await self._transport.hello(address, self.timeout_s)
        except PeerUnavailable as exc:
            log.debug("peers: %s does not answer hello: %s", address, exc)
            return
        if info.node_id == self.me.node_id:
            self._self_addresses.add(address)
            return
        self.admit(info, address)

    def admit(self, info: NodeInfo, address: str) -> Member:
        """A node said who it is (hello, or its own lease request): add or update it. It is
        written to the journal only when what is remembered changes (a lease request comes
        every second from every member)."""
        member = self.members.get(info.node_id)
        if member is not None:
            member.heard_s = self._clock.monotonic()
        if member is not None and (
            member.address == address
            and not member.has_left
            and member.info is not None
            and member.info.incarnation == info.incarnation
        ):
            return member
        if member is None:
            member = self.members[info.node_id] = Member(info.node_id, address, info)
            log.info("peers: %s joined at %s", info.node_id, address)
            for callback in self.on_join:
                callback(member)
        else:
            old = member.info
            if member.has_left:
                log.info("peers: %s is back at %s", info.node_id, address)
            member.address, member.info, member.has_left = address, info, False
            if old is not None and old.incarnation != info.incarnation:
                self._back(member)
            if old is not None and old.datadir_id != info.datadir_id:
                member.new_datadir_s = self._clock.monotonic()
                member.old_datadir_id = old.datadir_id
                log.warning(
                    "peers: %s answers with a new data dir (%s, was %s): what it held is gone",
                    info.node_id,
                    info.datadir_id,
                    old.datadir_id,
                )
                for on_new in self.on_new_datadir:
                    on_new(member, old.datadir_id)
        self._save(member)
        return member

    def _own_datadir_lost(self, told_by: str, datadir_id: str | None) -> None:
        """A member knew this node with another data dir: this one started empty after it
        (a wiped disk, a pod on an emptyDir), and what it held there lives only in its
        replicas until they are taken over. Reads here ask their holders meanwhile, as the
        others do (``Fleet.replica_candidates``): they read the bucket's older version."""
        if self.own_datadir_lost_s is not None:
            return  # told once: the window runs from then
        log.warning(
            "peers: %s knew this gateway with the data dir it had before (%s): what it held "
            "there is read from its replicas until they are taken over",
            told_by,
            datadir_id,
        )
        self.own_datadir_lost_s = self._clock.monotonic()

    def _back(self, member: Member) -> None:
        """A member back from a restart (a new incarnation said so, asking for this node's
        lease before it serves). Its writes are announced only to the nodes holding a
        lease from its new incarnation, and this node may hold none yet: having seen it
        down, it would read without it (found in the fleet simulator: a write acknowledged
        right after a restart was missed by the others). So it is asked on every read
        under any directory (reachable or not yet known, its old directory copy not
        trusted) until a lease from it comes, and one is asked for now."""
        member.remote.untrust()
        if member.is_reachable is False:
            member.is_reachable = None
        self._renew_in_background(member)

    async def renew_all(self) -> None:
        """Start a renewal with every active member that has none in flight (a member that
        does not answer holds up nobody else's renewal)."""
        for member in self.active():
            self._renew_in_background(member)

    def _renew_in_background(self, member: Member) -> None:
        if member.node_id not in self._renewing:
            task = asyncio.create_task(self.renew(member))
            self._renewing[member.node_id] = task
            task.add_done_callback(functools.partial(self._renewed, member.node_id))

    def _renewed(self, node_id: str, task: asyncio.Task[LeaseGrant | None]) -> None:
        if self._renewing.get(node_id) is task:
            del self._renewing[node_id]

    async def renew_now(self) -> None:
        """Renew with every active member and wait for the answers (start-up, tests)."""
        await self.renew_all()
        await asyncio.gather(*self._renewing.values(), return_exceptions=True)

    async def renew(self, member: Member) -> LeaseGrant | None:
        """One lease renewal with ``member``: the directory copy and the liveness check."""
        request = member.remote.request(self.me, self.port, self.shares(), self.cuts())
        sent_s = self._clock.monotonic()
        try:
            grant = await self._transport.lease(member.address, request, self.lease_s / 3)
        except PeerUnavailable as exc:
            member.note_failure(sent_s, str(exc) or type(exc).__name__)
            return None
        if grant.node.node_id != member.node_id:  # another node took the address over
            member.note_failure(sent_s, f"{member.address} is now {grant.node.node_id}")
            self.admit(grant.node, member.address)
            return None
        if member.info is None or member.info.incarnation != grant.node.incarnation:
            self.admit(grant.node, member.address)
        if grant.your_lost_datadir not in (None, self.me.datadir_id):
            self._own_datadir_lost(member.node_id, grant.your_lost_datadir)
        member.remote.apply_grant(grant, sent_s)
        member.note_ok()
        return grant

    def leave(self, node_id: str) -> None:
        """A member said goodbye (it shut down with nothing unflushed)."""
        member = self.members.get(node_id)
        if member is not None and not member.has_left:
            member.has_left = True
            member.remote.untrust()
            log.info("peers: %s left the fleet", node_id)
            self._save(member)

    async def forget(self, node_id: str) -> bool:
        """An operator removed a member for good. False if it was not one."""
        member = self.members.pop(node_id, None)
        if member is None:
            return False
        log.warning("peers: %s forgotten by an operator", node_id)
        await self._store.delete_member(node_id)
        return True

    async def say_bye(self) -> None:
        """Tell every reachable member this node leaves (best effort, short deadline)."""
        await asyncio.gather(
            *(self._bye(m) for m in self.active() if m.is_reachable), return_exceptions=True
        )

    async def _bye(self, member: Member) -> None:
        try:
            await self._transport.bye(member.address, self.me, self.timeout_s)
        except PeerUnavailable as exc:
            log.info("peers: could not say goodbye to %s: %s", member.node_id, exc)

    def _save(self, member: Member) -> None:
        task = asyncio.ensure_future(self._store.save_member(member.record()))
        self._saves.add(task)
        task.add_done_callback(self._saved)

    def _saved(self, task: asyncio.Task[None]) -> None:
        self._saves.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("peers: could not remember a member: %s", task.exception())

    async def close(self) -> None:
        for task in self._renewing.values():
            task.cancel()
        await asyncio.gather(*self._renewing.values(), *self._saves, return_exceptions=True)
