"""Replicas and takeover in the fake-clock simulator (replica_sim.py): 3-4 gateways with
``--replicas 1`` writing checkpoints (shards, an overwritten pointer per node, markers)
while nodes are killed, wiped, restarted, partitioned and paused at random points; and 5
gateways with ``--replicas 2`` losing two nodes at once.

Promises checked (docs/fleet.md, "Node loss"), over every seed:
- no acknowledged write is lost while at most N of the nodes holding it fail: the
  bucket ends with the newest acknowledged version of every key (or a newer one that was
  written and not acknowledged);
- no stale overwrite: the versions of a key reach the bucket in the order they were
  written;
- one uploader per version: no version is sent by two nodes (when no partition cut a
  running writer off its taker-over: then both may send the same bytes, never an older
  version over a newer);
- markers never before their shards (whoever wrote or took them over).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
from collections import defaultdict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
from fleet_sim import MARKER, Row
from replica_sim import Refused, ReplicaFleet, ReplicaNode, settle
from virtual_time import run

from gateway.fleet.replication import rank

PEER_TIMEOUT_S = 10.0


@dataclass
class Ledger:
    """What the clients were told: every attempt of a key, in the order written."""

    attempts: dict[str, list[tuple[str, bool]]] = field(default_factory=lambda: defaultdict(list))
    order: dict[str, int] = field(default_factory=dict)  # body -> its index among its key's
    steps: dict[int, list[str]] = field(default_factory=dict)  # acked shards of each step
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def body(self, key: str) -> str:
        body = f"{key}#{next(self.counter)}"
        self.order[body] = len(self.attempts[key])
        self.attempts[key].append((body, False))
        return body

    def acked(self, key: str, body: str) -> None:
        self.attempts[key][self.order[body]] = (body, True)


async def request(node: ReplicaNode, key: str, body: str) -> Row | None:
    """A client's PUT through ``node``: the row if acknowledged; None when the node is down,
    refused (strict policy) or died before answering."""
    if not node.is_up:
        return None
    task = node.spawn(node.put(key, body))
    await asyncio.wait({task})
    if task.cancelled() or isinstance(task.exception(), Refused):
        return None
    return task.result()


@dataclass
class Faults:
    """Random trouble, one failure at a time: a node is killed or wiped only once every
    node is up and every acknowledged version not in the bucket yet has two copies again
    (a failure takes one; its writer re-replicates what a lost holder held, holders take
    over what a lost writer held); partitions and paused flushers at any time."""

    fleet: ReplicaFleet
    ledger: Ledger
    partitions: bool
    wipes: int = 0
    cuts: int = 0
    takeovers_possible: int = 0
    events: list[tuple[float, str]] = field(default_factory=list)

    def note(self, what: str) -> None:
        self.events.append((asyncio.get_running_loop().time(), what))

    def _may_fail(self, nodes: int = 1) -> bool:
        """Whether every key's newest acknowledged version not in the bucket yet has
        ``nodes`` + 1 copies on nodes that are up (the writer's row, replicas; a later
        version of the key counts too): then ``nodes`` more failures lose nothing. A
        version whose holder was lost is down a copy until its writer re-replicates it (or
        uploads it)."""
        for key, tries in self.ledger.attempts.items():
            acked = [i for i, (_, ok) in enumerate(tries) if ok]
            if not acked or _upstream(self.fleet, self.ledger, key, tries[acked[-1]][0]):
                continue
            etags = {hashlib.md5(body.encode()).hexdigest() for body, _ in tries[acked[-1] :]}
            if len(_copies(self.fleet, key, etags)) < nodes + 1:
                return False
        return True

    async def run(self, until_s: float) -> None:
        loop = asyncio.get_running_loop()
        rng = self.fleet.rng
        while loop.time() < until_s:
            await asyncio.sleep(rng.uniform(1.0, 6.0))
            name = rng.choice(self.fleet.names)
            what = rng.random()
            may_fail = self._may_fail()
            if what < 0.3 and may_fail:
                self.wipes += 1
                self.note(f"wipe {name}")
                self.fleet.nodes[name].kill()
                await asyncio.sleep(rng.uniform(0.0, 2.5 * PEER_TIMEOUT_S))
                await self.fleet.restart(name, wipe=True)
                self.note(f"{name} back, empty")
            elif what < 0.55 and may_fail:
                down_s = rng.uniform(0.5, 2.5 * PEER_TIMEOUT_S)
                self.takeovers_possible += down_s > PEER_TIMEOUT_S
                self.note(f"kill {name}")
                self.fleet.nodes[name].kill()
                await asyncio.sleep(down_s)
                await self.fleet.restart(name)
                self.note(f"{name} back")
            elif what < 0.8 and self.partitions:
                self.cuts += 1
                other = rng.choice([n for n in self.fleet.names if n != name])
                self.fleet.net.cut(self.fleet.address_of(name), self.fleet.address_of(other))
                self.note(f"cut {name}-{other}")
                await asyncio.sleep(rng.uniform(0.5, 2.5 * PEER_TIMEOUT_S))
                self.fleet.net.heal()
                self.note("healed")
            else:
                await self.pause(name)

    async def pause(self, name: str) -> None:
        """Pause ``name``'s flusher for a while."""
        node = self.fleet.nodes[name]
        node.is_paused = True
        self.note(f"pause {name}")
        await asyncio.sleep(self.fleet.rng.uniform(0.5, 15.0))
        node.is_paused = False
        self.note(f"resume {name}")
        node.changed.set()


