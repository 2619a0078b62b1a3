"""What the flusher may take next: write-back delay, temp-name holds, lane room, and
commit ordering. Pure: decisions depend only on the row, ``now_s`` and the lanes.

- **Write-back delay.** A row becomes eligible ``write_back_delay_s`` after its ack, so an
  overwrite, delete or rename that follows quickly is coalesced instead of uploaded. Rows
  come in ack order, so the first row too young ends the round.
- **Temp names** (``*.tmp``) are held ``temp_hold_s``: writers rename them (copy + delete)
  within seconds, and then the temp key never needs to reach the upstream.
- **Lanes.** A row whose lane has no free slot, or is paused by ``Retry-After``, is skipped
  for this round: other lanes go on, and it keeps its place (oldest first) for the next.
- **Commit ordering.** A commit marker (``.metadata``, ``_SUCCESS``) is taken only when no
  row acknowledged before it under its parent prefix is still unflushed (failed included:
  the bucket must never show a marker without its data).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.flush.lanes import Lanes
from gateway.store.journal import CLAIM, SKIP, Action, QueueEntry, QueueView, Verdict


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    write_back_delay_s: float = 0.5
    temp_patterns: Sequence[str] = ("*.tmp",)
    temp_hold_s: float = 10.0
    commit_markers: Sequence[str] = (".metadata", "_SUCCESS")


def _name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def parent_prefix(key: str) -> str:
    """``ckpt/step_1/.metadata`` -> ``ckpt/step_1/`` (``""`` for a top-level key)."""
    head, sep, _ = key.rpartition("/")
    return head + sep


class FlushPolicy:
    def __init__(self, config: PolicyConfig, lanes: Lanes) -> None:
        self.config = config
        self.lanes = lanes

    def is_temp(self, key: str) -> bool:
        name = _name(key)
        return any(fnmatch.fnmatchcase(name, p) for p in self.config.temp_patterns)

    def is_marker(self, key: str) -> bool:
        name = _name(key)
        return any(fnmatch.fnmatchcase(name, p) for p in self.config.commit_markers)

    def round(self, monotonic_s: float) -> ClaimRound:
        """A decider for one claim (it counts what it admits per lane). Lane state runs on
        the monotonic clock, ack times on the wall clock: both are needed."""
        return ClaimRound(self, monotonic_s)


class ClaimRound:
    """One claim's decisions (``journal.ClaimPolicy``). Runs on the journal's writer
    thread, so it only reads lane state and keeps its own tally."""

    def __init__(self, policy: FlushPolicy, monotonic_s: float) -> None:
        self._policy = policy
        self._monotonic_s = monotonic_s
        self._taken: dict[tuple[str, str], int] = {}

    def decide(self, entry: QueueEntry, now_s: float, view: QueueView) -> Verdict:
        policy, config = self._policy, self._policy.config
        ready_s = entry.acked_s + config.write_back_delay_s
        if config.write_back_delay_s > 0 and ready_s > now_s:
            return Verdict(Action.STOP, ready_s)
        if policy.is_temp(entry.key) and not entry.is_delete:
            held_s = entry.acked_s + config.temp_hold_s
            if held_s > now_s:
                return Verdict(Action.HOLD, held_s)
        ident = (entry.bucket, policy.lanes.prefix_of(entry.key))
        lane = policy.lanes.peek(entry.bucket, entry.key)
        taken = self._taken.get(ident, 0)
        if lane is not None and not lane.has_room(self._monotonic_s, taken):
            return SKIP
        if taken >= policy.lanes.config.concurrency:
            return SKIP
        if policy.is_marker(entry.key) and view.unflushed_before(
            entry.bucket, parent_prefix(entry.key), entry.seq
        ):
            return SKIP
        self._taken[ident] = taken + 1
        return CLAIM
