"""A bucket's learnt request rate survives a restart (``flush/memory.py``) over real
sockets: a gateway drains into a throttled partition of the emulator and learns its limit;
stopped and started again on its data dir, its first flush to the bucket starts from that
figure (a slow start to it within a second) instead of 10 requests/s with nothing known."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from harness import REPO_ROOT, GatewayProcess, payload

sys.path.insert(0, str(REPO_ROOT / "loadtest"))

from emulator import EmulatorThread

BUCKET = "memory"


def budget(gw: GatewayProcess) -> dict[str, Any] | None:
    budgets = gw.status()["flow_budgets"]
    return next((b for b in budgets if b["bucket"] == BUCKET), None)


def write_and_drain(gw: GatewayProcess, keys: list[str]) -> None:
    gw.pause_flush()
    client = gw.client()
    for key in keys:
        client.put_object(Bucket=BUCKET, Key=key, Body=payload(1000, key))
    gw.resume_flush()
    gw.drained(bucket=BUCKET, timeout=120)


def test_a_restarted_gateway_starts_from_the_rate_it_learnt(tmp_path: Path) -> None:
    emu = EmulatorThread(latency_ms=1, prefix_rate=30, prefix_depth=1, buckets=[BUCKET]).start()
    gw = GatewayProcess(tmp_path / "gw", emu.url)
    try:
        gw.start()
        write_and_drain(gw, [f"ckpt/a/{i}" for i in range(1)])
        fresh = budget(gw)
        assert fresh is not None and fresh["w_max_per_s"] is None  # nothing known yet
        write_and_drain(gw, [f"ckpt/b/{i}" for i in range(150)])  # 10/s up to 30/s: 503s
        learnt = budget(gw)
        assert learnt is not None and learnt["events"] >= 1, learnt
        limit = learnt["w_max_per_s"]
        assert 10 < limit < 40, learnt
        gw.restart(hard=False)  # SIGTERM: the stop records every bucket's rate
        assert budget(gw) is None  # no budget before the first write to the bucket
        write_and_drain(gw, ["ckpt/c/0"])
        remembered = budget(gw)
        assert remembered is not None, gw.status()["flow_budgets"]
        assert remembered["events"] == 0  # nothing refused since: the figure is the last run's
        assert remembered["w_max_per_s"] == limit
        assert "the last run's rate" in gw.log_path.read_text()
    finally:
        gw.stop()
        emu.stop()
