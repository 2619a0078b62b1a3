"""A bucket's learnt request rate survives a restart (``flush/memory.py``) over real
sockets: a gateway drains into a throttled partition of the emulator and learns its limit;
killed (-9) or stopped, and started again on its data dir, its first flush to the bucket
starts from that figure (a slow start to it within a second) instead of 10 requests/s
with nothing known."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from harness import REPO_ROOT, GatewayProcess, payload

from gateway.flush.memory import SAVE_INTERVAL_S

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
        time.sleep(SAVE_INTERVAL_S + 1)  # the saver's round: what a kill -9 leaves
        for hard in (True, False):  # kill -9, then SIGTERM (the stop records every rate)
            gw.restart(hard=hard)
            assert budget(gw) is None  # no budget before the first write to the bucket
            write_and_drain(gw, [f"ckpt/c/{hard}"])
            remembered = budget(gw)
            assert remembered is not None, gw.status()["flow_budgets"]
            assert remembered["events"] == 0  # nothing refused since: the last run's figure
            assert remembered["w_max_per_s"] == limit
        assert gw.log_path.read_text().count("the last run's rate") == 2
    finally:
        gw.stop()
        emu.stop()
