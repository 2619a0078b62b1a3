"""Read-through fills: one upstream transfer per object per node, shared by every reader.

A fill copies one upstream object into new body files with parallel ranged GETs (chunks of
``part_bytes``, ``If-Match`` the ETag of the first answer, so every byte is of one
version), and readers read from those files as the bytes arrive: in order, at their own
pace, by ``sendfile`` like any local body. A reader never waits for the whole object, the
fill never waits for a reader, and memory stays bounded (about one MiB per chunk in
flight) whatever the object size or the number of readers. When every byte is there, the
copy is checked (MD5 against the ETag, or the part MD5s against a multipart ETag) and
committed as a ``durable`` row, so the next reader reads it locally. Readers get the
upstream's bytes as the upstream sends them (as a direct GET would: S3 has no digest of
a range, and an encrypted object's ETag is not an MD5): a copy that fails its check is
only not kept.

Contract (``FillManager``): at most one fill per key at a time; a fill MUST NOT commit a
copy that is incomplete, fails its check, or was overtaken by a local write or delete of the
key (journal ``watch``/``commit_cached``); it reserves its size under the cache's high
watermark first (``CacheSpace.reserve_fill``) and refuses to start when that fails, and it
evicts nothing (the evictor only ever removes durable rows). Upstream bytes go through the
shared upstream ``BandwidthBudget`` and at most ``request_concurrency`` ranged GETs run at
once across fills. ``close`` cancels running fills; their readers see errors.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from gateway.clock import Clock
from gateway.core.fill import BandwidthBudget, Fill, FillConfig
from gateway.core.integrity import BlobVerifier
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.space import CacheSpace
from gateway.upstream.client import Upstream

_RANGE_WINDOW_S = 30.0  # a second range read of a key within this starts a fill
_RANGE_MEMORY = 4096


class FillManager:
    """The registry of running fills (single-flight per key); see the module contract."""

    def __init__(
        self,
        journal: Journal,
        blobs: BlobStore,
        upstream: Upstream,
        space: CacheSpace | None,
        clock: Clock,
        verifier: BlobVerifier,
        config: FillConfig | None = None,
        budget: BandwidthBudget | None = None,
    ) -> None:
        self.journal = journal
        self.blobs = blobs
        self.upstream = upstream
        self.space = space
        self.clock = clock
        self.verifier = verifier
        self.config = config or FillConfig()
        self.budget = budget
        self.requests = asyncio.Semaphore(self.config.request_concurrency)
        self.executor = ThreadPoolExecutor(4, thread_name_prefix="fill")
        self._fills: dict[tuple[str, str], Fill] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._range_reads: OrderedDict[tuple[str, str], float] = OrderedDict()

    @property
    def is_enabled(self) -> bool:
        """Copies are made only with a capacity to account them against."""
        return self.space is not None

    def current(self, bucket: str, key: str) -> Fill | None:
        return self._fills.get((bucket, key))

    def start(self, bucket: str, key: str) -> Fill:
        """The running fill of the key, or a new one."""
        fill = self._fills.get((bucket, key))
        if fill is None:
            fill = Fill(self, bucket, key)
            self._fills[(bucket, key)] = fill
            task = asyncio.create_task(fill.run(), name=f"fill {bucket}/{key}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return fill

    def forget(self, fill: Fill) -> None:
        if self._fills.get((fill.bucket, fill.key)) is fill:
            del self._fills[(fill.bucket, fill.key)]

    def is_shared_range(self, bucket: str, key: str) -> bool:
        """Record a range read of a remote key; True when another one came within
        ``_RANGE_WINDOW_S`` (several readers, or one reading piece by piece: the whole
        object is worth one fill), False for a lone range read."""
        now_s = self.clock.monotonic()
        last_s = self._range_reads.pop((bucket, key), None)
        self._range_reads[(bucket, key)] = now_s
        while len(self._range_reads) > _RANGE_MEMORY:
            self._range_reads.popitem(last=False)
        return last_s is not None and now_s - last_s <= _RANGE_WINDOW_S

    def active(self) -> list[Fill]:
        return list(self._fills.values())

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.executor.shutdown(wait=False, cancel_futures=True)
