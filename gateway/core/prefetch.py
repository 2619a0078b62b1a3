"""Prefetch: pull every object under a prefix into the local cache before a job needs it.

A prefetch lists the prefix (local rows and the upstream listing, a local write or delete
winning), refuses at once when the objects would not fit under the cache's high watermark
next to what cannot be evicted (unflushed data, open uploads, copies being written), and
otherwise fetches every object held only upstream through the same single-flight fills
readers use (fills.py), several objects at a time: a reader arriving meanwhile shares the
transfer instead of starting another. It never evicts unflushed data (nothing in the cache
path can); it may evict older flushed copies to make room, least recently used first.

Progress (objects and bytes done of the total, bytes counted as they arrive) is kept per
(bucket, prefix) in memory: the admin API and ``gateway prefetch --wait`` read it. The last
``_KEPT_JOBS`` jobs are remembered; a new prefetch of the same prefix replaces a finished
job and joins a running one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gateway.clock import Clock
from gateway.core.fill import Fill
from gateway.core.fills import FillManager
from gateway.errors import S3Error
from gateway.models import FlushState
from gateway.store.journal import Journal
from gateway.store.space import CacheSpace
from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)

_PAGE = 1000
_KEPT_JOBS = 64
_FAILURES_SHOWN = 10


class PrefetchRefused(Exception):
    """The prefix cannot be prefetched (it would not fit): the message says why."""


@dataclass(slots=True)
class PrefetchJob:
    """One prefetch's progress. ``state``: ``running``, ``done`` (everything is local) or
    ``failed`` (some objects could not be fetched or kept: see ``failures``)."""

    bucket: str
    prefix: str
    started_s: float
    objects_total: int = 0
    bytes_total: int = 0
    objects_done: int = 0
    finished_bytes: int = 0  # bytes of objects done
    objects_failed: int = 0
    state: str = "running"
    finished_s: float | None = None
    failures: list[dict[str, str]] = field(default_factory=list)
    active: dict[str, Fill] = field(default_factory=dict)

    @property
    def bytes_done(self) -> int:
        return self.finished_bytes + sum(f.arrived_bytes for f in self.active.values())

    def as_dict(self, now_s: float) -> dict[str, Any]:
        end_s = self.finished_s if self.finished_s is not None else now_s
        return {
            "bucket": self.bucket,
            "prefix": self.prefix,
            "state": self.state,
            "done": self.state != "running",
            "objects_total": self.objects_total,
            "objects_done": self.objects_done,
            "objects_failed": self.objects_failed,
            "bytes_total": self.bytes_total,
            "bytes_done": min(self.bytes_done, self.bytes_total),
            "elapsed_seconds": round(max(0.0, end_s - self.started_s), 3),
            "failures": self.failures,
        }


@dataclass(frozen=True, slots=True)
class _Plan:
    fetch: list[tuple[str, int]]  # (key, size) held only upstream
    local_objects: int
    local_bytes: int
    evictable_bytes: int  # local flushed copies under the prefix (they must stay too)


class Prefetcher:
    """Owner of the prefetch jobs (see the module docstring). ``close`` cancels them."""

    def __init__(
        self,
        journal: Journal,
        upstream: Upstream,
        fills: FillManager,
        space: CacheSpace,
        clock: Clock,
        *,
        concurrency: int = 16,
    ) -> None:
        self._journal = journal
        self._upstream = upstream
        self._fills = fills
        self._space = space
        self._clock = clock
        self._concurrency = concurrency
        self._jobs: OrderedDict[tuple[str, str], PrefetchJob] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def job(self, bucket: str, prefix: str) -> PrefetchJob | None:
        return self._jobs.get((bucket, prefix))

    def jobs(self) -> list[PrefetchJob]:
        return list(self._jobs.values())

    def status(self) -> list[dict[str, Any]]:
        now_s = self._clock.monotonic()
        return [job.as_dict(now_s) for job in self._jobs.values()]

    async def start(self, bucket: str, prefix: str) -> PrefetchJob:
        """Start prefetching ``bucket``/``prefix`` (or return the running job). Raises
        PrefetchRefused when it cannot fit, S3Error when the upstream cannot be listed."""
        running = self._jobs.get((bucket, prefix))
        if running is not None and running.state == "running":
            return running
        plan = await self._plan(bucket, prefix)
        fetch_bytes = sum(size for _, size in plan.fetch)
        self._check_fits(fetch_bytes + plan.evictable_bytes, plan)
        job = PrefetchJob(bucket, prefix, self._clock.monotonic())
        job.objects_total = plan.local_objects + len(plan.fetch)
        job.bytes_total = plan.local_bytes + fetch_bytes
        job.objects_done, job.finished_bytes = plan.local_objects, plan.local_bytes
        self._jobs.pop((bucket, prefix), None)
        self._jobs[(bucket, prefix)] = job
        while len(self._jobs) > _KEPT_JOBS:
            self._jobs.popitem(last=False)
        task = asyncio.create_task(self._run(job, plan.fetch), name=f"prefetch {bucket}/{prefix}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _check_fits(self, needed_bytes: int, plan: _Plan) -> None:
        space = self._space
        if space.fits_cache(needed_bytes):
            return
        room = space.high_bytes - space.pinned_estimate_bytes - space.filling_bytes
        raise PrefetchRefused(
            f"the prefix does not fit in the cache: it needs {needed_bytes} bytes "
            f"({len(plan.fetch)} objects to fetch, {plan.evictable_bytes} bytes already "
            f"cached), and {max(0, room)} bytes are free to use under the high watermark "
            f"({space.high_bytes} of {space.capacity_bytes} bytes; "
            f"{space.pinned_estimate_bytes} hold unflushed data, open uploads and writes "
            f"in progress, {space.filling_bytes} copies being fetched)"
        )

    async def _plan(self, bucket: str, prefix: str) -> _Plan:
        await self._space.refresh()  # a fresh figure before a possible refusal
        local = await self._local_rows(bucket, prefix)
        fetch: list[tuple[str, int]] = []
        after = ""
        while True:
            entries, truncated = await self._upstream.list_page(bucket, prefix, "", after, _PAGE)
            for entry in entries:
                if not entry.is_prefix and entry.name not in local:
                    fetch.append((entry.name, entry.size_bytes))
            if not truncated or not entries:
                break
            after = entries[-1].name
        held = [(size, state) for size, state, is_delete in local.values() if not is_delete]
        return _Plan(
            fetch=fetch,
            local_objects=len(held),
            local_bytes=sum(size for size, _ in held),
            evictable_bytes=sum(size for size, state in held if state is FlushState.DURABLE),
        )

    async def _local_rows(
        self, bucket: str, prefix: str
    ) -> dict[str, tuple[int, FlushState, bool]]:
        rows: dict[str, tuple[int, FlushState, bool]] = {}
        after = ""
        while batch := await self._journal.scan(bucket, prefix, after, _PAGE):
            for row in batch:
                rows[row.meta.key] = (row.meta.size_bytes, row.state, row.is_delete)
            after = batch[-1].meta.key
        return rows

    async def _run(self, job: PrefetchJob, fetch: list[tuple[str, int]]) -> None:
        limit = asyncio.Semaphore(self._concurrency)

        async def one(key: str, size: int) -> None:
            async with limit:
                error = await self._fetch(job, key)
            if error is None:
                job.objects_done += 1
                job.finished_bytes += size
            else:
                job.objects_failed += 1
                if len(job.failures) < _FAILURES_SHOWN:
                    job.failures.append({"key": key, "error": error})

        try:
            await asyncio.gather(*(one(key, size) for key, size in fetch))
        finally:
            job.state = "done" if job.objects_failed == 0 else "failed"
            job.finished_s = self._clock.monotonic()
            log.info(
                "prefetch of %s/%s %s: %d of %d objects, %d bytes",
                job.bucket,
                job.prefix,
                job.state,
                job.objects_done,
                job.objects_total,
                job.finished_bytes,
            )

    async def _fetch(self, job: PrefetchJob, key: str) -> str | None:
        """Bring one object into the cache; None when it is local now, else why not."""
        if await self._journal.get(job.bucket, key) is not None:
            return None  # written (or read) here meanwhile: local already
        fill = self._fills.start(job.bucket, key)
        job.active[key] = fill
        try:
            await fill.head()
            if not fill.is_serving:
                return "no room in the cache under its high watermark"
            await fill.done()
        except S3Error as exc:
            return f"{exc.code}: {exc.message}"
        finally:
            job.active.pop(key, None)
        if fill.is_committed or await self._journal.get(job.bucket, key) is not None:
            return None
        if fill.error is not None:
            return f"{fill.error.code}: {fill.error.message}"
        return "the copy could not be verified against the upstream ETag (not kept)"