@dataclass
class TwoAtOnce(Faults):
    """With ``--replicas 2``: two nodes killed (or killed and wiped) at once whenever
    every pending version has three copies up, one node wiped when it has two, paused
    flushers; no partitions."""

    async def run(self, until_s: float) -> None:
        loop = asyncio.get_running_loop()
        rng = self.fleet.rng
        while loop.time() < until_s:
            await asyncio.sleep(rng.uniform(1.0, 6.0))
            names = rng.sample(self.fleet.names, 2)
            what = rng.random()
            if what < 0.5 and self._may_fail(2):
                wipe = rng.random() < 0.6
                self.wipes += 2 * wipe
                self.note(f"{'wipe' if wipe else 'kill'} {names}")
                for name in names:
                    self.fleet.nodes[name].kill()
                await asyncio.sleep(rng.uniform(0.0, 2.5 * PEER_TIMEOUT_S))
                for name in names:  # back one after the other
                    await self.fleet.restart(name, wipe=wipe)
                    await asyncio.sleep(rng.uniform(0.0, 3.0))
                self.note(f"{names} back")
            elif what < 0.8 and self._may_fail(1):
                self.wipes += 1
                self.note(f"wipe {names[0]}")
                self.fleet.nodes[names[0]].kill()
                await asyncio.sleep(rng.uniform(0.0, 2.5 * PEER_TIMEOUT_S))
                await self.fleet.restart(names[0], wipe=True)
                self.note(f"{names[0]} back, empty")
            else:
                await self.pause(names[0])


def _all_upstream(fleet: ReplicaFleet, ledger: Ledger) -> bool:
    """Whether the newest acknowledged version of every key (or a later one) is upstream."""
    for key, tries in ledger.attempts.items():
        acked = [body for body, ok in tries if ok]
        if acked and not _upstream(fleet, ledger, key, acked[-1]):
            return False
    return True


def _copies(fleet: ReplicaFleet, key: str, etags: set[str]) -> set[str]:
    """The nodes up that hold one of these versions of ``key``: their own row not durable
    yet, or a replica."""
    out = set()
    for name, node in fleet.nodes.items():
        if not node.is_up:
            continue
        row = node.disk.pending.get(key)
        if row is not None and row.value in etags:
            out.add(name)
        replicas = fleet.node(name).disk.journal.conn.execute(
            "SELECT meta FROM replicas WHERE key = ?", (key,)
        )
        if any(json.loads(meta)["etag"] in etags for (meta,) in replicas):
            out.add(name)
    return out


def _upstream(fleet: ReplicaFleet, ledger: Ledger, key: str, body: str) -> bool:
    """Whether the bucket holds ``body`` under ``key``, or a version written after it."""
    held = fleet.bucket.objects.get(key)
    return held is not None and ledger.order[_body_of(ledger, key, held[0])] >= ledger.order[body]


