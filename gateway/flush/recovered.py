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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gateway.errors import NoSuchKey
from gateway.fleet.view import NEWER_MARGIN_S
from gateway.models import LocalObject, ObjectMeta
from gateway.upstream.client import Upstream

# One request about a row, through the flusher's gate (``Flusher._send`` for that row).
SendOne = Callable[[Callable[[], Awaitable[ObjectMeta | None]]], Awaitable[ObjectMeta | None]]


async def newer_in_bucket(
    obj: LocalObject, started_s: float, upstream: Upstream, send: SendOne
) -> bool:
    """Whether ``obj`` (acknowledged before ``started_s``, wall seconds) must not go up:
    the bucket holds another version written more than ``NEWER_MARGIN_S`` after it."""
    if obj.acked_s >= started_s:
        return False
    bucket, key = obj.meta.bucket, obj.meta.key

    async def head() -> ObjectMeta | None:
        try:
            return await upstream.head_object(bucket, key)
        except NoSuchKey:
            return None

    there = await send(head)
    if there is None or (not obj.is_delete and there.etag == obj.meta.etag):
        return False
    return there.last_modified_s > obj.acked_s + NEWER_MARGIN_S
