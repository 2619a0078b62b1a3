"""Composition root: builds every object, runs both listeners, shuts down in order.

Shutdown order (SIGTERM/SIGINT): readiness fails and new writes get 503 SlowDown at once;
the S3 listener stops and in-flight requests finish; flushing goes on until everything is
durable or ``shutdown_drain_timeout_s`` passes; then the flusher stops (unfinished uploads
stay pending on disk), the admin listener closes, and the journal is closed last.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from gateway.admin.api import AdminServices, build_admin_app
from gateway.admin.auth import resolve_admin_token
from gateway.clock import SystemClock
from gateway.config import Settings
from gateway.core.buckets import BucketService
from gateway.core.copy import CopyService
from gateway.core.deletes import DeleteService
from gateway.core.listing import ListingService
from gateway.core.multipart import MultipartService
from gateway.core.objects import ObjectService
from gateway.errors import S3Error
from gateway.flush.backoff import Backoff
from gateway.flush.flusher import Flusher
from gateway.flush.lanes import LaneConfig
from gateway.flush.policy import PolicyConfig
from gateway.s3.credentials import CredentialStore
from gateway.s3.dispatch import S3Services
from gateway.s3.server import HttpLimits, build_s3_runner
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
    """Run the gateway until ``stop`` is set or SIGTERM/SIGINT arrives."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        await _run(settings, stop, stack)


