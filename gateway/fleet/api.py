"""The peer API: what other gateways of the fleet may ask this one (docs/fleet.md).

Served on the S3 listener under ``/_gateway/peer/v1/`` (no bucket name starts with ``_``,
so no path-style S3 request is shadowed), registered before the S3 catch-all route. Every
request MUST be signed with the fleet secret (``auth.py``); anything else, including a
request signed with S3 credentials, is answered ``403`` and nothing is done or read.

Operations (JSON bodies, ``wire.py``): ``hello``, ``lease``, ``directory`` (an
announcement or withdrawal), ``bye``, ``drain`` (a long poll), ``version`` and ``rows``
(this node's unflushed rows), ``supersede`` (a peer uploads a newer version of a key),
and ``GET``/``HEAD object`` (this node's unflushed version
of a key, evaluated with the request's range and preconditions; sent with sendfile).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from gateway.core.attributes import local_attributes
from gateway.core.objects import ObjectHead
from gateway.errors import S3Error
from gateway.fleet import api_replicas
from gateway.fleet.api_base import (
    PEER_SIDE,
    JsonOp,
    PeerSide,
    refused,
    verified,
)
from gateway.fleet.client import (
    ERROR_HEADER,
    HEAD_HEADER,
    HELD_HEADER,
    PART_HEADER,
    REPLICA_HEADER,
    encode_attributes,
    encode_error,
    encode_head,
)
from gateway.fleet.ordering import give_way
from gateway.fleet.transport import PeerHead
from gateway.fleet.wire import (
    PATH_PREFIX,
    DirChange,
    DrainAnswer,
    DrainRequest,
    LeaseRequest,
    NodeInfo,
    PeerRow,
    SupersedeAnswer,
    SupersedeRequest,
    Superseding,
    WireError,
)
from gateway.flush import stuck
from gateway.models import LocalObject
from gateway.s3.handlers.objects import read_options
from gateway.s3.streaming import send_body

log = logging.getLogger(__name__)
_MAX_BODY_BYTES = 1 << 20
_MAX_ROWS = 1000


def install(app: web.Application, side: PeerSide) -> None:
    """Add the peer routes to the S3 app (before its catch-all route)."""
    app[PEER_SIDE] = side
    app.router.add_route("POST", PATH_PREFIX + "{op}", json_op)
    app.router.add_route("POST", PATH_PREFIX + "replica/{op}", json_op)
    app.router.add_route("PUT", PATH_PREFIX + "replica/body", api_replicas.replica_body)
    app.router.add_route("PUT", PATH_PREFIX + "replica/commit", api_replicas.replica_commit_body)
    app.router.add_route("GET", PATH_PREFIX + "object", read_object)
    app.router.add_route("HEAD", PATH_PREFIX + "object", read_object)


async def json_op(request: web.Request) -> web.StreamResponse:
    side = request.app[PEER_SIDE]
    body = await request.content.read(_MAX_BODY_BYTES + 1)
    if verified(side, request, body) is None:
        return refused("not a signed request of this fleet")
    op = request.match_info["op"]
    if request.path.startswith(PATH_PREFIX + "replica/"):
        op = "replica/" + op
    handler = _OPS.get(op)
    if handler is None or len(body) > _MAX_BODY_BYTES:
        return web.json_response({"error": "InvalidRequest"}, status=400)
    try:
        doc = json.loads(body) if body else {}
        answer = await handler(side, doc, request)
    except (ValueError, WireError) as exc:  # json.JSONDecodeError is a ValueError
        return web.json_response({"error": "InvalidRequest", "message": str(exc)}, status=400)
    if answer is None:
        return web.Response(status=204)
    return web.json_response(answer)


async def _hello(side: PeerSide, doc: Any, request: web.Request) -> Any:
    return side.fleet.me.to_json()


async def _lease(side: PeerSide, doc: Any, request: web.Request) -> Any:
    grant = side.fleet.on_lease(LeaseRequest.from_json(doc), request.remote or "127.0.0.1")
    return grant.to_json()


async def _directory(side: PeerSide, doc: Any, request: web.Request) -> Any:
    side.fleet.on_change(DirChange.from_json(doc))
    return None


async def _bye(side: PeerSide, doc: Any, request: web.Request) -> Any:
    side.fleet.on_bye(NodeInfo.from_json(doc))
    return None


async def _drain(side: PeerSide, doc: Any, request: web.Request) -> Any:
    ask = DrainRequest.from_json(doc)
    if ask.owner is not None:  # a lost writer's replicas held here (docs/fleet.md)
        return (await api_replicas.owner_drain(side, ask)).to_json()
    journal = side.journal
    left = await stuck.wait_movable(
        journal,
        side.policy,
        ask.bucket,
        ask.prefix,
        journal.last_seq,
        ask.wait_s,
        exclude_markers=ask.exclude_markers,
        fleet=side.flusher_order,
    )
    answer = DrainAnswer(
        side.fleet.me, left.objects == 0, left.objects, left.bytes, left.failed, left.held
    )
    return answer.to_json()


def _strings(doc: Any, *names: str) -> list[str]:
    if not isinstance(doc, dict) or not all(isinstance(doc.get(n), str) for n in names):
        raise WireError(f"expected strings {', '.join(names)}")
    return [doc[n] for n in names]


async def _version(side: PeerSide, doc: Any, request: web.Request) -> Any:
    bucket, key = _strings(doc, "bucket", "key")
    page = _attributes_page(doc.get("attributes"))
    if doc.get("replica") is True:  # what a writer that cannot answer holds, from here
        row = await api_replicas.newest_replica(side, bucket, key)
    else:
        row = await side.objects.unflushed_row(bucket, key)
    if row is None:
        return {"head": None}
    answer: dict[str, Any] = {"head": encode_head(_peer_head(side, row), {})}
    if page is not None and not row.is_delete:  # GetObjectAttributes asked on a peer
        found = local_attributes(row, max_parts=page[0], part_number_marker=page[1])
        answer["attributes"] = encode_attributes(found)
    return answer


def _attributes_page(doc: Any) -> tuple[int, int] | None:
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise WireError("attributes: expected an object")
    max_parts, marker = doc.get("max_parts"), doc.get("marker")
    if not isinstance(max_parts, int) or not 0 <= max_parts <= _MAX_ROWS:
        raise WireError("attributes.max_parts: expected 0-1000")
    if not isinstance(marker, int) or marker < 0:
        raise WireError("attributes.marker: expected a part number")
    return max_parts, marker


async def _supersede(side: PeerSide, doc: Any, request: web.Request) -> Any:
    """A peer is about to upload its versions of some keys (docs/fleet.md, "One key
    through two nodes"): this node's older unflushed version of each never goes up after
    it; a newer version of this node's, durable already, is answered ``newer`` (the
    peer's must not go over it). Versions are ordered as reads order them:
    acknowledgement, then node id."""
    ask = SupersedeRequest.from_json(doc)
    answers = await asyncio.gather(*(_superseded(side, ask, v) for v in ask.versions))
    return {"answers": [a.to_json() for a in answers]}


async def _superseded(
    side: PeerSide, ask: SupersedeRequest, version: Superseding
) -> SupersedeAnswer:
    row = await side.journal.get(version.bucket, version.key)
    return await give_way(row, side.fleet.me.node_id, ask.node, version, side.withdraw, ask.wait_s)


async def _rows(side: PeerSide, doc: Any, request: web.Request) -> Any:
    bucket, prefix, after = _strings(doc, "bucket", "prefix", "after")
    limit = doc.get("limit")
    if not isinstance(limit, int) or not 0 < limit <= _MAX_ROWS:
        raise WireError("limit: expected 1-1000")
    rows = await side.journal.scan_unflushed(bucket, prefix, after, limit)
    out = [
        PeerRow(
            r.meta.key,
            r.meta.size_bytes,
            r.meta.etag,
            r.meta.last_modified_s,
            r.acked_s,
            r.is_delete,
        ).to_json()
        for r in rows
    ]
    return {"rows": out, "truncated": len(rows) == limit}


async def _figures(side: PeerSide, doc: Any, request: web.Request) -> Any:
    (bucket,) = _strings(doc, "bucket")
    paths = doc.get("paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise WireError("paths: expected a list of strings")
    if len(paths) > _MAX_ROWS:
        raise WireError("paths: at most 1000")
    if side.checkpoint_figures is None:
        return {"paths": {}}
    return {"paths": await side.checkpoint_figures(bucket, paths)}


_OPS: dict[str, JsonOp] = {
    "replica/commit": api_replicas.replica_commit,
    "replica/drop": api_replicas.replica_drop,
    "replica/needed": api_replicas.replica_needed,
    "figures": _figures,
    "hello": _hello,
    "lease": _lease,
    "directory": _directory,
    "bye": _bye,
    "drain": _drain,
    "supersede": _supersede,
    "version": _version,
    "rows": _rows,
}


def _peer_head(side: PeerSide, row: LocalObject) -> PeerHead:
    return PeerHead(side.fleet.me.node_id, row.meta, row.state.value, row.acked_s, row.is_delete)


async def read_object(request: web.Request) -> web.StreamResponse:
    """``GET|HEAD object?bucket=&key=``: this node's unflushed version, as S3 would serve
    it (range or part, preconditions evaluated here); ``x-gateway-peer-held: none`` when it
    holds none; an S3 error of its version as JSON with ``x-gateway-peer-error``."""
    side = request.app[PEER_SIDE]
    if verified(side, request, b"") is None:
        return refused("not a signed request of this fleet")
    bucket, key = request.query.get("bucket"), request.query.get("key")
    if not bucket or key is None:
        return web.json_response({"error": "InvalidRequest"}, status=400)
    try:
        query = (
            {"partNumber": request.headers[PART_HEADER]} if PART_HEADER in request.headers else {}
        )
        read = read_options(query, request.headers)
        with_body = request.method == "GET"
        if REPLICA_HEADER in request.headers:
            found = await api_replicas.replica_read(side, bucket, key, read, with_body=with_body)
        else:
            found = await side.objects.peer_read(bucket, key, read, with_body=with_body)
    except S3Error as exc:
        # In a header too: the answer to a HEAD carries no body (a delete read by HEAD was
        # taken for a peer that did not answer, and the older version served).
        error = encode_error(exc.code, exc.message, exc.fields)
        return web.json_response(
            {"code": exc.code, "message": exc.message, "fields": dict(exc.fields)},
            status=exc.status,
            headers={ERROR_HEADER: error},
        )
    if found is None:
        return web.Response(status=404, headers={HELD_HEADER: "none"})
    row, body = found
    head = body.head
    extra = {"byte_range": _range(head), "parts_count": head.parts_count}
    status = 304 if head.is_not_modified else (206 if head.byte_range else 200)
    headers = {HEAD_HEADER: encode_head(_peer_head(side, row), extra)}
    response = web.StreamResponse(status=status, headers=headers)
    if status != 304:
        span = head.byte_range
        response.content_length = span.length if span else head.meta.size_bytes
    try:
        await response.prepare(request)
        if request.method == "GET" and status != 304:
            await send_body(request, response, body.source)
    except Exception:
        # Headers are gone: a body cut short is the only honest signal left (the asking
        # gateway then cuts its client's connection too).
        if request.transport is not None:
            request.transport.close()
        raise
    finally:
        await body.source.aclose()
    await response.write_eof()
    return response


def _range(head: ObjectHead) -> list[int] | None:
    span = head.byte_range
    return None if span is None else [span.start, span.end, span.total_bytes]
