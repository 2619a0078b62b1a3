"""Composition root: builds every object, runs both listeners, shuts down in order.

Start-up checks what it can before anything is written to disk or a write is accepted: the
TLS files, both listen addresses (bound first, listening last), the upstream credentials;
then the data dir (its lock, and the upstream its rows were acknowledged for:
``startup.plan_data_dir``), and a first request to the upstream (a warning when it does not
answer, never a refusal). A start that fails undoes what it created, the data dir included.
Shutdown is in ``shutdown.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fnmatch
import functools
import logging
import os
import resource
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.admin import fleet as admin_fleet
from gateway.admin import reads as admin_reads
from gateway.admin.api import AdminServices, build_admin_app
from gateway.admin.auth import resolve_admin_token
from gateway.admin.status import FlusherView
from gateway.cli import human_bytes
from gateway.clock import SystemClock
from gateway.config import Settings
from gateway.core.attributes import ObjectAttributesService
from gateway.core.buckets import BucketService
from gateway.core.checkpoints import CheckpointService
from gateway.core.copy import CopyService
from gateway.core.deletes import DeleteService
from gateway.core.fill import FillConfig
from gateway.core.freshness import FreshRows
from gateway.core.listing import ListingService
from gateway.core.multipart import MultipartService
from gateway.core.objects import ObjectService
from gateway.core.prefetch import Prefetcher
from gateway.core.writes import remake_replica
from gateway.errors import S3Error
from gateway.fleet import api as peer_api
from gateway.fleet import auth as peer_auth
from gateway.fleet.api_base import HeldReplicas, PeerSide
from gateway.fleet.claims import Claimant, Claims
from gateway.fleet.client import PeerClient
from gateway.fleet.condlock import ConditionalLocks
from gateway.fleet.fence import LostWriters
from gateway.fleet.membership import Member, parse_peers
from gateway.fleet.node import Fleet, FleetConfig
from gateway.fleet.ordering import TAKEOVER_WAIT_S, give_way
from gateway.fleet.recovered import RecoveredVersions
from gateway.fleet.rereplication import Rereplication
from gateway.fleet.takeover import DeleteNotes, Takeover, TakeoverConfig, UploadClaims
from gateway.fleet.wire import DrainAnswer, DrainRequest, NodeInfo, SupersedeAnswer, Superseding
from gateway.flush import stuck
from gateway.flush.backoff import Backoff
from gateway.flush.control import RateConfig
from gateway.flush.flusher import Flusher
from gateway.flush.gate import GateConfig, RequestGate, build_gate
from gateway.flush.lanes import LaneConfig
from gateway.flush.memory import RateMemory
from gateway.flush.policy import PolicyConfig
from gateway.flush.shares import FleetShares
from gateway.flush.window import WindowConfig
from gateway.models import LocalObject
from gateway.s3.credentials import CredentialStore
from gateway.s3.dispatch import S3Services
from gateway.s3.server import HttpLimits, build_s3_runner
from gateway.shutdown import Running, shut_down
from gateway.startup import StartupError, bind, open_data_dir, starting
from gateway.store import origin
from gateway.store.blobs import BlobStore
from gateway.store.copies import ShortCopies
from gateway.store.journal import Journal
from gateway.store.members import MemberTable
from gateway.store.rates import RateTable
from gateway.store.replicas import Replica, ReplicaStore
from gateway.store.space import CacheSpace
from gateway.store.uploads import UploadJournal
from gateway.upstream.client import AiobotocoreUpstream, ProbeProblem

log = logging.getLogger("gateway")
# A first request to a real upstream at start waits this long for its answer (a warning
# without one: the start goes on).
_PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int


def _split(host_port: str) -> Endpoint:
    host, _, port = host_port.rpartition(":")
    return Endpoint(host.strip("[]"), int(port))


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run the gateway until ``stop`` is set or SIGTERM/SIGINT arrives; a second signal
    during the shutdown stops it at once (``shutdown.py``).

    Raises ``StartupError`` (one line naming the cause) when it cannot start; whatever was
    started by then (lock, threads, listeners, tasks, files in the data dir) is undone first."""
    stop = stop or asyncio.Event()
    aborted = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            stop.set()
        elif not aborted.is_set():
            aborted.set()
            log.warning(
                "%s during the shutdown: stopping at once, without waiting for the drain; "
                "what is not flushed stays on disk, safe, for the next start",
                sig.name,
            )

    signals = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
            signals.append(sig)
    try:
        async with contextlib.AsyncExitStack() as stack:
            running = await _start(settings, stack)
            await stop.wait()
            await shut_down(running, aborted)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


