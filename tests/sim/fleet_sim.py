"""A fake-clock simulator of a fleet of gateways, driving the REAL fleet objects
(``gateway.fleet``: Fleet, Membership, LocalDirectory, RemoteDirectory, FleetFence) for
thousands of simulated seconds in a fraction of a second.

- **Time.** ``VirtualTimeLoop`` is an asyncio event loop whose clock only moves when
  nothing is ready to run: it jumps to the next timer. ``asyncio.sleep``, ``wait_for`` and
  every timeout of the fleet code run unchanged, in simulated seconds.
- **Network.** ``Net`` carries every peer call (``SimTransport`` is the ``PeerTransport``
  of a node) with a random one-way delay; a node that is down refuses at once, a cut link
  loses the call (the caller's deadline fires); an answer on a link cut meanwhile is lost.
- **A node** (``SimNode``) is a journal reduced to what the fleet sees (``Disk``: rows with
  their ack sequence, state and whether they are markers; the remembered members; the
  data-dir id), a flusher that uploads pending rows to the shared ``Bucket`` after a
  per-node delay, markers held by the real fence (and by a local fence, as ``FlushOrder``
  holds them), and the peer API's answers. A restart builds a new Fleet on the same
  ``Disk``; a wipe gives it a new one.

Nothing here reimplements the protocol: every decision (who is a member, who holds a
lease, what a copy lists, when a marker is released) is the real classes'.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from virtual_time import LoopClock

from gateway.core.peers import newest_sources
from gateway.errors import NoSuchKey
from gateway.fleet.claims import Claimant, Claims
from gateway.fleet.membership import StaticPeers
from gateway.fleet.node import Fleet, FleetConfig
from gateway.fleet.ordering import held_answer
from gateway.fleet.recovered import newer_in_bucket
from gateway.fleet.takeover import DeleteNotes
from gateway.fleet.transport import (
    AttributesPage,
    PeerError,
    PeerHead,
    PeerRead,
    PeerUnavailable,
)
from gateway.fleet.wire import (
    DirChange,
    DrainAnswer,
    DrainRequest,
    LeaseGrant,
    LeaseRequest,
    NodeInfo,
    PeerRow,
    SupersedeAnswer,
    SupersedeRequest,
    Superseding,
)
from gateway.models import FlushState, LocalObject, ObjectMeta, parent_prefix
from gateway.store.members import MemberRecord
from gateway.upstream.classify import FlushError

T = TypeVar("T")
BUCKET = "sim"
MARKER = ".metadata"


# ------------------------------------------------------------------------------ the network


@dataclass
class Net:
    """Links between node addresses; see the module docstring."""

    rng: random.Random
    delay_s: tuple[float, float] = (0.0002, 0.002)
    nodes: dict[str, SimNode] = field(default_factory=dict)
    cuts: set[frozenset[str]] = field(default_factory=set)
    calls: int = 0

    def is_up(self, address: str) -> bool:
        node = self.nodes.get(address)
        return node is not None and node.is_up

    def linked(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.cuts

    def cut(self, a: str, b: str) -> None:
        self.cuts.add(frozenset((a, b)))

    def heal(self) -> None:
        self.cuts.clear()

    async def call(
        self, src: str, dst: str, op: Callable[[SimNode], Awaitable[T]], timeout_s: float
    ) -> T:
        self.calls += 1
        try:
            return await asyncio.wait_for(self._carry(src, dst, op), timeout_s)
        except TimeoutError:
            raise PeerUnavailable(f"{dst}: no answer in {timeout_s:g}s") from None

    async def _carry(self, src: str, dst: str, op: Callable[[SimNode], Awaitable[T]]) -> T:
        await asyncio.sleep(self.rng.uniform(*self.delay_s))
        if not self.linked(src, dst):
            await asyncio.Event().wait()  # lost: the caller's deadline fires
        node = self.nodes.get(dst)
        if node is None or not node.is_up:
            raise PeerUnavailable(f"{dst}: connection refused")
        task = node.spawn(op(node))
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the node died while answering
                raise PeerUnavailable(f"{dst}: connection reset") from None
            raise
        await asyncio.sleep(self.rng.uniform(*self.delay_s))
        if not self.linked(src, dst) or not node.is_up:
            await asyncio.Event().wait()
        return result


class SimTransport:
    """``PeerTransport`` of one node over ``Net``."""

    def __init__(self, net: Net, me: str) -> None:
        self._net = net
        self._me = me

    async def hello(self, address: str, timeout_s: float) -> NodeInfo:
        return await self._net.call(self._me, address, lambda n: n.api_hello(), timeout_s)

    async def lease(self, address: str, request: LeaseRequest, timeout_s: float) -> LeaseGrant:
        host = self._me.rpartition(":")[0]
        return await self._net.call(
            self._me, address, lambda n: n.api_lease(request, host), timeout_s
        )

    async def announce(self, address: str, change: DirChange, timeout_s: float) -> None:
        await self._net.call(self._me, address, lambda n: n.api_change(change), timeout_s)

    async def drain(self, address: str, request: DrainRequest, timeout_s: float) -> DrainAnswer:
        return await self._net.call(self._me, address, lambda n: n.api_drain(request), timeout_s)

    async def bye(self, address: str, node: NodeInfo, timeout_s: float) -> None:
        await self._net.call(self._me, address, lambda n: n.api_bye(node), timeout_s)

    async def version(
        self,
        address: str,
        bucket: str,
        key: str,
        timeout_s: float,
        *,
        replica: bool = False,
        attributes: AttributesPage | None = None,
    ) -> PeerHead | None:
        if replica:  # (nor are GetObjectAttributes: ``attributes`` is not asked here)
            return None  # (reads from replicas are not simulated)
        return await self._net.call(self._me, address, lambda n: n.api_version(key), timeout_s)

    async def read(
        self,
        address: str,
        bucket: str,
        key: str,
        *,
        method: str,
        headers: Mapping[str, str],
        timeout_s: float,
        zero_copy: bool = False,
    ) -> PeerRead | None:
        return await self._net.call(self._me, address, lambda n: n.api_read(key), timeout_s)

    async def list_rows(
        self, address: str, bucket: str, prefix: str, after: str, limit: int, timeout_s: float
    ) -> tuple[list[PeerRow], bool]:
        return await self._net.call(
            self._me, address, lambda n: n.api_rows(prefix, after, limit), timeout_s
        )

    async def supersede(
        self, address: str, request: SupersedeRequest, timeout_s: float
    ) -> list[SupersedeAnswer]:
        return await self._net.call(
            self._me, address, lambda n: n.api_supersede(request), timeout_s
        )


async def _at_once(call: Callable[[], Awaitable[T]]) -> T:
    """A request sent as it is (the simulated flusher has no request gate)."""
    return await call()


# ------------------------------------------------------------------------------ a node's disk


@dataclass
class Row:
    key: str
    seq: int
    acked_s: float
    value: str  # what a read returns (stands for the ETag); "" for a delete
    is_delete: bool = False
    state: str = "pending"  # pending | durable
    # The oldest acknowledged version of the key not durable yet (as the journal keeps it).
    fence_seq: int = 0

    @property
    def is_marker(self) -> bool:
        return self.key.rpartition("/")[2] == MARKER

    def as_local(self) -> LocalObject:
        meta = ObjectMeta(BUCKET, self.key, len(self.value), self.value, self.acked_s)
        state = FlushState.DURABLE if self.state == "durable" else FlushState.PENDING
        return LocalObject(meta, self.seq, state, None, self.is_delete, acked_s=self.acked_s)


@dataclass
class Disk:
    """What survives a restart (kill -9) and not a wipe."""

    datadir_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    rows: dict[str, Row] = field(default_factory=dict)
    pending: dict[str, Row] = field(default_factory=dict)  # rows not durable yet
    next_seq: int = 1
    members: dict[str, MemberRecord] = field(default_factory=dict)

    async def load_members(self) -> list[MemberRecord]:
        return list(self.members.values())

    async def save_member(self, record: MemberRecord) -> None:
        self.members[record.node_id] = record

    async def delete_member(self, node_id: str) -> None:
        self.members.pop(node_id, None)


@dataclass
class Bucket:
    """The upstream: key -> (value, the time it arrived); and every arrival, in order."""

    objects: dict[str, tuple[str, float]] = field(default_factory=dict)
    log: list[tuple[float, str, str]] = field(default_factory=list)
    control: dict[str, bytes] = field(default_factory=dict)  # claims (deletes noted)

    async def put_if_absent(self, bucket: str, key: str, body: bytes) -> bool:
        """The claims' conditional PUT (``DeleteNotes``), at once."""
        if key in self.control:
            return False
        self.control[key] = body
        return True

    async def get_small(self, bucket: str, key: str) -> bytes | None:
        return self.control.get(key)

    async def list_keys(self, bucket: str, prefix: str) -> list[str]:
        return sorted(k for k in self.control if k.startswith(prefix))

    def put(self, key: str, value: str, now_s: float, is_delete: bool) -> None:
        if is_delete:
            self.objects.pop(key, None)
        else:
            self.objects[key] = (value, now_s)
        self.log.append((now_s, key, "" if is_delete else value))


