"""Listing: merge the journal's local view with the upstream listing, in S3 order.

Both sides are turned into sorted streams of items (a key, a common prefix, or, locally, a
tombstone). Where a name is on both sides the local item wins: a newer local version
replaces the upstream figures, a local tombstone hides the upstream key. An upstream common
prefix whose every key is locally deleted is hidden too. Local keys under a common prefix are
rolled up and skipped with one seek, so listing a checkpoint directory of thousands of shards
costs one row per prefix, not one per shard. In a fleet only this node's unflushed rows
(and its peers') are merged: its durable rows are copies, and the bucket lists what they
stand for, or what another node has put there since.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from gateway.fleet.view import FleetView
from gateway.models import FlushState, ListEntry, ListPage
from gateway.store.journal import Journal
from gateway.upstream.client import Upstream

# Sorts after every valid key continuing a prefix: used to seek past a common prefix.
_AFTER_ALL = "\U0010ffff"
_BATCH = 1000


@dataclass(frozen=True, slots=True)
class _Item:
    entry: ListEntry
    is_tombstone: bool = False
    # For the fleet's merge (peers.py): an unflushed local row or a peer's row, and when it
    # was acknowledged.
    is_unflushed: bool = False
    acked_s: float = 0.0


def common_prefix(name: str, prefix: str, delimiter: str) -> str | None:
    """The common prefix ``name`` rolls up into, or None if it is listed as a key."""
    if not delimiter:
        return None
    cut = name.find(delimiter, len(prefix))
    return None if cut < 0 else name[: cut + len(delimiter)]


def resume_after(marker: str, prefix: str, delimiter: str) -> str:
    """Where a continuation resumes: past everything under ``marker`` if it was a prefix."""
    if common_prefix(marker, prefix, delimiter) == marker:
        return marker + _AFTER_ALL
    return marker


def successor(prefix: str) -> str:
    """The least string greater than every string starting with ``prefix`` (UTF-8 order)."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop())
        if code < 0x10FFFF:
            nxt = 0xE000 if code == 0xD7FF else code + 1  # skip the surrogate block
            return "".join(chars) + chr(nxt)
    return ""  # only an all-U+10FFFF prefix gets here; nothing sorts after it


async def _local(
    journal: Journal,
    bucket: str,
    prefix: str,
    delimiter: str,
    after: str,
    *,
    copies: bool = True,
) -> AsyncGenerator[_Item, None]:
    """This node's rows as items; without ``copies``, its durable rows are left to the
    bucket's listing (in a fleet, another node may have written or deleted the key since:
    core/freshness.py)."""
    cursor, inclusive = after, False
    while True:
        rows = await journal.scan(bucket, prefix, cursor, _BATCH, inclusive=inclusive)
        seeked, inclusive = False, False
        for row in rows:
            name = row.meta.key
            if not copies and row.state is FlushState.DURABLE:
                cursor = name
                continue
            rolled = common_prefix(name, prefix, delimiter)
            if rolled is not None:
                cursor = name
                if row.is_delete:
                    continue  # a deleted key alone does not make a prefix
                if rolled > after:  # a prefix at or before the marker was listed already
                    yield _Item(ListEntry(name=rolled, is_prefix=True))
                # Seek past everything under the prefix in one step.
                cursor, inclusive, seeked = successor(rolled), True, True
                if not cursor:
                    return
                break
            m = row.meta
            yield _Item(
                ListEntry(name, False, m.size_bytes, m.etag, m.last_modified_s, m.storage_class),
                row.is_delete,
                row.state is not FlushState.DURABLE,
                row.acked_s,
            )
            cursor = name
        if not seeked and len(rows) < _BATCH:
            return


async def _remote(
    upstream: Upstream,
    bucket: str,
    prefix: str,
    delimiter: str,
    after: str,
    hidden: str | None = None,
) -> AsyncGenerator[_Item, None]:
    """The upstream's listing as items; everything under ``hidden`` (the fleet's control
    prefix) is skipped with one seek past it."""
    cursor = after
    while True:
        entries, truncated = await upstream.list_page(bucket, prefix, delimiter, cursor, _BATCH)
        seek = None
        for entry in entries:
            if hidden is not None and entry.name.startswith(hidden):
                seek = hidden + _AFTER_ALL
                break
            if entry.name > cursor:
                yield _Item(entry)
        if seek is not None and seek > cursor:
            cursor = seek
            continue
        if not truncated or not entries:
            return
        last = entries[-1]
        cursor = last.name + _AFTER_ALL if last.is_prefix else last.name


