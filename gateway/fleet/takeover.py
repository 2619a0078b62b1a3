"""Takeover (docs/fleet.md, "Takeover"): the members holding a lost writer's replicas upload
them, exactly one per version (``claims.py``), never an older version over a newer one.

- ``UploadClaims`` is what the flusher asks of every upload when replicas are on: claim the
  version first (its writer claims like anyone: a member may have taken it over while this
  node was cut off), and mark it done after.
- ``Takeover.run`` is the holders' loop: every few seconds, for each writer it holds
  replicas of that is lost (silent for ``peer_timeout_s``, or back with a new data dir),
  claim and upload each version; and, for writers that are not lost, ask which versions
  they still need held (``replica/needed``) and drop the rest.

Loop-bound; blocking file work in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import io
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TypeVar

from gateway import metrics
from gateway.clock import Clock
from gateway.errors import S3Error
from gateway.fleet.claims import Claims, Outcome, SendGate, Version
from gateway.fleet.membership import Membership
from gateway.fleet.standing import Look, Standing, standing, version_of
from gateway.fleet.transport import PeerTransport, PeerUnavailable
from gateway.fleet.wire import ANY_LOST_WRITER, DrainAnswer, DrainRequest, NodeInfo, Superseding
from gateway.models import LocalObject, ObjectMeta
from gateway.store.blobs import BlobStore, close_bodies, open_bodies
from gateway.store.replicas import Replica, ReplicaStore, newest_of_each_key
from gateway.upstream.classify import ConditionFailed, FlushError
from gateway.upstream.client import AiobotocoreUpstream, PartSource, unchanged_since

log = logging.getLogger(__name__)
T = TypeVar("T")
_ROUND_S = 1.0  # how often lost writers are looked for (and held replicas counted)
_NEEDED_EVERY_S = 30.0  # how often a live writer is asked which replicas it still needs
_STAGED_TTL_S = 24 * 3600.0  # a staged body never committed is dropped after this
# How long a replica's standing is trusted by reads (``is_servable``): not superseded,
# only for the version question and the read that follows it (a newer version flushed
# just after would otherwise lose to the replica that long); superseded, longer (a newer
# version does not go away).
_SERVABLE_TTL_S = 0.25
_SUPERSEDED_TTL_S = 5.0
_SERVABLE_BUDGET_S = 1.0  # the look's time, within the default --peer-read-timeout (2 s)
_SERVABLE_MAX = 10_000
# Versions taken over at once by one node (each a claim, a look and an upload; the request
# gate, when there is one, bounds what is in flight and paces it with the node's own).
_CONCURRENCY = 128


# Around one takeover upload (``LocalDirectory.taking_over``): the key's directory
# announced to the peers, so that their copies of the key are checked again after it.
TakingOver = Callable[[str, str], AbstractAsyncContextManager[None]]


@contextlib.asynccontextmanager
async def _nothing_announced(bucket: str, key: str) -> AsyncIterator[None]:
    yield


class Decision(enum.Enum):
    UPLOAD = "upload"
    DONE = "done"  # uploaded by another node: nothing to send, it is durable
    WAIT = "wait"  # another node, not lost, holds the claim: look again later


class UploadClaims:
    """The flusher's side of claims (see the module docstring)."""

    def __init__(
        self,
        claims: Claims,
        me: NodeInfo,
        may_be_superseded: Callable[[str, str, int], bool] = lambda bucket, key, seq: False,
    ) -> None:
        self._claims = claims
        self._me = me
        # A newer version of this writer's may be on a holder only (Journal.
        # may_be_superseded_elsewhere): then its claims are looked at before an upload.
        self._may_be_superseded = may_be_superseded

    def _version(self, obj: LocalObject) -> Version:
        return Version.of_row(obj, self._me.node_id, self._me.datadir_id)

    async def before_upload(self, obj: LocalObject) -> str:
        version = self._version(obj)
        claim = await self._claims.claim(version)
        if claim.outcome is Outcome.WON and await self._superseded_elsewhere(obj, version):
            log.info(
                "%s/%s seq=%d: a newer version of this gateway's is in the bucket or on its "
                "way there (taken over); not uploaded",
                obj.meta.bucket,
                obj.meta.key,
                obj.seq,
            )
            await self._claims.done(version)
            return Decision.DONE.value
        if claim.outcome is Outcome.DONE:
            log.info(
                "%s/%s seq=%d was uploaded by another gateway (taken over)",
                obj.meta.bucket,
                obj.meta.key,
                obj.seq,
            )
            return Decision.DONE.value
        if claim.outcome is Outcome.HELD:
            return Decision.WAIT.value
        return Decision.UPLOAD.value

    async def superseded_elsewhere(self, obj: LocalObject) -> bool:
        """Whether a newer version of ``obj``'s key is in the bucket or on its way there,
        by its claims, where one may be that this node does not know of (a version of its
        own committed early on a holder and taken over; one written through another node
        while this node was down: ``fleet/recovered.py``). Reads ask it too."""
        return await self._superseded_elsewhere(obj, self._version(obj))

    async def _superseded_elsewhere(self, obj: LocalObject, version: Version) -> bool:
        """A newer version, committed early on a holder and never here, or written
        elsewhere while this node was down, was taken over or uploaded: this one must not
        land over it. Looked at only when that may be."""
        meta = obj.meta
        if not self._may_be_superseded(meta.bucket, meta.key, obj.seq):
            return False
        return await self._claims.newer_on_its_way(version)

    async def after_upload(self, obj: LocalObject) -> None:
        await self._claims.done(self._version(obj))