async def _run(settings: Settings, stop: asyncio.Event, stack: contextlib.AsyncExitStack) -> None:
    clock = SystemClock()
    endpoint = settings.upstream_endpoint
    upstream_keys: tuple[str | None, str | None] = (None, None)
    static: dict[str, str] = {}
    if settings.access_key is not None and settings.secret_key is not None:
        static[settings.access_key] = settings.secret_key
    credentials: Mapping[str, str] = CredentialStore(static, settings.credentials_file)
    admin_token = resolve_admin_token(
        _split(settings.admin_listen).host, settings.admin_token, settings.admin_token_file
    )
    quiet_secret_loggers()
    if settings.is_demo:
        from gateway.upstream.demo import DEMO_UPSTREAM_KEY, DEMO_UPSTREAM_SECRET, DemoUpstream

        demo = DemoUpstream()
        endpoint = await asyncio.to_thread(demo.start)
        stack.callback(demo.stop)
        upstream_keys = (DEMO_UPSTREAM_KEY, DEMO_UPSTREAM_SECRET)
        credentials = credentials if len(credentials) else {"demo": "demo-secret-key"}

    upstream = AiobotocoreUpstream(
        endpoint_url=endpoint,
        region=settings.upstream_region,
        addressing_style="path" if settings.is_demo else settings.upstream_addressing_style,
        max_connections=max(16, settings.flush_concurrency * 2),
        access_key=upstream_keys[0],
        secret_key=upstream_keys[1],
    )
    await upstream.start()
    stack.push_async_callback(upstream.close)

    data_dir = Path(settings.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    blobs = BlobStore(data_dir, fsync=settings.fsync)
    await asyncio.to_thread(blobs.open_store)
    stack.callback(blobs.close)
    journal = Journal(data_dir / "journal.db", fsync=settings.fsync)
    sweep_before_ns = await asyncio.to_thread(_ctime_mark, data_dir)
    referenced = await asyncio.to_thread(journal.open)
    stack.callback(journal.close)
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
    await space.refresh()

    if settings.is_demo:
        with contextlib.suppress(S3Error):
            await upstream.create_bucket(settings.demo_bucket, None)

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
    )
    object_service = ObjectService(
        journal,
        blobs,
        upstream,
        buckets,
        clock,
        max_object_bytes=settings.max_object_bytes,
        space=space,
        inline_max_bytes=settings.inline_threshold_bytes,
    )
    stack.push_async_callback(object_service.fills.close)
    s3 = S3Services(
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
        credentials=credentials,
        region=settings.upstream_region,
        domain=settings.domain,
        clock=clock,
        max_header_bytes=settings.max_header_size_bytes,
        max_xml_body_bytes=settings.max_xml_body_bytes,
    )
    flusher = Flusher(
        journal,
        blobs,
        upstream,
        clock,
        concurrency=settings.flush_concurrency,
        backoff=Backoff(base_s=settings.flush_retry_base_s, cap_s=settings.flush_retry_max_s),
        policy=PolicyConfig(
            write_back_delay_s=settings.write_back_delay_s,
            temp_patterns=settings.temp_patterns,
            temp_hold_s=settings.temp_hold_s,
            commit_markers=settings.commit_markers,
        ),
        lanes=LaneConfig(
            depth=settings.lane_depth,
            rate_per_s=settings.lane_rate,
            min_rate_per_s=settings.lane_min_rate,
            bandwidth_bytes_per_s=settings.lane_bandwidth_bytes,
            concurrency=settings.lane_concurrency,
        ),
        rate_per_s=settings.flush_rate,
        rate_burst=settings.flush_rate_burst,
        bandwidth_bytes_per_s=settings.flush_bandwidth_bytes,
        bandwidth_burst_bytes=settings.flush_bandwidth_burst_bytes,
        multipart_threshold_bytes=settings.multipart_threshold_bytes,
    )
    await flusher.attach()  # the pending rows, in memory, before any write can arrive
    flusher_task = asyncio.create_task(flusher.run(), name="flusher")
    evictor_task = asyncio.create_task(space.run(), name="evictor")
    admin = AdminServices(
        journal=journal, flusher=flusher, clock=clock, capacity_bytes=capacity, token=admin_token
    )

    limits = HttpLimits(
        max_line_bytes=settings.max_line_size_bytes,
        max_field_bytes=settings.max_header_size_bytes,
        max_headers=settings.max_headers,
    )
    s3_runner = build_s3_runner(s3, limits, shutdown_timeout_s=10.0)
    admin_runner = web.AppRunner(build_admin_app(admin), handle_signals=False, access_log=None)
    await s3_runner.setup()
    await admin_runner.setup()
    stack.push_async_callback(admin_runner.cleanup)
    s3_ep, admin_ep = _split(settings.listen), _split(settings.admin_listen)
    tls = _tls_context(settings)
    await web.TCPSite(
        s3_runner, s3_ep.host, s3_ep.port, ssl_context=tls, reuse_address=True
    ).start()
    await web.TCPSite(admin_runner, admin_ep.host, admin_ep.port, reuse_address=True).start()
    admin.is_ready = True
    _announce(settings, endpoint, credentials)
    # Crash leftovers are removed in the background: listing every blob before listening
    # would delay readiness on a large cache, and files made since the mark are spared.
    sweeper = asyncio.create_task(_sweep(blobs, referenced, sweep_before_ns), name="sweep")

    await stop.wait()
    log.info(
        "shutting down: refusing new writes, draining for up to %.0fs",
        settings.shutdown_drain_timeout_s,
    )
    admin.is_ready = False
    # The S3 listener stays up while draining: reads keep working and new writes get
    # 503 SlowDown (retryable: a client retries against the next gateway or after restart)
    # rather than a refused connection.
    s3.is_accepting_writes = False
    started = clock.monotonic()
    if not flusher.is_paused:
        await journal.wait_flushed(
            None, "", journal.last_seq, settings.shutdown_drain_timeout_s, skip_failed=True
        )
    left_s = settings.shutdown_drain_timeout_s - (clock.monotonic() - started)
    await flusher.stop(max(0.0, left_s))
    await flusher_task
    await s3_runner.cleanup()  # waits for requests in flight (writes admitted before)
    space.stop()
    await evictor_task
    await sweeper
    objects, size = await journal.unflushed(None, "", journal.last_seq)
    if objects:
        log.warning(
            "exiting with %d objects (%d bytes) not yet flushed; they resume at the next start",
            objects,
            size,
        )


def quiet_secret_loggers() -> None:
    """Keep botocore's and aiobotocore's debug output (request headers with the upstream's
    Authorization, signing strings) out of the log even at ``--log-level debug``."""
    for name in ("botocore", "aiobotocore", "urllib3", "s3transfer"):
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.getEffectiveLevel(), logging.INFO))


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
            "Everything flushed there is LOST when the gateway exits.",
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
