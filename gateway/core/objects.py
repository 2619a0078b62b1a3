"""ObjectService: PutObject / GetObject / HeadObject / DeleteObject with write-back.

Writes land locally (blob fsync, then journal COMMIT) and are acknowledged from there; the
flusher uploads them later. Reads prefer the local version (read-after-write, including
deletes) and fall through to the upstream for keys the gateway has never seen.

Reads evaluate preconditions first (412 / 304), then the range or part (416); a local body
is read from the right offset of the right part file, never from its start. Conditional
writes (``If-None-Match: *``, ``If-Match``) are checked once before the body is taken (to
fail fast) and again inside the commit transaction (so a concurrent write of the same key
through this gateway cannot slip in between).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

from gateway import metrics
from gateway.clock import Clock
from gateway.core import peers
from gateway.core.bodies import ChunkSource, LocalSource, NoBody, open_files, slices
from gateway.core.buckets import BucketService
from gateway.core.cache import admitted
from gateway.core.conditions import Preconditions, evaluate
from gateway.core.fill import BandwidthBudget, FillConfig
from gateway.core.fills import FillManager
from gateway.core.freshness import FreshRows
from gateway.core.heads import ObjectBody, ObjectHead, ReadOptions
from gateway.core.ingest import ingest, validate_key
from gateway.core.integrity import MEMO_ENTRIES, BlobVerifier, blob_checks
from gateway.core.ranges import ByteRange, parse_content_range, part_range, resolve_range
from gateway.core.writes import (
    EarlyCommit,
    TeeBody,
    WriteCheck,
    commit_replicas,
    fleet_deciding,
    fleet_writing,
    replicas_aborted,
)
from gateway.errors import InternalError, InvalidRange, NoSuchKey, NotModified
from gateway.fleet.view import FleetView, Holder, PeerHead, ReplicaWriter
from gateway.models import FlushState, LocalObject, ObjectMeta, PutRequest, RequestBody
from gateway.store.blobs import BlobStore, Ingested
from gateway.store.integrity import body_digests, check_bytes
from gateway.store.journal import Journal, RowCheck
from gateway.store.space import CacheSpace
from gateway.store.verified import VerifiedFiles
from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)
_NO_CONDITIONS = Preconditions()
_WHOLE = ReadOptions()
__all__ = ["ObjectBody", "ObjectHead", "ObjectService", "ReadOptions", "check_write", "select"]


class ObjectService:
    """Contract: ``put_object`` MUST NOT return before the body and its journal row are
    durable, and MUST leave nothing visible when it raises (a failed precondition
    included). Reads MUST see every acknowledged write and delete at once."""

    def __init__(
        self,
        journal: Journal,
        blobs: BlobStore,
        upstream: Upstream,
        buckets: BucketService,
        clock: Clock,
        *,
        max_object_bytes: int,
        space: CacheSpace | None = None,
        fill_config: FillConfig | None = None,
        budget: BandwidthBudget | None = None,
        inline_max_bytes: int = 64 << 10,
        fleet: FleetView | None = None,
        fresh: FreshRows | None = None,
    ) -> None:
        self._journal = journal
        self._fleet = fleet  # None: a gateway alone (no peers), nothing of the fleet runs
        # Rows for reads: in a fleet, copies of flushed versions checked (freshness.py).
        self._fresh = fresh or FreshRows(journal, upstream, blobs, clock, fleet)
        self._blobs = blobs
        self._upstream = upstream
        self._buckets = buckets
        self._clock = clock
        self._max_object_bytes = max_object_bytes
        self._inline_max_bytes = inline_max_bytes
        self._space = space
        self.verifier = BlobVerifier(store=VerifiedFiles(journal, MEMO_ENTRIES))
        config = fill_config or FillConfig(max_object_bytes=max_object_bytes)
        self.fills = FillManager(
            journal, blobs, upstream, space, clock, self.verifier, config, budget
        )

    async def put_object(
        self, req: PutRequest, body: RequestBody, cond: Preconditions = _NO_CONDITIONS
    ) -> ObjectMeta:
        validate_key(req.key)
        await self._buckets.require(req.bucket)
        check = await self.write_guard(req.bucket, req.key, cond)
        return await admitted(
            self._space,
            req.content_length or 0,
            self._put(req, body, check),
            max_bytes=self._max_object_bytes,
        )

    async def _put(self, req: PutRequest, body: RequestBody, check: RowCheck | None) -> ObjectMeta:
        async with fleet_writing(self._fleet, req.bucket, req.key) as announced:
            replica = (
                self._fleet.replicate(req.bucket, req.key, size_hint=req.content_length)
                if self._fleet
                else None
            )
            with replicas_aborted(replica):
                blob, checksums = await ingest(
                    self._blobs,
                    req,
                    body if replica is None else TeeBody(body, replica),
                    max_bytes=self._max_object_bytes,
                    inline_max_bytes=self._inline_max_bytes,
                )
            return await self._commit_put(req, blob, checksums, check, announced, replica)

    async def _commit_put(
        self,
        req: PutRequest,
        blob: Ingested,
        checksums: Mapping[str, str],
        check: RowCheck | None,
        announced: Awaitable[None],
        replica: ReplicaWriter | None = None,
    ) -> ObjectMeta:
        try:
            holders: Sequence[Holder] = ()
            if replica is not None:  # durable on the holders before anything commits here
                holders = await replica.staged(
                    blob.digests["md5"].hex(), blob.size_bytes, blob.crc32c
                )
            await announced  # the fleet knows the key's directory before it is acked
            meta = ObjectMeta(
                bucket=req.bucket,
                key=req.key,
                size_bytes=blob.size_bytes,
                etag=blob.digests["md5"].hex(),
                last_modified_s=self._clock.wall(),
                content_type=req.content_type,
                user_metadata=req.user_metadata,
                headers=req.headers,
                checksums=checksums,
            )
            acked_s = self._clock.wall()
            early = None
            if replica is not None:  # acknowledged once committed on the holders too
                # A conditional write's check may refuse it inside the commit: its holders
                # hear of it only after.
                reserved = self._journal.is_reserved if check is None else _never
                early = EarlyCommit(replica, holders, reserved, meta, acked_s)
            try:
                async with fleet_deciding(self._fleet, req.bucket, req.key, check):
                    row, superseded = await self._journal.commit_put(
                        meta,
                        blob.blob_id,
                        acked_s,
                        check,
                        crc32c=blob.crc32c,
                        body=blob.body,
                        on_seq=early.on_seq if early else None,
                    )
            except Exception:  # not committed here (a cancelled caller's commit still is)
                if early is not None and not await early.failed():
                    self._journal.mark_doubtful(req.bucket, req.key)
                raise
        except BaseException:
            await asyncio.shield(self._blobs.discard(blob.blob_ids))
            raise
        await self._blobs.discard(superseded)
        if early is not None:
            await early.committed(row)
        return meta

    async def write_guard(self, bucket: str, key: str, cond: Preconditions) -> RowCheck | None:
        """Conditional write (PutObject, CompleteMultipartUpload): check ``cond`` against the
        key's current version now, and return the check to repeat inside the commit
        transaction (None without conditions).

        The current version is the newest of the peers' unflushed ones and this node's row
        (a tombstone is a missing key), else the bucket's object (one HEAD). Inside the
        transaction this node's row decides only if it changed since (a write committed
        here meanwhile); the row that was looked at stays beneath what was seen: in a fleet
        a peer's newer version, a delete too, is newer than it (a conditional write through
        the node that wrote a key's older version, right after another node deleted it, was
        refused 412: found by loadtest/fleet_soak.py). A row that has vanished since (a
        flushed tombstone) leaves what was seen as well.
        """
        if cond.is_empty:
            return None
        seen, seen_seq = await self._current_etag(bucket, key)
        check_write(cond, seen, key)

        def check(row: LocalObject | None) -> None:
            if row is not None and row.seq != seen_seq:  # a write committed here since
                check_write(cond, _etag(row), key)
            else:
                check_write(cond, seen, key)

        if self._fleet is None:
            return check

        async def recheck() -> None:
            nonlocal seen, seen_seq
            seen, seen_seq = await self._current_etag(bucket, key)
            check_write(cond, seen, key)

        return WriteCheck(check, recheck)

    async def _current_etag(self, bucket: str, key: str) -> tuple[str | None, int | None]:
        """The key's current version for a conditional write (its ETag; None: no object):
        the newest of the peers' and this node's (a delete is none), else the bucket's;
        with the seq of this node's row as it was read (None: no row)."""
        row = await self._journal.get(bucket, key)
        seq = None if row is None else row.seq
        peer = await self._peer_version(bucket, key, row)
        local = None if peer is not None else await self._fresh.after_peers(row)
        if peer is not None:
            return _etag(peer), seq
        if local is not None:
            return _etag(local), seq
        try:
            return (await self._upstream.head_object(bucket, key)).etag, seq
        except NoSuchKey:
            return None, seq

    async def delete_object(self, bucket: str, key: str, cond: Preconditions | None = None) -> None:
        """DeleteObject; ``cond``: S3's conditional delete (``If-Match``: an ETag, or ``*``
        for any object; 412 on another version, 404 NoSuchKey when there is none), decided
        here as a conditional PutObject is, against the fleet's newest version."""
        validate_key(key)
        await self._buckets.require(bucket)
        check = None if cond is None else await self.write_guard(bucket, key, cond)
        async with fleet_writing(self._fleet, bucket, key) as announced:
            replica = self._fleet.replicate(bucket, key) if self._fleet else None
            await announced
            async with fleet_deciding(self._fleet, bucket, key, check):
                row, superseded = await self._journal.commit_delete(
                    bucket, key, self._clock.wall(), check
                )
        await self._blobs.discard(superseded)
        if replica is not None:
            await commit_replicas(replica, replica.holders, row, is_delete=True)

    async def head_object(self, bucket: str, key: str, read: ReadOptions = _WHOLE) -> ObjectHead:
        validate_key(key)
        await self._buckets.require(bucket)
        peer, local = await self._peer_or_local(bucket, key, read, "HEAD")
        if peer is not None:
            await peer.source.aclose()
            return peer.head
        if local is not None:
            return self._held(select(local, read), local)
        if read.part_number is not None:
            part = await self._upstream.head_part(bucket, key, read.part_number)
            head = ObjectHead(
                part.meta,
                FlushState.DURABLE,
                parse_content_range(part.content_range),
                part.parts_count,
            )
        else:
            head = ObjectHead(await self._upstream.head_object(bucket, key), FlushState.DURABLE)
        return _apply(head, read)

    async def get_object(self, bucket: str, key: str, read: ReadOptions = _WHOLE) -> ObjectBody:
        validate_key(key)
        await self._buckets.require(bucket)
        for _ in range(3):
            body, local = await self._peer_or_local(bucket, key, read, "GET")
            if body is None and local is None:
                body = await self._upstream_get(bucket, key, read)
                # None: the fill ended as we joined it: its copy is local now
            elif body is None and local is not None:
                body = await self._serve_local(local, read)
                # None: superseded between lookup and open: look again
            if body is not None:
                return body
        raise NoSuchKey(Key=key)  # pragma: no cover - three races in a row

    async def _serve_local(self, local: LocalObject, read: ReadOptions) -> ObjectBody | None:
        """A GET of this node's row (None: its body vanished, superseded meanwhile)."""
        head = self._held(select(local, read), local)
        if head.is_not_modified:
            return ObjectBody(head, NoBody())
        if local.body is not None:
            return await self._inline_body(local, head)
        try:
            source = await self._local_source(local, head)
        except FileNotFoundError:
            return None
        if self._space is not None:
            self._space.touch(local.meta.bucket, local.meta.key)
        return ObjectBody(head, source)

    # -- the fleet (docs/fleet.md) --------------------------------------------------------

    def _held(self, head: ObjectHead, local: LocalObject) -> ObjectHead:
        """A commit marker the fleet holds says so (``held``, and who it waits on); so
        does a version acknowledged with fewer replicas than asked for."""
        if self._fleet is None or local.state is FlushState.DURABLE:
            return head
        bucket, key = local.meta.bucket, local.meta.key
        reason = self._fleet.held_by(bucket, key)
        short = self._fleet.replicas_short(bucket, key, local.seq)
        if reason is None and short is None:
            return head
        return dataclasses.replace(head, held_by=reason, replicas=short)

    async def _peer_or_local(
        self, bucket: str, key: str, read: ReadOptions, method: str
    ) -> tuple[ObjectBody | None, LocalObject | None]:
        """A peer's answer (the newest unflushed version is there), else this node's row
        (None: the bucket's version is the one): the peers first, then a copy here
        checked (``FreshRows.after_peers``)."""
        row = await self._journal.get(bucket, key)
        body = await self._from_peer(bucket, key, read, row, method)
        if body is not None:
            return body, None
        return None, await self._fresh.after_peers(row)

    async def _from_peer(
        self, bucket: str, key: str, read: ReadOptions, local: LocalObject | None, method: str
    ) -> ObjectBody | None:
        """The read answered by the peer holding the newest unflushed version of ``key``
        (or a lost writer's replica), or None when this node's row or the bucket has the
        version to serve."""
        if self._fleet is None:
            return None
        headers = peers.forward_headers(read)
        found = await peers.read_newest(
            self._fleet, bucket, key, local, method, headers, zero_copy=True
        )
        if found is None:
            return None
        metrics.PEER_READS.inc()
        return peers.as_body(found)

    async def _peer_version(
        self, bucket: str, key: str, local: LocalObject | None
    ) -> PeerHead | None:
        """The newest unflushed version a peer holds of ``key``, if newer than this node's
        (for conditional writes)."""
        if self._fleet is None:
            return None
        nodes = self._fleet.candidates(bucket, key)
        found = await peers.newest_version(self._fleet, nodes, bucket, key)
        if found is None:
            return None
        best = found[0]
        if peers.is_unflushed(local) and local is not None and local.acked_s >= best.acked_s:
            return None
        return best

    async def unflushed_row(self, bucket: str, key: str) -> LocalObject | None:
        """This node's row of ``key`` if it is not durable upstream (the peer API)."""
        row = await self._journal.get(bucket, key)
        if row is None or not peers.is_unflushed(row):
            return None
        return await self._fresh.unflushed(row)

    async def replica_read(
        self, row: LocalObject, read: ReadOptions, *, with_body: bool
    ) -> ObjectBody | None:
        """A peer's read of a replica this node holds for another gateway (``row`` made
        from it): as ``peer_read``, from the replica's bodies. None: they vanished."""
        if not with_body:
            return ObjectBody(select(row, read), NoBody())
        return await self._serve_local(row, read)

    async def peer_read(
        self, bucket: str, key: str, read: ReadOptions, *, with_body: bool
    ) -> tuple[LocalObject, ObjectBody] | None:
        """A peer's read of this node's unflushed version of ``key``: None when there is
        none; S3 errors of that version raised (a delete: NoSuchKey)."""
        for _ in range(3):
            row = await self.unflushed_row(bucket, key)
            if row is None:
                return None
            if not with_body:
                return row, ObjectBody(self._held(select(row, read), row), NoBody())
            body = await self._serve_local(row, read)
            if body is not None:
                return row, body
        return None  # pragma: no cover - three races in a row

    async def _local_source(self, local: LocalObject, head: ObjectHead) -> LocalSource:
        """The files holding the selected bytes, opened now, released once verified: each
        body file the read touches is hashed whole against its recorded digest unless it
        is known good (integrity.py), while all but the last piece are already sent."""
        size = local.meta.size_bytes
        span = head.byte_range or ByteRange(0, size - 1, size)
        sizes = [p.size_bytes for p in local.parts] or [size]
        pieces = slices(sizes, span.start, span.length)
        touched = sorted({p.index for p in pieces})
        ids = local.blob_ids
        fds = await open_files([self._blobs.path(ids[i]) for i in touched])
        renumber = {index: n for n, index in enumerate(touched)}
        pieces = [type(p)(renumber[p.index], p.offset, p.count) for p in pieces]
        checks = blob_checks(local)
        files = [(fds[n], checks[i]) for n, i in enumerate(touched)] if checks else []
        verification = None
        if not all(self.verifier.is_known_good(fd, check) for fd, check in files):
            # Indexed like ``fds``; known good files among them are skipped inside.
            verification = self.verifier.start(files, self._corrupt_hook(local))
        return LocalSource(fds, pieces, verification)

    async def _inline_body(self, local: LocalObject, head: ObjectHead) -> ObjectBody:
        """A body stored in the journal row: checked before anything is sent (it is small:
        checking costs less than deciding whether to), then served from memory."""
        assert local.body is not None
        problem = check_bytes(local.body, body_digests(local)[0])
        if problem is not None:
            message = f"local corruption: inline body: {problem}"
            await self.report_corrupt(local, message)
            raise InternalError(message)
        if self._space is not None:
            self._space.touch(local.meta.bucket, local.meta.key)
        size = local.meta.size_bytes
        span = head.byte_range or ByteRange(0, size - 1, size)
        return ObjectBody(head, ChunkSource(_one_piece(local.body[span.start : span.end + 1])))

    async def _upstream_get(self, bucket: str, key: str, read: ReadOptions) -> ObjectBody | None:
        """Read-through. A whole GET, or a range of an object someone else reads too,
        shares the key's fill (started if none runs: fills.py) and reads the bytes as they
        arrive; preconditions and the range are evaluated against the fill's metadata. A
        lone range read, a part read, or an object the cache has no room for is one GET of
        just those bytes, evaluated by the upstream. None: the fill joined had just ended
        (its copy, if kept, is a local row now): look again."""
        is_whole = read.range is None and read.part_number is None
        if read.part_number is not None or not self.fills.is_enabled:
            return await self._upstream_fetch(bucket, key, read)
        fill = self.fills.current(bucket, key)
        if fill is None and (is_whole or self.fills.is_shared_range(bucket, key)):
            fill = self.fills.start(bucket, key)
        if fill is None:
            return await self._upstream_fetch(bucket, key, read)
        meta = await fill.head()
        if not fill.is_serving:
            return await self._upstream_fetch(bucket, key, read)
        head = _apply(ObjectHead(meta, FlushState.DURABLE), read)
        if head.is_not_modified:
            return ObjectBody(head, NoBody())
        span = head.byte_range or ByteRange(0, meta.size_bytes - 1, meta.size_bytes)
        reader = fill.reader(span.start, span.length)
        return None if reader is None else ObjectBody(head, reader)

    async def _upstream_fetch(self, bucket: str, key: str, read: ReadOptions) -> ObjectBody:
        try:
            remote = await self._upstream.get_object(
                bucket,
                key,
                range_header=read.range.header() if read.range else None,
                part_number=read.part_number,
                preconditions=_condition_headers(read.cond),
            )
        except NotModified:
            # A 304 carries the validators; the upstream's came without a body to parse.
            meta = await self._upstream.head_object(bucket, key)
            return ObjectBody(ObjectHead(meta, FlushState.DURABLE, is_not_modified=True), NoBody())
        except InvalidRange:
            meta = await self._upstream.head_object(bucket, key)
            assert read.range is not None
            raise InvalidRange(
                RangeRequested=read.range.header(), ActualObjectSize=str(meta.size_bytes)
            ) from None
        head = ObjectHead(
            remote.meta,
            FlushState.DURABLE,
            parse_content_range(remote.content_range),
            remote.parts_count,
        )
        return ObjectBody(head, ChunkSource(remote.chunks()))

    def _corrupt_hook(self, local: LocalObject) -> Callable[[str], Awaitable[None]]:
        async def on_corrupt(message: str) -> None:
            await self.report_corrupt(local, message)

        return on_corrupt

    async def report_corrupt(self, local: LocalObject, message: str) -> None:
        """A local body failed its digest check: log, count, and take it out of service
        (a durable copy is dropped so reads go upstream; an unflushed one becomes failed)."""
        log.error("%s/%s seq=%d: %s", local.meta.bucket, local.meta.key, local.seq, message)
        metrics.CORRUPT_BLOBS.inc()
        dropped = await asyncio.shield(self._journal.mark_corrupt(local, message))
        if dropped:
            await self._blobs.discard(dropped)

    async def state_of(self, bucket: str, key: str) -> LocalObject | None:
        return await self._journal.get(bucket, key)


