"""The emulator's throttle (loadtest/throttle.py): partitions the clients cannot see, limits
that change, storms, splits. Clock-driven: no sleeps."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

from emulator import EmulatorThread
from throttle import PrefixLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _allowed(lim: PrefixLimiter, keys: list[str]) -> list[bool]:
    return [lim.allow("b", k) for k in keys]


def test_a_coarse_partition_is_shared_by_every_prefix_under_it() -> None:
    clock = Clock()
    lim = PrefixLimiter(rate=1.0, depth=1, burst=2, clock=clock)
    keys = ["ckpt/step_1/rank_0/a", "ckpt/step_1/rank_1/a", "ckpt/step_2/rank_0/a"]
    assert _allowed(lim, keys) == [True, True, False]  # one bucket of 2 for all of ckpt/
    assert lim.partition_of("b", keys[2]) == "ckpt/"
    assert lim.allow("b", "other/x")  # another partition


def test_limit_schedule_changes_the_rate_and_keeps_the_tokens() -> None:
    clock = Clock()
    lim = PrefixLimiter(rate=2.0, depth=1, burst=1, clock=clock, schedule=[(10.0, 0.5)])
    assert lim.allow("b", "p/x")  # t0 = 100
    clock.now += 0.5
    assert lim.allow("b", "p/x")  # 2/s: one token in 0.5 s
    clock.now = 110.0
    assert lim.factor(clock.now) == 0.5
    assert lim.allow("b", "p/x")  # the bucket kept (filled to) its burst
    clock.now += 0.5
    assert not lim.allow("b", "p/x")  # now 1/s: 0.5 s earns half a token
    clock.now += 0.5
    assert lim.allow("b", "p/x")


def test_storm_refuses_everything_for_its_span() -> None:
    clock = Clock()
    lim = PrefixLimiter(rate=100.0, depth=1, clock=clock, storm=(5.0, 20.0))
    assert lim.allow("b", "p/x")
    clock.now += 5.0
    assert not lim.in_storm(clock.now - 0.001)
    assert [lim.allow("b", f"q{i}/x") for i in range(3)] == [False] * 3
    clock.now = 100.0 + 20.0
    assert lim.allow("b", "p/y")


def test_a_partition_under_sustained_load_splits_where_its_keys_differ() -> None:
    clock = Clock()
    lim = PrefixLimiter(rate=4.0, depth=1, burst=4, clock=clock, split_after=10.0)
    keys = [f"ckpt/step_1/rank_{r}/shard" for r in range(4)]
    for i in range(4 * 13):  # 4/s, every request accepted, for 13 s
        assert lim.allow("b", keys[i % 4])
        clock.now += 0.25
        if ("b", "ckpt/") in lim.splits:
            break
    depth, at = lim.splits[("b", "ckpt/")]
    assert depth == 3  # ckpt/step_1/ would not separate them: the ranks do
    assert 10.0 <= at - 100.0 <= 12.0
    assert lim.partition_of("b", keys[0]) == "ckpt/step_1/rank_0/"
    assert all(lim.allow("b", k) for k in keys for _ in range(4))  # 4 buckets of 4 now
    assert lim.describe()["splits"]["b/ckpt/"]["child_depth"] == 3


def test_no_split_without_sustained_load() -> None:
    clock = Clock()
    lim = PrefixLimiter(rate=4.0, depth=1, burst=4, clock=clock, split_after=5.0)
    for i in range(40):  # 1/s: a quarter of the rate
        lim.allow("b", f"ckpt/step_1/rank_{i % 4}/x")
        clock.now += 1.0
    assert lim.splits == {}


def test_emulator_logs_the_partition_and_reports_the_limiter() -> None:
    with EmulatorThread(
        latency_ms=0, prefix_rate=0.01, prefix_burst=1, storm=(1000.0, 2000.0), buckets=["bk"]
    ) as server:
        s3: Any = boto3.client(
            "s3",
            endpoint_url=server.url,
            aws_access_key_id="k",
            aws_secret_access_key="s",
            region_name="us-east-1",
            config=Config(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"}),
        )
        s3.put_object(Bucket="bk", Key="ckpt/step_1/rank_0/a", Body=b"a")
        with pytest.raises(ClientError):  # the default depth is 1: ckpt/ is one partition
            s3.put_object(Bucket="bk", Key="ckpt/step_1/rank_1/a", Body=b"b")
        log, stats = server.log, server.stats()
    assert [(e["prefix"], e["partition"], e["status"]) for e in log] == [
        ("ckpt/", "ckpt/", 200),
        ("ckpt/", "ckpt/", 503),
    ]
    assert stats["config"]["prefix_depth"] == 1
    assert stats["config"]["storm"] == (1000.0, 2000.0)
    assert stats["limiter"]["t0_wall"] is not None and not stats["limiter"]["in_storm"]
