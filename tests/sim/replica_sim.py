"""The fleet simulator (fleet_sim.py) with replicas before the ack and takeover through the
bucket (docs/fleet.md, "Node loss"), driving the REAL classes: ``Replication`` and
``ReplicaWrite`` (holders by rendezvous over the live members, stage, commit, the strict
policy's refusals), ``ReplicaStore`` (its SQL, on an in-memory SQLite that survives a
kill and not a wipe), ``Claims``, ``UploadClaims`` and ``Takeover`` (lost writers, one
uploader per version, guarded uploads, markers after their directory), and the fence's
``LostWriters``.

What stands in for the rest:
- **The bucket** (``ClaimingBucket``) answers conditional writes as S3 does (412 on a key
  that exists or changed; evaluated when the request completes, after its transfer time),
  lists strongly, and logs every arrival with who sent it.
- **A node's writes** (``ReplicaNode.put``) follow ``ObjectService._put``: replicate
  (strict: SlowDown before anything is written), tee the body to the holders, wait for
  them to stage it, commit here and there at once (a PutObject's early commit, the seq
  handed out first; a delete commits there after here), acknowledge. Bodies are small (staged in
  the holders' journal rows, as real bodies up to 64 KiB are).
- **The flusher** claims each version before its upload and marks it done after (as
  ``Flusher._flush`` does with ``UploadClaims``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from fleet_sim import BUCKET, MARKER, Bucket, Disk, Row, SimFleet, SimNode, SimTransport
from virtual_time import LoopClock

from gateway.fleet.claims import Claimant, Claims
from gateway.fleet.fence import LostWriters
from gateway.fleet.membership import Member
from gateway.fleet.replication import ReplicaPolicy, Replication
from gateway.fleet.rereplication import Rereplication
from gateway.fleet.takeover import Takeover, TakeoverConfig, UploadClaims
from gateway.fleet.wire import (
    DrainAnswer,
    DrainRequest,
    ReplicaCommit,
    SupersedeAnswer,
    SupersedeRequest,
    Superseding,
)
from gateway.models import FlushState, LocalObject, ObjectMeta
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.replicas import ReplicaStore
from gateway.store.tables import ensure_schema
from gateway.upstream.classify import ConditionFailed, FlushError
from gateway.upstream.client import AiobotocoreUpstream, Condition

T = TypeVar("T")
CONTROL = ".gateway/"
LOCAL_COMMIT_S = 0.002  # the writer's own journal commit (an fsync), beside the holders'


# ------------------------------------------------------------------------------ the bucket


@dataclass
class Arrival:
    t: float
    key: str
    value: str  # "" for a delete
    sender: str


@dataclass
class ClaimingBucket(Bucket):
    """The upstream with S3's conditional writes (see the module docstring)."""

    control: dict[str, bytes] = field(default_factory=dict)
    arrivals: list[Arrival] = field(default_factory=list)
    request_s: tuple[float, float] = (0.005, 0.03)

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def land(self, key: str, value: str, is_delete: bool, sender: str) -> None:
        self.put(key, value, self.now(), is_delete)
        self.arrivals.append(Arrival(self.now(), key, "" if is_delete else value, sender))

    def holds(self, key: str, condition: Condition | None) -> bool:
        """Whether a write's condition holds now (If-Match / If-None-Match: *)."""
        current = self.objects.get(key)
        if not condition:
            return True
        if "IfNoneMatch" in condition:
            return current is None
        return current is not None and f'"{current[0]}"' == condition["IfMatch"]


class BucketClient:
    """One node's client of the bucket: what Claims and Takeover call on the upstream."""

    def __init__(self, bucket: ClaimingBucket, node: SimNode) -> None:
        self._bucket = bucket
        self._node = node

    async def _request(self) -> None:
        await asyncio.sleep(self._node.rng.uniform(*self._bucket.request_s))

    async def put_if_absent(self, bucket: str, key: str, body: bytes) -> bool:
        await self._request()
        if key in self._bucket.control:
            return False
        self._bucket.control[key] = body
        return True

    async def get_small(self, bucket: str, key: str) -> bytes | None:
        await self._request()
        return self._bucket.control.get(key)

    async def list_keys(self, bucket: str, prefix: str) -> list[str]:
        await self._request()
        return sorted(k for k in self._bucket.control if k.startswith(prefix))

    async def state_of(self, bucket: str, key: str) -> tuple[str, float] | None:
        await self._request()
        return self._bucket.objects.get(key)

    async def put_object(
        self, meta: ObjectMeta, body: Any, condition: Condition | None = None
    ) -> str:
        await asyncio.sleep(self._node.rng.uniform(*self._node.upload_s))
        if not self._bucket.holds(meta.key, condition):
            raise ConditionFailed(f"412 PreconditionFailed: {meta.key}")
        self._bucket.land(meta.key, meta.etag, False, self._node.name)
        return meta.etag

    async def delete_object(
        self, bucket: str, key: str, condition: Condition | None = None
    ) -> None:
        await self._request()
        if not self._bucket.holds(key, condition):
            raise ConditionFailed(f"412 PreconditionFailed: {key}")
        self._bucket.land(key, "", True, self._node.name)


