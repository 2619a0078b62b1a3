"""Versions a fleet node acknowledged before its restart (docs/fleet.md, "One key through
two nodes", on restarts).

Before a node uploads a version, it asks the key's candidates to give way (ordering): a
peer that uploaded a newer version meanwhile answers so, and the older one is dropped. A
node that was down was no candidate for anyone: a peer that wrote the key then, and
uploaded it, asked nobody. Back with its disk, the node would upload its older version
over the newer one (found in the fleet simulator: a key rewritten through a while b was
down ended as b's older version). So a version acknowledged before this node started is
first compared with the bucket's: if the bucket holds another version written well after
its acknowledgement (the clocks of the bucket and the node differ: ``NEWER_MARGIN_S``),
the newer one stays and this one is dropped. One HEAD per such version, once, through the
flusher's request gate; versions acknowledged since the start are ordered by the peers.

Reads must not serve such a version either before that look (``RecoveredVersions``): the
node's directory is restored from its journal before it listens, so every node reads the
key through it at once, and a version deleted meanwhile through another node (nothing in
the bucket to compare with) was served everywhere until the flusher got to it, a
write-back delay later (found by loadtest/fleet_soak.py). With replicas on, the key's
claims tell (a newer version claimed or done): the same look the flusher makes after
claiming (``UploadClaims.superseded_elsewhere``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from gateway.errors import NoSuchKey
from gateway.fleet.view import NEWER_MARGIN_S
from gateway.models import LocalObject, ObjectMeta
from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)

# One request about a row, through the flusher's gate (``Flusher._send`` for that row).
SendOne = Callable[[Callable[[], Awaitable[ObjectMeta | None]]], Awaitable[ObjectMeta | None]]


# Whether a delete of the row's key newer than the row was noted (``view.DeleteNotes``).
DeletedSince = Callable[[LocalObject], Awaitable[bool]]


async def newer_in_bucket(
    obj: LocalObject,
    started_s: float,
    upstream: Upstream,
    send: SendOne,
    deleted_since: DeletedSince | None = None,
) -> bool:
    """Whether ``obj`` (acknowledged before ``started_s``, wall seconds) must not go up:
    the bucket holds another version written more than ``NEWER_MARGIN_S`` after it, or
    holds none and a newer delete of the key was noted (``deleted_since``)."""
    if obj.acked_s >= started_s:
        return False
    bucket, key = obj.meta.bucket, obj.meta.key

    async def head() -> ObjectMeta | None:
        try:
            return await upstream.head_object(bucket, key)
        except NoSuchKey:
            return None

    there = await send(head)
    if there is None:
        return not obj.is_delete and deleted_since is not None and await deleted_since(obj)
    if not obj.is_delete and there.etag == obj.meta.etag:
        return False
    return there.last_modified_s > obj.acked_s + NEWER_MARGIN_S


async def _at_once(call: Callable[[], Awaitable[ObjectMeta | None]]) -> ObjectMeta | None:
    return await call()


# With replicas on: whether a newer version of the row's key is claimed or done
# (``UploadClaims.superseded_elsewhere``).
SupersededElsewhere = Callable[[LocalObject], Awaitable[bool]]

MAX_LOOKS = 100_000  # versions whose look is remembered (the oldest are looked at again)


class RecoveredVersions:
    """Reads' side (see the module docstring): ``superseded`` says, once per version,
    whether a version acknowledged before ``started_s`` was overtaken while this node was
    down; a read then serves what it would without it. Loop-bound."""

    def __init__(self, started_s: float, upstream: Upstream) -> None:
        self.started_s = started_s
        self._upstream = upstream
        self.elsewhere: SupersededElsewhere | None = None  # set when replicas are on
        self.deleted_since: DeletedSince | None = None  # in a fleet (``DeleteNotes``)
        self._looks: OrderedDict[tuple[str, str, int], asyncio.Task[bool]] = OrderedDict()

    async def superseded(self, obj: LocalObject) -> bool:
        """True: a newer version of ``obj``'s key is in the bucket or on its way there
        (the flusher will drop ``obj``). Versions acknowledged since the start: False at
        once. Raises what the look raises (the bucket cannot say); not remembered then."""
        if obj.acked_s >= self.started_s:
            return False
        ident = (obj.meta.bucket, obj.meta.key, obj.seq)
        task = self._looks.get(ident)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            # Its own task: a reader that goes away does not cancel the others' look.
            task = asyncio.get_running_loop().create_task(self._look(obj))
            self._looks[ident] = task
            self._forget_oldest()
        return await asyncio.shield(task)

    async def _look(self, obj: LocalObject) -> bool:
        overtaken = await newer_in_bucket(
            obj, self.started_s, self._upstream, _at_once, self.deleted_since
        ) or (self.elsewhere is not None and await self.elsewhere(obj))
        if overtaken:
            log.info(
                "%s/%s seq=%d: not served: a newer version was written while this node was down",
                obj.meta.bucket,
                obj.meta.key,
                obj.seq,
            )
        return overtaken

    def _forget_oldest(self) -> None:
        # A look still running when forgotten goes on: its readers await it.
        while len(self._looks) > MAX_LOOKS:
            self._looks.popitem(last=False)