async def _peers(
    fleet: FleetView,
    nodes: Sequence[str],
    bucket: str,
    prefix: str,
    delimiter: str,
    after: str,
) -> AsyncGenerator[_Item, None]:
    """The peers' unflushed rows under ``prefix`` as items, rolled up like ``_local`` (a
    prefix is listed once, and only for a row under it that is not a delete)."""
    cursor, last_rolled = after, None
    while True:
        rows, bound = await fleet.rows(nodes, bucket, prefix, cursor, _BATCH)
        for row in rows:
            rolled = common_prefix(row.key, prefix, delimiter)
            if rolled is not None:
                if not row.is_delete and rolled != last_rolled and rolled > after:
                    last_rolled = rolled
                    yield _Item(ListEntry(name=rolled, is_prefix=True))
                continue
            entry = ListEntry(row.key, False, row.size_bytes, row.etag, row.last_modified_s)
            yield _Item(entry, row.is_delete, True, row.acked_s)
        if bound is None or not rows:
            return
        cursor = bound


async def _newest(
    mine: AsyncGenerator[_Item, None], theirs: AsyncGenerator[_Item, None]
) -> AsyncGenerator[_Item, None]:
    """Two sorted item streams as one; where both have a name, the newer version wins (an
    unflushed one over a durable one, else the later acknowledgement; this node on ties)."""
    lhs, rhs = await anext(mine, None), await anext(theirs, None)
    try:
        while lhs is not None or rhs is not None:
            if rhs is None or (lhs is not None and lhs.entry.name < rhs.entry.name):
                assert lhs is not None
                yield lhs
                lhs = await anext(mine, None)
            elif lhs is None or rhs.entry.name < lhs.entry.name:
                yield rhs
                rhs = await anext(theirs, None)
            else:
                mine_wins = lhs.entry.is_prefix or (
                    (lhs.is_unflushed, lhs.acked_s) >= (rhs.is_unflushed, rhs.acked_s)
                )
                yield lhs if mine_wins else rhs
                lhs, rhs = await anext(mine, None), await anext(theirs, None)
    finally:
        await mine.aclose()
        await theirs.aclose()


async def _all_deleted_locally(
    journal: Journal, upstream: Upstream, bucket: str, rolled: str
) -> bool:
    """True if every upstream key under ``rolled`` has a local tombstone."""
    if not await journal.scan(bucket, rolled, "", 1):
        return False  # nothing local under it: nothing can hide it
    async for item in _remote(upstream, bucket, rolled, "", ""):
        local = await journal.get(bucket, item.entry.name)
        if local is None or not local.is_delete:
            return False
    return True


async def list_objects(
    journal: Journal,
    upstream: Upstream,
    *,
    bucket: str,
    prefix: str,
    delimiter: str,
    after: str,
    max_keys: int,
    fleet: FleetView | None = None,
    hidden: str | None = None,
) -> ListPage:
    """One page of the merged listing: at most ``max_keys`` keys and prefixes after ``after``
    (in a fleet, the unflushed rows of peers that may hold any under ``prefix`` count as
    local ones)."""
    if max_keys <= 0:
        return ListPage((), False, None)  # S3: an empty, complete page
    local = _local(journal, bucket, prefix, delimiter, after, copies=fleet is None)
    nodes = fleet.prefix_candidates(bucket, prefix) if fleet is not None else ()
    if fleet is not None and nodes:
        peer_rows = _peers(fleet, nodes, bucket, prefix, delimiter, after)
        local = _newest(local, peer_rows)
    remote = _remote(upstream, bucket, prefix, delimiter, after, hidden)
    lhs = await anext(local, None)
    rhs = await anext(remote, None)
    out: list[ListEntry] = []
    truncated = False
    while lhs is not None or rhs is not None:
        if rhs is None or (lhs is not None and lhs.entry.name <= rhs.entry.name):
            assert lhs is not None
            if rhs is not None and rhs.entry.name == lhs.entry.name:
                rhs = await anext(remote, None)  # the local item wins
            item, lhs = lhs, await anext(local, None)
            if item.is_tombstone:
                continue
        else:
            item, rhs = rhs, await anext(remote, None)
            if item.entry.is_prefix and await _all_deleted_locally(
                journal, upstream, bucket, item.entry.name
            ):
                continue
        if len(out) >= max_keys:
            truncated = True
            break
        out.append(item.entry)
    await local.aclose()
    await remote.aclose()
    return ListPage(tuple(out), truncated, out[-1].name if out else None)


class ListingService:
    """ListObjects(V2) over the merged local + upstream view (see the module docstring)."""

    def __init__(
        self,
        journal: Journal,
        upstream: Upstream,
        fleet: FleetView | None = None,
        hidden_prefix: str | None = None,
    ) -> None:
        self._journal = journal
        self._upstream = upstream
        self._fleet = fleet
        # The fleet's own objects (--control-prefix): never listed to clients.
        self._hidden = hidden_prefix

    async def list_objects(
        self, bucket: str, *, prefix: str, delimiter: str, after: str, max_keys: int
    ) -> ListPage:
        return await list_objects(
            self._journal,
            self._upstream,
            bucket=bucket,
            prefix=prefix,
            delimiter=delimiter,
            after=after,
            max_keys=max_keys,
            fleet=self._fleet,
            hidden=self._hidden,
        )
