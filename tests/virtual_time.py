"""Simulated time for tests: an asyncio event loop whose clock only moves when nothing is
ready to run (it jumps to the next timer). ``asyncio.sleep``, ``wait_for`` and every
timeout run unchanged, in simulated seconds, as fast as the CPU allows. No real I/O.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class _NoIO(selectors.BaseSelector):
    """A selector with nothing to wait on: ``select(timeout)`` moves the clock instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, 0, events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("simulation stalled: nothing is ready and no timer is set")
        self._loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on simulated time (see the module docstring). No real I/O."""

    def __init__(self) -> None:
        self._now_s = 0.0
        super().__init__(selector=_NoIO(self))
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        self._now_s += max(0.0, seconds)


class LoopClock:
    """The ``Clock`` of every simulated node: the loop's (one virtual wall clock)."""

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    def wall(self) -> float:
        return 1_700_000_000.0 + asyncio.get_running_loop().time()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a virtual-time loop; like ``asyncio.run``, cancel and reap whatever it
    left behind (killed nodes' tasks) before closing the loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        for _ in range(100):  # 3.11's wait_for can swallow a cancellation: again
            left = {t for t in asyncio.all_tasks(loop) if not t.done()}
            if not left:
                break
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.wait(left, timeout=1.0))
        loop.close()