async def _start(settings: Settings, stack: contextlib.AsyncExitStack) -> Running:
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
    # Both addresses are bound before anything is created on disk (an address in use fails
    # the start here); they listen only once everything else is ready.
    s3_sockets = await bind(settings.listen, stack)
    admin_sockets = await bind(settings.admin_listen, stack)
    endpoint, upstream = await _start_upstream(settings, stack)
    probe = None
    if not settings.is_demo:  # answered while the data dir opens; awaited before listening
        probe = asyncio.create_task(upstream.probe(_PROBE_TIMEOUT_S), name="upstream probe")
        stack.push_async_callback(_cancel, probe)
    if settings.is_demo:
        credentials = credentials if len(credentials) else {"demo": "demo-secret-key"}
    data_dir = Path(settings.data_dir)
    footprint, found = await open_data_dir(settings, stack)
    blobs = BlobStore(data_dir, fsync=settings.fsync)
    journal = Journal(data_dir / origin.JOURNAL_NAME, fsync=settings.fsync)
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
        await _log_recovered(journal, settings)
    if settings.is_demo:
        await _create_demo_buckets(upstream, settings.demo_bucket, found.buckets)

    fleet, peer_secret = await _fleet(settings, clock, journal, blobs, upstream, stack)
    # One retry policy for the gate's retried requests and the flusher's retried objects.
    backoff = Backoff(base_s=settings.flush_retry_base_s, cap_s=settings.flush_retry_max_s)
    gate = _gate(settings, clock, backoff)
    flusher = _flusher(settings, clock, journal, blobs, upstream, gate, backoff, fleet)
    if fleet is not None:
        _lost_writers(settings, journal, flusher, fleet)
        if fleet.deletes is not None:  # deletes noted where a node back could miss them
            fleet.deletes.use_gate(gate)
            flusher.deletes = fleet.deletes
        if fleet.takeover is not None:  # a lost writer's uploads and claims: this gate too
            fleet.takeover.use_gate(gate)
            _takeover_in_order(fleet, fleet.takeover, journal, flusher)
        # Each lease renewal tells a member what this node gets through to each bucket;
        # a member that stops sending to one hands its share over (flush/shares.py).
        shares = FleetShares(gate, clock.monotonic)
        fleet.shares = shares
        fleet.membership.shares = shares.report
        fleet.membership.cuts = shares.report_cuts
    # What the last run learnt of each bucket's rate: its budgets slow-start to it quickly.
    memory = RateMemory(gate.lanes, RateTable(journal), clock)
    with starting(f"reading the journal {journal.path}"):
        _log_recalled(await memory.recall())
    await flusher.attach()  # the pending rows, in memory, before any write can arrive
    s3 = _s3_services(
        settings, clock, journal, blobs, upstream, space, credentials, flusher, fleet, stack
    )
    with starting(f"reading the journal {journal.path}"):
        await s3.objects.verifier.load()  # files verified before: trusted until they change
    prefetcher = Prefetcher(journal, upstream, s3.objects.fills, space, clock)
    stack.push_async_callback(prefetcher.close)
    checkpoints = CheckpointService(
        s3.listing, s3.objects, journal, markers=settings.commit_markers, fleet=fleet
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
            # Each bucket's adaptive budget: its rate, the limit it learnt (or remembered).
            "flow_budgets": lambda: [dataclasses.asdict(b) for b in flusher.budget_status()],
        },
        replicas_short=fleet.replicas_short if fleet is not None else None,
    )
    limits = HttpLimits(
        max_line_bytes=settings.max_line_size_bytes,
        max_field_bytes=settings.max_header_size_bytes,
        max_headers=settings.max_headers,
    )
    peer_routes = None
    if fleet is not None:
        side = PeerSide(
            fleet,
            peer_secret,
            clock,
            s3.objects,
            journal,
            flusher.policy,
            flusher.order,
            functools.partial(checkpoints.node_figures, flush=FlusherView(flusher)),
            HeldReplicas(ReplicaStore(journal), blobs, space, _servable(fleet)),
            withdraw=flusher.withdraw,
        )
        peer_routes = functools.partial(peer_api.install, side=side)
        admin.status_extras["fleet"] = fleet.status
    s3_runner = build_s3_runner(s3, limits, shutdown_timeout_s=10.0, routes=peer_routes)
    admin_app = build_admin_app(admin)
    admin_reads.install(admin_app, prefetcher, checkpoints)
    admin_fleet.install(admin_app, fleet, flusher)
    admin_runner = web.AppRunner(admin_app, handle_signals=False, access_log=None)
    if probe is not None:
        _warn_unreachable(endpoint, await probe)
    await _listen(admin_runner, settings.admin_listen, admin_sockets, None, stack)
    # From the S3 listener's first connection on, the data dir may hold acknowledged writes:
    # no failure after this point may undo what the start created.
    footprint.keep()
    await _listen(s3_runner, settings.listen, s3_sockets, tls, stack)

    # Background work only once the listeners are bound (nothing to undo if they are not).
    tasks = [
        asyncio.create_task(flusher.run(), name="flusher"),
        asyncio.create_task(space.run(), name="evictor"),
        # Crash leftovers (and the bodies of cached copies dropped at this start) are
        # removed in the background: listing every blob before listening would delay
        # readiness on a large cache, and files made since the mark are spared.
        asyncio.create_task(_sweep(blobs, referenced, sweep_before_ns), name="sweep"),
        asyncio.create_task(memory.run(), name="rate memory"),
    ]
    for task in tasks:
        stack.push_async_callback(_cancel, task)
    if fleet is not None:
        with starting("joining the fleet"):
            await fleet.start()  # first leases before the first read
    admin.is_ready = True
    _announce(settings, endpoint, credentials)
    return Running(
        settings,
        clock,
        journal,
        flusher,
        space,
        s3,
        admin,
        s3_runner,
        admin_runner,
        tasks,
        memory,
        fleet,
    )


