"""With replicas on, every upload also claims its version in the bucket (two requests of
its own, three with a look: docs/fleet.md, "Takeover"). Over real sockets against the
throttling emulator: those requests go through the node's request gate like the data's,
so each 503 S3 answers a claim is a throttle the flow control hears of (and retries), not
a failed upload behind its back."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetutil import fleet_of, start_all, stop_all, wait_joined
from harness import REPO_ROOT, GatewayProcess, http_request, payload, quoted_md5, upstream_client

sys.path.insert(0, str(REPO_ROOT / "loadtest"))

from emulator import EmulatorThread

BUCKET = "claims-flow"
CONTROL = ".gateway/"


def throttles_heard(gw: GatewayProcess) -> float:
    """``gateway_flush_throttles_total`` summed over its lanes."""
    text = http_request("GET", f"{gw.admin}/metrics", timeout=10).body.decode()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("gateway_flush_throttles_total{")
    )


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    # One partition per top-level prefix, a few requests a second: the claims (under the
    # control prefix) and the data (under ckpt/) are each refused in their own partition.
    emu = EmulatorThread(latency_ms=1, prefix_rate=6, prefix_depth=1, buckets=[BUCKET]).start()
    try:
        yield emu
    finally:
        emu.stop()


def test_every_claim_request_refused_by_the_bucket_is_a_throttle_of_the_gate(
    emulator: EmulatorThread, tmp_path: Path
) -> None:
    a, b = fleet_of(tmp_path, emulator.url, ("a", "b"), ("--replicas", "1"))
    try:
        start_all((a, b))
        wait_joined([a, b], ("a", "b"))
        keys = [f"ckpt/step_1/{i}" for i in range(24)]
        b.pause_flush()
        for key in keys:
            b.client().put_object(Bucket=BUCKET, Key=key, Body=payload(3000, key))
        b.resume_flush()
        b.drained(bucket=BUCKET, timeout=120)
        heard = throttles_heard(b)
    finally:
        stop_all((a, b))
    upstream = upstream_client(emulator.url)
    landed: dict[str, Any] = {
        o["Key"]: o["ETag"]
        for page in upstream.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        for o in page.get("Contents", [])
        if not o["Key"].startswith(CONTROL)
    }
    assert landed == {k: quoted_md5(payload(3000, k)) for k in keys}
    log = emulator.call(lambda: list(emulator.emulator.log))
    refused = [e for e in log if e["code"] == "SlowDown"]
    refused_claims = [e for e in refused if str(e["key"]).startswith(CONTROL)]
    assert refused_claims, "the control prefix's partition never refused: the case is not met"
    # Only b sent anything to the bucket; each refusal reached its gate, once.
    assert heard == len(refused)
