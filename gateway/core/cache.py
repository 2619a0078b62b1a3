"""Capacity admission for writes that bring new bytes (PutObject, UploadPart, CopyObject):
``admitted`` runs such a write inside its capacity reservation; a refusal is
``503 SlowDown``. (Read-through copies reserve their room themselves: fills.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from gateway.store.space import CacheSpace


class _Written(Protocol):
    @property
    def size_bytes(self) -> int: ...


W = TypeVar("W", bound=_Written)


async def admitted(space: CacheSpace | None, size_bytes: int, write: Awaitable[W]) -> W:
    """Run ``write`` inside a reservation of ``size_bytes`` (SlowDown when it does not fit;
    the coroutine is then closed unstarted), then count the bytes it actually wrote (a
    length not known up front, a copy's source). No-op without a space (unit tests of
    other behaviour)."""
    if space is None:
        return await write
    try:
        async with space.admit(size_bytes) as grant:
            written = await write
            grant.commit(written.size_bytes)
            return written
    finally:
        if asyncio.iscoroutine(write):
            write.close()  # refused before it ran: no "never awaited" warning
