"""Fresh copies: this node's durable rows in a fleet, checked against the bucket before a
read trusts them (docs/fleet.md, "Copies of flushed versions").

A durable row (a version this node flushed, or a read-through copy) stands for the bucket's
object. A gateway alone is its bucket's only writer, so the copy is current until it writes
the key again. In a fleet another node may write the key meanwhile: while that version is
unflushed, reads here see it through the directory (they ask that node); once it is
flushed, only the bucket has it, and this node's copy would be served over it, stale,
for as long as the copy is kept (found by loadtest/fleet_soak.py).

So a copy is trusted only if it was checked against the bucket (the same ETag and size)
after the last moment another node may have written its key unseen here, and while no
peer may hold an unflushed version of it (``FleetView.candidates``: the read asks them
first). That moment (``FleetView.copies_stale_since``) is the last announcement or
withdrawal of the key's directory by a peer (a node announces a directory before it
acknowledges a write there), or a lease from a peer gained after a time without one (this
node's start too: writes acknowledged then were not announced here). A checkpoint's copies
are therefore checked once per node after a restart or after another node wrote in their
directory, one HEAD each, and not again until the next such event. A copy found stale is
dropped as an evicted one is, and the read goes on as if it had never been here.

An unflushed version this node acknowledged before it started is served only once it is
known not to have been overtaken while the node was down (``fleet/recovered.py``): a read
otherwise goes on as if it were not here, as it will not be once the flusher drops it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from gateway import metrics
from gateway.clock import Clock
from gateway.errors import NoSuchKey, S3Error
from gateway.fleet.recovered import RecoveredVersions
from gateway.fleet.view import FleetView
from gateway.models import FlushState, LocalObject
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)

MAX_CHECKED = 100_000  # copies remembered as checked (the oldest are checked again)


class FreshRows:
    """``get`` is ``Journal.get`` for reads: in a fleet, a durable row that may be stale
    is checked against the bucket first (one HEAD), and dropped if it is. Loop-bound."""

    def __init__(
        self,
        journal: Journal,
        upstream: Upstream,
        blobs: BlobStore,
        clock: Clock,
        fleet: FleetView | None,
        recovered: RecoveredVersions | None = None,
    ) -> None:
        self._journal = journal
        self._recovered = recovered if fleet is not None else None
        self._upstream = upstream
        self._blobs = blobs
        self._clock = clock
        self._fleet = fleet
        self._checked: OrderedDict[tuple[str, str, int], float] = OrderedDict()

    async def get(self, bucket: str, key: str) -> LocalObject | None:
        """This node's row of ``key``, or None (also when its copy was stale: dropped)."""
        row = await self._journal.get(bucket, key)
        fleet = self._fleet
        if fleet is None or row is None or row.state is not FlushState.DURABLE:
            return row
        ident = (bucket, key, row.seq)
        checked_s = self._checked.get(ident)
        if (
            checked_s is not None
            and checked_s >= fleet.copies_stale_since(bucket, key)
            and not fleet.candidates(bucket, key)
        ):
            return row
        now_s = self._clock.monotonic()
        try:
            there = await self._upstream.head_object(bucket, key)
        except NoSuchKey:
            there = None
        except S3Error as exc:  # the bucket cannot say (an outage): the copy, unchecked
            log.warning("%s/%s: the copy here is served unchecked: %s", bucket, key, exc)
            return row
        if there is not None and (there.etag, there.size_bytes) == (
            row.meta.etag,
            row.meta.size_bytes,
        ):
            self._remember(ident, now_s)
            return row
        await self._drop(row)
        return None

    async def after_peers(self, row: LocalObject | None) -> LocalObject | None:
        """``row``, read from the journal before the peers were asked, as a read may use
        it after them: a copy of a flushed version is checked now (``get``), anything
        else is as it was. Checked after the peers, not before: a version a peer flushes
        in between is then found in the bucket; in the other order it was in neither
        place when looked for, and the copy here was served (found by
        loadtest/fleet_soak.py: a delete flushed during the read)."""
        if self._fleet is None or row is None:
            return row
        if row.state is not FlushState.DURABLE:
            return await self.unflushed(row)
        return await self.get(row.meta.bucket, row.meta.key)

    async def unflushed(self, row: LocalObject) -> LocalObject | None:
        """``row`` (not durable upstream) as reads here and on peers may serve it: None
        if it was acknowledged before this node started and overtaken while it was down.
        When the bucket cannot say, the row is served (it is the newest but for that)."""
        recovered = self._recovered
        if recovered is None:
            return row
        try:
            return None if await recovered.superseded(row) else row
        except Exception as exc:
            log.warning(
                "%s/%s: a version from before this start served unchecked: %r",
                row.meta.bucket,
                row.meta.key,
                exc,
            )
            return row

    async def _drop(self, row: LocalObject) -> None:
        dropped = await self._journal.drop_copy(row)
        if dropped is None:
            return  # the row changed meanwhile: the next read looks again
        await self._blobs.discard(dropped)
        metrics.STALE_COPIES_DROPPED.inc()
        log.info(
            "%s/%s: dropped this node's copy (ETag %s): the bucket has another version, "
            "written through another node",
            row.meta.bucket,
            row.meta.key,
            row.meta.etag,
        )

    def _remember(self, ident: tuple[str, str, int], now_s: float) -> None:
        checked = self._checked
        checked.pop(ident, None)
        checked[ident] = now_s
        if len(checked) > MAX_CHECKED:
            checked.popitem(last=False)
