"""Figures of the journal kept in memory as rows change, and drain fences over them.

Nothing here scans the table: ``Figures`` is loaded once when the journal opens (one pass
over the rows) and then follows every committed ``RowChange`` / ``PartsChange`` on the event
loop, in commit order. Status, metrics, the status page and capacity admission read it in
O(1) (per-lane figures live with the flush order, which knows the lanes).

Kept: objects and bytes by flush state, durable (cached) bytes, bytes of parts of open
uploads, the flushed counters (also persisted by ``mark_durable``), the oldest unflushed
acknowledgement (to the second), and for every *directory prefix* (``""``, ``a/``,
``a/b/`` ...) of every bucket the unflushed objects and bytes under it.

A ``Fence`` answers "is everything acknowledged before now under bucket/prefix durable
upstream?" and wakes its waiters when it is. It starts from the directory counts (or from a
count the journal takes inside its writer for other prefixes) and is then kept by the same
changes: a row counts while it is unflushed and its ``fence_seq`` (the oldest unflushed
version of its key) is at or before the fence. A commit marker waits on a fence taken at
its own acknowledgement, which is how commit ordering costs no scan either.

Loop affinity: ``apply`` and every fence method run on the event loop; ``load`` runs only
while the journal opens, before anything else touches the object.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gateway.models import FlushState
from gateway.store.rows import (
    Change,
    PartsChange,
    RowImage,
    directory_prefixes,
    is_directory_prefix,
)

_UNFLUSHED = (FlushState.PENDING, FlushState.FLUSHING, FlushState.FAILED)


@dataclass(frozen=True, slots=True)
class Backlog:
    """Totals of what is not durable upstream yet. ``pending_*`` counts every such row
    (failed ones included); ``flushing_objects`` and ``failed_*`` are parts of it."""

    pending_objects: int
    pending_bytes: int
    flushing_objects: int
    failed_objects: int
    oldest_acked_s: float | None
    failed_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Stats:
    backlog: Backlog
    flushed_objects: int
    flushed_bytes: int
    cached_bytes: int


@dataclass(frozen=True, slots=True)
class SpaceFigures:
    """Local body bytes, by whether they may be evicted."""

    unflushed_bytes: int
    durable_bytes: int
    parts_bytes: int
    replica_bytes: int = 0  # held for other gateways of the fleet (docs/fleet.md)

    @property
    def pinned_bytes(self) -> int:
        """Bytes that cannot be evicted."""
        return self.unflushed_bytes + self.parts_bytes + self.replica_bytes

    @property
    def used_bytes(self) -> int:
        return self.unflushed_bytes + self.durable_bytes + self.parts_bytes + self.replica_bytes


@dataclass(slots=True)
class Tally:
    """Unflushed objects and bytes, and how many of them are ``failed``."""

    objects: int = 0
    size_bytes: int = 0
    failed_objects: int = 0
    failed_bytes: int = 0

    def add(self, image: RowImage, sign: int) -> None:
        self.objects += sign
        self.size_bytes += sign * image.size_bytes
        if image.state is FlushState.FAILED:
            self.failed_objects += sign
            self.failed_bytes += sign * image.size_bytes

    def merge(self, other: Tally) -> None:
        self.objects += other.objects
        self.size_bytes += other.size_bytes
        self.failed_objects += other.failed_objects
        self.failed_bytes += other.failed_bytes

    def figures(self, *, skip_failed: bool = False) -> tuple[int, int]:
        if skip_failed:
            return self.objects - self.failed_objects, self.size_bytes - self.failed_bytes
        return self.objects, self.size_bytes

    @property
    def is_empty(self) -> bool:
        return self.objects == 0


class Fence:
    """Unflushed rows under ``bucket`` (None: every bucket) and ``prefix`` acknowledged at or
    before ``seq``; ``exclude_key`` (a commit marker's own key) never counts. Created by
    ``Figures.fence`` (or ``Journal.open_fence``); MUST be closed when no longer needed.
    ``on_clear`` runs once, when nothing is left."""

    def __init__(
        self,
        figures: Figures,
        bucket: str | None,
        prefix: str,
        seq: int,
        tally: Tally,
        exclude_key: str | None = None,
        on_clear: Callable[[Fence], None] | None = None,
    ) -> None:
        self._figures = figures
        self.bucket = bucket
        self.prefix = prefix
        self.seq = seq
        self.tally = tally
        self.exclude_key = exclude_key
        self._on_clear = on_clear
        self._changed = asyncio.Event()
        self.is_closed = False

    def matches(self, image: RowImage) -> bool:
        """Whether ``image`` is under this fence at all (bucket, prefix, not excluded)."""
        return (
            (self.bucket is None or image.bucket == self.bucket)
            and image.key.startswith(self.prefix)
            and image.key != self.exclude_key
        )

    def note(self, image: RowImage, sign: int) -> None:
        """A matching unflushed row entered (+1) or left (-1) the figures."""
        if image.fence_seq <= self.seq and image.key != self.exclude_key:
            self.tally.add(image, sign)

    def settle(self) -> None:
        """After a change: wake waiters and fire ``on_clear`` when a figure reached zero."""
        if self.tally.objects - self.tally.failed_objects <= 0:
            self._changed.set()
        if self.tally.objects <= 0 and self._on_clear is not None:
            callback, self._on_clear = self._on_clear, None
            callback(self)

    def figures(self, *, skip_failed: bool = False) -> tuple[int, int]:
        return self.tally.figures(skip_failed=skip_failed)

    async def wait(self, timeout_s: float, *, skip_failed: bool = False) -> tuple[int, int]:
        """Wait until nothing (not counting failed rows with ``skip_failed``) is left or
        ``timeout_s`` passes; returns what is left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            left = self.figures(skip_failed=skip_failed)
            wait_s = deadline - loop.time()
            if left[0] <= 0 or wait_s <= 0:
                return left
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait_s)

    def close(self) -> None:
        if not self.is_closed:
            self.is_closed = True
            self._figures.drop_fence(self)