async def _create_demo_buckets(
    upstream: AiobotocoreUpstream, demo_bucket: str, buckets: tuple[str, ...]
) -> None:
    """The new demo upstream is empty: create its bucket, and every bucket that has writes
    left to flush from an earlier demo run (they are flushed there)."""
    for name in sorted({demo_bucket, *buckets}):
        try:
            await upstream.create_bucket(name, None)
        except S3Error as exc:
            log.warning("demo upstream: cannot create bucket %s: %s", name, exc)


def _warn_unreachable(endpoint: str | None, problem: ProbeProblem | None) -> None:
    """Say what a failed probe means for writes (the start goes on)."""
    if problem is None:
        return
    then = "flush once it answers"
    if problem.is_credentials:
        then = "none flushes until the upstream credentials are fixed"
    log.warning(
        "upstream %s: %s; writes are acknowledged and kept on disk, and %s (gateway status "
        "shows the last error)",
        endpoint,
        problem.reason,
        then,
    )


async def _start_upstream(
    settings: Settings, stack: contextlib.AsyncExitStack
) -> tuple[str | None, AiobotocoreUpstream]:
    """The upstream client (and the embedded demo upstream without an endpoint). Without
    upstream credentials in the AWS chain a real upstream's start fails here."""
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
    sockets: list[socket.socket],
    tls: ssl.SSLContext | None,
    stack: contextlib.AsyncExitStack,
) -> None:
    """Set up ``runner`` and listen on its bound ``sockets`` (undone on ``stack``)."""
    await runner.setup()
    stack.push_async_callback(_cleanup, runner)
    with starting(f"listening on {host_port}"):
        for sock in sockets:
            await web.SockSite(runner, sock, ssl_context=tls).start()