# ------------------------------------------------------------------------------ a node's disk


class SqlJournal:
    """The journal's surface ReplicaStore uses, on an in-memory SQLite with the real
    schema. A write op runs whole within one step of the loop: a kill never splits it."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:", isolation_level=None)
        ensure_schema(self.conn)

    def record(self, change: object) -> None:
        """Figures are not simulated."""

    async def run_write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        self.conn.execute("BEGIN")
        try:
            result = op(self.conn)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return result

    async def run_read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        return op(self.conn)


@dataclass
class ReplicaDisk(Disk):
    journal: SqlJournal = field(default_factory=SqlJournal)
    bodies: dict[int, bytes] = field(default_factory=dict)  # by seq: a row's body


class NoBlobs:
    """Every simulated body is staged inline: no blob file is ever named."""

    async def discard(self, blob_ids: Iterable[str]) -> None:
        assert not list(blob_ids)


# ------------------------------------------------------------------------------ the network


class ReplicaTransport(SimTransport):
    """``SimTransport`` plus the peer API's replica calls."""

    async def replica_body(
        self,
        address: str,
        owner: str,
        stage_id: str,
        bucket: str,
        key: str,
        upload: tuple[str, int] | None,
        body: AsyncIterator[bytes],
        timeout_s: float,
        size_bytes: int | None = None,
        by_crc32c: bool = False,  # the simulated holder stages by MD5 (answered as such)
    ) -> tuple[str, int]:
        whole = b"".join([piece async for piece in body])  # read here: the writer sent it
        return await self._net.call(
            self._me,
            address,
            lambda n: _replica(n).api_stage(owner, stage_id, key, whole),
            timeout_s,
        )

    async def replica_commit(
        self, address: str, commit: ReplicaCommit, timeout_s: float
    ) -> list[str]:
        return await self._net.call(
            self._me, address, lambda n: _replica(n).api_commit(commit), timeout_s
        )

    async def replica_drop(
        self, address: str, owner: str, datadir_id: str, seqs: Sequence[int], timeout_s: float
    ) -> None:
        await self._net.call(
            self._me, address, lambda n: _replica(n).api_drop(owner, datadir_id, seqs), timeout_s
        )

    async def replica_needed(
        self, address: str, owner: str, datadir_id: str, seqs: Sequence[int], timeout_s: float
    ) -> list[int] | None:
        return await self._net.call(
            self._me, address, lambda n: _replica(n).api_needed(owner, datadir_id, seqs), timeout_s
        )


def _replica(node: SimNode) -> ReplicaNode:
    return cast(ReplicaNode, node)


# ------------------------------------------------------------------------------ a node


class Refused(Exception):
    """The write was not acknowledged (its client retries or gives up)."""


