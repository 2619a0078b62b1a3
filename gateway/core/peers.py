"""Reads across the fleet (docs/fleet.md, "Reads across nodes"): which version of a key
wins among this node's row, the peers' unflushed versions and the bucket, and how a peer's
answer becomes an S3 answer here.

Which version wins: an unflushed version (here or on a peer) beats the bucket's and a
durable local copy, since it will be uploaded after them; among unflushed versions the
newest acknowledgement wins (ties: this node, then the higher node id), a delete being a
version like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import NoReturn

from gateway.core.bodies import ChunkSource, NoBody
from gateway.core.heads import ObjectBody, ObjectHead, ReadOptions
from gateway.core.ranges import ByteRange
from gateway.errors import S3Error, upstream_error
from gateway.fleet.view import AttributesPage, FleetView, PeerError, PeerHead, PeerRead
from gateway.models import FlushState, LocalObject

log = logging.getLogger(__name__)
PART_HEADER = "x-gateway-part-number"


def is_unflushed(row: LocalObject | None) -> bool:
    return row is not None and row.state is not FlushState.DURABLE


async def newest_sources(
    fleet: FleetView, nodes: Sequence[str], bucket: str, key: str, local: LocalObject | None
) -> list[tuple[str, bool]]:
    """The peers to read ``key`` from, newest version first, each with whether what it
    holds there is a replica (of a writer that cannot answer); empty when this node's row
    or the bucket wins. A read tries them in turn: one that dies between its answer and
    the read leaves the next, a replica of the same version or an older version still
    newer than this node's row (the writer's version was answered, then its read failed,
    and this node served its own older row: found by loadtest/fleet_soak.py).

    With one candidate, nothing unflushed here and every member answering, the candidate is
    read at once (one round trip: it answers "not held" if it has nothing); otherwise the
    versions are asked first and compared (``newest_versions``: a lost writer's replicas
    too)."""
    if len(nodes) == 1 and not is_unflushed(local) and not fleet.replica_candidates(bucket, key):
        return [(nodes[0], False)]
    found = await newest_versions(fleet, nodes, bucket, key)
    if local is not None and is_unflushed(local):
        found = [(h, r) for h, r in found if h.acked_s > local.acked_s]
    return [(head.node_id, replica) for head, replica in found]


async def newest_version(
    fleet: FleetView,
    nodes: Sequence[str],
    bucket: str,
    key: str,
    *,
    attributes: AttributesPage | None = None,
) -> tuple[PeerHead, bool] | None:
    """The newest unflushed version (or delete) of ``key`` the candidates ``nodes`` hold,
    and whether it is a replica (``newest_versions``' first)."""
    found = await newest_versions(fleet, nodes, bucket, key, attributes=attributes)
    return found[0] if found else None


async def newest_versions(
    fleet: FleetView,
    nodes: Sequence[str],
    bucket: str,
    key: str,
    *,
    attributes: AttributesPage | None = None,
) -> list[tuple[PeerHead, bool]]:
    """The unflushed versions (or deletes) of ``key`` the candidates ``nodes`` hold, newest
    first, each with whether it is a replica (after its writer's own answer, for one
    version). While a member is unreachable, it may be a writer of a newer version than
    any candidate's (a candidate that does not answer, or one no longer a candidate: its
    lease ran out): with replicas, their holders are asked too. Without that, a node
    holding an older unflushed version, or a peer holding one, served it until the lost
    writer's was taken over (found by loadtest/fleet_soak.py)."""
    heads = await fleet.heads(nodes, bucket, key, attributes=attributes) if nodes else []
    # After the candidates: one that did not answer is unreachable now (none while every
    # member answers: no cost in the usual case).
    holders = fleet.replica_candidates(bucket, key)
    replicas = (
        await fleet.heads(holders, bucket, key, replica=True, attributes=attributes)
        if holders
        else []
    )
    found = [(h, False) for h in heads] + [(h, True) for h in replicas]
    return sorted(found, key=lambda f: (f[0].acked_s, not f[1], f[0].node_id), reverse=True)


async def read_newest(
    fleet: FleetView,
    bucket: str,
    key: str,
    local: LocalObject | None,
    method: str,
    headers: Mapping[str, str],
    *,
    zero_copy: bool = False,
) -> PeerRead | None:
    """``key`` read (GET or HEAD, ``headers`` forwarded) from the peer holding its newest
    unflushed version, or from a replica of a writer that cannot answer; None when this
    node's row ``local`` or the bucket has the version to serve. S3 errors of that version
    (a delete's 404, a failed precondition) raised. The caller MUST ``aclose`` it."""
    nodes = fleet.candidates(bucket, key)
    if not nodes and not is_unflushed(local):
        # A writer that cannot answer may hold it: its replicas can (--replicas).
        return await read_replica(fleet, bucket, key, method, headers, zero_copy=zero_copy)
    sources = await newest_sources(fleet, nodes, bucket, key, local)
    for node, replica in sources:
        try:
            found = await fleet.read(
                node, bucket, key, method, headers, replica=replica, zero_copy=zero_copy
            )
        except PeerError as exc:
            log.debug("%s/%s: %s answers %s (sources %s)", bucket, key, node, exc.code, sources)
            raise_peer_error(exc)
        if found is not None:
            log.debug(
                "%s/%s: read from %s%s, etag %s (sources %s)",
                bucket,
                key,
                node,
                " (a replica)" if replica else "",
                found.head.meta.etag,
                sources,
            )
            return found
    if sources and not any(replica for _, replica in sources) and not is_unflushed(local):
        # Not held there, or it did not answer: its replicas may (--replicas).
        return await read_replica(fleet, bucket, key, method, headers, zero_copy=zero_copy)
    return None


async def read_replica(
    fleet: FleetView,
    bucket: str,
    key: str,
    method: str,
    headers: Mapping[str, str],
    *,
    zero_copy: bool = False,
) -> PeerRead | None:
    """``key`` read from a replica of it (of a writer that cannot answer), if a holder has
    one: None otherwise, or while every member answers (S3 errors of that version raised).
    The holders are asked for their versions first and the newest is read: two holders
    may hold different versions of one key (of two lost writers, or one held here and a
    newer one elsewhere)."""
    holders = fleet.replica_candidates(bucket, key)
    heads = await fleet.heads(holders, bucket, key, replica=True) if holders else []
    for head in sorted(heads, key=lambda h: (h.acked_s, h.node_id), reverse=True):
        node = head.node_id
        try:
            found = await fleet.read(
                node, bucket, key, method, headers, replica=True, zero_copy=zero_copy
            )
        except PeerError as exc:
            raise_peer_error(exc)
        if found is not None:
            return found
    return None


def forward_headers(read: ReadOptions) -> dict[str, str]:
    """What a peer needs to answer a read as S3 would: range or part, preconditions."""
    out: dict[str, str] = {}
    if read.range is not None:
        out["Range"] = read.range.header()
    if read.part_number is not None:
        out[PART_HEADER] = str(read.part_number)
    cond = read.cond
    for name, value in (
        ("If-Match", cond.if_match),
        ("If-None-Match", cond.if_none_match),
        ("If-Modified-Since", cond.if_modified_since),
        ("If-Unmodified-Since", cond.if_unmodified_since),
    ):
        if value is not None:
            out[name] = value
    return out


def as_body(read: PeerRead) -> ObjectBody:
    """A peer's answer as this node's answer (the caller MUST ``aclose`` its source)."""
    rng = None if read.byte_range is None else ByteRange(*read.byte_range)
    head = ObjectHead(
        read.head.meta,
        FlushState(read.head.state),
        rng,
        read.parts_count,
        read.is_not_modified,
        node=read.head.node_id,
    )
    return ObjectBody(head, NoBody() if read.body is None else ChunkSource(read.body))


def raise_peer_error(exc: PeerError) -> NoReturn:
    """A peer's S3 error of its version, raised here as the same S3 error."""
    error: S3Error = upstream_error(exc.code, exc.status, exc.message)
    error.fields = dict(exc.fields)
    raise error from None
