"""Re-replication (``fleet/rereplication.py``): which versions a writer sends again when
one of their holders is lost, to whom, and how a pass goes on. The whole in the simulator
(tests/sim/test_sim_replicas.py) and over real sockets (tests/integration/
test_it_replicas.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gateway.cli_fleet import format_fleet
from gateway.errors import InternalError, SlowDown
from gateway.fleet.membership import Member
from gateway.fleet.replication import ReplicaPolicy, Replication, choose
from gateway.fleet.rereplication import _TRIES, Rereplication
from gateway.fleet.transport import PeerUnavailable
from gateway.fleet.wire import NodeInfo
from gateway.models import FlushState, LocalObject, ObjectMeta

ME = NodeInfo("w", "dw", 1.0)


class _Members:
    """The membership surface re-replication uses."""

    def __init__(self, *names: str) -> None:
        self.members = {n: Member(n, f"{n}:9000", NodeInfo(n, f"d{n}", 1.0)) for n in names}
        for m in self.members.values():
            m.note_ok()
        self.on_new_datadir: list[Any] = []

    def active(self) -> list[Member]:
        return [m for m in self.members.values() if not m.has_left]

    def get(self, node_id: str) -> Member | None:
        return self.members.get(node_id)

    def wipe(self, node_id: str) -> None:
        member = self.members[node_id]
        old = member.info
        assert old is not None
        member.info = NodeInfo(node_id, "new", 2.0)
        for callback in self.on_new_datadir:
            callback(member, old.datadir_id)


class _World:
    def __init__(self, keys: int = 40) -> None:
        self.members = _Members("a", "b", "c")
        fake: Any = self.members
        self.replication = Replication(ME, fake, fake, ReplicaPolicy(1))
        self.rows = [_row(f"k{i}", i + 1) for i in range(keys)]
        self.lost: set[str] = set()
        self.sent: list[tuple[str, list[str]]] = []
        self.refuse: set[str] = set()  # holders whose commits fail
        self.rere = Rereplication(
            self.replication,
            fake,
            lambda node: node in self.lost,
            lambda: len(self.rows),
            self.pending,
            self.send,
        )

    async def pending(self, after_seq: int, limit: int) -> list[LocalObject]:
        return [r for r in self.rows if r.seq > after_seq][:limit]

    async def send(self, row: LocalObject, holders: Sequence[Member]) -> int:
        self.sent.append((row.meta.key, [h.node_id for h in holders]))
        return sum(h.node_id not in self.refuse for h in holders)

    def holder_of(self, key: str, names: Sequence[str]) -> str:
        members = [self.members.members[n] for n in names]
        return choose(members, "bkt", key, 1, None)[0].node_id


def _row(key: str, seq: int) -> LocalObject:
    meta = ObjectMeta("bkt", key, 3, "0" * 32, 10.0)
    return LocalObject(meta, seq, FlushState.PENDING, None, acked_s=10.0)


async def test_a_silent_holders_versions_go_to_the_next_holder_once() -> None:
    world = _World()
    b = world.members.members["b"]
    b.note_failure(0.0, "refused")
    world.lost.add("b")
    await world.rere.round()
    held_by_b = [r.meta.key for r in world.rows if world.holder_of(r.meta.key, "abc") == "b"]
    assert held_by_b and len(held_by_b) < len(world.rows)
    assert world.sent == [(k, [world.holder_of(k, "ac")]) for k in held_by_b]
    assert world.rere.events == {}  # through
    await world.rere.round()  # still silent: the same loss is not a new event
    assert len(world.sent) == len(held_by_b)


async def test_a_holder_that_left_the_fleet_is_replaced_too() -> None:
    """A member that said goodbye as it shut down took what it held for others."""
    world = _World()
    world.members.members["b"].has_left = True
    await world.rere.round()
    held_by_b = [r.meta.key for r in world.rows if world.holder_of(r.meta.key, "abc") == "b"]
    assert world.sent == [(k, [world.holder_of(k, "ac")]) for k in held_by_b]


async def test_a_holder_back_with_its_copies_ends_the_event() -> None:
    world = _World()
    b = world.members.members["b"]
    b.note_failure(0.0, "refused")
    world.lost.add("b")
    held_by_b = [r for r in world.rows if world.holder_of(r.meta.key, "abc") == "b"]
    world.refuse = {"a", "c"}  # the pass stops at the first version
    await world.rere.round()
    assert len(world.sent) == len(held_by_b) and "b" in world.rere.events
    first = next(r.seq for r in world.rows if r.meta.key == held_by_b[0].meta.key)
    assert world.rere.events["b"].after_seq < first
    world.lost.clear()
    b.note_ok()  # back, same data dir: it has them
    await world.rere.round()
    assert world.rere.events == {} and len(world.sent) == len(held_by_b)


async def test_a_wiped_holder_gets_its_versions_again_and_a_failed_send_is_retried() -> None:
    world = _World()
    world.members.wipe("c")
    status = world.rere.status()
    assert status == [{"holder": "c", "wiped": True, "sent": 0}]
    replicas = {"copies": 1, "policy": "strict", "remaking": status}
    shown = format_fleet({"node": "w", "datadir_id": "dw", "members": [], "replicas": replicas})
    assert "re-replicating what c held (back empty): 0 versions sent" in shown
    held_by_c = [r.meta.key for r in world.rows if world.holder_of(r.meta.key, "abc") == "c"]
    world.refuse = {"c"}
    for _ in range(3):
        await world.rere.round()
    # The batch, round after round; the pass stays before the first of them.
    assert world.sent == [(k, ["c"]) for k in held_by_c] * 3
    first = next(r.seq for r in world.rows if r.meta.key == held_by_c[0])
    assert world.rere.events["c"].after_seq < first
    world.refuse = set()
    await world.rere.round()
    assert world.sent[3 * len(held_by_c) :] == [(k, ["c"]) for k in held_by_c]
    assert world.rere.events == {}


async def test_a_version_no_holder_takes_is_left_after_some_rounds() -> None:
    world = _World(keys=12)
    world.members.wipe("a")
    held_by_a = [r.meta.key for r in world.rows if world.holder_of(r.meta.key, "abc") == "a"]
    world.refuse = {"a"}
    for _ in range(_TRIES + 1):
        await world.rere.round()
    # The last of those rounds gave up on the first and stopped at the next version.
    seqs = {r.meta.key: r.seq for r in world.rows}
    assert seqs[held_by_a[0]] <= world.rere.events["a"].after_seq < seqs[held_by_a[1]]
    world.refuse = set()
    before = len(world.sent)
    await world.rere.round()
    assert [k for k, _ in world.sent[before:]] == held_by_a[1:]
    assert world.rere.events == {}


class _DeadHolders:
    """A transport whose holders die before the commit."""

    async def replica_commit(self, address: str, doc: object, timeout_s: float) -> list[str]:
        raise PeerUnavailable("replica/commit: gone")


async def test_too_few_commits_after_the_local_one_are_an_internal_error_not_a_refusal() -> None:
    """Strict policy: SlowDown only before anything is written (it did not happen); a
    version committed here whose holders then fail stays and may be uploaded: InternalError,
    whose outcome a client takes as unknown (the soak found a SlowDown taken for "not
    written" while the version was read and copied through this node)."""
    members: Any = _Members("a", "b")
    replication = Replication(ME, members, _DeadHolders(), ReplicaPolicy(1))  # type: ignore[arg-type]
    noted: list[tuple[str, str, int, int, int]] = []

    class _Short:
        async def note(self, bucket: str, key: str, seq: int, copies: int, wanted: int) -> None:
            noted.append((bucket, key, seq, copies, wanted))

    replication.short = _Short()  # type: ignore[assignment]
    write = replication.start("bkt", "k")
    meta = ObjectMeta("bkt", "k", 0, "", 10.0)
    with pytest.raises(InternalError):
        await write.commit(write.holders, 7, meta, 10.0, is_delete=True)
    assert noted == [("bkt", "k", 7, 0, 1)]  # its state says 0/1; it is topped up later
    for m in members.active():
        m.note_failure(0.0, "down")
    with pytest.raises(SlowDown):
        replication.start("bkt", "k2")
