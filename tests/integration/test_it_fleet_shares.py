"""The fleet's shares of a bucket (``flush/shares.py``) over real sockets: two gateways
of one fleet drain into one throttled partition of the emulator; the one that finishes
first stops reporting the bucket in its lease renewals, and the other takes its share
over at once (its metric counts it) instead of finding it by probing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fleetutil import fleet_of, start_all, stop_all, until, wait_joined
from harness import REPO_ROOT, GatewayProcess, payload, quoted_md5, upstream_client

sys.path.insert(0, str(REPO_ROOT / "loadtest"))

from emulator import EmulatorThread

BUCKET = "shares"


def shares_taken(gw: GatewayProcess) -> float:
    return gw.metric("gateway_flow_shares_taken", f'bucket="{BUCKET}"')


def test_a_gateway_done_with_a_bucket_hands_its_share_to_the_one_still_sending(
    tmp_path: Path,
) -> None:
    emu = EmulatorThread(latency_ms=1, prefix_rate=20, prefix_depth=1, buckets=[BUCKET]).start()
    a, b = fleet_of(tmp_path, emu.url, ("a", "b"))
    writes = {a: [f"ckpt/a/{i}" for i in range(30)], b: [f"ckpt/b/{i}" for i in range(120)]}
    try:
        start_all((a, b))
        wait_joined([a, b], ("a", "b"))
        for gw, keys in writes.items():
            gw.pause_flush()
            for key in keys:
                gw.client().put_object(Bucket=BUCKET, Key=key, Body=payload(2000, key))
        for gw in (a, b):
            gw.resume_flush()
        a.drained(bucket=BUCKET, timeout=60)
        assert shares_taken(a) == 0  # nobody stopped before it
        # a's next renewals leave the bucket out: b, still sending, takes a's share.
        until(lambda: shares_taken(b) >= 1, 15, "b to take a's share over")
        shares = b.admin_get("/admin/v1/fleet")["shares"]
        assert shares["handovers"] >= 1 and shares["taken_per_s"] > 0, shares
        b.drained(bucket=BUCKET, timeout=120)
        landed: dict[str, Any] = {
            o["Key"]: o["ETag"]
            for page in upstream_client(emu.url)
            .get_paginator("list_objects_v2")
            .paginate(Bucket=BUCKET)
            for o in page.get("Contents", [])
        }
    finally:
        stop_all((a, b))
        emu.stop()
    want = {k: quoted_md5(payload(2000, k)) for keys in writes.values() for k in keys}
    assert landed == want
