"""What every handler of the peer API shares: the state it answers from and its
authentication (``auth.py``: anything not signed with the fleet secret gets 403)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.clock import Clock
from gateway.core.objects import ObjectService
from gateway.fleet import auth
from gateway.fleet.node import Fleet
from gateway.flush.policy import FlushPolicy
from gateway.flush.stuck import FleetHeld
from gateway.models import LocalObject
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.replicas import Replica, ReplicaStore
from gateway.store.space import CacheSpace

log = logging.getLogger("gateway.fleet.api")
CheckpointFigures = Callable[[str, Sequence[str]], Awaitable[dict[str, dict[str, Any]]]]
# The flusher's ``withdraw``: never upload this version (after an upload on its way, up to
# the seconds given); True once it cannot reach the bucket any more.
Withdraw = Callable[[LocalObject, float], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class HeldReplicas:
    """Where this node keeps the replicas it holds for others (``--replicas`` > 0)."""

    store: ReplicaStore
    blobs: BlobStore
    space: CacheSpace | None
    # Whether a read may serve a replica (``Takeover.is_servable``: not superseded in the
    # bucket); None: every replica held is (no takeover runs here).
    is_servable: Callable[[Replica], Awaitable[bool]] | None = None


@dataclass(slots=True)
class PeerSide:
    """What the peer API answers from."""

    fleet: Fleet
    secret: bytes
    clock: Clock
    objects: ObjectService
    journal: Journal
    policy: FlushPolicy
    flusher_order: FleetHeld | None = None
    # A directory's checkpoint figures on this node (``figures``; None: not answered).
    checkpoint_figures: CheckpointFigures | None = None
    held: HeldReplicas | None = None  # with replicas: this node holds some for others
    withdraw: Withdraw | None = None  # None: nothing is withdrawn (answers "not held")


PEER_SIDE = web.AppKey("peer_side", PeerSide)
JsonOp = Callable[[PeerSide, Any, web.Request], Awaitable[Any]]


def refused(reason: str) -> web.Response:
    return web.json_response({"error": "AccessDenied", "message": reason}, status=403)


def verified(side: PeerSide, request: web.Request, body: bytes | None) -> str | None:
    raw_path, _, raw_query = request.raw_path.partition("?")
    try:
        return auth.verify(
            side.secret,
            request.method,
            raw_path,
            raw_query,
            request.headers,
            side.clock.wall(),
            body,
        )
    except auth.PeerAuthError as exc:
        log.info(
            "peer API: refused %s %s from %s: %s", request.method, raw_path, request.remote, exc
        )
        return None
