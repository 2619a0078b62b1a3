"""Re-replication (docs/fleet.md, "A holder lost"): a writer whose replica holder is lost
makes the missing copies again, so that its acknowledged versions do not wait out their
drain with fewer than N copies.

Without it, a holder lost in the middle of a long drain leaves every version it held for
this writer on this node alone until it is uploaded, and this node's loss then takes
them: two failures minutes apart lose data that ``--replicas 1`` was meant to keep. With
it, a version is lost only if its N+1 copies all go within one re-replication's time.

A holder is lost for a version when:
- it has been silent for ``--peer-timeout`` (``is_lost``, the rule the takeover uses for
  writers), or it left the fleet (said goodbye as it shut down); its versions go to the
  members that now come next by rendezvous;
- it answers from a new data dir (it came back with an empty disk): its versions go to it
  again (or to whoever comes next, if it is not reachable).

Each loss is an *event*; it covers this node's versions not yet durable upstream that were
acknowledged before it (up to the journal's last seq at the time) and whose holders, by
rendezvous over the members reachable now plus the lost one, include it. A version goes
to each holder of today's choice that the lost one's loss made new (or to the wiped node
itself), ``_BATCH`` versions at once. A holder that already holds a version answers at
once, without the body (``ReplicaStore.commit``). A send that fails stops the event's pass
there; the next round goes on from that version (with the holders it then chooses; the
versions after it are sent again, and answered at once), and after ``_TRIES`` rounds past
it. An event ends when its pass is through, or when its node turns
out not lost (it answers again from the same data dir: it has its copies).

Each round also tops up the versions acknowledged with fewer copies than wanted
(``--replica-policy degrade``, ``store/copies.py``) once enough members are reachable.

Loop-bound; ``round`` is one look (the simulator in tests/sim calls it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway import metrics
from gateway.fleet.membership import Member, Membership
from gateway.fleet.replication import Replication, choose
from gateway.models import FlushState, LocalObject

log = logging.getLogger(__name__)
_ROUND_S = 2.0
# A version no new holder takes this many rounds in a row is left (logged) and the pass
# goes on: a holder that is down is replaced by the next round's choice, so what fails
# this often is the version itself (its body unreadable here).
_TRIES = 10
# Versions read from the journal, and sent, at a time (inline bodies: up to 64 KiB each).
_BATCH = 64

# The versions not durable upstream with a seq above the first argument, in seq order, at
# most the second argument of them.
PendingRows = Callable[[int, int], Awaitable[Sequence[LocalObject]]]
# Send one version to these holders; how many committed it.
SendRow = Callable[[LocalObject, Sequence[Member]], Awaitable[int]]
# The current row of (bucket, key), None if there is none.
RowOf = Callable[[str, str], Awaitable[LocalObject | None]]


@dataclass(slots=True)
class Event:
    """One holder's loss: the versions up to ``until_seq`` it may have held."""

    node_id: str
    datadir_id: str | None  # the data dir whose copies are gone (None: the node is silent)
    until_seq: int
    after_seq: int = 0  # the pass is through up to here
    sent: int = 0  # versions sent to a new holder so far
    tries: int = 0  # failed sends of the version after ``after_seq``


