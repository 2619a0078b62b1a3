"""A multipart flush through the request gate: CreateMultipartUpload, every part at once
(each its own request on its own connection, as many in flight as the gate's window
allows), CompleteMultipartUpload; each request admitted, paced, retried and its answer
reported by the gate, so a throttle of any of them teaches the budget exactly once.

The part boundaries are the caller's (a client's own parts, or ``split_parts`` of a large
single PUT), so the upstream ETag is the one the client saw. The upload is recorded while
it is open (``UpstreamUploads``: an intent before the create, its row after), so a crash
at any point leaves a trace the sweep aborts; a failure the gate gives up on aborts it at
once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from gateway.flush.gate import RequestGate
from gateway.flush.lanes import Lane
from gateway.flush.orphans import UpstreamUploads
from gateway.models import ObjectMeta
from gateway.upstream.classify import FlushError, for_flush
from gateway.upstream.client import PartSource, Upstream


async def put_parts(
    gate: RequestGate,
    upstream: Upstream,
    uploads: UpstreamUploads,
    lane: Lane,
    order: int,
    meta: ObjectMeta,
    parts: Sequence[PartSource],
) -> str:
    """Upload ``parts`` as one multipart object; its ETag. Raises the ``FlushError`` that
    ended it. A cancelled upload (the shutdown deadline) keeps its records for the next
    start's sweep."""
    bucket, key = meta.bucket, meta.key
    intent = await uploads.begin(bucket, key)
    try:
        upload_id = await gate.send_retrying(
            lane, order, 0, lambda: upstream.create_multipart(meta), claimed=True
        )
    except Exception:
        await uploads.end(intent)
        raise
    try:
        await uploads.track(upload_id, bucket, key, False)
        await uploads.end(intent)
        etag = await _send_parts(gate, upstream, lane, order, meta, upload_id, parts)
    except BaseException as exc:
        aborted = await asyncio.shield(_abort(upstream, bucket, key, upload_id))
        if aborted:
            await asyncio.shield(uploads.track(upload_id, bucket, key, True))
        if isinstance(exc, Exception) and not isinstance(exc, FlushError):
            raise for_flush(exc) from exc
        raise
    await uploads.track(upload_id, bucket, key, True)
    return etag


async def _send_parts(
    gate: RequestGate,
    upstream: Upstream,
    lane: Lane,
    order: int,
    meta: ObjectMeta,
    upload_id: str,
    parts: Sequence[PartSource],
) -> str:
    bucket, key = meta.bucket, meta.key

    async def send(number: int, part: PartSource) -> tuple[int, str]:
        etag = await gate.send_retrying(
            lane,
            order,
            part.size_bytes,
            lambda: upstream.upload_part(bucket, key, upload_id, number, part),
            claimed=True,
        )
        return number, etag

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(send(i, p)) for i, p in enumerate(parts, 1)]
    except* FlushError as failed:
        raise failed.exceptions[0] from None
    done = [t.result() for t in tasks]
    return await gate.send_retrying(
        lane,
        order,
        0,
        lambda: upstream.complete_multipart(bucket, key, upload_id, done),
        claimed=True,
    )


async def _abort(upstream: Upstream, bucket: str, key: str, upload_id: str) -> bool:
    """Abort after a failure, at once and outside the budget: it frees storage, and must
    not queue behind the flush (nor outlive the shutdown deadline in a queue). False if
    it failed (the sweep tries again)."""
    with contextlib.suppress(FlushError):
        return await upstream.abort_multipart(bucket, key, upload_id)
    return False
