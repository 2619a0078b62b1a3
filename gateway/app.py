"""Composition root: builds every object, runs both listeners, shuts down in order.

Shutdown order (SIGTERM/SIGINT): readiness fails and new writes get 503 SlowDown at once;
the S3 listener stops and in-flight requests finish; flushing goes on until everything is
durable or ``shutdown_drain_timeout_s`` passes; then the flusher stops (unfinished uploads
stay pending on disk), the admin listener closes, and the journal is closed last.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import resource
import signal
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from gateway.admin import reads as admin_reads
from gateway.admin.api import AdminServices, build_admin_app
from gateway.admin.auth import resolve_admin_token
from gateway.cli import human_bytes
from gateway.clock import SystemClock
from gateway.config import Settings
from gateway.core.attributes import ObjectAttributesService
from gateway.core.buckets import BucketService
from gateway.core.checkpoints import CheckpointService
from gateway.core.copy import CopyService
from gateway.core.deletes import DeleteService
from gateway.core.fill import FillConfig
from gateway.core.listing import ListingService
from gateway.core.multipart import MultipartService
from gateway.core.objects import ObjectService
from gateway.core.prefetch import Prefetcher
from gateway.errors import S3Error
from gateway.flush import stuck
from gateway.flush.backoff import Backoff
from gateway.flush.control import RateConfig
from gateway.flush.flusher import Flusher
from gateway.flush.gate import GateConfig, RequestGate, build_gate
from gateway.flush.lanes import LaneConfig
from gateway.flush.policy import PolicyConfig
from gateway.flush.window import WindowConfig
from gateway.s3.credentials import CredentialStore
from gateway.s3.dispatch import S3Services
from gateway.s3.server import HttpLimits, build_s3_runner
from gateway.startup import StartupError, starting
from gateway.store import datadir
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.space import CacheSpace
from gateway.store.uploads import UploadJournal
from gateway.upstream.client import AiobotocoreUpstream

log = logging.getLogger("gateway")


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int


def _split(host_port: str) -> Endpoint:
    host, _, port = host_port.rpartition(":")
    return Endpoint(host.strip("[]"), int(port))


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run the gateway until ``stop`` is set or SIGTERM/SIGINT arrives.

    Raises ``StartupError`` (one line naming the cause) when it cannot start; whatever was
    started by then (lock, threads, listeners, tasks) is undone first."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            signals.append(sig)
    try:
        async with contextlib.AsyncExitStack() as stack:
            running = await _start(settings, stack)
            await stop.wait()
            await _shutdown(running)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


@dataclass(slots=True)
class _Running:
    """What a started gateway holds that its shutdown acts on, in order."""

    settings: Settings
    clock: SystemClock
    journal: Journal
    flusher: Flusher
    space: CacheSpace
    s3: S3Services
    admin: AdminServices
    s3_runner: web.AppRunner
    tasks: list[asyncio.Task[None]]  # flusher, evictor, sweep


async def _start(settings: Settings, stack: contextlib.AsyncExitStack) -> _Running:
    """Build and start everything; each step registers its undoing on ``stack`` first, so
    a failure at any step leaves nothing behind. Failures become ``StartupError``."""
    clock = SystemClock()
    _raise_open_files_limit()
    with starting("reading the TLS certificate and key"):
        tls = _tls_context(settings)
    static: dict[str, str] = {}
    if settings.access_key is not None and settings.secret_key is not None:
        static[settings.access_key] = settings.secret_key
    # A bad credentials file or admin token is a configuration error (raised as such).
    credentials: Mapping[str, str] = CredentialStore(static, settings.credentials_file)
    admin_token = resolve_admin_token(
        _split(settings.admin_listen).host, settings.admin_token, settings.admin_token_file
    )
    quiet_secret_loggers()
    data_dir = Path(settings.data_dir)
    with starting(f"data dir {data_dir}"):
        lock = datadir.lock(data_dir)
        stack.callback(lock.release)
        if settings.is_demo:
            datadir.reset_for_demo(data_dir)
    endpoint, upstream = await _start_upstream(settings, stack)
    if settings.is_demo:
        credentials = credentials if len(credentials) else {"demo": "demo-secret-key"}
    blobs = BlobStore(data_dir, fsync=settings.fsync)
    journal = Journal(data_dir / "journal.db", fsync=settings.fsync)
    stack.callback(journal.close)
    stack.callback(blobs.close)
    with starting(f"opening the data dir {data_dir}"):
        await asyncio.to_thread(blobs.open_store)
        sweep_before_ns = await asyncio.to_thread(_ctime_mark, data_dir)
    with starting(f"opening the journal {journal.path}"):
        referenced = await asyncio.to_thread(journal.open)
    capacity = settings.capacity_bytes or _filesystem_bytes(data_dir)
    space = CacheSpace(
        journal,
        blobs,
        clock,
        capacity_bytes=capacity,
        high_fraction=settings.cache_high_watermark,
        low_fraction=settings.cache_low_watermark,
    )
    blobs.on_disk_full = space.on_disk_full
    with starting(f"reading the journal {journal.path}"):
        await space.refresh()
        await _log_recovered(journal)
    if settings.is_demo:
        with contextlib.suppress(S3Error):
            await upstream.create_bucket(settings.demo_bucket, None)

    flusher = _flusher(settings, clock, journal, blobs, upstream, _gate(settings, clock))
    await flusher.attach()  # the pending rows, in memory, before any write can arrive
    s3 = _s3_services(settings, clock, journal, blobs, upstream, space, credentials, flusher, stack)
    with starting(f"reading the journal {journal.path}"):
        await s3.objects.verifier.load()  # files verified before: trusted until they change
    prefetcher = Prefetcher(journal, upstream, s3.objects.fills, space, clock)
    stack.push_async_callback(prefetcher.close)
    checkpoints = CheckpointService(
        s3.listing, s3.objects, journal, markers=settings.commit_markers
    )
    admin = AdminServices(
        journal=journal,
        flusher=flusher,
        clock=clock,
        capacity_bytes=capacity,
        token=admin_token,
        status_extras={
            "prefetch": prefetcher.status,
            # The request gate: its window of requests in flight and the answers so far.
            "flush_gate": lambda: dataclasses.asdict(flusher.gate_status()),
        },
    )
    limits = HttpLimits(
        max_line_bytes=settings.max_line_size_bytes,
        max_field_bytes=settings.max_header_size_bytes,
        max_headers=settings.max_headers,
    )
    s3_runner = build_s3_runner(s3, limits, shutdown_timeout_s=10.0)
    admin_app = build_admin_app(admin)
    admin_reads.install(admin_app, prefetcher, checkpoints)
    admin_runner = web.AppRunner(admin_app, handle_signals=False, access_log=None)
    await _listen(s3_runner, settings.listen, tls, stack)
    await _listen(admin_runner, settings.admin_listen, None, stack)

    # Background work only once the listeners are bound (nothing to undo if they are not).
    tasks = [
        asyncio.create_task(flusher.run(), name="flusher"),
        asyncio.create_task(space.run(), name="evictor"),
        # Crash leftovers are removed in the background: listing every blob before listening
        # would delay readiness on a large cache, and files made since the mark are spared.
        asyncio.create_task(_sweep(blobs, referenced, sweep_before_ns), name="sweep"),
    ]
    for task in tasks:
        stack.push_async_callback(_cancel, task)
    admin.is_ready = True
    _announce(settings, endpoint, credentials)
    return _Running(settings, clock, journal, flusher, space, s3, admin, s3_runner, tasks)


async def _start_upstream(
    settings: Settings, stack: contextlib.AsyncExitStack
) -> tuple[str | None, AiobotocoreUpstream]:
    """The upstream client (and the embedded demo upstream without an endpoint)."""
    endpoint = settings.upstream_endpoint
    keys: tuple[str | None, str | None] = (None, None)
    if settings.is_demo:
        with starting("starting the embedded demo upstream"):
            try:
                from gateway.upstream import demo
            except ImportError as exc:
                raise StartupError(
                    "no --upstream-endpoint given, and the embedded demo upstream is not "
                    f"installed ({exc.name} is missing): give --upstream-endpoint, or install "
                    "the demo extra (make run does; pip install -r requirements/demo.txt)"
                ) from None
            server = demo.DemoUpstream()
            stack.callback(server.stop)
            endpoint = await asyncio.to_thread(server.start)
            keys = (demo.DEMO_UPSTREAM_KEY, demo.DEMO_UPSTREAM_SECRET)
    upstream = AiobotocoreUpstream(
        endpoint_url=endpoint,
        region=settings.upstream_region,
        addressing_style="path" if settings.is_demo else settings.upstream_addressing_style,
        # Every flush request in flight has its connection, and reads have theirs.
        max_connections=max(16, settings.flush_max_concurrency + settings.read_concurrency),
        access_key=keys[0],
        secret_key=keys[1],
    )
    stack.push_async_callback(upstream.close)
    with starting(f"setting up the upstream client for {endpoint}"):
        await upstream.start()
    return endpoint, upstream


async def _listen(
    runner: web.AppRunner,
    host_port: str,
    tls: ssl.SSLContext | None,
    stack: contextlib.AsyncExitStack,
) -> None:
    """Set up ``runner`` and bind its listener (undone on ``stack``)."""
    await runner.setup()
    stack.push_async_callback(_cleanup, runner)
    ep = _split(host_port)
    with starting(f"listening on {host_port}"):
        await web.TCPSite(runner, ep.host, ep.port, ssl_context=tls, reuse_address=True).start()


async def _cleanup(runner: web.AppRunner) -> None:
    if runner.server is not None:  # not cleaned up by the shutdown already
        await runner.cleanup()


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel and reap ``task`` (a no-op once it finished, as after a shutdown)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _s3_services(
    settings: Settings,
    clock: SystemClock,
    journal: Journal,
    blobs: BlobStore,
    upstream: AiobotocoreUpstream,
    space: CacheSpace,
    credentials: Mapping[str, str],
    flusher: Flusher,
    stack: contextlib.AsyncExitStack,
) -> S3Services:
    buckets = BucketService(journal, blobs, upstream, clock)
    stack.push_async_callback(buckets.close)
    uploads = UploadJournal(journal)
    multipart = MultipartService(
        uploads,
        blobs,
        buckets,
        clock,
        max_part_bytes=settings.max_object_bytes,
        min_part_bytes=settings.min_part_bytes,
        space=space,
        upstream=upstream,
        listener=flusher.early if settings.early_multipart else None,
    )
    object_service = ObjectService(
        journal,
        blobs,
        upstream,
        buckets,
        clock,
        max_object_bytes=settings.max_object_bytes,
        space=space,
        fill_config=FillConfig(
            part_bytes=settings.read_part_size_bytes,
            fill_concurrency=max(1, settings.read_concurrency // 2),
            request_concurrency=settings.read_concurrency,
            max_object_bytes=settings.max_object_bytes,
        ),
        # Reads of the upstream share the flusher's global bytes/s budget.
        budget=None if flusher.gate.bandwidth.unlimited else flusher.gate.bandwidth,
        inline_max_bytes=settings.inline_threshold_bytes,
    )
    stack.push_async_callback(object_service.fills.close)
    stack.push_async_callback(object_service.verifier.close)
    return S3Services(
        objects=object_service,
        buckets=buckets,
        listing=ListingService(journal, upstream),
        multipart=multipart,
        copy=CopyService(
            journal,
            uploads,
            blobs,
            upstream,
            buckets,
            multipart,
            clock,
            max_object_bytes=settings.max_object_bytes,
            max_part_bytes=settings.max_object_bytes,
            space=space,
        ),
        deletes=DeleteService(journal, blobs, buckets, clock),
        attributes=ObjectAttributesService(journal, upstream, buckets),
        credentials=credentials,
        region=settings.upstream_region,
        domain=settings.domain,
        clock=clock,
        max_header_bytes=settings.max_header_size_bytes,
        max_xml_body_bytes=settings.max_xml_body_bytes,
    )


def _gate(settings: Settings, clock: SystemClock) -> RequestGate:
    """The request gate every upstream write goes through; reads draw on its bandwidth."""
    backoff = Backoff(base_s=settings.flush_retry_base_s, cap_s=settings.flush_retry_max_s)
    return build_gate(
        clock,
        lanes=LaneConfig(
            depth=settings.lane_depth,
            rate_per_s=settings.lane_rate,
            min_rate_per_s=settings.lane_min_rate,
            bandwidth_bytes_per_s=settings.lane_bandwidth_bytes,
            concurrency=settings.lane_concurrency,
        ),
        flow=RateConfig(
            initial_per_s=settings.flush_initial_rate, floor_per_s=settings.flush_min_rate
        ),
        config=GateConfig(
            window=WindowConfig(
                initial=settings.flush_concurrency,
                min_size=min(4, settings.flush_concurrency),
                max_size=settings.flush_max_concurrency,
            ),
            rate_per_s=settings.flush_rate,
            rate_burst=settings.flush_rate_burst,
            bandwidth_bytes_per_s=settings.flush_bandwidth_bytes,
            bandwidth_burst_bytes=settings.flush_bandwidth_burst_bytes,
        ),
        backoff=backoff,
    )


def _flusher(
    settings: Settings,
    clock: SystemClock,
    journal: Journal,
    blobs: BlobStore,
    upstream: AiobotocoreUpstream,
    gate: RequestGate,
) -> Flusher:
    return Flusher(
        journal,
        blobs,
        upstream,
        clock,
        gate=gate,
        backoff=Backoff(base_s=settings.flush_retry_base_s, cap_s=settings.flush_retry_max_s),
        policy=PolicyConfig(
            write_back_delay_s=settings.write_back_delay_s,
            temp_patterns=settings.temp_patterns,
            temp_hold_s=settings.temp_hold_s,
            commit_markers=settings.commit_markers,
        ),
        multipart_threshold_bytes=settings.multipart_threshold_bytes,
    )


async def _shutdown(gw: _Running) -> None:
    """SIGTERM/SIGINT: readiness fails, new writes get 503 SlowDown, flushing goes on until
    everything that can move is durable or the deadline passes, then everything stops."""
    settings, journal, flusher = gw.settings, gw.journal, gw.flusher
    deadline_s = settings.shutdown_drain_timeout_s
    objects, size = await journal.unflushed(None, "", journal.last_seq)
    if flusher.is_paused:
        log.info("shutting down: refusing new writes; the flusher is paused, so nothing is drained")
    elif objects:
        log.info(
            "shutting down: refusing new writes, draining %d objects (%s) for up to %.0fs",
            objects,
            human_bytes(size),
            deadline_s,
        )
    else:
        log.info("shutting down: refusing new writes; nothing is pending")
    gw.admin.is_ready = False
    # The S3 listener stays up while draining: reads keep working and new writes get
    # 503 SlowDown (retryable: a client retries against the next gateway or after restart)
    # rather than a refused connection.
    gw.s3.is_accepting_writes = False
    started = gw.clock.monotonic()
    if not flusher.is_paused:
        # Failed objects, and markers held behind them, wait for an operator, not for time.
        await stuck.wait_movable(journal, flusher.policy, None, "", journal.last_seq, deadline_s)
    left_s = deadline_s - (gw.clock.monotonic() - started)
    await flusher.stop(max(0.0, left_s))
    await gw.tasks[0]
    await gw.s3_runner.cleanup()  # waits for requests in flight (writes admitted before)
    gw.space.stop()
    await asyncio.gather(*gw.tasks[1:])
    left = await stuck.unflushed(journal, flusher.policy, None, "", journal.last_seq)
    if left.objects:
        log.warning(
            "exiting with %d objects (%s) not yet flushed%s; they are safe on disk and "
            "resume at the next start",
            left.objects,
            human_bytes(left.bytes),
            f", {left.failed} of them failed" if left.failed else "",
        )
    else:
        log.info("exiting: everything acknowledged is durable upstream")


async def _log_recovered(journal: Journal) -> None:
    """Say at start what an earlier run left to flush (and what failed)."""
    backlog = (await journal.stats()).backlog
    if backlog.pending_objects:
        failed = f", {backlog.failed_objects} of them failed" if backlog.failed_objects else ""
        log.info(
            "recovered %d pending objects (%s) from the journal%s; flushing resumes",
            backlog.pending_objects,
            human_bytes(backlog.pending_bytes),
            failed,
        )


def quiet_secret_loggers() -> None:
    """Keep botocore's and aiobotocore's debug output (request headers with the upstream's
    Authorization, signing strings) out of the log even at ``--log-level debug``."""
    for name in ("botocore", "aiobotocore", "urllib3", "s3transfer"):
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.getEffectiveLevel(), logging.INFO))


def _raise_open_files_limit() -> None:
    """A GET holds every body file it reads open (a multipart object: one per part), and a
    read-through copy of a multipart object writes one file per part: allow as many
    descriptors as this process may have (the soft limit is often 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _tls_context(settings: Settings) -> ssl.SSLContext | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context


def _ctime_mark(data_dir: Path) -> int:
    """A ctime (on the data dir's own clock) older than every file this process will make."""
    mark = data_dir / "tmp" / ".sweep-mark"
    mark.touch()
    mark_ns = mark.stat().st_ctime_ns
    mark.unlink()
    return mark_ns


async def _sweep(blobs: BlobStore, referenced: set[str], before_ns: int) -> None:
    try:
        swept = await asyncio.to_thread(blobs.sweep, referenced, before_ns)
    except OSError as exc:  # a failed sweep only leaves orphans behind, never loses data
        log.warning("sweep of unreferenced blob files failed: %s", exc)
        return
    if swept:
        log.info("removed %d unreferenced blob files left by an earlier crash", swept)


def _filesystem_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def _announce(settings: Settings, upstream: str | None, credentials: Mapping[str, str]) -> None:
    s3 = f"{'https' if settings.tls_cert else 'http'}://{settings.listen}"
    log.info(
        "S3 endpoint %s, admin http://%s, data in %s (durability=%s)",
        s3,
        settings.admin_listen,
        settings.data_dir,
        settings.durability,
    )
    if settings.is_demo:
        key, secret = next(iter(credentials.items()))
        banner = [
            "=" * 72,
            "DEMO MODE: no --upstream-endpoint given, so the upstream is an embedded,",
            f"in-memory S3 server at {upstream} (bucket '{settings.demo_bucket}').",
            "Everything flushed there is LOST when the gateway exits, so the demo data",
            f"dir ({settings.data_dir}) was emptied at this start: it starts empty too.",
            f"  endpoint_url      = {s3}",
            f"  access key id     = {key}",
            f"  secret access key = {secret}",
            f"  region            = {settings.upstream_region}",
            "=" * 72,
        ]
        for line in banner:
            log.warning("%s", line)
    else:
        log.info("upstream %s (region %s)", upstream, settings.upstream_region)
