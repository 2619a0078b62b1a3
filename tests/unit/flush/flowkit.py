"""Request gates for the flusher's tests: a fixed window (no adaptation, so counts and
orders are exact) and the flow control out of the way unless a test is about it."""

from __future__ import annotations

from gateway.clock import Clock
from gateway.flush.backoff import Backoff
from gateway.flush.control import RateConfig
from gateway.flush.gate import GateConfig, RequestGate, build_gate
from gateway.flush.lanes import LaneConfig
from gateway.flush.window import WindowConfig

# A budget starting at 1M/s, never cut below 1000/s (the waits it computes on a fake clock
# are then a millisecond or less).
FAST_FLOW = RateConfig(initial_per_s=1e6, floor_per_s=1000.0)


class ManualClock:
    """Monotonic seconds that move only when a test sets ``now_s``."""

    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def fixed_gate(
    clock: Clock,
    *,
    concurrency: int = 8,
    flow: RateConfig | None = FAST_FLOW,
    lanes: LaneConfig | None = None,
    backoff: Backoff | None = None,
    rate_per_s: float = 0.0,
    rate_burst: float = 0.0,
    bandwidth_bytes_per_s: int = 0,
) -> RequestGate:
    """A gate whose window is ``concurrency`` requests in flight, for good."""
    window = WindowConfig(initial=concurrency, min_size=concurrency, max_size=concurrency)
    config = GateConfig(
        window=window,
        rate_per_s=rate_per_s,
        rate_burst=rate_burst,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
    )
    return build_gate(clock, lanes=lanes, flow=flow, config=config, backoff=backoff)
