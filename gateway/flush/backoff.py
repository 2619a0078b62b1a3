"""Capped exponential backoff with full jitter (pure; the random source is injected)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """``delay_s(attempt)`` is uniform in [0, min(cap_s, base_s * 2**attempt)].

    Full jitter spreads retries of a burst that failed together, so they do not return to a
    throttled prefix in lockstep. ``attempt`` counts failures so far (0 for the first retry).
    A ``retry_after_s`` from the upstream is a floor.
    """

    base_s: float = 0.2
    cap_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)

    def delay_s(self, attempt: int, retry_after_s: float | None = None) -> float:
        ceiling = min(self.cap_s, self.base_s * (2 ** min(attempt, 32)))
        delay = self.rng.uniform(0.0, ceiling)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.cap_s))
        return delay