class DeleteNotes:
    """Deletes a node back with its disk cannot otherwise know of (docs/fleet.md, "One key
    through two nodes", on restarts). The bucket keeps nothing of a delete; a node that was
    down held an older version of the key and could not be asked to drop it; back, it
    found no object and uploaded its version over the delete (without replicas; with them
    every upload is claimed and marked done, and that tells). So a delete about to go up
    while a member of the fleet cannot be asked is marked done in its key's claims first
    (one small PUT, under ``--control-prefix``), and a version acknowledged before its
    node's start whose key the bucket does not hold looks there (one LIST)."""

    def __init__(self, claims: Claims, me: NodeInfo, unheard: Callable[[], bool]) -> None:
        self._claims = claims
        self._me = me
        self._unheard = unheard  # whether a member cannot be asked now
        self.noted = 0  # deletes noted (tests)

    def _version(self, obj: LocalObject) -> Version:
        return Version.of_row(obj, self._me.node_id, self._me.datadir_id)

    def use_gate(self, gate: SendGate) -> None:
        """The notes and the looks go to the bucket through the flusher's request gate."""
        self._claims.gate = gate

    async def before_delete(self, obj: LocalObject) -> None:
        """Before ``obj`` (a delete) goes up: noted if a member cannot be asked."""
        if obj.is_delete and self._unheard():
            await self._claims.done(self._version(obj))
            self.noted += 1

    async def deleted_since(self, obj: LocalObject, *, direct: bool = False) -> bool:
        """Whether a delete of ``obj``'s key newer than ``obj`` was noted or claimed.
        ``direct``: for a read, not through the request gate."""
        return await self._claims.newer_on_its_way(self._version(obj), direct=direct)


@dataclass(frozen=True, slots=True)
class TakeoverConfig:
    peer_timeout_s: float = 30.0
    is_marker: Callable[[str], bool] = lambda key: False