# ------------------------------------------------------------------------------ a node


class SimNode:
    """One gateway (see the module docstring). ``upload_s``: how long one upload takes."""

    transport_class: type[SimTransport] = SimTransport

    def __init__(
        self,
        name: str,
        address: str,
        net: Net,
        bucket: Bucket,
        addresses: list[str],
        disk: Disk,
        *,
        upload_s: tuple[float, float],
        rng: random.Random,
        lease_s: float = 3.0,
    ) -> None:
        self.name = name
        self.address = address
        self.net = net
        self.bucket = bucket
        self.disk = disk
        self.upload_s = upload_s
        self.rng = rng
        self.is_up = False
        self.is_paused = False
        self.changed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._holds: dict[int, Any] = {}
        self.released: set[int] = set()
        self.uploading: dict[str, Row] = {}  # key -> the row whose upload is on its way
        self.withdrawn: set[int] = set()  # seqs a peer's newer version supersedes
        self.dropped = 0
        me = NodeInfo(name, disk.datadir_id, LoopClock().wall())
        self.started_s = asyncio.get_running_loop().time()  # the rows' clock (acked_s)
        config = FleetConfig(port=int(address.rpartition(":")[2]), lease_s=lease_s, refresh_s=5.0)
        self.transport = self.transport_class(net, address)
        self.fleet = Fleet(
            me,
            config,
            StaticPeers(tuple(addresses)),
            self.transport,
            disk,
            LoopClock(),
            self._has_unflushed,
        )
        claimant = Claimant(name, disk.datadir_id, me.started_s)
        claims = Claims(bucket, claimant, ".gateway/", lambda *n: True)
        # As every gateway of a fleet (fleet/takeover.py): deletes noted while a member
        # cannot be asked, looked at by a version from before this start.
        self.deletes = DeleteNotes(claims, me, self.fleet.someone_unheard)

    # -- lifecycle --------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self) -> None:
        self.is_up = True
        # As the gateway starts: its unflushed rows' directories announced again.
        await self.fleet.load({(BUCKET, parent_prefix(key)) for key in self.disk.pending})
        for row in self.disk.pending.values():
            if row.is_marker and not row.is_delete:
                self._hold(row)
        await self.fleet.start()
        self.spawn(self._flush_loop())

    def kill(self) -> None:
        """kill -9: every task of the process ends where it is; the disk stays."""
        self.is_up = False
        for task in list(self._tasks):
            task.cancel()
        for task in self.fleet._tasks:
            task.cancel()
        for hold in self.fleet.fence.holds():
            for task in hold.tasks:
                task.cancel()
        for task in list(self.fleet.membership._renewing.values()):
            task.cancel()

    async def stop(self) -> None:
        """A clean shutdown (goodbye when nothing is left here)."""
        await self.fleet.stop(say_bye=not self.disk.pending)
        self.kill()

    # -- writes and reads (what a client does) ---------------------------------------------

    async def put(self, key: str, value: str, *, is_delete: bool = False) -> Row:
        async with self.fleet.writing(BUCKET, key) as intent:
            await intent.ready()
            row = self._record(key, value, is_delete)
        return self._published(row)

    def _record(self, key: str, value: str, is_delete: bool, early: Row | None = None) -> Row:
        """The version committed on this node's disk (as the journal's commit does), with
        the seq and time ``early`` was given already (``Journal.run_write_versions``)."""
        now_s = asyncio.get_running_loop().time() if early is None else early.acked_s
        seq = None if early is None else early.seq
        if seq is None:
            seq = self.disk.next_seq
            self.disk.next_seq += 1
        row = Row(key, seq, now_s, value, is_delete)
        older = self.disk.pending.get(key)
        row.fence_seq = older.fence_seq if older is not None else row.seq
        self.disk.rows[key] = row
        self.disk.pending[key] = row
        return row

    def _published(self, row: Row) -> Row:
        """After the commit: a marker held, the flusher woken."""
        if row.is_marker and not row.is_delete:
            self._hold(row)
        self.changed.set()
        return row

    async def read(self, key: str) -> str | None:
        """A GET as ObjectService answers it: the newest unflushed version in the fleet,
        else the local row, else the bucket. None: no such key."""
        local = self.disk.rows.get(key)
        nodes = self.fleet.candidates(BUCKET, key)
        if nodes:
            sources = await newest_sources(
                self.fleet, nodes, BUCKET, key, local and local.as_local()
            )
            for node, replica in sources:  # the next when one dies between answer and read
                try:
                    found = await self.fleet.read(node, BUCKET, key, "HEAD", {}, replica=replica)
                except PeerError:
                    return None  # a delete
                if found is not None:
                    return found.head.meta.etag
        if local is not None:
            return None if local.is_delete else local.value
        held = self.bucket.objects.get(key)
        return held[0] if held else None

    # -- the flusher ------------------------------------------------------------------------

    def _hold(self, row: Row) -> None:
        def released(seq: int = row.seq) -> None:
            self.released.add(seq)
            self.changed.set()

        self._holds[row.seq] = self.fleet.hold(BUCKET, row.key, row.seq, released)

    def _may_flush(self, row: Row) -> bool:
        if not row.is_marker or row.is_delete:
            return True
        if row.seq not in self.released:
            return False
        parent = parent_prefix(row.key)
        return not any(
            r.seq < row.seq and r.key.startswith(parent) and not r.is_marker
            for r in self.disk.pending.values()
        )

    async def _flush_loop(self) -> None:
        # Not ``while True``: Python 3.11's wait_for can swallow the kill's cancellation,
        # and a dead node must not go on flushing.
        while self.is_up:
            ready = [
                r
                for r in self.disk.pending.values()
                if not self.is_paused and self._may_flush(r) and r.seq not in self.withdrawn
            ]
            if not ready:
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 0.5)
                continue
            await self._flush_one(min(ready, key=lambda r: r.seq))

    async def _flush_one(self, row: Row) -> None:
        if not await self._in_order(row):
            return
        with self.upload_of(row):
            await asyncio.sleep(self.rng.uniform(*self.upload_s))
            current = self.disk.rows.get(row.key)
            if current is row and not self.is_paused:
                now_s = asyncio.get_running_loop().time()
                self.bucket.put(row.key, row.value, now_s, row.is_delete)
                self._mark_durable(row)

    @contextlib.contextmanager
    def upload_of(self, row: Row) -> Iterator[None]:
        """An upload of ``row`` on its way (a peer's supersede waits for it)."""
        self.uploading[row.key] = row
        try:
            yield
        finally:
            del self.uploading[row.key]
            self.changed.set()

    async def _in_order(self, row: Row) -> bool:
        """The real flusher's steps before an upload (fleet/ordering.py): peers drop older
        versions of the key; and a version acknowledged before this start is compared
        with the bucket's (fleet/recovered.py). False when this one is not to go up (a
        newer version is durable: dropped; or a peer could not be asked: later)."""
        try:
            local = row.as_local()
            if await self.fleet.upload_order.before_upload(local) and not (
                await newer_in_bucket(
                    local, self.started_s, self, _at_once, self.deletes.deleted_since
                )  # type: ignore[arg-type]
            ):
                await self.deletes.before_delete(local)
                return row.seq not in self.withdrawn
        except FlushError:
            await asyncio.sleep(1.0)
            return False
        self._drop(row)
        return False

    async def head_object(self, bucket: str, key: str) -> ObjectMeta:
        """The bucket's HEAD, as ``newer_in_bucket`` asks it (the value stands for the ETag)."""
        held = self.bucket.objects.get(key)
        if held is None:
            raise NoSuchKey(Key=key)
        return ObjectMeta(BUCKET, key, len(held[0]), held[0], held[1])

    def _drop(self, row: Row) -> None:
        if self.disk.pending.get(row.key) is row:
            del self.disk.pending[row.key]
            del self.disk.rows[row.key]
            self.dropped += 1
        self.changed.set()

    def _mark_durable(self, row: Row) -> None:
        row.state = "durable"
        if self.disk.pending.get(row.key) is row:
            del self.disk.pending[row.key]
            if row.is_delete:
                del self.disk.rows[row.key]
        self.changed.set()

    def _has_unflushed(self, bucket: str, prefix: str) -> bool:
        return any(r.key.startswith(prefix) for r in self.disk.pending.values())

    # -- the peer API -----------------------------------------------------------------------

    async def api_hello(self) -> NodeInfo:
        return self.fleet.me

    async def api_lease(self, request: LeaseRequest, host: str) -> LeaseGrant:
        return self.fleet.on_lease(request, host)

    async def api_change(self, change: DirChange) -> None:
        self.fleet.on_change(change)

    async def api_bye(self, node: NodeInfo) -> None:
        self.fleet.on_bye(node)

    async def api_drain(self, request: DrainRequest) -> DrainAnswer:
        fence_seq = self.disk.next_seq - 1
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + request.wait_s
        while True:
            left = [
                r
                for r in self.disk.pending.values()
                if r.fence_seq <= fence_seq
                and r.key.startswith(request.prefix)
                and not (request.exclude_markers and r.is_marker)
            ]
            if not left or loop.time() >= deadline_s - 1e-6:  # timers fire within 1e-9 s
                size = sum(len(r.value) for r in left)
                return DrainAnswer(self.fleet.me, not left, len(left), size)
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), deadline_s - loop.time())

    def _head(self, row: Row) -> PeerHead:
        local = row.as_local()
        return PeerHead(self.name, local.meta, "pending", row.acked_s, row.is_delete)

    async def api_supersede(self, request: SupersedeRequest) -> list[SupersedeAnswer]:
        """As the peer API's ``supersede`` with the flusher's ``withdraw``."""
        return list(await asyncio.gather(*(self._superseded(request, v) for v in request.versions)))

    async def _superseded(self, request: SupersedeRequest, version: Superseding) -> SupersedeAnswer:
        row = self.disk.rows.get(version.key)
        if row is None:
            return SupersedeAnswer()
        is_durable = row.state == "durable"
        answer = held_answer(row.acked_s, self.name, is_durable, request.node, version)
        if answer is not None:
            return answer
        self.withdrawn.add(row.seq)
        try:
            deadline_s = asyncio.get_running_loop().time() + request.wait_s
            while version.key in self.uploading:
                left_s = deadline_s - asyncio.get_running_loop().time()
                if left_s <= 0:
                    return SupersedeAnswer(busy=True)
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), left_s)
            self._drop(row)
            return SupersedeAnswer()
        finally:
            self.withdrawn.discard(row.seq)

    async def api_version(self, key: str) -> PeerHead | None:
        row = self.disk.rows.get(key)
        return None if row is None or row.state == "durable" else self._head(row)

    async def api_read(self, key: str) -> PeerRead | None:
        row = self.disk.rows.get(key)
        if row is None or row.state == "durable":
            return None
        if row.is_delete:
            raise PeerError(404, "NoSuchKey", "The specified key does not exist.")
        return PeerRead(self._head(row))

    async def api_rows(self, prefix: str, after: str, limit: int) -> tuple[list[PeerRow], bool]:
        rows = sorted((r for r in self.disk.pending.values() if r.key > after), key=lambda r: r.key)
        rows = [r for r in rows if r.key.startswith(prefix)][:limit]
        out = [
            PeerRow(r.key, len(r.value), r.value, r.acked_s, r.acked_s, r.is_delete) for r in rows
        ]
        return out, len(out) == limit


