"""The write-metrics middleware: what it records for a write, and what it must not record."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.clock import FakeClock
from gateway.errors import PreconditionFailed
from gateway.metrics import REGISTRY
from gateway.s3 import operations as ops
from gateway.s3.dispatch import OPERATION
from gateway.s3.metrics import WRITE_OPERATIONS, note_ingested, write_metrics
from gateway.s3.middleware import s3_errors


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def snapshot(operation: str) -> tuple[float, float, float, float]:
    return (
        sample("gateway_ack_latency_seconds_count", operation=operation),
        sample("gateway_ack_latency_seconds_sum", operation=operation),
        sample("gateway_ingest_objects_total", operation=operation),
        sample("gateway_ingest_bytes_total"),
    )


async def app_client(
    aiohttp_client: Any,
    clock: FakeClock,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Any:
    app = web.Application(middlewares=[s3_errors, write_metrics(clock)])
    app.router.add_route("*", "/{tail:.*}", handler)
    return await aiohttp_client(app)


def test_every_write_series_exists_from_the_start() -> None:
    for name in WRITE_OPERATIONS.values():
        assert (
            REGISTRY.get_sample_value("gateway_ack_latency_seconds_count", {"operation": name})
            is not None
        )
        assert (
            REGISTRY.get_sample_value("gateway_ingest_objects_total", {"operation": name})
            is not None
        )


async def test_successful_put_records_latency_object_and_bytes(aiohttp_client: Any) -> None:
    clock = FakeClock()

    async def handler(request: web.Request) -> web.StreamResponse:
        request[OPERATION] = ops.PutObject("b", "k")
        clock.advance(0.003)
        note_ingested(request, 1234)
        return web.Response(status=200)

    client = await app_client(aiohttp_client, clock, handler)
    before = snapshot("put_object")
    resp = await client.put("/b/k", data=b"x")
    assert resp.status == 200
    count, total_s, objects, size = snapshot("put_object")
    assert count - before[0] == 1
    assert abs((total_s - before[1]) - 0.003) < 1e-9
    assert objects - before[2] == 1
    assert size - before[3] == 1234


async def test_write_without_a_body_counts_no_bytes(aiohttp_client: Any) -> None:
    clock = FakeClock()

    async def handler(request: web.Request) -> web.StreamResponse:
        request[OPERATION] = ops.DeleteObject("b", "k")
        return web.Response(status=204)

    client = await app_client(aiohttp_client, clock, handler)
    before = snapshot("delete_object")
    assert (await client.delete("/b/k")).status == 204
    after = snapshot("delete_object")
    assert after[0] - before[0] == 1
    assert after[2] - before[2] == 1
    assert after[3] == before[3]


async def test_failed_write_and_reads_are_not_recorded(aiohttp_client: Any) -> None:
    clock = FakeClock()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            request[OPERATION] = ops.GetObject("b", "k")
            return web.Response(status=200, body=b"data")
        request[OPERATION] = ops.PutObject("b", "k")
        note_ingested(request, 99)
        raise PreconditionFailed()

    client = await app_client(aiohttp_client, clock, handler)
    before = snapshot("put_object")
    assert (await client.put("/b/k", data=b"x")).status == 412
    assert (await client.get("/b/k")).status == 200
    assert snapshot("put_object") == before
    assert (
        REGISTRY.get_sample_value("gateway_ack_latency_seconds_count", {"operation": "get_object"})
        is None
    )
