"""The directory's pure rules (directory.py): what a copy lists after reordered
announcements, withdrawals and snapshots; what a grant carries; who must be told."""

from __future__ import annotations

import asyncio

from virtual_time import LoopClock, run

from gateway.clock import FakeClock
from gateway.fleet.directory import (
    MAX_CHANGES,
    TRUST_MARGIN_S,
    WITHDRAW_AFTER_S,
    LocalDirectory,
    RemoteDirectory,
)
from gateway.fleet.wire import DirChange, LeaseGrant, LeaseRequest, NodeInfo
from gateway.models import parent_prefix

B = NodeInfo("b", "disk-b", 1.0)
M = NodeInfo("m", "disk-m", 2.0)


def change(
    version: int, prefix: str, added: bool, inc: tuple[str, float] = B.incarnation
) -> DirChange:
    return DirChange("b", inc, "bkt", prefix, version, added)


def test_parent_prefix() -> None:
    assert parent_prefix("ckpt/1/shard") == "ckpt/1/"
    assert parent_prefix("top") == ""


def test_an_announcement_is_never_hidden_by_an_older_withdrawal_or_snapshot() -> None:
    copy = RemoteDirectory("b")
    copy.apply_grant(LeaseGrant(B, 3.0, 2, (("bkt", "x/"),)), sent_s=0.0)
    copy.apply_change(change(5, "ckpt/1/", True), 0.0)  # announced at 5 ...
    copy.apply_change(change(4, "ckpt/1/", False), 0.0)  # ... an older withdrawal arrives late
    assert copy.lists_key("bkt", "ckpt/1/a")
    copy.apply_grant(LeaseGrant(B, 3.0, 3, ()), sent_s=1.0)  # a snapshot from before 5
    assert copy.lists_key("bkt", "ckpt/1/a") and not copy.lists_key("bkt", "x/k")
    copy.apply_change(change(6, "ckpt/1/", False), 0.0)  # a newer withdrawal does remove it
    assert not copy.lists_key("bkt", "ckpt/1/a")


def test_copies_may_be_stale_since_a_lease_gained_after_a_gap_or_a_change_of_their_dir() -> None:
    """What a read here must check its flushed copies against (core/freshness.py): b's
    writes while no lease from b was held went unannounced here, and a directory's
    announcement or withdrawal means b wrote under it."""
    copy = RemoteDirectory("b")
    assert copy.stale_since(("bkt", "x/")) == float("-inf")
    copy.apply_grant(LeaseGrant(B, 3.0, 0, ()), sent_s=10.0)  # the first lease: a gap
    assert copy.stale_since(("bkt", "x/")) == 10.0
    copy.apply_grant(LeaseGrant(B, 3.0, 0, None), sent_s=11.0)  # renewed in time
    assert copy.stale_since(("bkt", "x/")) == 10.0
    copy.apply_change(change(1, "x/", True), 11.5)
    copy.apply_change(change(2, "x/", False), 12.0)
    assert copy.stale_since(("bkt", "x/")) == 12.0
    assert copy.stale_since(("bkt", "y/")) == 10.0
    copy.apply_grant(LeaseGrant(B, 3.0, 2, None), sent_s=20.0)  # after the lease ran out
    assert copy.stale_since(("bkt", "y/")) == 20.0


