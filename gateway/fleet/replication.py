"""Replicas before the ack (docs/fleet.md, "Node loss"), the writer's side.

``Replication.start(bucket, key)`` picks the version's holders (rendezvous hashing of the
key over the reachable members, another zone first) and returns a ``ReplicaWrite``: its
``tee`` passes the request body through while streaming it to every holder (each stages it
durably and answers its MD5 and size), ``staged`` says which holders have it, and
``commit`` commits the version on them after the writer's own journal commit. The write is
acknowledged only after ``commit`` (``copies`` says on how many holders it is). A small
body (``SMALL_BODY_BYTES``) is not streamed: it travels with the commit, which stages and
commits it on the holder in one request and one fsync.

Loop-bound. A holder that fails is left out of the rest of the write, never retried within
it. One that cannot be reached for the commit (killed a moment ago: membership notices
within a renewal, a second) is replaced by the next member by rendezvous when the commit
carries everything it needs (a small body, a delete, or bodies ``resend`` can send again),
as a reader and the re-replication of a lost holder would look for it there; only then
does the policy decide whether fewer copies may be acknowledged.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from gateway import metrics
from gateway.errors import InternalError, SlowDown
from gateway.fleet.membership import Member, Membership
from gateway.fleet.transport import PeerTransport, PeerUnavailable, crc32c_sum, is_crc32c_sum
from gateway.fleet.view import Holder
from gateway.fleet.wire import INLINE_BODY_MAX_BYTES, NodeInfo, ReplicaCommit
from gateway.models import ObjectMeta
from gateway.store.copies import ShortCopies

log = logging.getLogger(__name__)
_QUEUE_PIECES = 4  # body pieces buffered per holder (the slowest holder paces the write)
SMALL_BODY_BYTES = INLINE_BODY_MAX_BYTES
_COMMIT_TIMEOUT_S = 10.0
_BODY_TIMEOUT_S = 30.0  # a holder that takes a piece no faster than this is left out


def rank(node_id: str, bucket: str, key: str) -> int:
    """Rendezvous weight of ``node_id`` for ``bucket/key`` (higher: chosen first)."""
    digest = hashlib.blake2b(f"{node_id}\x00{bucket}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def choose(
    members: Sequence[Member], bucket: str, key: str, copies: int, zone: str | None
) -> list[Member]:
    """The ``copies`` holders of ``bucket/key`` among ``members``: by rendezvous weight,
    members of another zone than ``zone`` first (when zones are known)."""

    def weight(m: Member) -> tuple[bool, int]:
        other_zone = zone is not None and m.info is not None and m.info.zone != zone
        return (other_zone, rank(m.node_id, bucket, key))

    return sorted(members, key=weight, reverse=True)[:copies]


@dataclass(frozen=True, slots=True)
class ReplicaPolicy:
    copies: int  # N: holders an acknowledgement needs
    is_strict: bool = True  # fewer than N: 503 SlowDown (strict) or acknowledge (degrade)


class Replication:
    """The writer's side (see the module docstring)."""

    def __init__(
        self,
        me: NodeInfo,
        membership: Membership,
        transport: PeerTransport,
        policy: ReplicaPolicy,
    ) -> None:
        self.me = me
        self._membership = membership
        self._transport = transport
        self.policy = policy
        # Versions acknowledged with fewer copies (degrade): set by the composition root.
        self.short: ShortCopies | None = None

    def holders(self, bucket: str, key: str, copies: int | None = None) -> list[Member]:
        """The first ``copies`` (default N) holders of ``bucket/key`` among the reachable
        members, in rendezvous order."""
        live = [m for m in self._membership.active() if m.is_reachable]
        wanted = self.policy.copies if copies is None else copies
        return choose(live, bucket, key, wanted, self.me.zone)

    def start(
        self,
        bucket: str,
        key: str,
        *,
        upload: tuple[str, int] | None = None,
        size_hint: int | None = None,
    ) -> ReplicaWrite:
        """One write's replication (``size_hint``: the body's length when known). Raises
        SlowDown when fewer than N members are reachable and the policy is strict (before
        anything is written)."""
        holders = self.holders(bucket, key)
        self._enough(len(holders), f"{bucket}/{key}")
        small = upload is None and size_hint is not None and size_hint <= SMALL_BODY_BYTES
        return ReplicaWrite(self, bucket, key, holders, upload, is_small=small)

    def remake(self, bucket: str, key: str, holders: list[Member]) -> ReplicaWrite:
        """A version committed here long ago, sent again to ``holders`` (one of its
        holders was lost: ``rereplication.py``). Its ``commit`` says on how many it
        committed and applies no policy: nothing is being acknowledged."""
        return ReplicaWrite(self, bucket, key, holders, None, is_remake=True)

    def _enough(self, copies: int, what: str, *, committed_here: bool = False) -> None:
        """Strict policy: too few copies refuse the write. Before anything is committed
        that is SlowDown (it did not happen: S3's refusal of a request); once the version
        is committed here it stays and may be uploaded, so the answer is InternalError,
        whose outcome a client takes as unknown (it retries, or reads what happened): a
        SlowDown there was taken for "not written", and a copy or read through this node
        then saw the version the client believed refused (found by
        loadtest/fleet_soak.py)."""
        if copies >= self.policy.copies:
            return
        if self.policy.is_strict and committed_here:
            raise InternalError(
                f"Only {copies} of the {self.policy.copies} replicas this gateway needs "
                "(--replicas) committed: the write is stored on this gateway, not "
                "acknowledged, and may still be uploaded; retry it."
            )
        if self.policy.is_strict:
            raise SlowDown(
                f"Only {copies} of the {self.policy.copies} replicas this gateway needs "
                "(--replicas) can be written now; retry shortly."
            )
        metrics.REPLICA_DEGRADED.inc()
        log.warning("%s: acknowledged with %d of %d replicas", what, copies, self.policy.copies)

    @property
    def transport(self) -> PeerTransport:
        return self._transport


