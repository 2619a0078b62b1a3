"""Shutdown: drain until a deadline, or stop at once on a second signal; then say what is
left on disk and what will become of it.

Order (the first SIGTERM/SIGINT): readiness fails and new writes get 503 SlowDown at once;
flushing goes on until everything that can move is durable or ``shutdown_drain_timeout_s``
passes (the S3 listener keeps serving reads meanwhile); the flusher stops (unfinished
uploads stay pending on disk); the S3 listener closes once the requests in flight finish;
the background tasks and the admin listener stop. The journal closes last (the caller's
exit stack). This is also Kubernetes' path: the preStop hook's drain, then SIGTERM, whose
drain keeps its deadline.

A second SIGTERM/SIGINT (``aborted``) cuts every wait short: uploads in flight are
cancelled, requests in flight get ``ABORT_GRACE_S`` to finish, background tasks are
cancelled. Nothing acknowledged is lost by it: an acknowledged write is in the journal
before its answer is sent, and a cancelled upload is pending again at the next start.

Every message says what really happens to what is left: with a real upstream it flushes at
the next start on the same data dir with the same ``--upstream-endpoint``; with the demo,
the next demo start flushes it into its new in-memory upstream, and what was flushed to this
one is lost with the process.

Part of the composition root: it acts on the objects ``app.py`` built, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.admin.api import AdminServices
from gateway.cli import human_bytes
from gateway.clock import SystemClock
from gateway.config import Settings
from gateway.fleet.node import Fleet
from gateway.flush import stuck
from gateway.flush.flusher import Flusher
from gateway.flush.memory import RateMemory
from gateway.s3.dispatch import S3Services
from gateway.store.journal import Journal
from gateway.store.space import CacheSpace

log = logging.getLogger("gateway")
# Requests in flight when a second signal comes: this long to finish, then cancelled (a
# write cancelled before its answer was not acknowledged; its client retries it).
ABORT_GRACE_S = 1.0


@dataclass(slots=True)
class Running:
    """What a started gateway holds that its shutdown acts on, in order."""

    settings: Settings
    clock: SystemClock
    journal: Journal
    flusher: Flusher
    space: CacheSpace
    s3: S3Services
    admin: AdminServices
    s3_runner: web.AppRunner
    admin_runner: web.AppRunner
    tasks: list[asyncio.Task[None]]  # flusher, evictor, sweep, rate memory
    memory: RateMemory
    fleet: Fleet | None = None  # with --peers (docs/fleet.md)


def fate(settings: Settings) -> str:
    """What becomes of writes left unflushed when the gateway stops, in words."""
    if settings.is_demo:
        return (
            f"they are safe on disk in {settings.data_dir}, and the next demo start on it "
            "flushes them into its new in-memory upstream"
        )
    return (
        f"they are safe on disk in {settings.data_dir} and flush at the next start on it "
        f"with --upstream-endpoint {settings.upstream_endpoint}"
    )


async def shut_down(gw: Running, aborted: asyncio.Event) -> None:
    """Refuse writes, drain until the deadline (or ``aborted``), stop, say what is left."""
    await _say_shutting_down(gw)
    gw.admin.is_ready = False
    # The S3 listener stays up while draining: reads keep working and new writes get
    # 503 SlowDown (retryable: a client retries against the next gateway or after restart)
    # rather than a refused connection.
    gw.s3.is_accepting_writes = False
    flusher = gw.flusher
    if not await _unless(aborted, _drain(gw)):
        await flusher.stop(0.0)  # cancels the uploads in flight now
    if not await _unless(aborted, _join(gw.tasks[0])):
        await _cancel(gw.tasks[0])
    await _close(gw.s3_runner, aborted)  # waits for requests in flight (writes admitted before)
    gw.space.stop()
    gw.memory.stop()  # its last save: the rates the drain ended with
    for task in gw.tasks[1:]:
        if not await _unless(aborted, _join(task)):
            await _cancel(task)
    await _close(gw.admin_runner, aborted)
    left = await _say_what_is_left(gw)
    if gw.fleet is not None:
        # With nothing left here, the fleet stops waiting on this node (it says goodbye).
        await gw.fleet.stop(say_bye=left == 0)


async def _drain(gw: Running) -> None:
    """Flush until everything that can move is durable or the deadline passes."""
    journal, flusher = gw.journal, gw.flusher
    deadline_s = gw.settings.shutdown_drain_timeout_s
    started = gw.clock.monotonic()
    if not flusher.is_paused:
        # Failed objects, and markers held behind them (or, in a fleet, held for a node that
        # cannot answer), wait for an operator, not for time.
        await stuck.wait_movable(
            journal, flusher.policy, None, "", journal.last_seq, deadline_s, fleet=flusher.order
        )
    left_s = deadline_s - (gw.clock.monotonic() - started)
    await flusher.stop(max(0.0, left_s))


async def _say_shutting_down(gw: Running) -> None:
    journal = gw.journal
    objects, size = await journal.unflushed(None, "", journal.last_seq)
    if gw.flusher.is_paused:
        log.info("shutting down: refusing new writes; the flusher is paused, so nothing is drained")
    elif objects:
        log.info(
            "shutting down: refusing new writes, draining %d objects (%s) for up to %.0fs; a "
            "second SIGINT or SIGTERM stops at once and keeps what is left on disk",
            objects,
            human_bytes(size),
            gw.settings.shutdown_drain_timeout_s,
        )
    else:
        log.info("shutting down: refusing new writes; nothing is pending")


async def _say_what_is_left(gw: Running) -> int:
    """Log what is left and what becomes of it; returns how many objects are left."""
    settings, journal, flusher = gw.settings, gw.journal, gw.flusher
    left = await stuck.unflushed(journal, flusher.policy, None, "", journal.last_seq, flusher.order)
    if left.objects:
        failed = ""
        if left.failed:
            failed = (
                f", {left.failed} of them failed (those wait for POST /admin/v1/flush/retry "
                "once their cause is fixed)"
            )
        log.warning(
            "exiting with %d objects (%s) not yet flushed%s; %s",
            left.objects,
            human_bytes(left.bytes),
            failed,
            fate(settings),
        )
        if settings.is_demo:
            log.warning(
                "what was flushed to the demo upstream is lost now: it lived in this process's "
                "memory"
            )
    elif settings.is_demo:
        log.info(
            "exiting: everything acknowledged was flushed to the demo upstream, which lived "
            "in this process's memory and is lost now"
        )
    else:
        log.info("exiting: everything acknowledged is durable upstream")
    return left.objects


async def _unless(aborted: asyncio.Event, work: Coroutine[Any, Any, None]) -> bool:
    """Run ``work`` to its end unless ``aborted`` is set first, which cancels it. Returns
    True when it ended on its own (its exception, if any, is raised)."""
    if aborted.is_set():
        work.close()
        return False
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(aborted.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return False
    task.result()
    return True


async def _join(task: asyncio.Task[None]) -> None:
    await asyncio.shield(task)  # cancelling the wait leaves the task to ``_cancel``


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel and reap ``task`` (a no-op once it finished)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _close(runner: web.AppRunner, aborted: asyncio.Event) -> None:
    """Close a listener: requests in flight finish (the runner's shutdown timeout), or get
    ``ABORT_GRACE_S`` once ``aborted``."""
    if runner.server is None or await _unless(aborted, runner.cleanup()):
        return
    for site in list(runner.sites):
        await site.stop()  # no new connections
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle keep-alive connections close now
        await runner.server.shutdown(ABORT_GRACE_S)
    await runner.cleanup()  # nothing left to wait for
