"""The peer API's replica operations (docs/fleet.md, "Node loss"): a holder staging bodies
and committing versions for their writer, dropping them, and a writer saying which of its
versions it still needs held. Registered by ``api.install`` when replicas are configured.

- ``PUT replica/body?owner=&stage=&bucket=&key=[&upload=&part=]``: the body, streamed; it
  is written, fsynced and staged here within the node's capacity (503 when there is no
  room: the writer leaves this holder out); answers ``{"md5", "size"}``.
- ``POST replica/commit`` (``wire.ReplicaCommit``): ``{"missing": [stage ids]}``; empty:
  committed (durable here before the answer). ``PUT replica/commit?commit=`` (the commit
  as base64url JSON in the signed query) with a small body: staged and committed at once.
- ``POST replica/drop`` ``{"owner", "datadir_id", "seqs"}``: those versions go.
- ``POST replica/needed`` (asked of the writer) ``{"owner", "datadir_id", "seqs"}``:
  ``{"needed": [...]}``, the versions not yet durable upstream and not superseded here.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
from typing import Any

from aiohttp import web

from gateway.core.cache import admitted
from gateway.core.heads import ObjectBody, ReadOptions
from gateway.errors import S3Error
from gateway.fleet.api_base import PEER_SIDE, PeerSide, refused, verified
from gateway.fleet.wire import DrainAnswer, DrainRequest, ReplicaCommit, WireError
from gateway.models import FlushState, LocalObject, PartRef
from gateway.store.replicas import Replica

log = logging.getLogger(__name__)
_BODY_PIECE_BYTES = 1 << 20
INLINE_MAX_BYTES = 64 << 10  # a body this small is staged in the journal (no file, fsync)
_MAX_BODY_BYTES = 5 << 30


async def replica_body(request: web.Request) -> web.StreamResponse:
    side = request.app[PEER_SIDE]
    if verified(side, request, None) is None:
        return refused("not a signed request of this fleet")
    held = side.held
    q = request.query
    owner, stage, bucket, key = q.get("owner"), q.get("stage"), q.get("bucket"), q.get("key")
    if held is None or not owner or not stage or not bucket or key is None:
        return web.json_response({"error": "InvalidRequest"}, status=400)
    upload = None
    if "upload" in q:
        if not q.get("part", "").isdigit():
            return web.json_response({"error": "InvalidRequest"}, status=400)
        upload = (q["upload"], int(q["part"]))
    size = request.content_length or 0
    if request.content_length is not None and size <= INLINE_MAX_BYTES:
        return await _stage_inline(side, request, owner, stage, bucket, key, upload)
    # By its CRC32C alone when the writer names it in the commit (``sum=crc32c``): the
    # blob store computes it anyway, at memory speed, where an MD5 pass costs a core per
    # ~700 MB/s of replicas received. An older writer gets the MD5 it checks.
    by_crc32c = q.get("sum") == "crc32c"
    try:
        blob = await admitted(
            held.space,
            size,
            held.blobs.write(
                request.content.iter_chunked(_BODY_PIECE_BYTES),
                set() if by_crc32c else {"md5"},
                max_bytes=_MAX_BODY_BYTES,
            ),
        )
    except S3Error as exc:  # no room here (SlowDown), too large: the writer leaves us out
        return web.json_response({"error": exc.code, "message": exc.message}, status=exc.status)
    md5 = "" if by_crc32c else blob.digests["md5"].hex()
    stale = await held.store.stage(
        stage,
        owner,
        bucket,
        key,
        blob.blob_id,
        blob.size_bytes,
        md5,
        blob.crc32c,
        side.clock.wall(),
        upload,
    )
    await held.blobs.discard(stale)
    if by_crc32c:
        return web.json_response({"crc32c": blob.crc32c, "size": blob.size_bytes})
    return web.json_response({"md5": md5, "size": blob.size_bytes})


async def _stage_inline(
    side: PeerSide,
    request: web.Request,
    owner: str,
    stage: str,
    bucket: str,
    key: str,
    upload: tuple[str, int] | None,
) -> web.StreamResponse:
    """A small body staged in the journal row itself: one grouped commit, no file."""
    held = side.held
    assert held is not None
    body = await request.content.read(INLINE_MAX_BYTES + 1)
    if len(body) != request.content_length:
        return web.json_response({"error": "IncompleteBody"}, status=400)
    md5 = hashlib.md5(body).hexdigest()
    stale = await held.store.stage(
        stage, owner, bucket, key, None, len(body), md5, None, side.clock.wall(), upload, body
    )
    await held.blobs.discard(stale)
    return web.json_response({"md5": md5, "size": len(body)})


async def replica_commit_body(request: web.Request) -> web.StreamResponse:
    """A small body and its commit in one request: the body raw (checked against the
    commit's MD5, as streamed bodies are), the commit in the signed query."""
    side = request.app[PEER_SIDE]
    if verified(side, request, None) is None:
        return refused("not a signed request of this fleet")
    size = request.content_length
    if size is None or size > INLINE_MAX_BYTES:
        return web.json_response({"error": "InvalidRequest"}, status=400)
    body = await request.content.read(size + 1)
    try:
        raw = base64.urlsafe_b64decode(request.query.get("commit", ""))
        commit = ReplicaCommit.from_json(json.loads(raw))
        if len(body) != size or commit.body is not None or len(commit.stage_ids) != 1:
            raise WireError("expected one staged body, whole, in the request's body")
        return web.json_response(await _commit(side, dataclasses.replace(commit, body=body)))
    except (ValueError, WireError) as exc:
        return web.json_response({"error": "InvalidRequest", "message": str(exc)}, status=400)


async def replica_commit(side: PeerSide, doc: Any, request: web.Request) -> Any:
    return await _commit(side, ReplicaCommit.from_json(doc))


async def _commit(side: PeerSide, commit: ReplicaCommit) -> dict[str, list[str]]:
    held = side.held
    if held is None:
        raise WireError("this gateway holds no replicas (--replicas 0)")
    if side.fleet.takeover is not None:
        side.fleet.takeover.heard_from(commit.owner, commit.datadir_id)
    expected = _expected_md5(commit)
    missing, superseded = await held.store.commit(
        commit.owner,
        commit.datadir_id,
        commit.seq,
        commit.meta,
        commit.is_delete,
        commit.stage_ids,
        commit.parts,
        commit.acked_s,
        expected,
        None if commit.body is None else (commit.body, side.clock.wall()),
        is_early=commit.is_early,
        expected_crc32c=commit.crc32cs,
    )
    await held.blobs.discard(superseded)
    return {"missing": missing}


def _expected_md5(commit: ReplicaCommit) -> list[str | None]:
    """What each staged body must hash to: a part's ETag, or a single body's."""
    if commit.parts:
        return [etag for _, etag in commit.parts]
    return [commit.meta.etag for _ in commit.stage_ids]


def _seqs(doc: Any) -> tuple[str, str, list[int]]:
    if not isinstance(doc, dict):
        raise WireError("expected an object")
    owner, datadir, seqs = doc.get("owner"), doc.get("datadir_id"), doc.get("seqs")
    if not isinstance(owner, str) or not isinstance(datadir, str):
        raise WireError("owner and datadir_id: expected strings")
    if (
        not isinstance(seqs, list)
        or not all(isinstance(s, int) for s in seqs)
        or len(seqs) > 10_000
    ):
        raise WireError("seqs: expected at most 10,000 integers")
    return owner, datadir, seqs


async def replica_drop(side: PeerSide, doc: Any, request: web.Request) -> Any:
    held = side.held
    if held is None:
        return None
    owner, datadir, seqs = _seqs(doc)
    await held.blobs.discard(await held.store.drop(owner, datadir, seqs))
    return None


async def replica_needed(side: PeerSide, doc: Any, request: web.Request) -> Any:
    owner, datadir, seqs = _seqs(doc)
    if owner != side.fleet.me.node_id or datadir != side.fleet.me.datadir_id:
        return {"needed": None}  # another incarnation's versions: lost with its disk
    return {"needed": sorted(await side.journal.unflushed_seqs(seqs))}


async def owner_drain(side: PeerSide, ask: DrainRequest) -> DrainAnswer:
    """Replicas of the lost writer ``ask.owner`` under the prefix not uploaded yet here."""
    takeover = side.fleet.takeover
    if takeover is None:  # no replicas here: nothing of anyone's is held
        return DrainAnswer(side.fleet.me, True, 0, 0)
    return await takeover.owner_answer(ask)


async def replica_read(
    side: PeerSide, bucket: str, key: str, read: ReadOptions, *, with_body: bool
) -> tuple[LocalObject, ObjectBody] | None:
    """The newest replica of ``key`` this node holds (for a writer that cannot answer):
    read as the writer would serve it. None: none held here, or it is superseded."""
    replica = await _servable_replica(side, bucket, key)
    if replica is None:
        return None
    assert side.held is not None
    row = as_row(replica)
    body = await side.objects.replica_read(row, read, with_body=with_body)
    return None if body is None else (row, body)


async def newest_replica(side: PeerSide, bucket: str, key: str) -> LocalObject | None:
    """The newest replica of ``key`` held here, as its writer's row (None: none held, or
    it is superseded)."""
    replica = await _servable_replica(side, bucket, key)
    return None if replica is None else as_row(replica)


async def _servable_replica(side: PeerSide, bucket: str, key: str) -> Replica | None:
    """The newest replica of ``key`` held here, unless a newer version is in the bucket or
    on its way there (then so are the older ones): a replica lingers after its version
    was superseded (until its writer says it is not needed, or a takeover drops it), and
    was served over the bucket's newer version (docs/fleet.md, "Takeover", on reads)."""
    held = side.held
    replicas = [] if held is None else await held.store.for_key(bucket, key)
    if not replicas:
        return None
    assert held is not None
    if held.is_servable is not None and not await held.is_servable(replicas[0]):
        return None
    return replicas[0]


def as_row(replica: Replica) -> LocalObject:
    """A replica as a journal row of its writer's version (for the read path)."""
    parts = tuple(
        PartRef(blob_id, size, etag)
        for blob_id, (size, etag) in zip(replica.blob_ids, replica.parts, strict=False)
    )
    single = replica.blob_ids[0] if replica.blob_ids and not replica.parts else None
    return LocalObject(
        replica.meta,
        replica.seq,
        FlushState.PENDING,
        single,
        replica.is_delete,
        parts=parts,
        acked_s=replica.acked_s,
        body=replica.body,
    )
