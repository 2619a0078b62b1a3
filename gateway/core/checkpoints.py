"""Checkpoints under a prefix: which directories exist, which are complete, which are durable.

A checkpoint is a "directory" directly under the prefix (``ckpt/step_10/`` under ``ckpt/``),
from the merged listing (local writes and deletes win over the upstream listing, as for
ListObjects). It is *complete* when its commit marker exists directly in it (a file whose
name matches one of the commit-marker globs: ``.metadata``, which
torch.distributed.checkpoint writes last, or ``_SUCCESS``), and *durable* when it is
complete and nothing under it is still waiting for the upstream: with commit ordering the
marker is flushed last, so a durable checkpoint is whole in the bucket.

Newest first: directory names in natural order, descending, numbers compared as numbers
(``step_10`` is newer than ``step_9``; ``epoch_2_step_100`` newer than ``epoch_1_step_900``;
zero-padded and date-like names sort as expected); names that tie (``step_10`` and
``step_010``) are ordered by their marker's Last-Modified, newest first.
"""

from __future__ import annotations

import asyncio
import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.listing import ListingService
from gateway.core.objects import ObjectService
from gateway.errors import NoSuchKey
from gateway.store.journal import Journal

_DIGITS = re.compile(r"(\d+)")
_GLOB_CHARS = frozenset("*?[")
_PAGE = 1000
_HEADS_AT_ONCE = 16


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint directory (``prefix`` ends with ``/``)."""

    prefix: str
    name: str
    marker: str | None  # the commit marker's file name when complete
    marker_last_modified_s: float | None
    pending_objects: int
    pending_bytes: int

    @property
    def is_complete(self) -> bool:
        return self.marker is not None

    @property
    def is_durable(self) -> bool:
        return self.is_complete and self.pending_objects == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "name": self.name,
            "complete": self.is_complete,
            "durable": self.is_durable,
            "marker": self.marker,
            "marker_last_modified": self.marker_last_modified_s,
            "pending_objects": self.pending_objects,
            "pending_bytes": self.pending_bytes,
        }


def natural_key(name: str) -> tuple[str | int, ...]:
    """Sort key that compares digit runs as numbers: text and numbers alternate, so two
    keys compare position by position (``step_9`` < ``step_10``)."""
    parts = _DIGITS.split(name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def directory(prefix: str) -> str:
    """A prefix as a directory: ``ckpt`` and ``ckpt/`` both mean ``ckpt/``; empty is the
    bucket's root."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


class CheckpointService:
    """Lists checkpoint directories (see the module docstring); read-only."""

    def __init__(
        self,
        listing: ListingService,
        objects: ObjectService,
        journal: Journal,
        markers: Sequence[str],
    ) -> None:
        self._listing = listing
        self._objects = objects
        self._journal = journal
        self._markers = tuple(markers)

    async def checkpoints(self, bucket: str, prefix: str) -> list[Checkpoint]:
        """Every directory directly under ``prefix``, newest first."""
        base = directory(prefix)
        dirs = await self._directories(bucket, base)
        limit = asyncio.Semaphore(_HEADS_AT_ONCE)

        async def describe(path: str) -> Checkpoint:
            async with limit:
                return await self._describe(bucket, base, path)

        found = await asyncio.gather(*(describe(d) for d in dirs))
        found.sort(key=lambda c: c.marker_last_modified_s or 0.0, reverse=True)
        found.sort(key=lambda c: natural_key(c.name), reverse=True)  # stable: ties by time
        return found

    async def _directories(self, bucket: str, base: str) -> list[str]:
        out: list[str] = []
        after = ""
        while True:
            page = await self._listing.list_objects(
                bucket, prefix=base, delimiter="/", after=after, max_keys=_PAGE
            )
            out += [e.name for e in page.entries if e.is_prefix]
            if not page.is_truncated or page.last_name is None:
                return out
            after = page.last_name

    async def _describe(self, bucket: str, base: str, path: str) -> Checkpoint:
        marker, modified_s = await self._marker(bucket, path)
        pending, size = await self._journal.unflushed(bucket, path, self._journal.last_seq)
        return Checkpoint(path, path[len(base) : -1], marker, modified_s, pending, size)

    async def _marker(self, bucket: str, path: str) -> tuple[str | None, float | None]:
        """The first commit marker present directly in ``path``, and its Last-Modified."""
        for pattern in self._markers:
            if _GLOB_CHARS.isdisjoint(pattern):
                try:
                    head = await self._objects.head_object(bucket, path + pattern)
                except NoSuchKey:
                    continue
                return pattern, head.meta.last_modified_s
            found = await self._matching_file(bucket, path, pattern)
            if found is not None:
                return found
        return None, None

    async def _matching_file(
        self, bucket: str, path: str, pattern: str
    ) -> tuple[str, float] | None:
        after = ""
        while True:
            page = await self._listing.list_objects(
                bucket, prefix=path, delimiter="/", after=after, max_keys=_PAGE
            )
            for entry in page.entries:
                name = entry.name[len(path) :]
                if not entry.is_prefix and fnmatch.fnmatchcase(name, pattern):
                    return name, entry.last_modified_s
            if not page.is_truncated or page.last_name is None:
                return None
            after = page.last_name