class ReplicaNode(SimNode):
    """A SimNode with replicas (see the module docstring)."""

    transport_class = ReplicaTransport
    disk: ReplicaDisk
    bucket: ClaimingBucket

    def __init__(self, *args: Any, replicas: int, peer_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        me = self.fleet.me
        self.store = ReplicaStore(cast(Journal, self.disk.journal))
        self.replication = Replication(
            me, self.fleet.membership, self.transport, ReplicaPolicy(replicas, is_strict=True)
        )
        client = BucketClient(self.bucket, self)
        claimant = Claimant(me.node_id, me.datadir_id, me.started_s)
        claims = Claims(client, claimant, CONTROL, lambda *n: self.takeover.claimant_lost(*n))
        self.takeover = Takeover(
            me,
            self.fleet.membership,
            self.transport,
            self.store,
            cast(BlobStore, NoBlobs()),
            cast(AiobotocoreUpstream, client),
            claims,
            LoopClock(),
            TakeoverConfig(peer_timeout_s, lambda key: key.rpartition("/")[2] == MARKER),
            held_bytes=lambda: 0,
            wait_fleet_drained=self.fleet.fence.drained_everywhere,
        )
        # As the composition root: a version taken over goes up as its writer's would, the
        # key's older versions (on peers, and here) giving way first.
        self.fleet.upload_order.here = self._give_way_here
        self.takeover.in_order = self.fleet.upload_order.before_takeover
        # As Journal.may_be_superseded_elsewhere: rows an earlier run left (it may have
        # died between a newer version's early commit on a holder and its own).
        self.first_seq = self.disk.next_seq
        self.claims = UploadClaims(claims, me, lambda bucket, key, seq: seq < self.first_seq)
        self.fleet.fence.lost = LostWriters(
            self.takeover.is_lost, self.takeover.owner_answer, self._own_drain
        )
        self.uploads = 0
        self.in_flight: set[int] = set()  # seqs handed out, not committed (process memory)
        self.rereplication = Rereplication(
            self.replication,
            self.fleet.membership,
            self.takeover.is_lost,
            lambda: self.disk.next_seq - 1,
            self._pending_after,
            self._remake,
        )

    async def start(self) -> None:
        await super().start()
        self.spawn(self._rounds(self.takeover.round, 1.0))
        self.spawn(self._rounds(self.rereplication.round, 2.0))

    async def _give_way_here(self, asker: str, version: Superseding) -> SupersedeAnswer:
        """This node's own row of a key taken over from here, asked as a peer is."""
        return await self._superseded(SupersedeRequest(asker, (version,), 5.0), version)

    async def _rounds(self, one: Callable[[], Any], every_s: float) -> None:
        """``Takeover.run``, ``Rereplication.run`` while the node is up (see
        ``_flush_loop``)."""
        while self.is_up:
            try:
                await one()
            except Exception:  # as their run: logged, the next round runs
                logging.getLogger(__name__).exception("%s failed", one)
            await asyncio.sleep(every_s)

    # -- re-replication ---------------------------------------------------------------------

    async def _pending_after(self, after_seq: int, limit: int) -> list[LocalObject]:
        """As Journal.unflushed_after."""
        rows = sorted((r for r in self.disk.pending.values() if r.seq > after_seq), key=_seq)
        return [self._local(r) for r in rows[:limit]]

    async def _remake(self, obj: LocalObject, holders: Sequence[Member]) -> int:
        """As app.py's ``remake`` (core/writes.py ``remake_replica``): the commit, and
        the body to a holder that lacks it."""
        body = self.disk.bodies.get(obj.seq, b"")
        write = self.replication.remake(BUCKET, obj.meta.key, list(holders))
        return int(
            await write.commit(
                holders,
                obj.seq,
                self._meta_of(obj, len(body)),
                obj.acked_s,
                is_delete=obj.is_delete,
                stage_ids=() if obj.is_delete else [write.stage_id],
                resend=lambda stage_id: _one(body),
            )
        )

    # -- writes -----------------------------------------------------------------------------

    async def put(self, key: str, value: str, *, is_delete: bool = False) -> Row:
        """Acknowledge ``value`` (the body) under ``key`` as ObjectService does with
        replicas; Refused when the strict policy refuses."""
        body = value.encode()
        md5 = hashlib.md5(body).hexdigest()
        async with self.fleet.writing(BUCKET, key) as intent:
            try:
                replica = self.replication.start(BUCKET, key, size_hint=len(body))
                holders: Sequence[Any] = replica.holders
                if not is_delete:
                    async for _ in replica.tee(_one(body)):
                        pass
                    holders = await replica.staged(md5, len(body))
            except Exception as exc:  # SlowDown: too few holders
                raise Refused(str(exc)) from exc
            await intent.ready()
            if is_delete:
                row = self._published(self._record(key, "", is_delete))
                commit = self._commit(replica, holders, row, len(body), is_early=False)
            else:  # PutObject: the holders' commit beside the local one (EarlyCommit)
                seq = self.disk.next_seq  # handed out, under the durable ceiling
                self.disk.next_seq += 1
                early = Row(key, seq, asyncio.get_running_loop().time(), md5, False)
                self.in_flight.add(seq)
                try:
                    commit = self.spawn(self._commit(replica, holders, early, len(body), True))
                    await asyncio.sleep(LOCAL_COMMIT_S)
                    self.disk.bodies[seq] = body
                    row = self._published(self._record(key, md5, False, early))
                finally:
                    self.in_flight.discard(seq)
        try:
            await commit
        except Exception as exc:  # committed here, not acknowledged: it still flushes
            raise Refused(str(exc)) from exc
        return row

    async def _commit(
        self, replica: Any, holders: Sequence[Any], row: Row, size: int, is_early: bool
    ) -> None:
        await replica.commit(
            holders,
            row.seq,
            self._meta(row, size),
            row.acked_s,
            is_delete=row.is_delete,
            stage_ids=() if row.is_delete else [replica.stage_id],
            is_early=is_early,
        )

    @staticmethod
    def _meta(row: Row, size_bytes: int) -> ObjectMeta:
        return ObjectMeta(BUCKET, row.key, size_bytes, row.value, row.acked_s)

    def _local(self, row: Row) -> LocalObject:
        meta = self._meta(row, 0)
        return LocalObject(
            meta, row.seq, FlushState.PENDING, None, row.is_delete, acked_s=row.acked_s
        )

    @staticmethod
    def _meta_of(obj: LocalObject, size_bytes: int) -> ObjectMeta:
        meta = obj.meta
        return ObjectMeta(BUCKET, meta.key, size_bytes, meta.etag, meta.last_modified_s)

    # -- the flusher ------------------------------------------------------------------------

    async def _flush_one(self, row: Row) -> None:
        if not await self._in_order(row):
            return
        with self.upload_of(row):
            await self._claimed_upload(row)

    async def _claimed_upload(self, row: Row) -> None:
        try:
            decision = await self.claims.before_upload(self._local(row))
            if decision == "wait":  # another, not lost, holds its claim: it uploads it
                await asyncio.sleep(1.0)
                return
            if decision == "upload":
                if self.disk.rows.get(row.key) is not row or self.is_paused:
                    return  # superseded meanwhile (its claim stays unused)
                client = BucketClient(self.bucket, self)
                if row.is_delete:
                    await client.delete_object(BUCKET, row.key)
                else:
                    await client.put_object(self._meta(row, 0), None)
                self.uploads += 1
                await self.claims.after_upload(self._local(row))
        except FlushError:
            await asyncio.sleep(1.0)
            return
        self._mark_durable(row)

    # -- the peer API -----------------------------------------------------------------------

    async def api_stage(self, owner: str, stage_id: str, key: str, body: bytes) -> tuple[str, int]:
        md5 = hashlib.md5(body).hexdigest()
        now_s = LoopClock().wall()
        await self.store.stage(
            stage_id, owner, BUCKET, key, None, len(body), md5, None, now_s, None, body
        )
        return md5, len(body)

    async def api_commit(self, c: ReplicaCommit) -> list[str]:
        self.takeover.heard_from(c.owner, c.datadir_id)
        expected = [c.meta.etag for _ in c.stage_ids]
        inline = None if c.body is None else (c.body, LoopClock().wall())
        missing, _ = await self.store.commit(
            c.owner,
            c.datadir_id,
            c.seq,
            c.meta,
            c.is_delete,
            c.stage_ids,
            c.parts,
            c.acked_s,
            expected,
            inline,
            is_early=c.is_early,
        )
        return missing

    async def api_drop(self, owner: str, datadir_id: str, seqs: Sequence[int]) -> None:
        await self.store.drop(owner, datadir_id, seqs)

    async def api_needed(
        self, owner: str, datadir_id: str, seqs: Sequence[int]
    ) -> list[int] | None:
        if (owner, datadir_id) != (self.fleet.me.node_id, self.fleet.me.datadir_id):
            return None
        # As Journal.unflushed_seqs: pending versions, and those a pending one superseded.
        spans = [(r.fence_seq, r.seq) for r in self.disk.pending.values()]
        return [
            s for s in seqs if s in self.in_flight or any(low <= s <= high for low, high in spans)
        ]

    async def api_drain(self, request: DrainRequest) -> DrainAnswer:
        if request.owner is not None:  # a lost writer's replicas held here
            return await self.takeover.owner_answer(request)
        return await super().api_drain(request)

    async def _own_drain(self, ask: DrainRequest) -> DrainAnswer:
        return await super().api_drain(
            DrainRequest(ask.bucket, ask.prefix, 0.0, exclude_markers=True)
        )


async def _one(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _seq(row: Row) -> int:
    return row.seq


# ------------------------------------------------------------------------------ a fleet


class ReplicaFleet(SimFleet):
    """N ReplicaNodes on one ``ClaimingBucket``."""

    node_type = ReplicaNode

    def __init__(
        self, n: int, seed: int, *, replicas: int = 1, peer_timeout_s: float = 10.0, **kw: Any
    ) -> None:
        super().__init__(n, seed, **kw)
        self.bucket = ClaimingBucket()
        self.replicas = replicas
        self.peer_timeout_s = peer_timeout_s

    def new_disk(self) -> Disk:
        return ReplicaDisk()

    def node_options(self) -> dict[str, Any]:
        return {"replicas": self.replicas, "peer_timeout_s": self.peer_timeout_s}

    def node(self, name: str) -> ReplicaNode:
        return _replica(self.nodes[name])

    def pending_anywhere(self) -> int:
        return sum(len(d.pending) for d in self.disks.values())


async def settle(fleet: ReplicaFleet, limit_s: float) -> None:
    """Heal, bring every node up and unpaused, and wait until nothing is pending on any
    disk (or ``limit_s`` passed)."""
    fleet.net.heal()
    for name in fleet.names:
        if not fleet.nodes[name].is_up:
            await fleet.restart(name)
        fleet.nodes[name].is_paused = False
        fleet.nodes[name].changed.set()
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + limit_s
    while loop.time() < deadline_s and fleet.pending_anywhere():
        await asyncio.sleep(1.0)
    with contextlib.suppress(Exception):
        await asyncio.sleep(0)
