"""Writes in a fleet: the key's directory announced before the ack (docs/fleet.md).

Every write service (PutObject, DeleteObject(s), CopyObject, CompleteMultipartUpload)
commits inside ``fleet_writing``: it starts the announcement at once, so that it overlaps
the body, and the write awaits what it yields just before its journal commit. Without a
fleet it costs one completed future.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence

from gateway.fleet.view import FleetView


def _done() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


@contextlib.asynccontextmanager
async def fleet_writing(
    fleet: FleetView | None, bucket: str, key: str
) -> AsyncIterator[Awaitable[None]]:
    """Around one write of ``key``: yields what to await before the commit."""
    if fleet is None:
        yield _done()
        return
    async with fleet.writing(bucket, key) as intent:
        if intent.is_ready():
            yield _done()
            return
        task = asyncio.ensure_future(intent.ready())
        try:
            yield task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


@contextlib.asynccontextmanager
async def fleet_writing_all(
    fleet: FleetView | None, bucket: str, keys: Sequence[str]
) -> AsyncIterator[Awaitable[None]]:
    """``fleet_writing`` for many keys at once (DeleteObjects): one per directory."""
    if fleet is None:
        yield _done()
        return
    by_dir = {key.rpartition("/")[0]: key for key in keys}
    async with contextlib.AsyncExitStack() as stack:
        waits = [
            await stack.enter_async_context(fleet_writing(fleet, bucket, k))
            for k in by_dir.values()
        ]
        yield asyncio.ensure_future(_all(waits))


async def _all(waits: Sequence[Awaitable[None]]) -> None:
    for wait in waits:
        await wait
