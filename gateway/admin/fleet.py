"""Admin routes of the fleet (docs/fleet.md): fleet-wide drain, the fleet's status, and
what only an operator decides.

- ``GET /admin/v1/drain`` with peers answers for the fleet: this node and every member are
  asked the same fence with the same wait, in parallel; ``drained`` only when every one
  answered drained. ``nodes`` lists each node's figures, and each node that did not answer
  with its error (never counted as drained).
- ``GET /admin/v1/fleet``: the members as this node sees them, and the held markers.
- ``POST /admin/v1/markers/release?bucket=B&key=K``: publish a held commit marker now,
  whatever it waits on (logged at warning level).
- ``POST /admin/v1/fleet/forget?node=N``: remove a member for good (a node gone with its
  disk): markers stop waiting on it.

Without peers the fleet routes answer 404 ``NoFleet``; release works for any held marker.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from aiohttp import web

from gateway.admin.api import FLEET_DRAIN, AdminServices, FleetDrain
from gateway.fleet.node import Fleet
from gateway.flush import stuck
from gateway.flush.flusher import Flusher

log = logging.getLogger(__name__)
FLEET = web.AppKey("fleet", Fleet)
FLUSHER = web.AppKey("fleet_flusher", Flusher)


def install(app: web.Application, fleet: Fleet | None, flusher: Flusher) -> None:
    if fleet is not None:
        app[FLEET] = fleet
        drain: FleetDrain = functools.partial(fleet_drain, fleet)
        app[FLEET_DRAIN] = drain
    app[FLUSHER] = flusher
    app.router.add_get("/admin/v1/fleet", fleet_status)
    app.router.add_post("/admin/v1/markers/release", release_marker)
    app.router.add_post("/admin/v1/fleet/forget", forget_node)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status)


async def fleet_drain(
    fleet: Fleet, svc: AdminServices, bucket: str | None, prefix: str, wait_s: float
) -> dict[str, Any]:
    """The drain fence of every node of the fleet (see the module docstring)."""
    journal = svc.journal
    local, others = await asyncio.gather(
        stuck.wait_movable(
            journal,
            svc.flusher.policy,
            bucket,
            prefix,
            journal.last_seq,
            wait_s,
            fleet=svc.flusher.order,
        ),
        fleet.drain(bucket, prefix, wait_s),
    )
    nodes: list[dict[str, Any]] = [
        {
            "node": fleet.me.node_id,
            "drained": local.objects == 0,
            "pending_objects": local.objects,
            "pending_bytes": local.bytes,
            "failed_objects": local.failed,
            "held_objects": local.held,
            "error": None,
        },
        *(n.to_json() for n in others),
    ]
    answered = [n for n in nodes if n["error"] is None]

    def total(name: str) -> int:
        return sum(int(n[name] or 0) for n in answered)

    return {
        "drained": all(n["drained"] for n in nodes) and len(answered) == len(nodes),
        "pending_objects": total("pending_objects"),
        "pending_bytes": total("pending_bytes"),
        "failed_objects": total("failed_objects"),
        "held_objects": total("held_objects"),
        "unanswered_nodes": [n["node"] for n in nodes if n["error"] is not None],
        "nodes": nodes,
    }


async def fleet_status(request: web.Request) -> web.Response:
    fleet = request.app.get(FLEET)
    if fleet is None:
        return _error(404, "NoFleet", "this gateway has no peers (--peers)")
    return web.json_response(fleet.status())


async def release_marker(request: web.Request) -> web.Response:
    bucket, key = request.query.get("bucket", ""), request.query.get("key", "")
    if not bucket or not key:
        return _error(400, "InvalidArgument", "bucket and key are required")
    released = request.app[FLUSHER].release_marker(bucket, key)
    if not released:
        return _error(404, "NoSuchHeldMarker", "no commit marker of that key is held here")
    log.warning("commit marker %s/%s released by an operator (admin API)", bucket, key)
    return web.json_response({"bucket": bucket, "key": key, "released": True})


async def forget_node(request: web.Request) -> web.Response:
    fleet = request.app.get(FLEET)
    if fleet is None:
        return _error(404, "NoFleet", "this gateway has no peers (--peers)")
    node = request.query.get("node", "")
    if not node:
        return _error(400, "InvalidArgument", "node is required")
    if not await fleet.forget(node):
        return _error(404, "NoSuchNode", f"{node} is not a member known here")
    return web.json_response({"node": node, "forgotten": True})