async def _cleanup(runner: web.AppRunner) -> None:
    if runner.server is not None:  # not cleaned up by the shutdown already
        await runner.cleanup()


async def _cancel(task: asyncio.Task[Any]) -> None:
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
    fleet: Fleet | None,
    stack: contextlib.AsyncExitStack,
) -> S3Services:
    buckets = BucketService(journal, blobs, upstream, clock, fleet)
    stack.push_async_callback(buckets.close)
    # The fleet's claims live under the control prefix of each bucket: hidden from clients.
    hidden = settings.control_prefix if fleet is not None else None
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
        fleet=fleet,
    )
    recovered = RecoveredVersions(flusher.started_s, upstream)
    if fleet is not None and fleet.claims is not None:  # replicas on: the keys' claims
        recovered.elsewhere = fleet.claims.superseded_elsewhere
    if fleet is not None and fleet.deletes is not None:  # a read's look: at once
        recovered.deleted_since = functools.partial(fleet.deletes.deleted_since, direct=True)
    fresh = FreshRows(journal, upstream, blobs, clock, fleet, recovered)
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
        fleet=fleet,
        fresh=fresh,
    )
    stack.push_async_callback(object_service.fills.close)
    stack.push_async_callback(object_service.verifier.close)
    return S3Services(
        objects=object_service,
        buckets=buckets,
        listing=ListingService(journal, upstream, fleet, hidden),
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
            fleet=fleet,
            fresh=fresh,
            write_guard=object_service.write_guard,
        ),
        deletes=DeleteService(
            journal, blobs, buckets, clock, fleet, conditional_delete=object_service.delete_object
        ),
        attributes=ObjectAttributesService(journal, upstream, buckets, fresh, fleet),
        credentials=credentials,
        region=settings.upstream_region,
        domain=settings.domain,
        clock=clock,
        max_header_bytes=settings.max_header_size_bytes,
        max_xml_body_bytes=settings.max_xml_body_bytes,
        hidden_prefix=hidden,
    )


def _gate(settings: Settings, clock: SystemClock, backoff: Backoff) -> RequestGate:
    """The request gate every upstream write goes through; reads draw on its bandwidth."""
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
    backoff: Backoff,
    fleet: Fleet | None,
) -> Flusher:
    return Flusher(
        journal,
        blobs,
        upstream,
        clock,
        gate=gate,
        backoff=backoff,
        policy=PolicyConfig(
            write_back_delay_s=settings.write_back_delay_s,
            temp_patterns=settings.temp_patterns,
            temp_hold_s=settings.temp_hold_s,
            commit_markers=settings.commit_markers,
        ),
        multipart_threshold_bytes=settings.multipart_threshold_bytes,
        marker_holds=fleet,
        claims=fleet.claims if fleet is not None else None,
        upload_order=fleet.upload_order if fleet is not None else None,
    )