class Rereplication:
    """See the module docstring."""

    def __init__(
        self,
        replication: Replication,
        membership: Membership,
        is_lost: Callable[[str], bool],
        last_seq: Callable[[], int],
        pending: PendingRows,
        send: SendRow,
        row_of: RowOf | None = None,
    ) -> None:
        self._row_of = row_of
        self._replication = replication
        self._membership = membership
        self._is_lost = is_lost
        self._last_seq = last_seq
        self._pending = pending
        self._send = send
        self.events: dict[str, Event] = {}  # by node id: one loss each at a time
        self._silent: set[str] = set()  # nodes whose silence made an event already
        membership.on_new_datadir.append(self._wiped)

    def _wiped(self, member: Member, old_datadir_id: str) -> None:
        """``member`` answered from a new data dir: the copies it held are gone."""
        self.events[member.node_id] = Event(member.node_id, old_datadir_id, self._last_seq())

    def status(self) -> list[dict[str, object]]:
        """The losses whose versions are being sent again (status page, ``gateway fleet``)."""
        return [
            {"holder": e.node_id, "wiped": e.datadir_id is not None, "sent": e.sent}
            for e in self.events.values()
        ]

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except Exception:  # the worker loop: logged, the next round runs
                log.exception("re-replication round failed")
            await asyncio.sleep(_ROUND_S)

    async def round(self) -> None:
        """Open an event for each holder newly silent for the peer timeout, close those of
        holders back with their copies, and take each open event's pass as far as it goes."""
        for member in list(self._membership.members.values()):
            node = member.node_id
            # A member that left (it shut down with nothing of its own unflushed) took
            # what it held for others with it, as a lost one did.
            if member.has_left or self._is_lost(node):
                if node not in self._silent and node not in self.events:
                    self.events[node] = Event(node, None, self._last_seq())
                self._silent.add(node)
            else:
                self._silent.discard(node)
                event = self.events.get(node)
                if event is not None and event.datadir_id is None and member.is_reachable:
                    del self.events[node]  # back from the same data dir: it kept its copies
        await self._top_up()
        for event in list(self.events.values()):
            if await self._pass(event) and self.events.get(event.node_id) is event:
                del self.events[event.node_id]
                log.info(
                    "re-replication after %s's loss: %d versions sent to new holders",
                    event.node_id,
                    event.sent,
                )

    async def _top_up(self) -> None:
        """Versions here with fewer copies than wanted (acknowledged so under
        ``--replica-policy degrade``; committed here and answered 500 under strict): sent
        to their holders once enough members are reachable; forgotten once durable
        upstream or replaced."""
        short, wanted = self._replication.short, self._replication.policy.copies
        if short is None or self._row_of is None or not short.versions():
            return
        if sum(1 for m in self._membership.active() if m.is_reachable) < wanted:
            return  # too few members to top anything up: no journal reads this round
        for bucket, key, seq in short.versions():
            row = await self._row_of(bucket, key)
            if row is None or row.seq != seq or row.state is FlushState.DURABLE:
                await short.clear(bucket, key, seq)
                continue
            holders = self._replication.holders(bucket, key)
            if len(holders) >= wanted and await self._send(row, holders) >= wanted:
                await short.clear(bucket, key, seq)
                metrics.REPLICAS_REMADE.inc()

    async def _pass(self, event: Event) -> bool:
        """Send the event's versions from where its pass stopped, a batch at a time (its
        sends at once); True once through."""
        while event.after_seq < event.until_seq:
            rows = await self._pending(event.after_seq, _BATCH)
            rows = [r for r in rows if r.seq <= event.until_seq]
            if not rows:
                return True
            work = [(row, self._targets(event, row)) for row in rows]
            results = await asyncio.gather(*(self._send(r, t) for r, t in work if t))
            committed = iter(results)
            for row, targets in work:
                if targets and next(committed) < len(targets):
                    if event.tries < _TRIES:
                        event.tries += 1
                        return False  # a new holder did not take it: again next round
                    log.warning(
                        "re-replication of %s/%s seq=%d: given up after %d tries",
                        row.meta.bucket,
                        row.meta.key,
                        row.seq,
                        event.tries + 1,
                    )
                elif targets:
                    event.sent += 1
                    metrics.REPLICAS_REMADE.inc()
                event.after_seq, event.tries = row.seq, 0
        return True

    def _targets(self, event: Event, row: LocalObject) -> list[Member]:
        """The holders ``row`` needs now that ``event``'s node lost its copy (none if that
        node was not one of its holders)."""
        members = [m for m in self._membership.active() if m.is_reachable]
        # A member an operator forgot is ranked by its id alone, as any member is.
        lost = self._membership.get(event.node_id) or Member(event.node_id, "")
        bucket, key = row.meta.bucket, row.meta.key
        copies, zone = self._replication.policy.copies, self._replication.me.zone
        others = [m for m in members if m.node_id != lost.node_id]
        before = choose([*others, lost], bucket, key, copies, zone)
        if lost not in before:
            return []
        kept = {m.node_id for m in before if m is not lost}
        now = choose(members, bucket, key, copies, zone)
        return [m for m in now if m.node_id not in kept]
