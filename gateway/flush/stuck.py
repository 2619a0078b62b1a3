"""What only an operator can unstick, for waiters with a deadline (drain, shutdown).

A ``failed`` object waits for ``POST /admin/v1/flush/retry``, not for time; so does a commit
marker that commit ordering holds back behind it (the bucket must never show a marker
without its data). A drain or a shutdown that waited for either would wait out its whole
timeout for nothing: ``wait_movable`` returns once nothing else is left.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from gateway.flush.policy import FlushPolicy
from gateway.models import FlushState, LocalObject, parent_prefix
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue

# Held markers are looked for only while this few objects are still moving: past it they
# cannot all be markers (a checkpoint has one), and the lookup is not worth its reads.
_MAX_HELD_LOOKUP = 64
# Failed objects that can hold a marker back, at most (beyond them a marker counts as moving).
_MAX_FAILED_LOOKUP = 10_000
_RECHECK_S = 1.0  # how often a waiter looks again for markers held behind failed objects


@dataclass(frozen=True, slots=True)
class Unflushed:
    """Objects acknowledged up to a fence and not durable upstream yet."""

    objects: int
    bytes: int
    failed: int  # of ``objects``: failed, waiting for an operator's retry
    held: int  # of ``objects``: commit markers held back behind a failed object

    @property
    def is_stuck(self) -> bool:
        """Nothing is left that can progress without an operator."""
        return self.objects > 0 and self.failed + self.held >= self.objects


async def held_markers(
    journal: Journal, policy: FlushPolicy, bucket: str | None, prefix: str, fence_seq: int
) -> int:
    """Pending commit markers under ``bucket``/``prefix`` acknowledged up to ``fence_seq``
    that commit ordering holds back behind a failed object (one acknowledged before the
    marker under its parent prefix). Reads up to ``_MAX_HELD_LOOKUP`` pending keys: call
    it only when at most that many objects are still moving."""
    queue = FlushQueue(journal)
    failed_by_bucket: dict[str, list[LocalObject]] = {}
    for row in await queue.failed(_MAX_FAILED_LOOKUP):
        failed_by_bucket.setdefault(row.meta.bucket, []).append(row)
    held = 0
    for row_bucket, key in await queue.pending_keys(bucket, prefix, fence_seq, _MAX_HELD_LOOKUP):
        failed = failed_by_bucket.get(row_bucket)
        if not failed or not policy.is_marker(key):
            continue
        marker = await journal.get(row_bucket, key)
        if marker is None or marker.state is not FlushState.PENDING or marker.seq > fence_seq:
            continue
        parent = parent_prefix(key)
        if any(f.seq < marker.seq and f.meta.key.startswith(parent) for f in failed):
            held += 1
    return held


class FleetHeld(Protocol):
    def fleet_stuck(self, bucket: str | None, prefix: str) -> int:
        """Commit markers under bucket/prefix the fleet holds for nodes that cannot answer
        (unreachable, or back with an empty disk): they wait for an operator too."""
        ...


async def unflushed(
    journal: Journal,
    policy: FlushPolicy,
    bucket: str | None,
    prefix: str,
    fence_seq: int,
    fleet: FleetHeld | None = None,
) -> Unflushed:
    """What is not durable yet of what was acknowledged up to ``fence_seq``, with how much
    of it is failed or held behind a failed object (or, in a fleet, held for a node that
    cannot answer). (A few reads, not one snapshot: a row may change state between them,
    so the parts are clamped to the whole.)"""
    objects, size = await journal.unflushed(bucket, prefix, fence_seq)
    moving, _ = await journal.unflushed(bucket, prefix, fence_seq, skip_failed=True)
    failed = min(objects, max(0, objects - moving))
    held = 0
    if failed and 0 < moving <= _MAX_HELD_LOOKUP:
        held = min(moving, await held_markers(journal, policy, bucket, prefix, fence_seq))
    if fleet is not None and moving > held:
        held += min(moving - held, fleet.fleet_stuck(bucket, prefix))
    return Unflushed(objects, size, failed, held)


async def without_markers(
    journal: Journal,
    policy: FlushPolicy,
    bucket: str | None,
    prefix: str,
    fence_seq: int,
    state: Unflushed,
) -> Unflushed:
    """``state`` less the commit markers among it (a fleet fence asks so: markers of one
    directory held on two nodes must not wait on each other). Looked up only while few
    objects are left (past ``_MAX_HELD_LOOKUP`` they cannot all be markers)."""
    if not 0 < state.objects <= _MAX_HELD_LOOKUP:
        return state
    markers, size = 0, 0
    queue = FlushQueue(journal)
    for row_bucket, key in await queue.unflushed_keys(bucket, prefix, fence_seq, _MAX_HELD_LOOKUP):
        if policy.is_marker(key):
            row = await journal.get(row_bucket, key)
            markers += 1
            size += row.meta.size_bytes if row is not None else 0
    objects = max(0, state.objects - markers)
    held = min(objects, max(0, state.held - markers))
    failed = min(objects, state.failed)
    return Unflushed(objects, max(0, state.bytes - size), failed, held)


async def wait_movable(
    journal: Journal,
    policy: FlushPolicy,
    bucket: str | None,
    prefix: str,
    fence_seq: int,
    timeout_s: float,
    *,
    exclude_markers: bool = False,
    fleet: FleetHeld | None = None,
) -> Unflushed:
    """Wait until everything acknowledged up to ``fence_seq`` under ``bucket``/``prefix`` is
    durable or stuck (failed, or a marker held behind a failed object), or ``timeout_s``
    passes; return what is left (``exclude_markers``: commit markers do not count). Returns
    within about a second of the last object that could move."""
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + timeout_s
    while True:
        left_s = max(0.0, deadline_s - loop.time())
        await journal.wait_flushed(
            bucket, prefix, fence_seq, min(left_s, _RECHECK_S), skip_failed=True
        )
        state = await unflushed(journal, policy, bucket, prefix, fence_seq, fleet)
        if exclude_markers:
            state = await without_markers(journal, policy, bucket, prefix, fence_seq, state)
        if state.objects == 0 or state.is_stuck or loop.time() >= deadline_s:
            return state
