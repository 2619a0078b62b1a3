"""The bench's flow figures (loadtest/flowstats.py) on small, hand-made logs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

from flowstats import Throttles, flow_figures, gateway_of, jain, minimum_s, recovery_s

KEYS = [f"ckpt/step_1/rank_{r}/shard_{i:05d}" for r in range(4) for i in range(10)]


def test_minimum_one_shared_partition() -> None:
    model = Throttles(rate_per_s=2.0, depth=1, burst=4, bandwidth=0)
    assert minimum_s(model, KEYS, 1000) == pytest.approx((40 - 4) / 2.0)


def test_minimum_partition_per_rank_and_the_bandwidth_cap() -> None:
    model = Throttles(rate_per_s=2.0, depth=3, burst=2, bandwidth=0)
    assert minimum_s(model, KEYS, 1000) == pytest.approx((40 - 8) / 8.0)
    capped = Throttles(rate_per_s=2.0, depth=3, burst=2, bandwidth=4000)  # 4 objects/s
    # The bursts send requests at once, but their bytes still cross the link: 40 / 4.
    assert minimum_s(capped, KEYS, 1000) == pytest.approx(40 / 4.0)


def test_minimum_follows_the_schedule_the_storm_and_the_split() -> None:
    doubled = Throttles(rate_per_s=2.0, depth=1, burst=4, bandwidth=0, schedule=((10.0, 2.0),))
    assert minimum_s(doubled, KEYS, 1000) == pytest.approx(10.0 + (36 - 20) / 4.0)
    storm = Throttles(rate_per_s=2.0, depth=1, burst=4, bandwidth=0, storm=(5.0, 15.0))
    assert minimum_s(storm, KEYS, 1000) == pytest.approx(18.0 + 10.0)
    split = Throttles(rate_per_s=1.0, depth=1, burst=4, bandwidth=0, split_after=10.0)
    assert minimum_s(split, KEYS, 1000) == pytest.approx(10.0 + (36 - 10) / 4.0)  # into 4 ranks


def test_gateway_of_and_jain() -> None:
    assert gateway_of("ckpt/step_1/rank_17/shard_00001", 8) == 2
    assert jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0]) == pytest.approx(0.5)


def _entry(key: str, ts: float, status: int = 200) -> dict[str, Any]:
    code = "SlowDown" if status == 503 else None
    return {
        "op": "PutObject",
        "key": key,
        "ts": ts,
        "ts_end": ts + 0.1,
        "status": status,
        "code": code,
    }


def test_flow_figures_per_gateway_after_3_s_fairness_and_finish() -> None:
    log = [
        _entry("ckpt/step_1/rank_0/a", 100.0, 503),  # gateway 0, in its first 3 s
        _entry("ckpt/step_1/rank_0/a", 101.0),
        _entry("ckpt/step_1/rank_0/b", 104.0, 503),  # after its first 3 s
        _entry("ckpt/step_1/rank_0/b", 105.0),
        _entry("ckpt/step_1/rank_2/a", 102.0),  # gateway 1 (2 ranks per gateway)
        _entry("ckpt/step_1/rank_3/a", 103.0),
        _entry("ckpt/step_1/rank_3/b", 110.0),
        {"op": "ListObjectsV2", "key": "", "ts": 1.0, "ts_end": 1.0, "status": 200, "code": None},
    ]
    f = flow_figures(log, gateways=2, ranks_per_gateway=2, started_wall=99.0)
    assert (f["requests"], f["slowdown_503"]) == (7, 2)
    assert (f["after_3s_requests"], f["after_3s_503"]) == (3, 1)  # gateway 0: 2, gateway 1: 1
    assert [g["finished_s"] for g in f["gateways"]] == pytest.approx([6.1, 11.1])
    assert f["finish_spread"] == pytest.approx(11.1 / 6.1, rel=1e-3)
    assert f["jain"] == pytest.approx(jain([2.0, 2.0]))  # accepted until the first finished


def test_storm_503s_are_left_out_and_the_recovery_is_timed() -> None:
    log = [_entry(f"ckpt/step_1/rank_0/s{i}", 100.0 + i * 0.1, 503) for i in range(50, 100)]
    log += [_entry(f"ckpt/step_1/rank_0/x{i}", 110.0 + i * 0.2) for i in range(10)]
    log += [_entry(f"ckpt/step_1/rank_0/y{i}", 112.0 + i * 0.1) for i in range(20)]
    f = flow_figures(
        log,
        gateways=1,
        ranks_per_gateway=1,
        started_wall=104.0,
        limit_per_s=10.0,
        storm_wall=(105.0, 110.0),
    )
    assert f["after_3s_503"] == 0  # every 503 fell in the storm
    # 9 acceptances (90 % of 10) in the second from 111.75 on: 2.75 s after the end
    assert f["storm_recovery_s"] == pytest.approx(2.75)
    assert recovery_s([], 0.0, 10.0) is None
