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

Each directory carries this node's figures and its state in words (checkpoint_figures.py).
When the upstream cannot be listed (unreachable, or the bucket is gone there), the
directories are those this node holds rows for, and ``upstream_error`` says why: a node
that cannot reach its bucket still says what it holds and why it is not durable.

Roots (``roots``): without a prefix, the places checkpoints are written to are found from
the journal: every parent of a directory holding a commit marker row (``ckpt/`` for
``ckpt/step_3/.metadata``), one scan of the rows cached for ``ROOTS_TTL_S``; a bucket with
rows and no marker yet is listed from its root.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.core.checkpoint_figures import (
    CheckpointFigures,
    CheckpointState,
    FleetPart,
    FlushView,
    failed_rows,
    node_figures,
    state_of,
)
from gateway.core.listing import ListingService
from gateway.core.objects import ObjectService
from gateway.errors import NoSuchKey, S3Error
from gateway.fleet.view import FleetView
from gateway.models import LocalObject
from gateway.store import catalog
from gateway.store.journal import Journal

_DIGITS = re.compile(r"(\d+)")
_GLOB_CHARS = frozenset("*?[")
_PAGE = 1000
_HEADS_AT_ONCE = 16
ROOTS_TTL_S = 30.0  # how long the scan for marker rows is trusted
_MARKER_SCAN_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint directory (``prefix`` ends with ``/``) and this node's figures."""

    prefix: str
    name: str
    marker: str | None  # the commit marker's file name when complete
    marker_last_modified_s: float | None
    figures: CheckpointFigures = field(default_factory=CheckpointFigures)
    fleet: FleetPart | None = None  # with peers: figures summed over every node

    @property
    def is_complete(self) -> bool:
        return self.marker is not None

    @property
    def is_durable(self) -> bool:
        unanswered = self.fleet is not None and bool(self.fleet.unanswered)
        return self.is_complete and self.figures.unflushed_objects == 0 and not unanswered

    @property
    def state(self) -> CheckpointState:
        return state_of(self.is_complete, self.figures, self.fleet)

    def as_dict(self) -> dict[str, Any]:
        state = self.state
        return {
            "prefix": self.prefix,
            "name": self.name,
            "complete": self.is_complete,
            "durable": self.is_durable,
            "marker": self.marker,
            "marker_last_modified": self.marker_last_modified_s,
            "state": state.state,
            "state_text": state.text,
            "reason": state.reason,
            **self.figures.as_dict(),
            **(
                {}
                if self.fleet is None
                else {
                    "unanswered_nodes": list(self.fleet.unanswered),
                    "held_by": self.fleet.held_by,
                }
            ),
        }


@dataclass(frozen=True, slots=True)
class CheckpointList:
    """The checkpoints under one root, newest first; ``upstream_error`` when only what this
    node holds could be listed."""

    bucket: str
    prefix: str
    checkpoints: list[Checkpoint]
    upstream_error: str | None = None


