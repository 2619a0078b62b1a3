"""The simulator (tests/sim) on a bench case: the same partitions, link, latency, write-
back delay and ingest time, so that ``bench.py --sim`` prints the simulator's figure next
to the bench's (issue 22: the two within 15 % of each other)."""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "sim"))

from s3sim import Net, Result, S3Model, run

WRITE_BACK_S = 0.5  # the gateways' default --write-back-delay


@dataclass(frozen=True, slots=True)
class SimFigures:
    ratios: list[float]  # drain / minimum, one per seed
    share_503: float  # the worst seed's
    finish_spread: float  # the worst seed's

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)


def simulate(
    throttles: dict[str, Any],
    *,
    gateways: int,
    ranks: int,
    shards: int,
    size_bytes: int,
    ingest_s: float,
    paused_ingest: bool,
    seeds: list[int],
    fleet: bool = False,
    warm_up: str | bool = False,
) -> SimFigures:
    """The bench's case in the simulator (``throttles``: the emulator's options). With
    ``warm_up`` the figure is a second run's, its gateways started from what the first
    run's learnt (``known_rates``: a restart, or the next checkpoint after idle, which
    starts the same way); ``"replace one"``: gateway 0 starts fresh."""
    latency_s = float(throttles["latency_ms"]) / 1000
    net = Net(
        up_s=latency_s / 2,
        down_s=latency_s / 2,
        jitter_s=0.002,
        conn_bytes_per_s=float(throttles.get("request_bandwidth", 0)),
        link_bytes_per_s=float(throttles.get("bandwidth", 0)),
    )

    def once(seed: int, known: list[dict[str, float]]) -> Result:
        s3 = S3Model(
            rate_per_s=float(throttles["prefix_rate"]),
            depth=int(throttles["prefix_depth"]),
            burst=float(throttles["prefix_burst"]),
        )
        return run(
            s3,
            gateways=gateways,
            ranks=ranks,
            shards=shards,
            seed=seed,
            net=net,
            size_bytes=size_bytes,
            write_back_s=0.0 if paused_ingest else WRITE_BACK_S,
            ingest_s=0.0 if paused_ingest else ingest_s,
            fleet_shares=fleet,
            known_rates=known,
        )

    results = []
    for seed in seeds:
        result = once(seed, [])
        if warm_up:
            known = result.known_rates
            result = once(seed + 1000, [{}, *known[1:]] if warm_up == "replace one" else known)
        results.append(result)
    return SimFigures(
        [round(r.ratio, 3) for r in results],
        max(r.share_503 for r in results),
        max(r.finish_spread for r in results),
    )
