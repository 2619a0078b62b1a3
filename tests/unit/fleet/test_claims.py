"""Claims (gateway/fleet/claims.py) over an in-memory bucket with S3's conditional-write
answers: one winner per epoch, a lost claimant taken over at the next, a done mark ends
it, a claimant that lost its answer finds its own claim, and the order of versions that a
taker-over reads from the listing of a key's claims."""

from __future__ import annotations

import pytest

from gateway.fleet.claims import Claimant, Claims, Outcome, Version, key_prefix
from gateway.fleet.takeover import DeleteNotes, UploadClaims
from gateway.fleet.wire import NodeInfo
from gateway.models import FlushState, LocalObject, ObjectMeta


class MemoryBucket:
    """put_if_absent / get_small / list_keys as S3 answers them (strongly consistent)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    async def put_if_absent(self, bucket: str, key: str, body: bytes) -> bool:
        if key in self.objects:
            return False
        self.objects[key] = body
        return True

    async def get_small(self, bucket: str, key: str) -> bytes | None:
        return self.objects.get(key)

    async def list_keys(self, bucket: str, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))


def version(seq: int = 1, owner: str = "a", acked_s: float = 100.0, key: str = "k") -> Version:
    return Version("b", key, acked_s, owner, f"dir-{owner}", seq, f"etag{seq}{owner}")


def claims_of(
    bucket: MemoryBucket, me: str, lost: set[str] | None = None, started_s: float = 1.0
) -> Claims:
    gone = lost if lost is not None else set()

    def is_lost(node: str, datadir: str | None, started: float | None) -> bool:
        # As Takeover.claimant_lost: lost by the view, or an earlier run of this node.
        return node in gone or (node == me and started != started_s)

    return Claims(bucket, Claimant(me, f"dir-{me}", started_s), ".gateway/", is_lost)


async def test_one_winner_and_the_others_see_who_holds_it() -> None:
    bucket = MemoryBucket()
    v = version()
    assert (await claims_of(bucket, "a").claim(v)).outcome is Outcome.WON
    held = await claims_of(bucket, "b").claim(v)
    assert (held.outcome, held.epoch, held.holder) == (Outcome.HELD, 1, "a")


async def test_a_lost_claimant_is_taken_over_at_the_next_epoch_and_learns_it() -> None:
    bucket = MemoryBucket()
    v = version()
    lost: set[str] = set()
    assert (await claims_of(bucket, "a", lost).claim(v)).outcome is Outcome.WON
    lost.add("a")
    taken = await claims_of(bucket, "b", lost).claim(v)
    assert (taken.outcome, taken.epoch) == (Outcome.WON, 2)
    # a comes back (its claim of epoch 1 answered long ago): it sees epoch 2 is b's.
    back = await claims_of(bucket, "a", set()).claim(v)
    assert (back.outcome, back.holder) == (Outcome.HELD, "b")


async def test_a_claimant_that_lost_its_answer_finds_its_own_claim() -> None:
    bucket = MemoryBucket()
    v = version()
    await claims_of(bucket, "a").claim(v)
    again = await claims_of(bucket, "a").claim(v)  # a retry after a lost answer
    assert (again.outcome, again.epoch) == (Outcome.WON, 1)


async def test_after_a_restart_the_writer_and_a_taker_over_race_for_a_new_epoch() -> None:
    bucket = MemoryBucket()
    v = version()
    await claims_of(bucket, "a", started_s=1.0).claim(v)  # then a is killed, restarts
    back = claims_of(bucket, "a", started_s=2.0)
    taker = claims_of(bucket, "b", {"a"})  # b saw a silent past --peer-timeout
    first, second = await taker.claim(v), await back.claim(v)
    assert (first.outcome, first.epoch) == (Outcome.WON, 2)  # b won the race for epoch 2
    assert (second.outcome, second.holder) == (Outcome.HELD, "b")  # a learns it, not epoch 1


async def test_a_claimant_back_with_another_data_dir_is_taken_over() -> None:
    bucket = MemoryBucket()
    v = version()
    await claims_of(bucket, "b").claim(v)  # b claims a's version, then loses its disk
    wiped = Claims(bucket, Claimant("b", "dir-new", 5.0), ".gateway/", lambda n, d, t: False)
    c = Claims(bucket, Claimant("c", "dir-c", 1.0), ".gateway/", lambda n, d, t: d == "dir-b")
    assert (await c.claim(v)).outcome is Outcome.WON
    assert (await wiped.claim(v)).outcome is Outcome.HELD


async def test_done_ends_every_later_claim() -> None:
    bucket = MemoryBucket()
    v = version()
    claims = claims_of(bucket, "a")
    await claims.claim(v)
    await claims.done(v)
    await claims.done(v)  # idempotent
    assert (await claims_of(bucket, "b", {"a"}).claim(v)).outcome is Outcome.DONE


async def test_claims_of_a_key_share_its_prefix_whatever_the_key() -> None:
    bucket = MemoryBucket()
    long_key = "x/" * 500 + "é\udcff"  # 1,000+ characters, a lone surrogate
    await claims_of(bucket, "a").claim(version(key=long_key))
    [name] = bucket.objects
    assert name.startswith(key_prefix(".gateway/", long_key)) and len(name) < 200


@pytest.mark.parametrize(
    ("claimed", "held", "newer"),
    [
        (version(seq=6, acked_s=99.0), version(seq=5), True),  # one writer: by sequence
        (version(seq=4, acked_s=101.0), version(seq=5), False),
        (version(owner="b", acked_s=100.5), version(), True),  # writers: by ack time
        (version(owner="b", acked_s=99.5), version(), False),
        (version(owner="b"), version(), True),  # same microsecond: by node id
        (version(owner="b", key="other", acked_s=200.0), version(), False),  # another key
        (version(), version(), False),  # itself
    ],
)
async def test_claimed_versions_are_ordered_as_the_fleet_orders_writes(
    claimed: Version, held: Version, newer: bool
) -> None:
    bucket = MemoryBucket()
    await claims_of(bucket, claimed.owner).claim(claimed)
    found = await claims_of(bucket, "c").claimed(held)
    assert found == ({claimed} if claimed.key == held.key else set())  # ETags too
    assert any(v.is_newer_than(held) for v in found) is newer


async def test_a_newer_version_is_on_its_way_only_while_someone_alive_claims_it() -> None:
    """The writer ``a`` acknowledged seq 7 (a replica on ``b``), then claimed seq 10 and
    was wiped before uploading it (seq 10 was never acknowledged: nobody holds it). Seq 10
    is not on its way, so ``b`` uploads seq 7; a newer version claimed by a live node, or
    done, is on its way and seq 7 stays out."""
    bucket = MemoryBucket()
    older, newer = version(seq=7), version(seq=10)
    lost: set[str] = set()
    await claims_of(bucket, "a", lost).claim(newer)
    taker = claims_of(bucket, "b", lost)
    assert await taker.newer_on_its_way(older)  # a is alive: it uploads seq 10
    lost.add("a")
    assert not await taker.newer_on_its_way(older)
    assert not await taker.newer_on_its_way(newer)  # nothing newer than itself
    # c holds a replica of seq 10 after all and takes it over: on its way again, then done.
    assert (await claims_of(bucket, "c", lost).claim(newer)).epoch == 2
    assert await taker.newer_on_its_way(older)
    lost.add("c")
    assert not await taker.newer_on_its_way(older)
    await claims_of(bucket, "c", lost).done(newer)
    assert await taker.newer_on_its_way(older)
    # Another writer's later acknowledgement counts as newer; an earlier one does not.
    assert not await taker.newer_on_its_way(version(seq=1, owner="z", acked_s=200.0))


def _row(seq: int) -> LocalObject:
    meta = ObjectMeta("b", "k", 1, f"etag{seq}a", 100.0)
    return LocalObject(meta, seq, FlushState.PENDING, None, False, acked_s=100.0 + seq)


async def test_a_row_an_earlier_run_left_does_not_follow_its_newer_version_taken_over() -> None:
    """A writer that died between a newer version's early commit on a holder and its own
    commit comes back with the older row: the holder took the newer one over, so the
    writer's flusher finds it done and does not upload the older over it."""
    bucket = MemoryBucket()
    me = NodeInfo("a", "dir-a", 2.0)
    newer = Version("b", "k", 111.0, "a", "dir-a", 11, "etag11a")
    taker = claims_of(bucket, "h")
    assert (await taker.claim(newer)).outcome is Outcome.WON
    await taker.done(newer)
    back = UploadClaims(claims_of(bucket, "a", started_s=2.0), me, lambda b, k, seq: seq < 20)
    assert await back.before_upload(_row(10)) == "done"
    # A row of this run is never superseded so: its claim alone decides (one request less).
    plain = UploadClaims(claims_of(bucket, "a", started_s=2.0), me)
    assert await plain.before_upload(_row(9)) == "upload"