async def _fleet(
    settings: Settings,
    clock: SystemClock,
    journal: Journal,
    blobs: BlobStore,
    upstream: AiobotocoreUpstream,
    stack: contextlib.AsyncExitStack,
) -> tuple[Fleet | None, bytes]:
    """This gateway as a member of its fleet (docs/fleet.md), or None without --peers:
    then nothing of the fleet is built or runs."""
    if settings.peers is None:
        return None, b""
    with starting("joining the fleet"):
        secret = await _peer_secret(settings, upstream)
        table = MemberTable(journal)
        node_id = settings.node_id or os.environ.get("NODE_NAME") or socket.gethostname()
        me = NodeInfo(node_id, await table.datadir_id(), clock.wall(), settings.zone)
        scheme = "https" if settings.tls_cert else "http"
        transport = PeerClient(node_id, secret, clock, scheme=scheme)
        stack.push_async_callback(transport.close)
        listen = _split(settings.listen)
        config = FleetConfig(
            port=listen.port,
            self_address=f"{_reachable(listen.host)}:{listen.port}",
            lease_s=settings.peer_lease_s,
            refresh_s=settings.peer_refresh_s,
            read_timeout_s=settings.peer_read_timeout_s,
            replicas=settings.replicas,
            replica_strict=settings.replica_policy == "strict",
            peer_timeout_s=settings.peer_timeout_s,
        )

        def has_unflushed(bucket: str, prefix: str) -> bool:
            return not journal.figures.unflushed_under(bucket, prefix).is_empty

        fleet = Fleet(
            me, config, parse_peers(settings.peers), transport, table, clock, has_unflushed
        )
        stack.push_async_callback(fleet.stop, say_bye=False)
        claims = _claims(settings, upstream, fleet)
        if settings.replicas > 0:
            _replicas(settings, clock, journal, blobs, upstream, fleet, transport, claims)
        fleet.deletes = DeleteNotes(claims, me, fleet.someone_unheard)
        fleet.conditional = ConditionalLocks(upstream, me.node_id, settings.control_prefix, clock)
        await fleet.load(await journal.unflushed_dirs())
    log.info("fleet: this gateway is %s; peers from %s", node_id, settings.peers)
    return fleet, secret


def _servable(fleet: Fleet) -> Callable[[Replica], Awaitable[bool]] | None:
    """What replica reads ask before serving one (docs/fleet.md, "Takeover", on reads)."""
    return None if fleet.takeover is None else fleet.takeover.is_servable


def _takeover_in_order(
    fleet: Fleet, takeover: Takeover, journal: Journal, flusher: Flusher
) -> None:
    """A version taken over goes up as its writer's would (docs/fleet.md, "Takeover"): the
    key's older versions give way first, on the peers and on this node."""
    node_id = fleet.me.node_id

    async def here(asker: str, version: Superseding) -> SupersedeAnswer:
        row = await journal.get(version.bucket, version.key)
        return await give_way(row, node_id, asker, version, flusher.withdraw, TAKEOVER_WAIT_S)

    fleet.upload_order.here = here
    takeover.in_order = fleet.upload_order.before_takeover


def _claims(settings: Settings, upstream: AiobotocoreUpstream, fleet: Fleet) -> Claims:
    """The fleet's claims in each bucket (docs/fleet.md, "Takeover"; without replicas, only
    deletes noted: ``DeleteNotes``). A claimant is lost as the takeover judges (set by
    ``_replicas``); without replicas nothing but deletes is claimed, and a claim left by
    an earlier run with replicas counts as lost."""
    me = fleet.me
    claimant = Claimant(me.node_id, me.datadir_id, me.started_s)
    return Claims(upstream, claimant, settings.control_prefix, lambda *n: True)


def _replicas(
    settings: Settings,
    clock: SystemClock,
    journal: Journal,
    blobs: BlobStore,
    upstream: AiobotocoreUpstream,
    fleet: Fleet,
    transport: PeerClient,
    claims: Claims,
) -> None:
    """Replicas and takeover (docs/fleet.md, "Node loss"): the claims every upload takes,
    the holders' loop, and (strict policy) the fence's view of lost writers."""

    def is_marker(key: str) -> bool:
        name = key.rpartition("/")[2]
        return any(fnmatch.fnmatchcase(name, p) for p in settings.commit_markers)

    me = fleet.me
    takeover = Takeover(
        me,
        fleet.membership,
        transport,
        ReplicaStore(journal),
        blobs,
        upstream,
        claims,
        clock,
        TakeoverConfig(settings.peer_timeout_s, is_marker),
        held_bytes=lambda: journal.figures.replica_bytes,
        wait_fleet_drained=fleet.fence.drained_everywhere,
        taking_over=fleet.directory.taking_over,
    )
    fleet.takeover = takeover
    claims.is_lost = lambda *n: takeover.claimant_lost(*n)
    fleet.claims = UploadClaims(claims, me, journal.may_be_superseded_elsewhere)
    replication = fleet.replication
    assert replication is not None
    # Versions with fewer copies than asked: acknowledged so (degrade), or committed here
    # and answered 500 (strict): their state says so, and re-replication tops them up.
    replication.short = ShortCopies(journal)

    async def remake(row: LocalObject, holders: Sequence[Member]) -> int:
        write = replication.remake(row.meta.bucket, row.meta.key, list(holders))
        return await remake_replica(write, row, blobs)

    fleet.rereplication = Rereplication(
        replication,
        fleet.membership,
        takeover.is_lost,
        lambda: journal.last_seq,
        journal.unflushed_after,
        remake,
        journal.get,
    )


