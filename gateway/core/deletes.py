"""DeleteService: DeleteObjects (multi-object delete) with write-back.

Every valid key of one request becomes a pending tombstone in ONE journal transaction, so the
request is durable as a whole before it is acknowledged: after a crash either all its deletes
are visible or none is. Keys that cannot be deleted (too long, empty, a version id) are
reported per key, as S3 does, and do not fail the others. Deleting a key that does not exist
is a success (the tombstone still goes upstream: the upstream may hold an older version).

An entry with an ``<ETag>`` is S3's conditional delete: it is decided and committed on its
own, as DeleteObject with ``If-Match`` (``conditional_delete``), and its refusal (412, or
404 when there is no object) is reported for that key alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway.clock import Clock
from gateway.core.buckets import BucketService
from gateway.core.conditions import Preconditions
from gateway.core.ingest import validate_key
from gateway.core.writes import commit_replicas, fleet_writing_all
from gateway.errors import S3Error, S3NotImplemented
from gateway.fleet.view import FleetView, ReplicaWriter
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal

MAX_KEYS_PER_REQUEST = 1000


@dataclass(frozen=True, slots=True)
class DeleteEntry:
    """One ``<Object>`` of the request."""

    key: str
    version_id: str | None = None
    etag: str | None = None  # delete only this version (S3's conditional delete)


@dataclass(frozen=True, slots=True)
class DeleteOutcome:
    """What happened to one entry: ``error`` None means deleted."""

    entry: DeleteEntry
    error: S3Error | None = None


class DeleteService:
    """Contract: ``delete_objects`` MUST NOT return before every delete it reports as done is
    durable (one COMMIT for all of them), and reads MUST see them at once. Superseded blobs
    are unlinked only after that COMMIT."""

    def __init__(
        self,
        journal: Journal,
        blobs: BlobStore,
        buckets: BucketService,
        clock: Clock,
        fleet: FleetView | None = None,
        conditional_delete: Callable[[str, str, Preconditions], Awaitable[None]] | None = None,
    ) -> None:
        self._fleet = fleet
        self._conditional_delete = conditional_delete
        self._journal = journal
        self._blobs = blobs
        self._buckets = buckets
        self._clock = clock

    async def delete_objects(
        self, bucket: str, entries: Sequence[DeleteEntry]
    ) -> list[DeleteOutcome]:
        await self._buckets.require(bucket)
        outcomes = [DeleteOutcome(entry, _refusal(entry)) for entry in entries]
        for i, outcome in enumerate(outcomes):
            if outcome.error is None and outcome.entry.etag is not None:
                outcomes[i] = await self._delete_if_match(bucket, outcome.entry)
        keys = list(
            dict.fromkeys(o.entry.key for o in outcomes if o.error is None and o.entry.etag is None)
        )
        if keys:
            replicas = [self._fleet.replicate(bucket, k) for k in keys] if self._fleet else []
            async with fleet_writing_all(self._fleet, bucket, keys) as announced:
                await announced
                superseded = await self._journal.commit_deletes(bucket, keys, self._clock.wall())
            await self._blobs.discard(superseded)
            await self._replicate_deletes(bucket, [r for r in replicas if r is not None])
        return outcomes

    async def _delete_if_match(self, bucket: str, entry: DeleteEntry) -> DeleteOutcome:
        if self._conditional_delete is None:
            return DeleteOutcome(
                entry, S3NotImplemented("Conditional deletes are not implemented.")
            )
        try:
            await self._conditional_delete(bucket, entry.key, Preconditions(if_match=entry.etag))
        except S3Error as exc:
            return DeleteOutcome(entry, exc)
        return DeleteOutcome(entry)

    async def _replicate_deletes(self, bucket: str, replicas: Sequence[ReplicaWriter]) -> None:
        """With replicas: each delete committed on its holders before the answer."""

        async def one(replica: ReplicaWriter) -> None:
            row = await self._journal.get(bucket, replica.key)
            if row is not None and row.is_delete:
                await commit_replicas(replica, replica.holders, row, is_delete=True)

        await asyncio.gather(*(one(r) for r in replicas))


def _refusal(entry: DeleteEntry) -> S3Error | None:
    """The per-key error S3 would report for this entry, if any."""
    if entry.version_id is not None and entry.version_id != "null":
        # An unversioned bucket only has the "null" version; versions are not supported.
        return S3NotImplemented("Deleting a specific object version is not implemented.")
    try:
        validate_key(entry.key)
    except S3Error as exc:
        return exc
    return None
