"""RateMemory: the buckets' learnt rates go to a store when they change and at the stop,
and come back to the lanes at the next start (``flush/memory.py``)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

import pytest

from gateway.clock import FakeClock
from gateway.flush.control import AdaptiveRate
from gateway.flush.lanes import LaneConfig, Lanes
from gateway.flush.memory import MAX_AGE_S, REFRESH_S, RateMemory


class Store:
    """The table's contract in memory: bucket -> (rate, recorded wall time)."""

    def __init__(self) -> None:
        self.records: dict[str, tuple[float, float]] = {}
        self.saves: list[dict[str, float]] = []
        self.fail = False

    async def load(self, since_wall_s: float) -> dict[str, float]:
        return {b: rate for b, (rate, at_s) in self.records.items() if at_s >= since_wall_s}

    async def save(self, rates: Mapping[str, float], now_wall_s: float) -> None:
        if self.fail:
            raise OSError("disk full")
        self.saves.append(dict(rates))
        self.records.update((b, (rate, now_wall_s)) for b, rate in rates.items())


def _learn_again(rate: AdaptiveRate, now_s: float) -> None:
    """Answers, then a throttle: a new congestion event measures a new limit."""
    for i in range(20):
        rate.on_success(now_s + i * 0.01, now_s + i * 0.01 + 0.005)
    assert rate.on_throttle(now_s + 0.3, now_s + 0.31)


def test_lanes_hand_a_remembered_rate_to_the_budget_they_make() -> None:
    lanes = Lanes(LaneConfig())
    lanes.remember({"a": 120.0, "b": 0.0, "c": math.inf, "d": math.nan})  # (nothing)
    assert lanes.known_rates() == {}  # nothing sent yet this run
    rate = lanes.budget("a", 0.0).rate
    assert (rate.w_max_per_s, rate.is_slow_start) == (120.0, True)
    assert [lanes.budget(b, 0.0).rate.w_max_per_s for b in "bcd"] == [None, None, None]
    assert lanes.known_rates() == {"a": 120.0}


async def test_recall_hands_recent_records_only_and_a_save_writes_what_changed() -> None:
    clock = FakeClock(wall_s=1_000_000.0)
    store = Store()
    store.records = {"a": (200.0, 1_000_000.0 - 60), "old": (50.0, 1_000_000.0 - MAX_AGE_S - 1)}
    lanes = Lanes(LaneConfig())
    memory = RateMemory(lanes, store, clock)
    assert await memory.recall() == {"a": 200.0}
    lanes.budget("a", clock.monotonic())
    await memory.save()
    assert store.saves == []  # a's rate is the one recalled: nothing to write
    budget = lanes.budget("c", clock.monotonic())
    budget.rate.take_share(clock.monotonic(), 10.0)  # (a rate with no limit known)
    await memory.save()
    assert store.saves == []
    clock.advance(1.0)
    budget.rate.on_throttle(clock.monotonic() - 0.5, clock.monotonic())  # c learns a limit
    await memory.save()
    assert list(store.saves[-1]) == ["c"]
    await memory.save(every=True)  # the stop's: every bucket sent to, as of now
    assert store.saves[-1].keys() == {"a", "c"}
    assert store.records["a"] == (200.0, clock.wall())
    saves = len(store.saves)
    await memory.save()
    assert len(store.saves) == saves  # nothing changed
    clock.advance(REFRESH_S)
    await memory.save()  # an hour on: every rate again, so none ages out while in use
    assert store.saves[-1].keys() == {"a", "c"}
    assert store.records["a"] == (200.0, clock.wall())


async def test_run_saves_on_its_interval_and_once_more_at_the_stop_and_outlives_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    store = Store()
    lanes = Lanes(LaneConfig())
    lanes.remember({"a": 80.0})
    memory = RateMemory(lanes, store, clock, interval_s=0.01)
    task = asyncio.create_task(memory.run())
    lanes.budget("a", clock.monotonic()).rate.on_throttle(0.0, 0.1)  # 80 -> what got through
    for _ in range(100):
        await asyncio.sleep(0.01)
        if store.saves:
            break
    assert store.saves, "the interval's save"
    store.fail = True
    _learn_again(lanes.budget("a", clock.monotonic()).rate, clock.monotonic())
    await asyncio.sleep(0.05)
    assert "could not record" in caplog.text
    assert not task.done()
    store.fail = False
    saves = len(store.saves)
    memory.stop()
    await asyncio.wait_for(task, 5.0)
    assert len(store.saves) > saves and store.saves[-1].keys() == {"a"}
