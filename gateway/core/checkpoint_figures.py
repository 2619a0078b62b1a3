"""One checkpoint directory's figures on this node, and its state in words.

The figures are what this node holds of the directory that is not durable upstream yet,
split in disjoint parts: *pending* (will flush on its own), *failed* (waits for an
operator's ``gateway retry``) and *held* (commit markers that commit ordering holds back
behind a failed object); plus the bytes already sent of its uploads in flight. They add up
(``+``): a fleet sums every node's ``node_figures`` for one directory and derives the state
from the sum exactly as one node does from its own.

States (``state_of``):

- ``writing``: no commit marker yet;
- ``complete``: "complete on this node": the marker is acknowledged, something under the
  directory is not durable upstream yet (it will be, on its own);
- ``held``: complete, but something under it failed: it becomes durable only after the
  cause is fixed and ``gateway retry`` (the reason names the objects and the command);
- ``durable``: "durable in the bucket": complete and nothing under it unflushed; with commit
  ordering the marker went last, so the bucket holds the whole checkpoint.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.models import LocalObject
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue

WRITING, COMPLETE, HELD, DURABLE = "writing", "complete", "held", "durable"
RETRY_COMMAND = "gateway retry"
_NAMED_FAILURES = 3  # failed objects named in a reason (the count says how many there are)
_FAILED_LOOKUP = 10_000  # failed rows read, at most, to name those under a directory


class FlushView(Protocol):
    """What the flusher knows and the journal does not (the admin layer passes it in: core
    never imports flush)."""

    def held_markers(self) -> Collection[tuple[str, str]]:
        """(bucket, key) of the commit markers held back behind failed objects."""
        ...

    def sent_bytes(self, bucket: str | None, prefix: str) -> int:
        """Bytes already sent of the uploads in flight under ``bucket``/``prefix``."""
        ...


@dataclass(frozen=True, slots=True)
class FailedObject:
    key: str
    error: str


@dataclass(frozen=True, slots=True)
class CheckpointFigures:
    """What one node (or, summed, a fleet) holds of a directory that is not durable yet."""

    unflushed_objects: int = 0  # all of it: pending + failed + held
    unflushed_bytes: int = 0
    failed_objects: int = 0
    failed_bytes: int = 0
    held_objects: int = 0
    held_bytes: int = 0
    sent_bytes: int = 0  # of pending objects whose upload is in flight: already sent
    failures: tuple[FailedObject, ...] = ()  # a few of the failed objects, named

    def __add__(self, other: CheckpointFigures) -> CheckpointFigures:
        return CheckpointFigures(
            self.unflushed_objects + other.unflushed_objects,
            self.unflushed_bytes + other.unflushed_bytes,
            self.failed_objects + other.failed_objects,
            self.failed_bytes + other.failed_bytes,
            self.held_objects + other.held_objects,
            self.held_bytes + other.held_bytes,
            self.sent_bytes + other.sent_bytes,
            (self.failures + other.failures)[:_NAMED_FAILURES],
        )

    @property
    def pending_objects(self) -> int:
        """Objects that will flush on their own (queued, in flight, backing off)."""
        return max(0, self.unflushed_objects - self.failed_objects - self.held_objects)

    @property
    def pending_bytes(self) -> int:
        return max(0, self.unflushed_bytes - self.failed_bytes - self.held_bytes)

    @property
    def remaining_bytes(self) -> int:
        """Pending bytes not sent yet: what an ETA waits for."""
        return max(0, self.pending_bytes - self.sent_bytes)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> CheckpointFigures:
        """The inverse of ``as_dict`` (another node's figures, from the peer API)."""
        failures = tuple(
            FailedObject(str(f["key"]), str(f["error"])) for f in doc.get("failures") or ()
        )
        return cls(
            int(doc["unflushed_objects"]),
            int(doc["unflushed_bytes"]),
            int(doc["failed_objects"]),
            int(doc["failed_bytes"]),
            int(doc["held_objects"]),
            int(doc["held_bytes"]),
            int(doc["sent_bytes"]),
            failures[:_NAMED_FAILURES],
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "pending_objects": self.pending_objects,
            "pending_bytes": self.pending_bytes,
            "failed_objects": self.failed_objects,
            "failed_bytes": self.failed_bytes,
            "held_objects": self.held_objects,
            "held_bytes": self.held_bytes,
            "unflushed_objects": self.unflushed_objects,
            "unflushed_bytes": self.unflushed_bytes,
            "sent_bytes": self.sent_bytes,
            "failures": [{"key": f.key, "error": f.error} for f in self.failures],
        }


@dataclass(frozen=True, slots=True)
class CheckpointState:
    state: str  # writing | complete | held | durable
    text: str  # the state in words, as the CLI and the page show it
    reason: str | None = None  # what failed and the command that resolves it


@dataclass(frozen=True, slots=True)
class FleetPart:
    """In a fleet: the nodes that did not answer (the checkpoint is then never "durable":
    what they hold is unknown), and why the fleet holds the directory's marker, if it does."""

    unanswered: tuple[str, ...] = ()
    held_by: str | None = None


def state_of(
    is_complete: bool, figures: CheckpointFigures, fleet: FleetPart | None = None
) -> CheckpointState:
    """The state of a directory from whether its marker exists and its (summed) figures
    (``fleet``: the rest of the fleet's part, with peers)."""
    failures = _failures_text(figures)
    if not is_complete:
        return CheckpointState(WRITING, "writing", failures)
    if fleet is not None and fleet.held_by is not None and failures is None:
        return CheckpointState(HELD, f"held: waiting on {fleet.held_by}", fleet.held_by)
    if fleet is not None and fleet.unanswered:
        who = ", ".join(fleet.unanswered)
        return CheckpointState(COMPLETE, f"complete; not known to be durable: {who} did not answer")
    if figures.unflushed_objects == 0:
        return CheckpointState(DURABLE, "durable in the bucket")
    if failures is None:
        where = "on this node" if fleet is None else "in the fleet"
        return CheckpointState(COMPLETE, f"complete {where}")
    if figures.held_objects:
        why = f"its commit marker waits behind {_objects(figures.failed_objects)} that failed"
    else:
        why = f"{_objects(figures.failed_objects)} failed"
    return CheckpointState(HELD, f"held: {why}", failures)


def _failures_text(figures: CheckpointFigures) -> str | None:
    if not figures.failed_objects:
        return None
    named = ", ".join(f"{f.key} ({f.error})" for f in figures.failures)
    more = figures.failed_objects - len(figures.failures)
    if more > 0:
        named += f"{', ' if named else ''}{more} more"
    return f"failed: {named}; fix the cause, then `{RETRY_COMMAND}`"


def _objects(n: int) -> str:
    return f"{n} object" if n == 1 else f"{n} objects"


async def failed_rows(journal: Journal, limit: int = _FAILED_LOOKUP) -> list[LocalObject]:
    """The oldest ``limit`` failed rows (one read, shared by the directories of a listing)."""
    return await FlushQueue(journal).failed(limit)


async def node_figures(
    journal: Journal,
    bucket: str,
    path: str,
    flush: FlushView | None,
    failed: Sequence[LocalObject] | None = None,
) -> CheckpointFigures:
    """This node's figures of the directory ``path`` (ends with ``/``) of ``bucket``: the
    counts from memory (O(1)), held markers from ``flush``, the failed objects named from
    ``failed`` (read here when not given and some failed). The fleet sums these."""
    tally = journal.figures.unflushed_under(bucket, path)
    if tally.is_empty:
        return CheckpointFigures()
    held_keys = [key for b, key in (flush.held_markers() if flush else ()) if b == bucket]
    held_bytes = 0
    held = 0
    for key in held_keys:
        if key.startswith(path) and (row := await journal.get(bucket, key)) is not None:
            held += 1
            held_bytes += row.meta.size_bytes
    names: tuple[FailedObject, ...] = ()
    if tally.failed_objects:
        rows = failed if failed is not None else await failed_rows(journal)
        names = tuple(
            FailedObject(r.meta.key, r.last_error or "no error recorded")
            for r in rows
            if r.meta.bucket == bucket and r.meta.key.startswith(path)
        )[:_NAMED_FAILURES]
    return CheckpointFigures(
        unflushed_objects=tally.objects,
        unflushed_bytes=tally.size_bytes,
        failed_objects=tally.failed_objects,
        failed_bytes=tally.failed_bytes,
        held_objects=held,
        held_bytes=held_bytes,
        sent_bytes=flush.sent_bytes(bucket, path) if flush else 0,
        failures=names,
    )