def _reachable(host: str) -> str:
    """How this process reaches its own listener bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _lost_writers(settings: Settings, journal: Journal, flusher: Flusher, fleet: Fleet) -> None:
    """Strict replicas: every acknowledged write has its replicas, so a lost member's part
    of a directory is known from them (the fence then waits on its takeover, not on it)."""
    takeover = fleet.takeover
    if takeover is None or settings.replica_policy != "strict":
        return

    async def local_drain(ask: DrainRequest) -> DrainAnswer:
        left = await stuck.wait_movable(
            journal,
            flusher.policy,
            ask.bucket,
            ask.prefix,
            journal.last_seq,
            0.0,
            exclude_markers=True,
            fleet=flusher.order,
        )
        return DrainAnswer(fleet.me, left.objects == 0, left.objects, left.bytes)

    fleet.fence.lost = LostWriters(takeover.is_lost, takeover.owner_answer, local_drain)


async def _peer_secret(settings: Settings, upstream: AiobotocoreUpstream) -> bytes:
    """--peer-secret, --peer-secret-file, else derived from the upstream credentials."""
    if settings.peer_secret:
        return settings.peer_secret.encode()
    if settings.peer_secret_file is not None:
        text = settings.peer_secret_file.read_text().strip()
        if not text:
            raise StartupError(f"peer-secret-file {settings.peer_secret_file} is empty")
        return text.encode()
    upstream_secret = await upstream.shared_secret_key()
    if upstream_secret is None:
        raise StartupError(
            "--peers needs a fleet secret: set --peer-secret or --peer-secret-file "
            "(GATEWAY_PEER_SECRET): the upstream credentials are not static (an instance "
            "role or web identity differs per node), so none can be derived from them"
        )
    return peer_auth.derive_secret(upstream_secret)


def _log_recalled(rates: Mapping[str, float]) -> None:
    for bucket, rate in sorted(rates.items()):
        log.info(
            "bucket %s: the last run's rate, %.1f requests/s, is where its flush starts "
            "from (reached in a few round trips; a 503 cuts it as any overshoot)",
            bucket,
            rate,
        )


async def _log_recovered(journal: Journal, settings: Settings) -> None:
    """Say at start what an earlier run left to flush (and what failed)."""
    backlog = (await journal.stats()).backlog
    if backlog.pending_objects:
        failed = f", {backlog.failed_objects} of them failed" if backlog.failed_objects else ""
        log.info(
            "recovered %d pending objects (%s) from the journal%s; flushing resumes%s",
            backlog.pending_objects,
            human_bytes(backlog.pending_bytes),
            failed,
            " into the new demo upstream" if settings.is_demo else "",
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
        log.info(
            "removed %d blob files no journal row refers to (left by a crash, or the "
            "bodies of cached copies dropped at this start)",
            swept,
        )


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
            "What is flushed there is LOST when the gateway exits. Writes not flushed",
            f"yet stay in the data dir ({settings.data_dir}): the next demo start",
            "flushes them into its own new upstream (and forgets what was flushed).",
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