def test_a_copy_forgets_old_changes_as_a_change_of_every_directory() -> None:
    copy = RemoteDirectory("b")
    for i in range(MAX_CHANGES + 1):
        copy.apply_change(change(i + 1, f"d{i}/", True), float(i))
    assert len(copy.changes) <= MAX_CHANGES
    assert copy.stale_since(("bkt", "never/")) == float(MAX_CHANGES // 2 - 1)
    assert copy.stale_since(("bkt", f"d{MAX_CHANGES}/")) == float(MAX_CHANGES)


def test_a_copy_is_trusted_until_its_lease_ends_by_the_holders_clock() -> None:
    copy = RemoteDirectory("b")
    assert not copy.is_trusted(0.0)
    copy.apply_grant(LeaseGrant(B, 3.0, 0, ()), sent_s=10.0)
    assert copy.is_trusted(12.0) and not copy.is_trusted(13.0 - TRUST_MARGIN_S)
    copy.apply_grant(LeaseGrant(B, 0.0, 0, None), sent_s=20.0)  # a refused lease
    assert not copy.is_trusted(20.0)


def test_a_new_incarnation_voids_the_copy() -> None:
    copy = RemoteDirectory("b")
    copy.apply_grant(LeaseGrant(B, 3.0, 1, (("bkt", "a/"),)), sent_s=0.0)
    copy.apply_change(change(1, "b/", True, inc=("disk-b", 99.0)), 0.0)  # b restarted
    assert not copy.is_trusted(0.5) and not copy.lists_key("bkt", "a/k")
    assert copy.lists_key("bkt", "b/k")


def test_prefixes_match_directories_above_and_below() -> None:
    copy = RemoteDirectory("b")
    copy.apply_grant(LeaseGrant(B, 3.0, 1, (("bkt", "ckpt/7/"),)), sent_s=0.0)
    assert copy.lists_prefix("bkt", "ckpt/")
    assert copy.lists_prefix("bkt", "ckpt/7/__0")
    assert not copy.lists_prefix("bkt", "data/")
    assert not copy.lists_prefix("other", "ckpt/")


async def test_a_grant_carries_the_whole_directory_only_to_a_stale_holder() -> None:
    clock = FakeClock()
    sent: list[tuple[str, DirChange]] = []

    async def send(address: str, change: DirChange, timeout_s: float) -> None:
        sent.append((address, change))

    local = LocalDirectory(B, clock, send, lease_s=3.0)
    async with local.writing("bkt", "ckpt/1/a") as intent:
        assert intent.is_ready()  # nobody holds a lease: nobody to tell
    grant = local.grant(LeaseRequest(M, 9000, 0, None), "10.0.0.2:9000")
    assert grant.snapshot == (("bkt", "ckpt/1/"),) and grant.version == 1
    again = local.grant(LeaseRequest(M, 9000, grant.version, B.incarnation), "10.0.0.2:9000")
    assert again.snapshot is None
    async with local.writing("bkt", "ckpt/2/a") as intent:
        assert not intent.is_ready()
        await intent.ready()
    assert sent == [("10.0.0.2:9000", DirChange("b", B.incarnation, "bkt", "ckpt/2/", 2, True))]
    async with local.writing("bkt", "ckpt/2/b") as intent:
        assert intent.is_ready()  # told once per directory


def test_an_unreachable_holder_is_outwaited_once_then_refused_a_lease() -> None:
    async def send(address: str, change: DirChange, timeout_s: float) -> None:
        raise OSError("unreachable")

    async def scenario() -> float:
        local = LocalDirectory(B, LoopClock(), send, lease_s=3.0)
        loop = asyncio.get_running_loop()
        await asyncio.sleep(1.0)
        local.grant(LeaseRequest(M, 9000, 0, None), "10.0.0.2:9000")  # until 4.0
        async with local.writing("bkt", "d/k") as intent:
            await intent.ready()  # the holder's lease is outwaited
        waited = loop.time() - 1.0
        assert local.holders() == []
        assert local.grant(LeaseRequest(M, 9000, 0, None), "10.0.0.2:9000").lease_s == 0.0
        async with local.writing("bkt", "e/k") as intent:
            assert intent.is_ready()  # it holds no lease now: nobody to outwait
        return waited

    assert run(scenario()) == 3.0


def test_a_directory_is_withdrawn_only_when_empty_unwritten_and_quiet() -> None:
    clock = FakeClock()

    async def send(address: str, change: DirChange, timeout_s: float) -> None:
        return None

    async def scenario() -> None:
        local = LocalDirectory(B, clock, send, lease_s=3.0)
        unflushed = {("bkt", "d/"): True}
        async with local.writing("bkt", "d/k"):
            unflushed[("bkt", "d/")] = False
            local.tick(lambda b, p: unflushed.get((b, p), False))
            clock.advance(WITHDRAW_AFTER_S + 1)
            local.tick(lambda b, p: unflushed.get((b, p), False))
            assert local.announced() == [("bkt", "d/")]  # a write is between ack and commit
        local.tick(lambda b, p: False)
        clock.advance(WITHDRAW_AFTER_S)
        local.tick(lambda b, p: False)
        assert local.announced() == []
        assert local.version == 2  # announced at 1, withdrawn at 2

    asyncio.run(scenario())


async def test_a_takeover_upload_is_announced_and_changes_this_nodes_copies() -> None:
    """Around a takeover's upload: the directory is announced to the lease holders (their
    copies are checked while it lasts and after its withdrawal), and this node's own copies
    there count as changed: always, while it lasts; from its end, after."""
    clock = FakeClock()
    sent: list[DirChange] = []

    async def send(address: str, change: DirChange, timeout_s: float) -> None:
        sent.append(change)

    local = LocalDirectory(B, clock, send, lease_s=3.0)
    local.grant(LeaseRequest(M, 9000, 0, None), "10.0.0.2:9000")
    assert local.taken_over_since(("bkt", "t/")) == float("-inf")
    async with local.taking_over("bkt", "t/k"):
        assert [c.prefix for c in sent] == ["t/"] and local.announced() == [("bkt", "t/")]
        clock.advance(5.0)
        assert local.taken_over_since(("bkt", "t/")) == clock.monotonic()
    ended_s = clock.monotonic()
    clock.advance(1.0)
    assert local.taken_over_since(("bkt", "t/")) == ended_s
    assert local.taken_over_since(("bkt", "other/")) == float("-inf")
    local.tick(lambda b, p: False)
    clock.advance(WITHDRAW_AFTER_S)
    local.tick(lambda b, p: False)
    assert local.announced() == []  # withdrawn: the holders note the change


def test_a_restarted_node_grants_its_unflushed_directories_in_its_first_snapshot() -> None:
    local = LocalDirectory(B, FakeClock(), lambda *a: asyncio.sleep(0), lease_s=3.0)
    local.restore([("bkt", "ckpt/1/"), ("bkt", "ckpt/2/"), ("bkt", "ckpt/1/")])
    grant = local.grant(LeaseRequest(M, 9000, 0, None), "10.0.0.2:9000")
    assert grant.snapshot is not None and sorted(grant.snapshot) == [
        ("bkt", "ckpt/1/"),
        ("bkt", "ckpt/2/"),
    ]