def natural_key(name: str) -> tuple[str | int, ...]:
    """Sort key that compares digit runs as numbers: text and numbers alternate, so two
    keys compare position by position (``step_9`` < ``step_10``)."""
    parts = _DIGITS.split(name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def directory(prefix: str) -> str:
    """A prefix as a directory: ``ckpt`` and ``ckpt/`` both mean ``ckpt/``; empty is the
    bucket's root."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def root_of(marker_key: str) -> str:
    """Where the checkpoint holding ``marker_key`` lives: ``ckpt/`` for
    ``ckpt/step_3/.metadata`` (``""`` for ``step_3/.metadata`` or a top-level marker)."""
    checkpoint_dir = marker_key.rpartition("/")[0]
    return checkpoint_dir.rpartition("/")[0] + "/" if "/" in checkpoint_dir else ""


class CheckpointService:
    """Lists checkpoint directories (see the module docstring); read-only."""

    def __init__(
        self,
        listing: ListingService,
        objects: ObjectService,
        journal: Journal,
        markers: Sequence[str],
        clock: Callable[[], float] = time.monotonic,
        fleet: FleetView | None = None,
    ) -> None:
        self._fleet = fleet
        self._listing = listing
        self._objects = objects
        self._journal = journal
        self._markers = tuple(markers)
        self._clock = clock
        self._roots: tuple[float, dict[str, list[str]]] | None = None

    async def checkpoints(
        self,
        bucket: str,
        prefix: str,
        flush: FlushView | None = None,
        limit: int | None = None,
    ) -> CheckpointList:
        """Every directory directly under ``prefix`` (the ``limit`` newest only, when given:
        one marker lookup each), newest first, with this node's figures. Raises the
        upstream's S3Error only when it cannot be listed and this node holds nothing under
        the prefix either (e.g. ``NoSuchBucket``)."""
        base = directory(prefix)
        upstream_error = None
        try:
            dirs = await self._directories(bucket, base, local_only=False)
        except S3Error as exc:
            dirs = await self._directories(bucket, base, local_only=True)
            if not dirs and not await self._journal.scan(bucket, base, "", 1):
                raise
            upstream_error = f"{exc.code}: {exc.message}"
        if limit is not None:
            dirs.sort(key=lambda d: natural_key(d[len(base) : -1]), reverse=True)
            dirs = dirs[: max(0, limit)]
        failed = None
        if self._journal.figures.unflushed_under(bucket, base).failed_objects:
            failed = await failed_rows(self._journal)
        at_once = asyncio.Semaphore(_HEADS_AT_ONCE)

        async def describe(path: str) -> Checkpoint:
            async with at_once:
                return await self._describe(bucket, base, path, flush, failed, upstream_error)

        found = await asyncio.gather(*(describe(d) for d in dirs))
        if self._fleet is not None:
            found = await self._fleet_wide(bucket, found)
        found.sort(key=lambda c: c.marker_last_modified_s or 0.0, reverse=True)
        found.sort(key=lambda c: natural_key(c.name), reverse=True)  # stable: ties by time
        return CheckpointList(bucket, base, found, upstream_error)

    async def _fleet_wide(self, bucket: str, found: list[Checkpoint]) -> list[Checkpoint]:
        """Every member's figures of the same directories, summed with this node's (one
        request per member); a member that does not answer is named, never counted."""
        assert self._fleet is not None
        answers = await self._fleet.figures(bucket, [c.prefix for c in found])
        out = []
        for checkpoint in found:
            figures, unanswered = checkpoint.figures, []
            held_by = None
            if checkpoint.marker is not None:
                held_by = self._fleet.stuck_reason(bucket, checkpoint.prefix + checkpoint.marker)
            for node, by_path, _error in answers:
                doc = by_path.get(checkpoint.prefix) if by_path is not None else None
                if by_path is None:
                    unanswered.append(node)
                elif doc is not None:
                    figures = figures + CheckpointFigures.from_dict(doc)
                    held_by = held_by or doc.get("held_by")
            fleet = FleetPart(tuple(unanswered), held_by)
            out.append(dataclasses.replace(checkpoint, figures=figures, fleet=fleet))
        return out

    async def node_figures(
        self, bucket: str, paths: Sequence[str], flush: FlushView | None
    ) -> dict[str, dict[str, Any]]:
        """This node's figures of each directory in ``paths`` (what a peer asks), with why
        the fleet holds its marker there, if it does."""
        failed = None
        if self._journal.figures.unflushed_under(bucket, "").failed_objects:
            failed = await failed_rows(self._journal)
        out: dict[str, dict[str, Any]] = {}
        for path in paths:
            figures = await node_figures(self._journal, bucket, path, flush, failed)
            doc: dict[str, Any] = {**figures.as_dict(), "held_by": None}
            if self._fleet is not None:
                for pattern in self._markers:
                    doc["held_by"] = doc["held_by"] or self._fleet.stuck_reason(
                        bucket, path + pattern
                    )
            out[path] = doc
        return out

    async def roots(self, bucket: str | None) -> list[tuple[str, str]]:
        """(bucket, root) where checkpoints are written, per bucket holding rows (``bucket``
        only, if given), sorted: the parents of directories with a commit marker row, or
        the bucket's root when it has none yet."""
        by_bucket = await self._marker_roots()
        names = [bucket] if bucket is not None else await self.buckets()
        return [(name, root) for name in names for root in by_bucket.get(name, [""])]

    async def buckets(self) -> list[str]:
        """Every bucket this node holds rows for (pending, failed, or cached), sorted."""
        return await catalog.buckets_with_rows(self._journal)

    async def _marker_roots(self) -> dict[str, list[str]]:
        now_s = self._clock()
        if self._roots is not None and now_s - self._roots[0] < ROOTS_TTL_S:
            return self._roots[1]
        found: dict[str, set[str]] = {}
        for bucket, key in await catalog.marker_keys(
            self._journal, None, self._markers, _MARKER_SCAN_LIMIT
        ):
            name = key.rpartition("/")[2]
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in self._markers):
                found.setdefault(bucket, set()).add(root_of(key))
        roots = {bucket: sorted(prefixes) for bucket, prefixes in found.items()}
        self._roots = (now_s, roots)
        return roots

    async def _directories(self, bucket: str, base: str, *, local_only: bool) -> list[str]:
        if local_only:
            return await self._local_directories(bucket, base)
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

    async def _local_directories(self, bucket: str, base: str) -> list[str]:
        """Directories directly under ``base`` holding a live local row (one seek each)."""
        out: list[str] = []
        after = ""
        while rows := await self._journal.scan(bucket, base, after, _PAGE):
            row = next((r for r in rows if "/" in r.meta.key[len(base) :]), None)
            if row is None:
                if len(rows) < _PAGE:
                    return out
                after = rows[-1].meta.key
                continue
            rest = row.meta.key[len(base) :]
            path = base + rest[: rest.index("/") + 1]
            if await self._has_live_row(bucket, path):
                out.append(path)
            after = path + "\U0010ffff"  # past everything under it
        return out

    async def _has_live_row(self, bucket: str, path: str) -> bool:
        after = ""
        while rows := await self._journal.scan(bucket, path, after, _PAGE):
            if any(not r.is_delete for r in rows):
                return True
            after = rows[-1].meta.key
        return False

    async def _describe(
        self,
        bucket: str,
        base: str,
        path: str,
        flush: FlushView | None,
        failed: list[LocalObject] | None,
        upstream_error: str | None,
    ) -> Checkpoint:
        if upstream_error is None:
            marker, modified_s = await self._marker(bucket, path)
        else:
            marker, modified_s = await self._local_marker(bucket, path)
        figures = await node_figures(self._journal, bucket, path, flush, failed)
        return Checkpoint(path, path[len(base) : -1], marker, modified_s, figures)

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

    async def _local_marker(self, bucket: str, path: str) -> tuple[str | None, float | None]:
        """``_marker`` from this node's rows only (the upstream cannot be asked)."""
        for pattern in self._markers:
            if _GLOB_CHARS.isdisjoint(pattern):
                row = await self._journal.get(bucket, path + pattern)
                if row is not None and not row.is_delete:
                    return pattern, row.meta.last_modified_s
                continue
            after = ""
            while rows := await self._journal.scan(bucket, path, after, _PAGE):
                for row in rows:
                    name = row.meta.key[len(path) :]
                    if "/" not in name and not row.is_delete and fnmatch.fnmatchcase(name, pattern):
                        return name, row.meta.last_modified_s
                after = rows[-1].meta.key
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