@dataclass(slots=True)
class _Oldest:
    """Unflushed rows by acknowledgement second; the smallest second with any is the oldest."""

    counts: dict[int, int] = field(default_factory=dict)
    heap: list[int] = field(default_factory=list)

    def add(self, acked_s: float, sign: int) -> None:
        second = int(acked_s)
        n = self.counts.get(second, 0) + sign
        if n > 0:
            if second not in self.counts:
                heapq.heappush(self.heap, second)
            self.counts[second] = n
        else:
            self.counts.pop(second, None)
        if len(self.heap) > 2 * len(self.counts) + 1024:  # drop stale seconds now and then
            self.heap = sorted(self.counts)

    def oldest(self) -> float | None:
        while self.heap and self.heap[0] not in self.counts:
            heapq.heappop(self.heap)
        return float(self.heap[0]) if self.heap else None


class Figures:
    """The journal's figures, kept from its changes (see the module docstring)."""

    def __init__(self) -> None:
        self._states = {state: [0, 0] for state in _UNFLUSHED}  # objects, bytes
        self.durable_bytes = 0
        self.parts_bytes = 0
        self.replica_bytes = 0  # replicas held for other gateways (store/replicas.py)
        self.flushed_objects = 0
        self.flushed_bytes = 0
        self.last_seq = 0  # the newest version whose change was applied
        self._oldest = _Oldest()
        self._dirs: dict[tuple[str, str], Tally] = {}
        self._buckets: dict[str, int] = {}  # unflushed rows per bucket
        self._dir_fences: dict[tuple[str | None, str], set[Fence]] = {}
        self._other_fences: set[Fence] = set()

    # -- keeping them ----------------------------------------------------------------------

    def load(self, image: RowImage) -> None:
        """While the journal opens: count one existing row."""
        self._account(image, 1, None)
        self.last_seq = max(self.last_seq, image.seq)

    def apply(self, change: Change) -> None:
        """A committed change (on the loop, in commit order)."""
        if isinstance(change, PartsChange):
            if change.is_replica:
                self.replica_bytes += change.delta_bytes
            else:
                self.parts_bytes += change.delta_bytes
            return
        touched: set[Fence] = set()
        if change.old is not None:
            self._account(change.old, -1, touched)
        if change.new is not None:
            self._account(change.new, 1, touched)
            self.last_seq = max(self.last_seq, change.new.seq)
        if change.is_flush and change.old is not None:
            self.flushed_objects += 1
            self.flushed_bytes += change.old.size_bytes
        for fence in touched:
            fence.settle()

    def _account(self, image: RowImage, sign: int, touched: set[Fence] | None) -> None:
        if not image.is_unflushed:
            if not image.is_delete:
                self.durable_bytes += sign * image.size_bytes
            return
        totals = self._states[image.state]
        totals[0] += sign
        totals[1] += sign * image.size_bytes
        self._oldest.add(image.acked_s, sign)
        n = self._buckets.get(image.bucket, 0) + sign
        if n:
            self._buckets[image.bucket] = n
        else:
            self._buckets.pop(image.bucket, None)
        for prefix in directory_prefixes(image.key):
            ident = (image.bucket, prefix)
            tally = self._dirs.get(ident)
            if tally is None:
                tally = self._dirs[ident] = Tally()
            tally.add(image, sign)
            if tally.objects == 0:
                del self._dirs[ident]
            if touched is not None and self._dir_fences:
                for fence_ident in (ident, (None, prefix)):
                    for fence in self._dir_fences.get(fence_ident, ()):
                        fence.note(image, sign)
                        touched.add(fence)
        if touched is not None:
            for fence in self._other_fences:
                if fence.matches(image):
                    fence.note(image, sign)
                    touched.add(fence)

    # -- reading them ----------------------------------------------------------------------

    def stats(self) -> Stats:
        pending, flushing, failed = (self._states[s] for s in _UNFLUSHED)
        backlog = Backlog(
            pending_objects=pending[0] + flushing[0] + failed[0],
            pending_bytes=pending[1] + flushing[1] + failed[1],
            flushing_objects=flushing[0],
            failed_objects=failed[0],
            oldest_acked_s=self._oldest.oldest(),
            failed_bytes=failed[1],
        )
        return Stats(backlog, self.flushed_objects, self.flushed_bytes, self.space().used_bytes)

    def space(self) -> SpaceFigures:
        unflushed = sum(totals[1] for totals in self._states.values())
        return SpaceFigures(unflushed, self.durable_bytes, self.parts_bytes, self.replica_bytes)

    def unflushed_under(self, bucket: str | None, prefix: str) -> Tally:
        """A copy of the unflushed figures under a directory prefix (every bucket for None)."""
        assert is_directory_prefix(prefix), prefix
        buckets: Iterable[str] = self._buckets if bucket is None else (bucket,)
        out = Tally()
        for name in buckets:
            tally = self._dirs.get((name, prefix))
            if tally is not None:
                out.merge(tally)
        return out

    def has_unflushed(self, bucket: str) -> bool:
        return bucket in self._buckets

    def unflushed_buckets(self) -> list[str]:
        """Buckets with unflushed rows, sorted."""
        return sorted(self._buckets)

    # -- fences ----------------------------------------------------------------------------

    def fence(
        self,
        bucket: str | None,
        prefix: str,
        *,
        exclude: RowImage | None = None,
        on_clear: Callable[[Fence], None] | None = None,
    ) -> Fence:
        """A fence over what is acknowledged now under a directory prefix. ``exclude``: a
        row (already counted) that must not count, e.g. the commit marker waiting on it."""
        tally = self.unflushed_under(bucket, prefix)
        if exclude is not None and exclude.is_unflushed:
            tally.add(exclude, -1)
        key = exclude.key if exclude is not None else None
        return self.register(bucket, prefix, self.last_seq, tally, key, on_clear)

    def register(
        self,
        bucket: str | None,
        prefix: str,
        seq: int,
        tally: Tally,
        exclude_key: str | None = None,
        on_clear: Callable[[Fence], None] | None = None,
    ) -> Fence:
        """A fence at ``seq`` whose figures the caller counted at the current position of
        the change stream (the journal does so inside its writer, for prefixes that are
        not directories and for commit markers found while loading)."""
        fence = Fence(self, bucket, prefix, seq, tally, exclude_key, on_clear)
        if is_directory_prefix(prefix):
            self._dir_fences.setdefault((bucket, prefix), set()).add(fence)
        else:
            self._other_fences.add(fence)
        return fence

    def drop_fence(self, fence: Fence) -> None:
        if fence in self._other_fences:
            self._other_fences.discard(fence)
            return
        fences = self._dir_fences.get((fence.bucket, fence.prefix))
        if fences is not None:
            fences.discard(fence)
            if not fences:
                del self._dir_fences[(fence.bucket, fence.prefix)]
