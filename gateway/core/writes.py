"""Writes in a fleet: the key's directory announced before the ack (docs/fleet.md).

Every write service (PutObject, DeleteObject(s), CopyObject, CompleteMultipartUpload)
commits inside ``fleet_writing``: it starts the announcement at once, so that it overlaps
the body, and the write awaits what it yields just before its journal commit. Without a
fleet it costs one completed future.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gateway import metrics
from gateway.fleet.view import FleetView, Holder, ReplicaWriter
from gateway.models import LocalObject, ObjectMeta, RequestBody
from gateway.store.blobs import BlobStore


def _done() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


@contextlib.asynccontextmanager
async def fleet_writing(
    fleet: FleetView | None, bucket: str, key: str
) -> AsyncIterator[Awaitable[None]]:
    """Around one write of ``key``: yields what to await before the commit."""
    if fleet is None:
        yield _done()
        return
    async with fleet.writing(bucket, key) as intent:
        if intent.is_ready():
            yield _done()
            return
        task = asyncio.ensure_future(intent.ready())
        try:
            yield task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


@dataclass(frozen=True, slots=True)
class WriteCheck:
    """A conditional write's check (the journal's ``RowCheck``: ``check(row)`` inside the
    commit) and, in a fleet, ``recheck``: the whole look again (peers, this node, the
    bucket) under the key's lock (``fleet_deciding``)."""

    row_check: Callable[[LocalObject | None], None]
    recheck: Callable[[], Awaitable[None]]

    def __call__(self, row: LocalObject | None) -> None:
        self.row_check(row)


@contextlib.asynccontextmanager
async def fleet_deciding(
    fleet: FleetView | None, bucket: str, key: str, check: object
) -> AsyncIterator[None]:
    """Around a write's commit: a conditional one (``check`` a ``WriteCheck``) in a fleet
    holds the key's lock and is checked again (docs/fleet.md, "Conditional writes"); the
    others, and every write of a gateway alone, pass straight through."""
    if fleet is None or not isinstance(check, WriteCheck):
        yield
        return
    async with fleet.deciding(bucket, key):
        await check.recheck()
        yield


@contextlib.asynccontextmanager
async def fleet_writing_all(
    fleet: FleetView | None, bucket: str, keys: Sequence[str]
) -> AsyncIterator[Awaitable[None]]:
    """``fleet_writing`` for many keys at once (DeleteObjects): one per directory."""
    if fleet is None:
        yield _done()
        return
    by_dir = {key.rpartition("/")[0]: key for key in keys}
    async with contextlib.AsyncExitStack() as stack:
        waits = [
            await stack.enter_async_context(fleet_writing(fleet, bucket, k))
            for k in by_dir.values()
        ]
        yield asyncio.ensure_future(_all(waits))


async def _all(waits: Sequence[Awaitable[None]]) -> None:
    for wait in waits:
        await wait


class TeeBody:
    """A request body whose chunks also stream to the write's replica holders."""

    def __init__(self, body: RequestBody, replica: ReplicaWriter) -> None:
        self._body = body
        self._replica = replica

    def chunks(self) -> AsyncIterator[bytes]:
        return self._replica.tee(self._body.chunks())

    @property
    def trailers(self) -> Mapping[str, str]:
        return self._body.trailers


@contextlib.contextmanager
def replicas_aborted(replica: ReplicaWriter | None) -> Iterator[None]:
    """A write that fails here stops its replica streams (holders drop what they got)."""
    try:
        yield
    except BaseException:
        if replica is not None:
            replica.abort()
        raise


async def commit_replicas(
    replica: ReplicaWriter,
    holders: Sequence[Holder],
    row: LocalObject,
    *,
    is_delete: bool = False,
    stage_ids: Sequence[str] = (),
    parts: Sequence[tuple[int, str]] = (),
    resend: Callable[[str], AsyncIterator[bytes]] | None = None,
    crc32cs: Sequence[int | None] = (),
) -> None:
    """Commit the version ``row`` (committed here) on its holders before the ack: under
    the strict policy SlowDown when too few commit (the version stays here, its client
    retries), under degrade fewer copies are acknowledged (and counted)."""
    started_s = time.monotonic()
    await replica.commit(
        holders,
        row.seq,
        row.meta,
        row.acked_s,
        is_delete=is_delete,
        stage_ids=stage_ids,
        parts=parts,
        resend=resend,
        crc32cs=crc32cs,
    )
    metrics.REPLICA_LAG_S.observe(time.monotonic() - started_s)