async def _writer(fleet: ReplicaFleet, ledger: Ledger, steps: int) -> None:
    """A job: each step every node's rank writes 2 shards and rewrites its pointer; when
    every shard was acknowledged (its barrier), one rank writes the marker."""
    rng = fleet.rng
    for step in range(steps):
        names = list(fleet.names)
        keys = [(n, f"ckpt/{step}/{n}_{i}") for n in names for i in range(2)]
        keys += [(n, f"latest/{n}") for n in names]

        async def put(name: str, key: str) -> bool:
            body = ledger.body(key)
            row = await request(fleet.node(name), key, body)
            if row is not None:
                ledger.acked(key, body)
            return row is not None

        results = await asyncio.gather(*(put(n, k) for n, k in keys))
        shards = [k for (_, k), ok in zip(keys, results, strict=True) if "ckpt/" in k and ok]
        if all(ok for (_, k), ok in zip(keys, results, strict=True) if "ckpt/" in k):
            ledger.steps[step] = shards
            await put(rng.choice(names), f"ckpt/{step}/{MARKER}")
        await asyncio.sleep(rng.uniform(0.2, 3.0))


def check(fleet: ReplicaFleet, ledger: Ledger, *, one_uploader: bool) -> dict[str, int]:
    """The promises of the module docstring against the bucket's arrivals."""
    bucket = fleet.bucket
    lost = []
    for key, tries in ledger.attempts.items():
        acked = [i for i, (_, ok) in enumerate(tries) if ok]
        if not acked:
            continue
        held = bucket.objects.get(key)
        newest_ok = {tries[i][0] for i in range(acked[-1], len(tries))}
        if held is None or _body_of(ledger, key, held[0]) not in newest_ok:
            lost.append((key, tries[acked[-1]][0], held))
    assert not lost, f"acknowledged writes lost or stale in the bucket: {lost[:5]}"

    landed: dict[str, int] = {}
    senders: dict[str, set[str]] = defaultdict(set)
    for a in bucket.arrivals:
        body = _body_of(ledger, a.key, a.value)
        index = ledger.order[body]
        assert index >= landed.get(a.key, -1), f"t={a.t:.2f}: {body} over a newer version"
        landed[a.key] = index
        senders[body].add(a.sender)
    twice = {b: s for b, s in senders.items() if len(s) > 1}
    taken = [a for a in bucket.arrivals if _writer_of(a.key) not in (None, a.sender)]
    if one_uploader:
        assert not twice, f"versions sent by two nodes: {list(twice.items())[:5]}"

    arrived: dict[str, float] = {}
    for a in bucket.arrivals:
        if a.key.endswith(MARKER):
            step = int(a.key.split("/")[1])
            missing = [k for k in ledger.steps.get(step, []) if k not in arrived]
            assert not missing, f"t={a.t:.2f}: marker of step {step} before {missing}"
        else:
            arrived.setdefault(a.key, a.t)
    acked = sum(ok for tries in ledger.attempts.values() for _, ok in tries)
    return {
        "acked": acked,
        "arrivals": len(bucket.arrivals),
        "taken over": len(taken),
        "sent twice": len(twice),
    }


def _writer_of(key: str) -> str | None:
    """The node a key is written through (markers: any)."""
    if key.endswith(MARKER):
        return None
    return key.rpartition("/")[2].split("_")[0]


def _body_of(ledger: Ledger, key: str, etag: str) -> str:
    """The attempt whose body has this MD5 (bodies are unique)."""
    for body, _ in ledger.attempts[key]:
        if hashlib.md5(body.encode()).hexdigest() == etag:
            return body
    raise AssertionError(f"{key}: {etag} was never written")


async def scenario(
    seed: int, *, n: int, steps: int, partitions: bool, replicas: int = 1
) -> dict[str, int]:
    fleet = ReplicaFleet(
        n, seed, replicas=replicas, upload_s=(0.05, 1.5), peer_timeout_s=PEER_TIMEOUT_S
    )
    await fleet.start()
    ledger = Ledger()
    loop = asyncio.get_running_loop()
    faults = (TwoAtOnce if replicas == 2 else Faults)(fleet, ledger, partitions)
    trouble = asyncio.ensure_future(faults.run(loop.time() + steps * 4.0))
    await _writer(fleet, ledger, steps)
    await trouble
    await settle(fleet, 600.0)
    for _ in range(600):  # takeovers of what wiped nodes left finish
        if _all_upstream(fleet, ledger):
            break
        await asyncio.sleep(1.0)
    assert fleet.pending_anywhere() == 0, f"seed {seed}: still pending after settling"
    figures = check(fleet, ledger, one_uploader=not partitions)
    figures.update(wipes=faults.wipes, cuts=faults.cuts, steps_marked=len(ledger.steps))
    await fleet.close()
    return figures


