"""GET /metrics: ack latency, ingest, upstream requests and backlog gauges, as scraped.

Counters are process-wide and the gateway is shared by the module, so every assertion on a
counter is on its increase across the steps of one test.
"""

from __future__ import annotations

import time
from typing import Any

from harness import payload
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
_PUT_200 = {"operation": "PutObject", "status": "200"}


def scrape(gateway: Any) -> Samples:
    resp = gateway.admin_request("GET", "/metrics")
    assert resp.status == 200, resp.body[:500]
    assert (resp.header("content-type") or "").startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(resp.body.decode())
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 for a labelled series not created yet (a counter not yet hit)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def increase(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_writes_and_flushes_are_counted(gateway: Any, s3: Any, bucket: str) -> None:
    bodies = [payload(size, seed=f"metrics-{size}") for size in (1, 1000, 65_536, 300_001)]
    before = scrape(gateway)
    for i, body in enumerate(bodies):
        s3.put_object(Bucket=bucket, Key=f"m/obj{i}", Body=body)
    s3.copy_object(Bucket=bucket, Key="m/copy", CopySource={"Bucket": bucket, "Key": "m/obj1"})
    s3.delete_object(Bucket=bucket, Key="m/obj0")
    gateway.drained(bucket=bucket)
    after = scrape(gateway)

    ack = "gateway_ack_latency_seconds"
    assert increase(before, after, f"{ack}_count", operation="put_object") == len(bodies)
    assert increase(before, after, f"{ack}_sum", operation="put_object") > 0
    assert increase(before, after, f"{ack}_bucket", operation="put_object", le="+Inf") == len(
        bodies
    )
    assert increase(before, after, f"{ack}_count", operation="copy_object") == 1
    assert increase(before, after, f"{ack}_count", operation="delete_object") == 1
    assert increase(before, after, f"{ack}_count", operation="get_object") == 0
    ingest = "gateway_ingest_objects_total"
    assert increase(before, after, ingest, operation="put_object") == len(bodies)
    assert increase(before, after, ingest, operation="copy_object") == 1
    assert increase(before, after, ingest, operation="delete_object") == 1
    # Only request bodies count as ingested bytes: a copy or a delete adds none.
    assert increase(before, after, "gateway_ingest_bytes_total") == sum(map(len, bodies))

    # Flushed: at least the three surviving objects plus the copy went up as PutObject.
    upstream = "gateway_upstream_requests_total"
    assert increase(before, after, upstream, operation="PutObject", status="200") >= 4
    assert increase(before, after, "gateway_flushed_objects") >= 4
    assert value(after, "gateway_pending_objects") == 0
    assert value(after, "gateway_pending_bytes") == 0
    assert value(after, "gateway_oldest_unflushed_seconds") == 0
    assert value(after, "gateway_failed_objects") == 0
    assert value(after, "gateway_cache_used_bytes") >= 0


def test_backlog_gauges_while_paused(gateway: Any, s3: Any, bucket: str) -> None:
    gateway.drained()
    bodies = [payload(size, seed=f"paused-{size}") for size in (10, 20_000, 123_457)]
    with gateway.flush_paused():
        before = scrape(gateway)
        for i, body in enumerate(bodies):
            s3.put_object(Bucket=bucket, Key=f"p/obj{i}", Body=body)
        time.sleep(0.2)
        paused = scrape(gateway)
        assert value(paused, "gateway_pending_objects") == len(bodies)
        assert value(paused, "gateway_pending_bytes") == sum(map(len, bodies))
        # Nothing failed or held: everything unflushed is pending; the flusher says paused.
        assert value(paused, "gateway_unflushed_objects") == len(bodies)
        assert value(paused, "gateway_unflushed_bytes") == sum(map(len, bodies))
        assert value(paused, "gateway_failed_objects") == value(paused, "gateway_held_objects") == 0
        assert value(paused, "gateway_flush_paused") == 1
        # The lane's limit and its measured rate are separate series: 3500/s may be sent,
        # none is accepted while paused.
        lane = {"bucket": bucket, "lane": "p/"}
        assert value(paused, "gateway_lane_rate_limit_per_second", **lane) == 3500
        assert value(paused, "gateway_lane_accepted_per_second", **lane) == 0
        assert value(paused, "gateway_lane_pending_objects", **lane) == len(bodies)
        assert value(paused, "gateway_oldest_unflushed_seconds") >= 0.2
        assert value(paused, "gateway_cache_used_bytes") >= sum(map(len, bodies))
        # Nothing of these reached the upstream while paused.
        assert increase(before, paused, "gateway_upstream_requests_total", **_PUT_200) == 0
    gateway.drained(bucket=bucket)
    after = scrape(gateway)
    assert increase(before, after, "gateway_upstream_requests_total", **_PUT_200) >= len(bodies)
    assert value(after, "gateway_pending_objects") == 0
    assert value(after, "gateway_pending_bytes") == 0
    assert value(after, "gateway_oldest_unflushed_seconds") == 0
    assert value(after, "gateway_flush_paused") == 0
    # Measured over the last 10 s: the drain that just ended still shows.
    assert value(after, "gateway_flush_rate_bytes_per_second") > 0


def test_multipart_is_counted_per_part(gateway: Any, s3: Any, bucket: str) -> None:
    parts = [payload(5 * 1024 * 1024, seed="mp-1"), payload(4321, seed="mp-2")]
    before = scrape(gateway)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="mp/obj")["UploadId"]
    etags = [
        s3.upload_part(Bucket=bucket, Key="mp/obj", UploadId=upload_id, PartNumber=n, Body=body)[
            "ETag"
        ]
        for n, body in enumerate(parts, 1)
    ]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="mp/obj",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    gateway.drained(bucket=bucket)
    after = scrape(gateway)

    ack = "gateway_ack_latency_seconds_count"
    assert increase(before, after, ack, operation="create_multipart_upload") == 1
    assert increase(before, after, ack, operation="upload_part") == 2
    assert increase(before, after, ack, operation="complete_multipart_upload") == 1
    ingest = "gateway_ingest_objects_total"
    assert increase(before, after, ingest, operation="upload_part") == 2
    assert increase(before, after, ingest, operation="complete_multipart_upload") == 1
    # The parts' bytes, once: completing the upload adds none.
    assert increase(before, after, "gateway_ingest_bytes_total") == sum(map(len, parts))
    # Flushed with the same part boundaries.
    upstream = "gateway_upstream_requests_total"
    assert increase(before, after, upstream, operation="CreateMultipartUpload", status="200") >= 1
    assert increase(before, after, upstream, operation="UploadPart", status="200") >= 2
    assert increase(before, after, upstream, operation="CompleteMultipartUpload", status="200") >= 1