class Takeover:
    """The holders' loop (see the module docstring)."""

    def __init__(
        self,
        me: NodeInfo,
        membership: Membership,
        transport: PeerTransport,
        store: ReplicaStore,
        blobs: BlobStore,
        upstream: AiobotocoreUpstream,
        claims: Claims,
        clock: Clock,
        config: TakeoverConfig,
        held_bytes: Callable[[], int],
        wait_fleet_drained: Callable[[str, str, str], Awaitable[bool]] | None = None,
        taking_over: TakingOver = _nothing_announced,
    ) -> None:
        self._me = me
        self._membership = membership
        self._transport = transport
        self._store = store
        self._blobs = blobs
        self._upstream = upstream
        self._claims = claims
        self._clock = clock
        self._config = config
        self._held_bytes = held_bytes
        self._wait_drained = wait_fleet_drained
        self._asked_s: dict[tuple[str, str], float] = {}
        self._heard: dict[str, tuple[str, float]] = {}  # writer -> (data dir, monotonic s)
        self._gone: set[tuple[str, str]] = set()  # (writer, data dir) it no longer runs on
        # Versions this node claimed and has not finished: finished even if their writer
        # comes back meanwhile (it waits on the claim).
        self._unfinished: set[tuple[str, str, int]] = set()
        # Replicas held here, by writer, as of the last round (the status says so).
        self.held: list[dict[str, object]] = []
        # The flusher's request gate (``use_gate``, once the composition root built it).
        self.gate: SendGate | None = None
        self._servable: dict[tuple[str, str, int], tuple[float, bool]] = {}
        self._taking_over = taking_over
        # The key's older versions, on peers and here, give way first (``UploadOrder.
        # before_takeover``; set by the composition root once the flusher exists).
        self.in_order: Callable[[Superseding, str], Awaitable[bool]] | None = None

    def use_gate(self, gate: SendGate) -> None:
        """Send the uploads taken over, and every claim's requests (this node's own
        uploads' too: one ``Claims``), through the flusher's request gate."""
        self.gate = gate
        self._claims.gate = gate

    def is_lost(
        self, node_id: str, datadir_id: str | None = None, alive_at_s: float | None = None
    ) -> bool:
        """Lost by this node's view: not a member (forgotten), started from another data
        dir than ``datadir_id`` after ``alive_at_s`` (when that data dir was last known
        alive, on the node's own clock; None: any time), or silent for ``peer_timeout_s``.
        A data dir newer than this node has heard of is not lost: its view is behind."""
        if node_id == self._me.node_id:
            return datadir_id is not None and datadir_id != self._me.datadir_id
        if datadir_id is not None and (node_id, datadir_id) in self._gone:
            return True
        heard = self._heard.get(node_id)
        if heard is not None and self._clock.monotonic() - heard[1] < self._config.peer_timeout_s:
            # It committed a replica here lately: alive, with that data dir (membership
            # may not have heard from it yet).
            return datadir_id is not None and datadir_id != heard[0]
        member = self._membership.get(node_id)
        if member is None:
            return True
        info = member.info
        if (
            datadir_id is not None
            and info is not None
            and info.datadir_id != datadir_id
            and info.started_s > 0
            and (alive_at_s is None or info.started_s > alive_at_s)
        ):
            return True  # it answered since, from a data dir it started after that one
        if member.is_reachable is not False or member.unreachable_since_s is None:
            return False
        # Silent: neither answering nor asking (a node back from a restart asks for its
        # leases before it flushes anything).
        silent_since_s = max(member.unreachable_since_s, member.heard_s or float("-inf"))
        return self._clock.monotonic() - silent_since_s >= self._config.peer_timeout_s

    def claimant_lost(self, node_id: str, datadir_id: str, started_s: float) -> bool:
        """Whether a claim's claimant (an incarnation) is gone: lost, or restarted since
        (a claim dies with the process that made it)."""
        if node_id == self._me.node_id:
            return started_s != self._me.started_s or datadir_id != self._me.datadir_id
        member = self._membership.get(node_id)
        restarted = (
            member is not None
            and member.info is not None
            and member.info.datadir_id == datadir_id
            and member.info.started_s > started_s
        )
        return restarted or self.is_lost(node_id, datadir_id, started_s)

    def heard_from(self, owner: str, datadir_id: str) -> None:
        """A writer committed a replica here: it is alive, with this data dir."""
        self._heard[owner] = (datadir_id, self._clock.monotonic())

    async def owner_answer(self, ask: DrainRequest) -> DrainAnswer:
        """This node's part of a lost writer's drain: its replicas of ``ask.owner`` under
        the prefix not uploaded yet (markers aside, when asked)."""
        assert ask.owner is not None
        if ask.owner == ANY_LOST_WRITER:
            live = set(ask.live_writers)
            held = [
                r
                for owner, datadir, *_ in await self._store.owners()
                if f"{owner}/{datadir}" not in live
                for r in await self._store.of_owner(owner, datadir)
            ]
        else:
            held = await self._store.of_owner(ask.owner, ask.owner_datadir)
        held = newest_of_each_key(held)[0]  # the older ones are never uploaded
        left = [
            r
            for r in held
            if not r.is_uploaded
            and r.meta.key.startswith(ask.prefix)
            and (ask.bucket is None or r.meta.bucket == ask.bucket)
            and not (ask.exclude_markers and self._config.is_marker(r.meta.key))
        ]
        size = sum(r.meta.size_bytes for r in left)
        return DrainAnswer(self._me, not left, len(left), size)

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except Exception:  # the worker loop: logged, the next round runs
                log.exception("takeover round failed")
            await asyncio.sleep(_ROUND_S)

    async def round(self) -> None:
        """One look at every writer this node holds replicas for."""
        await self._blobs.discard(
            await self._store.drop_stale_staged(self._clock.wall() - _STAGED_TTL_S)
        )
        held = []
        for owner, datadir, versions, size, newest_s in await self._store.owners():
            lost = self.is_lost(owner, datadir, newest_s)
            held.append(
                {
                    "writer": owner,
                    "datadir_id": datadir,
                    "objects": versions,
                    "bytes": size,
                    "writer_lost": lost,
                }
            )
            if lost:
                await self._take_over(owner, datadir)
            else:
                await self._finish_claimed(owner, datadir)
                await self._forget_unneeded(owner, datadir)
        self.held = held
        metrics.REPLICA_HELD_BYTES.set(self._held_bytes())

    async def _forget_unneeded(self, owner: str, datadir: str) -> None:
        """Ask a live writer which of its versions held here it still needs."""
        now_s = self._clock.monotonic()
        if now_s - self._asked_s.get((owner, datadir), float("-inf")) < _NEEDED_EVERY_S:
            return
        member = self._membership.get(owner)
        if member is None or not member.is_reachable:
            return
        held = await self._store.seqs_of_owner(owner, datadir)
        if not held:
            return
        try:
            answer = await self._transport.replica_needed(
                member.address, owner, datadir, held, 10.0
            )
        except PeerUnavailable:
            return
        self._asked_s[(owner, datadir)] = now_s
        if answer is None:  # it runs on another data dir: these are a lost writer's
            self._gone.add((owner, datadir))
            return
        needed = set(answer)
        done = [seq for seq in held if seq not in needed]
        if done:
            await self._blobs.discard(await self._store.drop(owner, datadir, done))

    async def _finish_claimed(self, owner: str, datadir: str) -> None:
        """Versions claimed here while their writer was lost: their writer, back, waits on
        this node's claim. (Only those are read: a round looks at every writer each
        second, and parsing every replica held for it was most of a round's cost.)"""
        seqs = [seq for o, d, seq in self._unfinished if (o, d) == (owner, datadir)]
        if not seqs:
            return
        for replica in await self._store.of_owner(owner, datadir, seqs):
            if replica.version in self._unfinished and not replica.is_uploaded:
                await self._take_one(replica)

    async def _take_over(self, owner: str, datadir: str) -> None:
        newest, older = newest_of_each_key(await self._store.of_owner(owner, datadir))
        if older:  # kept beside early versions (the newest is here, and goes up)
            await self._blobs.discard(
                await self._store.drop(owner, datadir, [r.seq for r in older])
            )
        # Markers go last (below); the rest at once, a bounded number at a time: a lost
        # node may have left thousands of versions, and each takes a few requests.
        await self._take_all(
            [
                r
                for r in newest
                if not r.is_uploaded
                and not (self._config.is_marker(r.meta.key) and self._wait_drained is not None)
            ]
        )
        for replica in await self._store.of_owner(owner, datadir):
            if not replica.is_uploaded and self._config.is_marker(replica.meta.key):
                parent = replica.meta.key.rpartition("/")[0] + "/"
                assert self._wait_drained is not None
                me = f"{self._me.node_id}/{self._me.datadir_id}"
                if await self._wait_drained(replica.meta.bucket, parent, me):
                    await self._take_one(replica)  # else: its directory is not drained yet

    async def _take_all(self, replicas: list[Replica]) -> None:
        """``_take_one`` of each, ``_CONCURRENCY`` at a time (different keys: the newest
        version of each). An unexpected error of one is logged; the others go on."""
        room = asyncio.Semaphore(_CONCURRENCY)

        async def one(replica: Replica) -> None:
            async with room:
                await self._take_one(replica)

        results = await asyncio.gather(*(one(r) for r in replicas), return_exceptions=True)
        for replica, result in zip(replicas, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                log.error(
                    "takeover of %s/%s failed (next round)",
                    replica.meta.bucket,
                    replica.meta.key,
                    exc_info=result,
                )

    async def _take_one(self, replica: Replica) -> None:
        version = version_of(replica)
        try:
            claim = await self._claims.claim(version)
            if claim.outcome is Outcome.HELD:
                return
            if claim.outcome is Outcome.WON:
                self._unfinished.add(replica.version)
                async with self._taking_over(replica.meta.bucket, replica.meta.key):
                    await self._upload(replica)
                await self._claims.done(version)  # also when not sent: nothing left to do
                self._unfinished.discard(replica.version)
                metrics.TAKEOVERS.inc()
                log.warning(
                    "took over %s/%s seq=%d of lost gateway %s",
                    replica.meta.bucket,
                    replica.meta.key,
                    replica.seq,
                    replica.owner,
                )
        except FlushError as exc:
            log.warning(
                "takeover of %s/%s: %s (next round)", replica.meta.bucket, replica.meta.key, exc
            )
            return
        await self._store.mark_uploaded(*replica.version)
        await self._blobs.discard(
            await self._store.drop(replica.owner, replica.datadir_id, [replica.seq])
        )

    async def _upload(self, replica: Replica) -> None:
        """Upload one version unless a newer one was claimed (by its writer or another) or
        the bucket holds a newer one (``standing.py``); guarded by the state read
        (If-Match / If-None-Match), so a newer version that lands after the look fails
        the write and is seen at the next look."""
        meta = replica.meta
        version = Superseding(meta.bucket, meta.key, replica.acked_s)
        if self.in_order is not None and not await self.in_order(version, replica.owner):
            log.info(
                "%s/%s: a newer version is in the bucket; not taken over", meta.bucket, meta.key
            )
            return
        for _ in range(3):
            look = await self.look(replica)
            if look.standing is not Standing.NEWEST:
                if look.why:
                    log.info("%s/%s: %s; not taken over", meta.bucket, meta.key, look.why)
                return
            try:
                await self._send(replica, look.etag)
                return
            except ConditionFailed:
                continue  # the key changed between the read and the write: look again
        raise FlushError(f"{meta.bucket}/{meta.key} keeps changing in the bucket")

    async def look(self, replica: Replica, *, for_read: bool = False) -> Look:
        """Where ``replica`` stands against the bucket now (``standing.py``): the bucket's
        state and the key's claims, both at once (one round trip, not two). Through the
        request gate, paced with this node's uploads; ``for_read``: at once, as a read's
        requests go (a paused or backlogged flusher must not hold a read)."""
        meta = replica.meta

        async def state() -> tuple[str, float] | None:
            return await self._upstream.state_of(meta.bucket, meta.key)

        found, (newer_on_its_way, claimed) = await asyncio.gather(
            state() if for_read else self._through_gate(meta, 0, state),
            self._claims.look(version_of(replica), direct=for_read),
        )
        return standing(replica, found, newer_on_its_way, claimed)

    async def is_servable(self, replica: Replica) -> bool:
        """Whether a read may serve ``replica`` as its key's newest version: not superseded
        (a look at most every ``_SERVABLE_TTL_S`` per version, ``_SUPERSEDED_TTL_S`` once
        superseded: a read asks twice, for the version and then the body)."""
        now_s = self._clock.monotonic()
        known = self._servable.get(replica.version)
        if known is not None and known[0] > now_s:
            return known[1]
        try:
            # Within a budget: the reader waits for this answer at most its peer read
            # timeout, and a holder that answers late is left out (a slow bucket would
            # make the replica unreadable, and an older version served in its place).
            look = await asyncio.wait_for(self.look(replica, for_read=True), _SERVABLE_BUDGET_S)
        except (S3Error, FlushError, TimeoutError) as exc:  # served unchecked
            log.warning(
                "%s/%s: the replica is served unchecked (the bucket did not say): %r",
                replica.meta.bucket,
                replica.meta.key,
                exc,
            )
            return True
        servable = look.standing is not Standing.SUPERSEDED
        ttl_s = _SERVABLE_TTL_S if servable else _SUPERSEDED_TTL_S
        self._servable[replica.version] = (now_s + ttl_s, servable)
        while len(self._servable) > _SERVABLE_MAX:
            del self._servable[next(iter(self._servable))]
        return servable

    async def _send(self, replica: Replica, etag: str | None) -> None:
        meta = replica.meta
        guard = unchanged_since(etag)
        up = self._upstream
        if replica.is_delete:
            if etag is not None:
                await self._through_gate(
                    meta, 0, lambda: up.delete_object(meta.bucket, meta.key, guard)
                )
            return
        size = meta.size_bytes
        if replica.body is not None:  # a small body kept in the journal
            body = replica.body
            await self._through_gate(
                meta, size, lambda: up.put_object(meta, io.BytesIO(body), guard)
            )
            return
        files = await asyncio.to_thread(open_bodies, self._blobs, replica.blob_ids)
        try:
            if replica.parts:
                sources = [
                    PartSource(f, size, part_etag)
                    for f, (size, part_etag) in zip(files, replica.parts, strict=True)
                ]
                await self._through_gate(
                    meta, size, lambda: up.put_multipart(meta, sources, condition=guard)
                )
            else:
                await self._through_gate(meta, size, lambda: up.put_object(meta, files[0], guard))
        finally:
            await asyncio.to_thread(close_bodies, files)

    async def _through_gate(
        self, meta: ObjectMeta, size_bytes: int, call: Callable[[], Awaitable[T]]
    ) -> T:
        """One request about ``meta``'s key, through this node's request gate when it has
        one (admitted and paced with its own uploads, throttles retried; after a pause),
        else at once."""
        if self.gate is None:
            return await call()
        return await self.gate.early_request(meta.bucket, meta.key, 0, size_bytes, call)