class ReplicaWrite:
    """One write's copies on its holders."""

    def __init__(
        self,
        replication: Replication,
        bucket: str,
        key: str,
        holders: list[Member],
        upload: tuple[str, int] | None,
        *,
        is_small: bool = False,
        is_remake: bool = False,
    ) -> None:
        self._replication = replication
        self._is_small = is_small
        self._is_remake = is_remake
        self.bucket = bucket
        self.key = key
        self.holders = holders
        self.upload = upload
        # A part's id names its upload and number (a part sent again replaces it there);
        # a whole body's is fresh.
        self.stage_id = f"{upload[0]}.{upload[1]}" if upload else uuid.uuid4().hex
        self._queues: dict[str, asyncio.Queue[bytes | None]] = {}
        self._sends: dict[str, asyncio.Task[tuple[str, int]]] = {}
        self._small_body: bytes | None = None  # sent with the commit
        self._crc32c: int | None = None  # the body's, once staged: named in its commit
        self.failed: set[str] = set()
        self._unreached: set[str] = set()  # holders the commit could not reach

    # -- the body -------------------------------------------------------------------------

    async def tee(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``chunks`` as they come, each also queued for every holder (a small body: kept
        for the commit)."""
        if self._is_small:
            async for chunk in self._tee_small(chunks):
                yield chunk
            return
        transport = self._replication.transport
        owner = self._replication.me.node_id
        for member in self.holders:
            queue: asyncio.Queue[bytes | None] = asyncio.Queue(_QUEUE_PIECES)
            self._queues[member.node_id] = queue
            body = _drain(queue)
            send = transport.replica_body(
                member.address,
                owner,
                self.stage_id,
                self.bucket,
                self.key,
                self.upload,
                body,
                _BODY_TIMEOUT_S,
                by_crc32c=True,  # the holder spares itself an MD5 pass over the body
            )
            self._sends[member.node_id] = asyncio.ensure_future(send)
        try:
            async for chunk in chunks:
                await self._put(chunk)
                yield chunk
            await self._put(None)
        except BaseException:
            self.abort()
            raise

    async def _tee_small(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        pieces = []
        size = 0
        async for chunk in chunks:
            pieces.append(chunk)
            size += len(chunk)
            yield chunk
        if size <= SMALL_BODY_BYTES:  # else (a short size hint): committed without it
            self._small_body = b"".join(pieces)

    async def _put(self, piece: bytes | None) -> None:
        for node, queue in self._queues.items():
            if node in self.failed:
                continue
            send = self._sends[node]
            if send.done():  # it failed (a holder never answers before the end)
                self._fail(node, send)
                continue
            if not queue.full():  # the usual case: no task, no timer for this piece
                queue.put_nowait(piece)
                continue
            put = asyncio.ensure_future(queue.put(piece))
            done, _ = await asyncio.wait(
                {put, send}, timeout=_BODY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
            )
            if put not in done:
                put.cancel()
                self._fail(node, send)

    def _fail(self, node: str, send: asyncio.Task[tuple[str, int]]) -> None:
        self.failed.add(node)
        send.cancel()
        log.warning("replica of %s/%s on %s: left out", self.bucket, self.key, node)

    def abort(self) -> None:
        """The write failed here: stop every stream (holders discard what they got)."""
        for send in self._sends.values():
            send.cancel()

    async def staged(
        self, md5_hex: str, size_bytes: int, crc32c: int | None = None
    ) -> list[Member]:
        """The holders that staged the body (its MD5, CRC32C and size as written here: a
        holder checks it by one or the other). Strict policy: SlowDown when fewer than N
        did (nothing is committed anywhere then). A small body is with every holder so
        far: it travels with the commit."""
        self._crc32c = crc32c
        if self._small_body is not None:
            return list(self.holders)
        crc_sum = "" if crc32c is None else crc32c_sum(crc32c)
        out = []
        for member in self.holders:
            send = self._sends.get(member.node_id)
            if send is None or member.node_id in self.failed:
                continue
            try:
                got_md5, got_size = await send
            except (PeerUnavailable, asyncio.CancelledError) as exc:
                log.warning(
                    "replica of %s/%s on %s failed: %s", self.bucket, self.key, member.node_id, exc
                )
                self.failed.add(member.node_id)
                continue
            wanted = crc_sum if is_crc32c_sum(got_md5) else md5_hex
            if (got_md5, got_size) != (wanted, size_bytes):
                log.error(
                    "replica of %s/%s on %s differs: %s/%d, here %s/%d",
                    self.bucket,
                    self.key,
                    member.node_id,
                    got_md5,
                    got_size,
                    wanted,
                    size_bytes,
                )
                self.failed.add(member.node_id)
                continue
            out.append(member)
        if len(out) < self._replication.policy.copies and self._replication.policy.is_strict:
            raise SlowDown(
                f"Only {len(out)} of the {self._replication.policy.copies} replicas this "
                "gateway needs (--replicas) could be written; retry shortly."
            )
        return out

    # -- the commit -----------------------------------------------------------------------

    async def commit(
        self,
        holders: Sequence[Holder],
        seq: int,
        meta: ObjectMeta,
        acked_s: float,
        *,
        is_delete: bool = False,
        stage_ids: Sequence[str] = (),
        parts: Sequence[tuple[int, str]] = (),
        resend: Callable[[str], AsyncIterator[bytes]] | None = None,
        is_early: bool = False,
        crc32cs: Sequence[int | None] = (),
    ) -> int:
        """Commit the version on ``holders``; returns on how many it is committed. A holder
        missing a body gets it again from ``resend(stage_id)`` (a part of a multipart upload
        it did not stage), then the commit once more. ``is_early``: sent beside this
        node's own commit of ``seq`` (``withdraw`` it if that fails). ``crc32cs``: each
        stage id's body's CRC32C (for bodies a holder staged by it; by default this
        write's own body's)."""
        me = self._replication.me
        doc = ReplicaCommit(
            me.node_id,
            me.datadir_id,
            seq,
            meta,
            is_delete,
            tuple(stage_ids),
            tuple(parts),
            acked_s,
            self._small_body if list(stage_ids) == [self.stage_id] else None,
            is_early,
            tuple(crc32cs) or (self._crc32c,) * (list(stage_ids) == [self.stage_id]),
        )
        chosen = [m for m in self.holders if m.node_id in {h.node_id for h in holders}]
        results = await asyncio.gather(*(self._commit_one(m, doc, resend) for m in chosen))
        copies = sum(results)
        unreached = [m for m in chosen if m.node_id in self._unreached]
        if (
            unreached
            and not self._is_remake
            and (doc.body is not None or not doc.stage_ids or resend)
        ):
            copies += await self._substitute(len(unreached), doc, resend)
        if not self._is_remake:
            wanted = self._replication.policy.copies
            short = self._replication.short
            if copies < wanted and short is not None:
                # Degraded, or committed here and refused (strict): either way the version
                # is here with fewer copies; its state says so, and it is topped up later.
                await short.note(meta.bucket, meta.key, seq, copies, wanted)
            self._replication._enough(copies, f"{meta.bucket}/{meta.key}", committed_here=True)
        return copies

    async def _substitute(
        self,
        count: int,
        doc: ReplicaCommit,
        resend: Callable[[str], AsyncIterator[bytes]] | None,
    ) -> int:
        """Commit on up to ``count`` members that come next by rendezvous after the
        holders tried (they could not be reached); on how many it committed. Each one
        tried joins the holders (a ``withdraw`` tells it too: it may have committed)."""
        tried = {m.node_id for m in self.holders}
        ranked = self._replication.holders(self.bucket, self.key, len(tried) + count)
        spare = [m for m in ranked if m.node_id not in tried][:count]
        results = await asyncio.gather(*(self._commit_one(m, doc, resend) for m in spare))
        for member, ok in zip(spare, results, strict=True):
            self.holders.append(member)
            if ok:
                log.info(
                    "replica of %s/%s on %s instead (a holder could not be reached)",
                    self.bucket,
                    self.key,
                    member.node_id,
                )
        return sum(results)

    async def withdraw(self, seq: int) -> bool:
        """This node's own commit of ``seq`` failed after an early commit on the holders:
        they drop it. False if a holder could not be told (it drops it when it next asks
        whether its versions are still needed, unless it takes it over first)."""
        me = self._replication.me
        transport = self._replication.transport
        told = True
        for member in self.holders:
            try:
                await transport.replica_drop(
                    member.address, me.node_id, me.datadir_id, [seq], _COMMIT_TIMEOUT_S
                )
            except PeerUnavailable as exc:
                told = False
                log.warning("withdrawing %s/%s from %s: %s", self.bucket, self.key, member, exc)
        return told

    async def _commit_one(
        self,
        member: Member,
        doc: ReplicaCommit,
        resend: Callable[[str], AsyncIterator[bytes]] | None,
    ) -> bool:
        transport = self._replication.transport
        try:
            missing = await transport.replica_commit(member.address, doc, _COMMIT_TIMEOUT_S)
            if missing and resend is not None:
                owner = self._replication.me.node_id
                for stage_id in missing:
                    await transport.replica_body(
                        member.address,
                        owner,
                        stage_id,
                        self.bucket,
                        self.key,
                        None,
                        resend(stage_id),
                        _BODY_TIMEOUT_S,
                    )
                missing = await transport.replica_commit(member.address, doc, _COMMIT_TIMEOUT_S)
        except PeerUnavailable as exc:
            self._unreached.add(member.node_id)
            log.warning(
                "replica commit of %s/%s on %s failed: %s",
                doc.meta.bucket,
                doc.meta.key,
                member.node_id,
                exc,
            )
            return False
        return not missing


async def _drain(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    while (piece := await queue.get()) is not None:
        yield piece
