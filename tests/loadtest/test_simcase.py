"""``bench.py --sim``'s simulator runs: a fresh case, and the second checkpoint of a
warm-up (restarted from what the first learnt, or with gateway 0 replaced)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

import simcase

THROTTLES = {"latency_ms": 35.0, "bandwidth": 200e6, "prefix_rate": 200.0}
CASE = {"ranks": 16, "size_bytes": 4096, "ingest_s": 0.0, "paused_ingest": True, "seeds": [1]}


def test_a_restart_from_what_was_learnt_saves_the_slow_start() -> None:
    throttles = {**THROTTLES, "prefix_depth": 1, "prefix_burst": 200.0}
    fresh = simcase.simulate(throttles, gateways=1, shards=150, **CASE)  # type: ignore[arg-type]
    warm = simcase.simulate(throttles, gateways=1, shards=150, warm_up=True, **CASE)  # type: ignore[arg-type]
    assert fresh.ratio > 1.2 and warm.ratio < 1.12, (fresh.ratio, warm.ratio)


def test_a_replaced_gateway_starts_fresh_among_the_others() -> None:
    throttles = {**THROTTLES, "prefix_depth": 1, "prefix_burst": 200.0}
    kw = {"gateways": 3, "shards": 40, "fleet": True, **CASE}
    restarted = simcase.simulate(throttles, warm_up=True, **kw)  # type: ignore[arg-type]
    replaced = simcase.simulate(throttles, warm_up="replace one", **kw)  # type: ignore[arg-type]
    assert restarted.ratio < replaced.ratio < 1.3, (restarted.ratio, replaced.ratio)