def _row(acked_s: float, *, is_delete: bool = False, seq: int = 5) -> LocalObject:
    meta = ObjectMeta("b", "k", 0 if is_delete else 1, "" if is_delete else "e1", acked_s)
    return LocalObject(meta, seq, FlushState.PENDING, None, is_delete, acked_s=acked_s)


async def test_a_delete_flushed_while_a_member_cannot_be_asked_is_noted_for_it() -> None:
    """DeleteNotes (without replicas): a's delete is noted only while someone is unheard;
    b's older version of the key, acknowledged before b's restart, finds it; a version
    newer than the delete does not."""
    bucket = MemoryBucket()
    unheard = [False]
    a_node = NodeInfo("a", "dir-a", 1.0)
    a = DeleteNotes(claims_of(bucket, "a"), a_node, lambda: unheard[0])
    await a.before_delete(_row(200.0, is_delete=True))
    assert a.noted == 0 and not bucket.objects  # everyone answers: they are asked
    unheard[0] = True
    await a.before_delete(_row(150.0))  # not a delete: nothing
    await a.before_delete(_row(200.0, is_delete=True))
    assert a.noted == 1 and len(bucket.objects) == 1
    b = DeleteNotes(claims_of(bucket, "b"), NodeInfo("b", "dir-b", 1.0), lambda: False)
    assert await b.deleted_since(_row(190.0))
    assert not await b.deleted_since(_row(210.0))