class EarlyCommit:
    """A PutObject's commit on its holders, sent beside its own journal commit instead of
    after it: the ack then waits for the slower of the two, not for both in a row.

    The holders' commit names the version's seq, which the journal hands out as it queues
    the commit (``on_seq``). Only a seq under the journal's durable ceiling may be named
    before it commits (a restart never hands it out again); above it (a moment after a
    start) the commit goes after the local one, as for every other write. The holders keep
    an early version beside the older ones it would supersede (it may never commit here);
    if the local commit fails, ``failed`` withdraws it from them."""

    def __init__(
        self,
        replica: ReplicaWriter,
        holders: Sequence[Holder],
        is_reserved: Callable[[int], bool],
        meta: ObjectMeta,
        acked_s: float,
    ) -> None:
        self._replica = replica
        self._holders = holders
        self._is_reserved = is_reserved
        self._meta = meta
        self._acked_s = acked_s
        self._seq: int | None = None
        self._task: asyncio.Task[None] | None = None

    def on_seq(self, seq: int) -> None:
        """The journal queued the local commit as ``seq``: send the holders' now."""
        if self._is_reserved(seq):
            self._seq = seq
            self._task = asyncio.ensure_future(self._commit(seq, is_early=True))
            # Its outcome is read by ``committed`` or ``failed``, unless the request was
            # cancelled meanwhile (a client gone: never acknowledged).
            self._task.add_done_callback(_retrieved)

    async def committed(self, row: LocalObject) -> None:
        """The local commit succeeded: the holders' commit, awaited or sent now."""
        if self._task is not None:
            await self._task
        else:
            await self._commit(row.seq, is_early=False)

    async def failed(self) -> bool:
        """The local commit failed: withdraw an early version from the holders. False
        if some holder may still have it (the journal's ``mark_doubtful``)."""
        if self._task is None or self._seq is None:
            return True
        with contextlib.suppress(Exception):
            await self._task
        return await self._replica.withdraw(self._seq)

    async def _commit(self, seq: int, *, is_early: bool) -> None:
        started_s = time.monotonic()
        await self._replica.commit(
            self._holders,
            seq,
            self._meta,
            self._acked_s,
            stage_ids=[self._replica.stage_id],
            is_early=is_early,
        )
        metrics.REPLICA_LAG_S.observe(time.monotonic() - started_s)


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


async def replicate_local(replica: ReplicaWriter, row: LocalObject, blobs: BlobStore) -> None:
    """Replicate a version whose bodies are already on this node's disk (a copy): its
    commit names bodies the holders lack, and they get them from here (``resend``)."""
    ids, parts, resend = _stored_bodies(replica, row, blobs)
    await commit_replicas(replica, replica.holders, row, stage_ids=ids, parts=parts, resend=resend)


async def remake_replica(replica: ReplicaWriter, row: LocalObject, blobs: BlobStore) -> int:
    """Send a version committed here long ago to new holders (one of its holders was
    lost: fleet/rereplication.py); on how many it committed. A holder that holds it
    already answers without its bodies."""
    ids, parts, resend = _stored_bodies(replica, row, blobs)
    return await replica.commit(
        replica.holders,
        row.seq,
        row.meta,
        row.acked_s,
        is_delete=row.is_delete,
        stage_ids=ids,
        parts=parts,
        resend=resend,
    )


def _stored_bodies(
    replica: ReplicaWriter, row: LocalObject, blobs: BlobStore
) -> tuple[list[str], list[tuple[int, str]], Callable[[str], AsyncIterator[bytes]] | None]:
    """The stage ids of a stored version's bodies, its part list, and how a holder that
    lacks one of them gets it from this node's disk (or the journal row's inline body);
    a delete has none."""
    if row.is_delete:
        return [], [], None
    sid = replica.stage_id
    if row.parts:
        ids = [f"{sid}.{n}" for n in range(1, len(row.parts) + 1)]
        files = dict(zip(ids, (p.blob_id for p in row.parts), strict=True))
        parts = [(p.size_bytes, p.etag) for p in row.parts]
    else:
        ids, parts = [sid], []
        files = {sid: row.blob_id} if row.blob_id else {}

    async def resend(stage_id: str) -> AsyncIterator[bytes]:
        if stage_id in files:
            async for piece in blobs.read_chunks(files[stage_id]):
                yield piece
        elif row.body:
            yield row.body  # an inline body lives in the journal row

    return ids, parts, resend
