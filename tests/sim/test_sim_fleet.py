"""The fleet's promises in the fake-clock simulator (fleet_sim.py): the real membership,
directory, leases and fence of N gateways, with crashes, restarts, partitions that heal,
paused flushers and wiped disks at random points.

Promises checked (docs/fleet.md):
- commit order across nodes: a checkpoint's marker reaches the bucket only after every
  shard of it, whichever node wrote them, whatever failed meanwhile;
- a fleet drain never says drained while a shard acknowledged before the question is not
  in the bucket;
- read-after-write across nodes for nodes that stay connected, or are back from a restart
  with their disk;
- a dead peer delays the first write of a new directory by at most one lease, once;
- a node back with an empty disk keeps the markers that waited on it held.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from fleet_sim import BUCKET, MARKER, SimFleet
from virtual_time import run

from gateway.fleet.wire import DrainRequest


async def _checkpoint(fleet: SimFleet, step: int, shards_per_node: int) -> dict[str, str]:
    """Every node writes its shards of ``step`` (at once), then, after the barrier, one
    node writes the marker. Returns key -> value of the shards."""
    up = [n for n in fleet.names if fleet.nodes[n].is_up]
    writes = {
        f"ckpt/{step}/{name}_{i}": f"v{step}-{name}-{i}"
        for name in up
        for i in range(shards_per_node)
    }

    async def write(key: str, value: str) -> None:
        await fleet.nodes[key.split("/")[2].split("_")[0]].put(key, value)

    await asyncio.gather(*(write(k, v) for k, v in writes.items()))  # the job's barrier
    await fleet.nodes[fleet.rng.choice(up)].put(f"ckpt/{step}/{MARKER}", f"meta{step}")
    return writes


def _marker_after_shards(fleet: SimFleet, steps: dict[int, dict[str, str]]) -> int:
    """Check the bucket's arrival log: each marker after every shard of its step. Returns
    how many markers arrived."""
    arrived: dict[str, float] = {}
    markers = 0
    for t, key, value in fleet.bucket.log:
        step = int(key.split("/")[1])
        if key.endswith(MARKER):
            markers += 1
            missing = [k for k in steps[step] if k not in arrived]
            assert not missing, f"t={t:.2f}: marker of step {step} before {missing}"
        elif value:
            arrived.setdefault(key, t)
    return markers


async def _fleet_drain(fleet: SimFleet, asker: str, prefix: str) -> bool:
    """What ``GET /admin/v1/drain?prefix=`` on ``asker`` answers: itself and every member."""
    node = fleet.nodes[asker]
    local = await node.api_drain(DrainRequest(BUCKET, prefix, 0.0))
    others = await node.fleet.drain(BUCKET, prefix, 0.0)
    return local.drained and all(o.answer is not None and o.answer.drained for o in others)


async def _faults(fleet: SimFleet, until_s: float) -> None:
    """Random trouble until ``until_s``: kills and restarts (disk intact), partitions that
    heal, flushers paused and resumed."""
    loop = asyncio.get_running_loop()
    rng = fleet.rng
    while loop.time() < until_s:
        await asyncio.sleep(rng.uniform(1.0, 8.0))
        name = rng.choice(fleet.names)
        what = rng.random()
        if what < 0.3:
            fleet.nodes[name].kill()
            await asyncio.sleep(rng.uniform(0.5, 10.0))
            await fleet.restart(name)
        elif what < 0.6:
            other = rng.choice([n for n in fleet.names if n != name])
            fleet.net.cut(fleet.address_of(name), fleet.address_of(other))
            await asyncio.sleep(rng.uniform(0.5, 10.0))
            fleet.net.heal()
        else:
            fleet.nodes[name].is_paused = True
            await asyncio.sleep(rng.uniform(0.5, 6.0))
            fleet.nodes[name].is_paused = False
            fleet.nodes[name].changed.set()


async def _checkpoints_under_faults(seed: int, n: int, steps: int) -> tuple[int, int]:
    fleet = SimFleet(n, seed)
    await fleet.start()
    loop = asyncio.get_running_loop()
    written: dict[int, dict[str, str]] = {}
    drains_true = 0
    faults = asyncio.ensure_future(_faults(fleet, loop.time() + steps * 6.0))
    for step in range(steps):
        shards = await _checkpoint(fleet, step, shards_per_node=3)
        written[step] = shards
        asked_s = loop.time()
        asker = fleet.rng.choice([x for x in fleet.names if fleet.nodes[x].is_up])
        if await _fleet_drain(fleet, asker, f"ckpt/{step}/"):
            drains_true += 1
            arrived = {k for t, k, _ in fleet.bucket.log if t <= loop.time()}
            late = [k for k in shards if k not in arrived]
            assert not late, f"seed {seed}: drain said drained at {asked_s:.1f}s, {late} missing"
        await asyncio.sleep(fleet.rng.uniform(0.5, 5.0))
    await faults
    fleet.net.heal()
    for name in fleet.names:
        if not fleet.nodes[name].is_up:
            await fleet.restart(name)
        fleet.nodes[name].is_paused = False
        fleet.nodes[name].changed.set()
    await asyncio.sleep(60.0)  # everything can drain now
    markers = _marker_after_shards(fleet, written)
    assert markers == steps, f"seed {seed}: {steps - markers} markers never arrived"
    await fleet.close()
    return markers, drains_true


@pytest.mark.parametrize("seed", range(40))
def test_markers_never_before_their_shards_under_crashes_and_partitions(seed: int) -> None:
    n = 2 + seed % 3
    markers, _ = run(_checkpoints_under_faults(seed, n, steps=8))
    assert markers == 8


def test_a_long_run_of_thousands_of_simulated_seconds() -> None:
    """Two nodes, 400 checkpoints under faults: about 2,500 simulated seconds (in about a
    second here; three nodes run about 1,000 times faster than real time, two 3,000)."""

    async def main() -> float:
        await _checkpoints_under_faults(1234, 2, steps=400)
        return asyncio.get_running_loop().time()

    assert run(main()) > 2000.0


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_one_key_through_many_nodes_reads_newest_and_lands_in_ack_order(seed: int) -> None:
    """Keys rewritten and deleted through random nodes, whose uploads take 1-5 s: every
    read anywhere sees the newest acknowledged version, and in the bucket a key's versions
    arrive in acknowledgement order, ending with the newest (an older version pending on a
    slow node never lands over a newer one another node uploaded)."""

    async def main() -> int:
        fleet = SimFleet(4, seed=seed, upload_s=(1.0, 5.0))
        await fleet.start()
        rng = random.Random(seed)
        latest: dict[str, str | None] = {}
        for i in range(400):
            key = f"data/{rng.randrange(6)}/k{rng.randrange(5)}"
            writer, reader = rng.sample(fleet.names, 2)
            if rng.random() < 0.2 and key in latest:
                await fleet.nodes[writer].put(key, f"d{i}", is_delete=True)
                latest[key] = None
            else:
                value = f"v{i}"
                await fleet.nodes[writer].put(key, value)
                latest[key] = value
            assert await fleet.nodes[reader].read(key) == latest[key], (i, key, writer, reader)
            await asyncio.sleep(rng.uniform(0.0, 0.5))
        assert sum(n.fleet.read_fallbacks for n in fleet.nodes.values()) == 0
        while any(n.disk.pending for n in fleet.nodes.values()):
            await asyncio.sleep(1.0)
        for key, value in latest.items():
            assert fleet.bucket.objects.get(key, (None,))[0] == value, key
        arrived: dict[str, int] = {}
        for _, key, value in fleet.bucket.log:
            order = int((value or "d-1")[1:]) if value else -1
            if order >= 0:
                assert order > arrived.get(key, -1), (key, value)
                arrived[key] = order
        dropped = sum(n.dropped for n in fleet.nodes.values())
        await fleet.close()
        return dropped

    assert run(main()) > 0  # older versions were dropped, not uploaded over newer ones


def test_a_dead_peer_delays_the_first_write_of_a_directory_by_at_most_one_lease() -> None:
    async def main() -> tuple[float, float]:
        fleet = SimFleet(3, seed=3, lease_s=3.0)
        await fleet.start()
        await asyncio.sleep(2.0)  # leases settled
        fleet.nodes["c"].kill()  # silently: it still holds a's lease
        loop = asyncio.get_running_loop()
        started = loop.time()
        await fleet.nodes["a"].put("fresh/dir/k1", "v")
        first = loop.time() - started
        started = loop.time()
        await fleet.nodes["a"].put("fresh/dir/k2", "v")
        second = loop.time() - started
        # b, alive and connected, knows the directory: it reads a's write.
        assert await fleet.nodes["b"].read("fresh/dir/k1") == "v"
        await fleet.close()
        return first, second

    first, second = run(main())
    assert 0 < first <= 3.0 + 0.1 and second == 0.0


def test_a_partitioned_holder_stops_trusting_its_copy_before_the_writer_stops_waiting() -> None:
    async def main() -> None:
        fleet = SimFleet(2, seed=5, lease_s=3.0, upload_s=(100.0, 100.0))
        await fleet.start()
        await asyncio.sleep(2.0)
        a, b = fleet.nodes["a"], fleet.nodes["b"]
        loop = asyncio.get_running_loop()
        fleet.net.cut(a.address, b.address)
        cut_s = loop.time()
        await a.put("p/new/k", "written during the partition")
        acked_s = loop.time()
        member = b.fleet.membership.get("a")
        assert member is not None
        # b's copy of a's directory was untrusted before a acknowledged without it.
        assert member.remote.trusted_until_s <= acked_s, (cut_s, acked_s)
        assert b.fleet.candidates(BUCKET, "p/new/k") == []  # a is unreachable: do without
        fleet.net.heal()
        await asyncio.sleep(3.0)  # the next renewal brings a's directory back
        assert await b.read("p/new/k") == "written during the partition"
        await fleet.close()

    run(main())


def test_a_node_back_with_an_empty_disk_keeps_the_marker_held() -> None:
    async def main() -> None:
        fleet = SimFleet(2, seed=11, upload_s=(0.05, 0.1))
        await fleet.start()
        fleet.nodes["b"].is_paused = True
        await fleet.nodes["b"].put("ck/9/b_0", "only on b")
        await fleet.nodes["a"].put("ck/9/a_0", "on a")
        marker = await fleet.nodes["a"].put(f"ck/9/{MARKER}", "meta")
        await asyncio.sleep(5.0)
        await fleet.restart("b", wipe=True)
        await asyncio.sleep(30.0)
        assert f"ck/9/{MARKER}" not in fleet.bucket.objects
        reason = fleet.nodes["a"].fleet.held_by(BUCKET, marker.key)
        assert reason is not None and "new data dir" in reason
        await fleet.close()

    run(main())


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_a_node_back_with_an_empty_disk_is_told_of_the_data_dir_it_lost(seed: int) -> None:
    """Its reads then ask the holders of its old data dir's replicas, as the others' do
    (with replicas on: ``Fleet.replica_candidates``). Whichever lease comes first, b's own
    request or a peer's renewal with b, the peers tell it in their grants; a restart with
    the disk tells nothing."""

    async def main() -> None:
        fleet = SimFleet(3, seed=seed, upload_s=(0.05, 0.1))
        await fleet.start()
        await asyncio.sleep(3.0)
        b = await fleet.restart("b", wipe=True)
        await asyncio.sleep(3.0)
        assert b.fleet.membership.own_datadir_lost_s is not None
        c = await fleet.restart("c")
        await asyncio.sleep(3.0)
        assert c.fleet.membership.own_datadir_lost_s is None
        assert fleet.nodes["a"].fleet.membership.own_datadir_lost_s is None
        await fleet.close()

    run(main())


def test_a_node_back_with_its_disk_is_read_through_the_others_before_it_flushes() -> None:
    """b restarts holding unflushed versions: the others ask it for them at once (its first
    lease grants carry their directories), not the bucket (a 404, or an older version)."""

    async def main() -> None:
        fleet = SimFleet(3, seed=13, upload_s=(0.05, 0.1))
        await fleet.start()
        a, b = fleet.nodes["a"], fleet.nodes["b"]
        await a.put("rs/dir/k", "old")
        await asyncio.sleep(5.0)  # flushed: "old" is in the bucket
        b.is_paused = True
        await b.put("rs/dir/k", "new")
        await b.put("rs/other/k2", "only on b")
        await fleet.restart("b")
        fleet.nodes["b"].is_paused = True  # still not flushed after the restart
        await asyncio.sleep(3.0)  # leases from the new incarnation
        for reader in ("a", "c"):
            assert await fleet.nodes[reader].read("rs/dir/k") == "new", reader
            assert await fleet.nodes[reader].read("rs/other/k2") == "only on b", reader
        fleet.nodes["b"].is_paused = False
        fleet.nodes["b"].changed.set()
        await fleet.close()

    run(main())


def test_a_node_back_with_its_disk_never_uploads_over_a_newer_version() -> None:
    """b is down holding an older version of a key that a writes and uploads meanwhile
    (b is nobody's candidate then); back, b drops its version: it went up over a's."""

    async def main() -> None:
        fleet = SimFleet(3, seed=21, upload_s=(0.05, 0.1))
        await fleet.start()
        fleet.nodes["b"].is_paused = True
        await fleet.nodes["b"].put("rt/k", "older, through b")
        fleet.nodes["b"].kill()
        await asyncio.sleep(10.0)
        await fleet.nodes["a"].put("rt/k", "newer, through a")
        await asyncio.sleep(10.0)  # uploaded, and a's directory withdrawn
        b = await fleet.restart("b")
        await asyncio.sleep(20.0)
        assert not b.disk.pending and b.dropped == 1
        assert [v for _, k, v in fleet.bucket.log if k == "rt/k"] == ["newer, through a"]
        await fleet.close()

    run(main())


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_a_node_back_with_its_disk_never_uploads_over_a_delete_made_meanwhile(seed: int) -> None:
    """As above with a delete: the bucket keeps nothing of it, and a noted it in the key's
    claims (b could not be asked); b back with its disk drops its older version."""

    async def main() -> None:
        fleet = SimFleet(3, seed=seed, upload_s=(0.05, 0.1))
        await fleet.start()
        await fleet.nodes["a"].put("rd/k", "v1")
        await asyncio.sleep(5.0)
        fleet.nodes["b"].is_paused = True
        await fleet.nodes["b"].put("rd/k", "older, through b")
        fleet.nodes["b"].kill()
        await asyncio.sleep(10.0)
        await fleet.nodes["a"].put("rd/k", "", is_delete=True)
        await asyncio.sleep(10.0)  # flushed, and a's directory withdrawn
        assert "rd/k" not in fleet.bucket.objects and fleet.nodes["a"].deletes.noted == 1
        b = await fleet.restart("b")
        await asyncio.sleep(20.0)
        assert not b.disk.pending and b.dropped == 1
        assert "rd/k" not in fleet.bucket.objects
        await fleet.close()

    run(main())


def test_a_write_right_after_a_restart_is_read_through_the_others() -> None:
    """a is back from a restart and acknowledges a write at once: b and c saw it down and
    hold no lease from its new incarnation yet, so it told them nothing. They must ask it
    (it said it is back, asking for their leases), not read the bucket without it."""

    async def main() -> None:
        fleet = SimFleet(3, seed=17, upload_s=(0.05, 0.1))
        await fleet.start()
        fleet.nodes["a"].kill()
        await asyncio.sleep(5.0)  # b and c find it unreachable
        a = await fleet.restart("a")
        a.is_paused = True
        await a.put("back/k", "written at once")
        for reader in ("b", "c"):
            assert await fleet.nodes[reader].read("back/k") == "written at once", reader
        await fleet.close()

    run(main())
