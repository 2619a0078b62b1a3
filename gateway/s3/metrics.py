"""Ack latency and ingest counters of S3 writes, recorded in one middleware.

``dispatch`` stores the parsed operation on the request (``OPERATION``); handlers that store
a request body report its decoded size with ``note_ingested`` (they already know it from the
service's result, so nothing is counted twice). The middleware records a write only when
its handler returned a 2xx: an S3 error raised by the handler propagates through it to
``s3_errors`` unrecorded.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import Counter, Histogram

from gateway.clock import Clock
from gateway.metrics import ACK_LATENCY_S, INGEST_BYTES, INGEST_OBJECTS
from gateway.s3 import operations as ops
from gateway.s3.dispatch import OPERATION

INGESTED_BYTES = web.RequestKey("ingested_bytes", int)

# The acknowledged writes, labelled with the handler's name (snake_case of the AWS name).
WRITE_OPERATIONS: dict[type[ops.Operation], str] = {
    ops.PutObject: "put_object",
    ops.UploadPart: "upload_part",
    ops.UploadPartCopy: "upload_part_copy",
    ops.CreateMultipartUpload: "create_multipart_upload",
    ops.CompleteMultipartUpload: "complete_multipart_upload",
    ops.CopyObject: "copy_object",
    ops.DeleteObject: "delete_object",
    ops.DeleteObjects: "delete_objects",
}
# Label children resolved once: every series exists (at 0) from the start, and a request
# pays no label lookup.
_SERIES: dict[type[ops.Operation], tuple[Histogram, Counter]] = {
    op_type: (ACK_LATENCY_S.labels(name), INGEST_OBJECTS.labels(name))
    for op_type, name in WRITE_OPERATIONS.items()
}


def note_ingested(request: web.Request, size_bytes: int) -> None:
    """Report the decoded body bytes a write handler stored (counted if it succeeds)."""
    request[INGESTED_BYTES] = size_bytes


def write_metrics(clock: Clock) -> Middleware:
    """A middleware observing ``gateway_ack_latency_seconds`` (request start to handler
    return) and the ingest counters for every successful write operation."""

    @web.middleware
    async def record_writes(request: web.Request, handler: Handler) -> web.StreamResponse:
        started_s = clock.monotonic()
        response = await handler(request)
        op = request.get(OPERATION)
        series = None if op is None else _SERIES.get(type(op))
        if series is not None and 200 <= response.status < 300:
            latency, objects = series
            latency.observe(clock.monotonic() - started_s)
            objects.inc()
            size_bytes = request.get(INGESTED_BYTES)
            if size_bytes:
                INGEST_BYTES.inc(size_bytes)
        return response

    return record_writes
