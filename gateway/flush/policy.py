"""What the flusher may take next: write-back delay, temp-name holds, lane room, and
commit ordering. Pure: decisions depend only on the row, the time and the lanes.

- **Write-back delay.** A row becomes eligible ``write_back_delay_s`` after its ack, so an
  overwrite, delete or rename that follows quickly is coalesced instead of uploaded.
- **Temp names** (``*.tmp``) are held ``temp_hold_s``: writers rename them (copy + delete)
  within seconds, and then the temp key never needs to reach the upstream.
- **Lanes.** A row whose lane has no free slot, or is paused by ``Retry-After``, waits: other
  lanes go on, and it keeps its place (oldest first) for when the lane has room.
- **Commit ordering.** A commit marker (``.metadata``, ``_SUCCESS``) is taken only when no
  row acknowledged before it under its parent prefix is still unflushed (failed included:
  the bucket must never show a marker without its data).

``flush/order.py`` applies these to the rows it keeps in memory; this module decides.
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.flush.lanes import Lanes


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    write_back_delay_s: float = 0.5
    temp_patterns: Sequence[str] = ("*.tmp",)
    temp_hold_s: float = 10.0
    commit_markers: Sequence[str] = (".metadata", "_SUCCESS")


class Room(enum.Enum):
    """Whether a lane may start one more upload now, and if not, what it waits for."""

    FREE = "free"
    SLOTS = "slots"  # every slot is taken: an upload of the lane must finish first
    LATER = "later"  # paused (Retry-After) or otherwise held: look again after a while


def _name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


class FlushPolicy:
    """The flush gates, for one configuration and the flusher's lanes."""

    def __init__(self, config: PolicyConfig, lanes: Lanes) -> None:
        self.config = config
        self.lanes = lanes

    def is_temp(self, key: str) -> bool:
        name = _name(key)
        return any(fnmatch.fnmatchcase(name, p) for p in self.config.temp_patterns)

    def is_marker(self, key: str) -> bool:
        name = _name(key)
        return any(fnmatch.fnmatchcase(name, p) for p in self.config.commit_markers)

    def ready_s(self, acked_s: float) -> float | None:
        """When a new version acked at ``acked_s`` may first flush (None: at once)."""
        if self.config.write_back_delay_s <= 0:
            return None
        return acked_s + self.config.write_back_delay_s

    def held_until_s(self, key: str, is_delete: bool, acked_s: float) -> float | None:
        """A new temp version's hold (the later of its hold and the write-back delay);
        None for anything else. A delete is never held: it ends a rename."""
        if is_delete or not self.is_temp(key):
            return None
        return acked_s + max(self.config.temp_hold_s, self.config.write_back_delay_s)

    def room(self, bucket: str, key: str, now_s: float, taken: int) -> Room:
        """Room in the lane of ``key`` (``now_s`` monotonic), ``taken`` already claimed for
        it in this round."""
        lane = self.lanes.peek(bucket, key)
        in_flight = lane.in_flight if lane is not None else 0
        if in_flight + taken >= self.lanes.lane_concurrency:
            return Room.SLOTS
        if lane is not None and lane.is_paused(now_s):
            return Room.LATER
        return Room.FREE