def _etag(version: LocalObject | PeerHead) -> str | None:
    """A version's ETag for a condition; None for a delete (no object)."""
    return None if version.is_delete else version.meta.etag


def check_write(cond: Preconditions, etag: str | None, key: str) -> None:
    """A conditional write against the current version (``etag`` None: no such key).

    S3: ``If-Match`` on a missing key is 404 NoSuchKey; a mismatch is 412; ``If-None-Match:
    *`` on an existing key is 412.
    """
    if cond.if_match is not None and etag is None:
        raise NoSuchKey(Key=key)
    evaluate(cond, etag, None, is_read=False)


def select(local: LocalObject, read: ReadOptions) -> ObjectHead:
    """What a GET/HEAD of this local row returns: 404, 412, 304, 416, 206 or 200."""
    if local.is_delete:
        raise NoSuchKey(Key=local.meta.key)
    # S3 sends x-amz-mp-parts-count only for a part of a multipart object.
    count = len(local.parts) if local.parts and read.part_number is not None else None
    sizes = [p.size_bytes for p in local.parts] or [local.meta.size_bytes]
    return _apply(ObjectHead(local.meta, local.state, parts_count=count), read, sizes)


def _apply(head: ObjectHead, read: ReadOptions, part_sizes: list[int] | None = None) -> ObjectHead:
    """Preconditions first (RFC 9110 order, as S3), then the range or the part (from
    ``part_sizes``; without them ``head`` already carries the part's range)."""
    meta = head.meta
    try:
        evaluate(read.cond, meta.etag, meta.last_modified_s, is_read=True)
    except NotModified:
        return ObjectHead(meta, head.state, is_not_modified=True)
    if part_sizes is not None and read.part_number is not None:
        rng = part_range(part_sizes, read.part_number)
        return ObjectHead(meta, head.state, rng, head.parts_count)
    if read.range is not None:
        return ObjectHead(meta, head.state, resolve_range(read.range, meta.size_bytes))
    return head


def _condition_headers(cond: Preconditions) -> dict[str, str]:
    pairs = {
        "If-Match": cond.if_match,
        "If-None-Match": cond.if_none_match,
        "If-Modified-Since": cond.if_modified_since,
        "If-Unmodified-Since": cond.if_unmodified_since,
    }
    return {name: value for name, value in pairs.items() if value is not None}


async def _one_piece(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


def _never(seq: int) -> bool:
    return False