# ------------------------------------------------------------------------------ a fleet


class SimFleet:
    """N nodes on one ``Net`` and one ``Bucket``; nodes can be killed, restarted (disk
    intact), wiped, partitioned."""

    node_type: type[SimNode] = SimNode

    def __init__(
        self,
        n: int,
        seed: int,
        *,
        upload_s: tuple[float, float] = (0.01, 0.2),
        lease_s: float = 3.0,
    ) -> None:
        self.rng = random.Random(seed)
        self.net = Net(self.rng)
        self.bucket = Bucket()
        self.names = [chr(ord("a") + i) for i in range(n)]
        self.addresses = [f"10.0.0.{i + 1}:9000" for i in range(n)]
        self.lease_s = lease_s
        self.upload_s = upload_s
        self.disks = {name: self.new_disk() for name in self.names}
        self.nodes: dict[str, SimNode] = {}

    def new_disk(self) -> Disk:
        return Disk()

    def address_of(self, name: str) -> str:
        return self.addresses[self.names.index(name)]

    def _build(self, name: str) -> SimNode:
        node = self.make_node(name)
        self.net.nodes[node.address] = node
        self.nodes[name] = node
        return node

    def make_node(self, name: str) -> SimNode:
        return self.node_type(
            name,
            self.address_of(name),
            self.net,
            self.bucket,
            self.addresses,
            self.disks[name],
            upload_s=self.upload_s,
            rng=self.rng,
            lease_s=self.lease_s,
            **self.node_options(),
        )

    def node_options(self) -> dict[str, Any]:
        """What a subclass's ``node_type`` takes besides a ``SimNode``'s arguments."""
        return {}

    async def start(self) -> None:
        for name in self.names:
            self._build(name).is_up = True  # reachable while the others start
        await asyncio.gather(*(self.nodes[n].start() for n in self.names))

    async def restart(self, name: str, *, wipe: bool = False) -> SimNode:
        self.nodes[name].kill()
        if wipe:
            self.disks[name] = self.new_disk()
        node = self._build(name)
        await node.start()
        return node

    async def close(self) -> None:
        for node in self.nodes.values():
            node.kill()
        await asyncio.sleep(0)


_ids = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}{next(_ids)}"
