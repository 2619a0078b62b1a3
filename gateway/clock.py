"""Clock seam: policies take a Clock so tests can drive time without sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Time source. ``monotonic()`` for intervals, ``wall()`` only for Last-Modified."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class FakeClock:
    """A clock tests advance by hand."""

    def __init__(self, start_s: float = 1000.0, wall_s: float = 1_700_000_000.0) -> None:
        self.now_s = start_s
        self.wall_s = wall_s

    def monotonic(self) -> float:
        return self.now_s

    def wall(self) -> float:
        return self.wall_s + self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
