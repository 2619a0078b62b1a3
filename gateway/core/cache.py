"""Capacity admission for writes that bring new bytes (PutObject, UploadPart, CopyObject):
``admitted`` runs such a write inside its capacity reservation; a refusal is
``503 SlowDown``. (Read-through copies reserve their room themselves: fills.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from gateway.errors import EntityTooLarge
from gateway.store.space import CacheSpace


class _Written(Protocol):
    @property
    def size_bytes(self) -> int: ...


W = TypeVar("W", bound=_Written)


async def admitted(
    space: CacheSpace | None,
    size_bytes: int,
    write: Awaitable[W],
    *,
    max_bytes: int | None = None,
) -> W:
    """Run ``write`` inside a reservation of ``size_bytes`` (SlowDown when it does not fit;
    the coroutine is then closed unstarted), then count the bytes it actually wrote (a
    length not known up front, a copy's source). A declared size over ``max_bytes`` is
    EntityTooLarge before anything is reserved, as S3 answers a Content-Length past its
    limit: reserving it first answered 503 SlowDown to a body that could never fit, and a
    client retries that for ever. No reservation without a space (unit tests of other
    behaviour)."""
    try:
        if max_bytes is not None and size_bytes > max_bytes:
            raise EntityTooLarge(ProposedSize=str(size_bytes), MaxSizeAllowed=str(max_bytes))
        if space is None:
            return await write
        async with space.admit(size_bytes) as grant:
            written = await write
            grant.commit(written.size_bytes)
            return written
    finally:
        if asyncio.iscoroutine(write):
            write.close()  # refused before it ran: no "never awaited" warning