def _run(main: Coroutine[Any, Any, dict[str, int]]) -> dict[str, int]:
    return run(main)


# make test runs 960 short runs (4 checkpoint steps, about 20 simulated seconds of faults
# each) and a few long ones; GATEWAY_SIM_SEEDS=<runs per chunk> runs more of the same.
PER_CHUNK = int(os.environ.get("GATEWAY_SIM_SEEDS", "30"))


def _chunk(first: int, *, partitions: bool, steps: int = 4) -> None:
    for seed in range(first * PER_CHUNK, (first + 1) * PER_CHUNK):
        n = 3 if partitions else 3 + seed % 2
        try:
            _run(scenario(seed, n=n, steps=steps, partitions=partitions))
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from None


@pytest.mark.parametrize("chunk", range(20))
def test_no_acknowledged_write_lost_under_crashes_and_wipes(chunk: int) -> None:
    _chunk(chunk, partitions=False)


@pytest.mark.parametrize("chunk", range(100, 110))
def test_with_partitions_no_stale_overwrite_and_nothing_lost(chunk: int) -> None:
    _chunk(chunk, partitions=True)


@pytest.mark.parametrize("chunk", range(200, 204))
def test_two_replicas_survive_two_nodes_lost_at_once(chunk: int) -> None:
    """Five gateways with ``--replicas 2``; two of them killed, or killed and wiped, at
    the same moment (400 seeds run once beside this test: none lost anything)."""
    for seed in range(chunk * PER_CHUNK // 2, (chunk + 1) * PER_CHUNK // 2):
        try:
            _run(scenario(seed, n=5, steps=6, partitions=False, replicas=2))
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from None


def test_long_runs_with_takeovers() -> None:
    """Six long runs: every promise checked in each; and takeovers happen in them (a run
    whose faults happened to hit no node holding anything unflushed takes over nothing:
    the count is over all six)."""
    taken = 0
    for seed in range(6):
        figures = _run(scenario(seed, n=3 + seed % 2, steps=30, partitions=seed % 2 == 1))
        assert figures["steps_marked"] > 0, seed
        taken += figures["taken over"]
    assert taken > 0


async def _marker_after_a_wipe() -> list[str]:
    """Shards through c (its flusher paused), c wiped and back empty at once, then the
    marker through a: the bucket's arrivals under the checkpoint, in order."""
    fleet = ReplicaFleet(3, 1, upload_s=(1.0, 1.0), peer_timeout_s=PEER_TIMEOUT_S)
    await fleet.start()
    ledger = Ledger()
    fleet.node("c").is_paused = True
    for i in range(2):
        key = f"ckpt/0/c_{i}"
        assert await request(fleet.node("c"), key, ledger.body(key)) is not None
    await fleet.restart("c", wipe=True)
    marker = f"ckpt/0/{MARKER}"
    assert await request(fleet.node("a"), marker, ledger.body(marker)) is not None
    await settle(fleet, 600.0)
    await fleet.close()
    return [a.key for a in fleet.bucket.arrivals if a.key.startswith("ckpt/0/")]


def test_a_marker_waits_for_the_replicas_of_a_writer_wiped_before_it() -> None:
    """The hold of a marker asks each member for its data dir of now; a writer wiped and
    back before the hold began left its shards in replicas only. They go up first."""
    arrived = run(_marker_after_a_wipe())
    assert sorted(arrived) == sorted(["ckpt/0/c_0", "ckpt/0/c_1", f"ckpt/0/{MARKER}"])
    assert arrived[-1] == f"ckpt/0/{MARKER}", arrived


async def _holder_then_writer(*, wipe_holder: bool) -> tuple[dict[str, int], list[str]]:
    """Keys through a (its flusher paused: nothing drains); the holder b lost (wiped and
    back, or silent past the peer timeout); a while later a wiped as well. Copies of each
    key just before a's wipe (on nodes up), and the keys missing from the bucket at the
    end."""
    fleet = ReplicaFleet(3, 2, upload_s=(0.2, 0.2), peer_timeout_s=PEER_TIMEOUT_S)
    await fleet.start()
    ledger = Ledger()
    fleet.node("a").is_paused = True
    keys = [f"ckpt/0/a_{i}" for i in range(24)]
    for key in keys:
        assert await request(fleet.node("a"), key, ledger.body(key)) is not None
    if wipe_holder:
        await fleet.restart("b", wipe=True)
        await asyncio.sleep(8.0)
    else:
        fleet.nodes["b"].kill()
        await asyncio.sleep(PEER_TIMEOUT_S + 8.0)
    etags = {k: {hashlib.md5(b.encode()).hexdigest() for b, _ in ledger.attempts[k]} for k in keys}
    copies = {k: len(_copies(fleet, k, etags[k])) for k in keys}
    await fleet.restart("a", wipe=True)
    await settle(fleet, 600.0)
    for _ in range(120):  # the takeovers of what a held
        missing = [k for k in keys if not _upstream(fleet, ledger, k, ledger.attempts[k][0][0])]
        if not missing:
            break
        await asyncio.sleep(1.0)
    await fleet.close()
    return copies, missing


@pytest.mark.parametrize("wipe_holder", [True, False], ids=["holder wiped", "holder silent"])
def test_a_lost_holders_versions_are_replicated_again(wipe_holder: bool) -> None:
    """Two failures minutes apart: the holder's loss leaves the writer's versions on one
    copy until the writer sends them to a holder again; the writer's loss after that
    loses nothing."""
    copies, missing = run(_holder_then_writer(wipe_holder=wipe_holder))
    assert set(copies.values()) == {2}, copies
    assert not missing, missing


async def _older_after_a_cut(key: str) -> tuple[list[str], str, str]:
    """c writes v1 of ``key`` (its replica on b), is cut off from b and a, writes v2
    (refused: no holder can commit it, but committed on c), uploads v2 and dies before
    marking it done. b, for which c has been silent, takes c's versions over: the
    bucket's arrivals of ``key``, and the two bodies."""
    fleet = ReplicaFleet(3, 3, upload_s=(0.2, 0.2), peer_timeout_s=PEER_TIMEOUT_S)
    await fleet.start()
    ledger = Ledger()
    c = fleet.node("c")
    assert [h.node_id for h in c.replication.holders("sim", key)] == ["b"]
    c.is_paused = True
    v1, v2 = ledger.body(key), ledger.body(key)
    assert await request(c, key, v1) is not None
    fleet.net.cut(fleet.address_of("c"), fleet.address_of("b"))
    fleet.net.cut(fleet.address_of("c"), fleet.address_of("a"))  # else a takes b's place
    assert await request(c, key, v2) is None  # no replica: refused, committed on c
    landed = fleet.bucket.land

    def land(k: str, value: str, is_delete: bool, sender: str) -> None:
        landed(k, value, is_delete, sender)
        if k == key and sender == "c":
            fleet.nodes["c"].kill()  # before its done mark

    fleet.bucket.land = land  # type: ignore[method-assign]
    c.is_paused = False
    c.changed.set()
    await asyncio.sleep(3 * PEER_TIMEOUT_S)  # b takes over what it holds of c's
    arrivals = [_body_of(ledger, a.key, a.value) for a in fleet.bucket.arrivals if a.key == key]
    await fleet.close()
    return arrivals, v1, v2


def test_a_taker_over_never_puts_an_older_version_over_one_already_in_the_bucket() -> None:
    """The newer version's claimant is lost to the taker-over (cut off from it, then dead)
    and never marked it done; the bucket holds it all the same, and the older version
    stays out."""
    key = next(k for k in (f"latest/c{i}" for i in range(100)) if _holder_is_b(k))
    arrivals, v1, v2 = run(_older_after_a_cut(key))
    assert arrivals == [v2], f"{v1} landed after {v2}: {arrivals}"


def _holder_is_b(key: str) -> bool:
    return max(("a", "b"), key=lambda n: rank(n, "sim", key)) == "b"
