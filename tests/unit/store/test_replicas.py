"""ReplicaStore (gateway/store/replicas.py) on a real journal: staged bodies, commits (a
small body staged by its commit), supersession in either order, counted bytes, and what a
holder answers about a lost writer."""

from __future__ import annotations

import hashlib

from gateway.models import ObjectMeta
from gateway.store.journal import Journal
from gateway.store.replicas import ReplicaStore, newest_of_each_key


def _meta(key: str, body: bytes) -> ObjectMeta:
    return ObjectMeta("bkt", key, len(body), hashlib.md5(body).hexdigest(), 10.0)


async def _commit_inline(store: ReplicaStore, seq: int, key: str, body: bytes) -> list[str]:
    meta = _meta(key, body)
    missing, superseded = await store.commit(
        "w", "d", seq, meta, False, [f"s{seq}"], [], 10.0 + seq, [meta.etag], (body, 1.0)
    )
    assert superseded == []  # inline bodies have no files
    return missing


async def test_a_small_body_is_staged_and_committed_by_one_call(journal: Journal) -> None:
    store = ReplicaStore(journal)
    assert await _commit_inline(store, 1, "k", b"hello") == []
    [replica] = await store.for_key("bkt", "k")
    assert (replica.seq, replica.body, replica.blob_ids) == (1, b"hello", ())
    assert journal.figures.replica_bytes == 5


async def test_a_damaged_inline_body_is_neither_staged_nor_committed(journal: Journal) -> None:
    store = ReplicaStore(journal)
    meta = _meta("k", b"hello")
    missing, _ = await store.commit(
        "w", "d", 1, meta, False, ["s1"], [], 11.0, [meta.etag], (b"hellO", 1.0)
    )
    assert missing == ["s1"]
    assert await store.for_key("bkt", "k") == []
    assert journal.figures.replica_bytes == 0


async def test_versions_of_a_key_supersede_in_either_commit_order(journal: Journal) -> None:
    store = ReplicaStore(journal)
    await _commit_inline(store, 2, "k", b"newer")
    await _commit_inline(store, 1, "k", b"older")  # crossed on the way: not kept
    await _commit_inline(store, 3, "j", b"other key")
    assert [r.seq for r in await store.for_key("bkt", "k")] == [2]
    await _commit_inline(store, 4, "k", b"newest")
    assert [r.body for r in await store.for_key("bkt", "k")] == [b"newest"]
    assert journal.figures.replica_bytes == len(b"newest") + len(b"other key")
    [(owner, datadir, versions, size, newest_s)] = await store.owners()
    assert (owner, datadir, versions, size, newest_s) == ("w", "d", 2, 15, 14.0)


async def _commit_early(store: ReplicaStore, seq: int, key: str, body: bytes) -> None:
    meta = _meta(key, body)
    missing, superseded = await store.commit(
        "w", "d", seq, meta, False, [f"s{seq}"], [], 10.0 + seq, [meta.etag], (body, 1.0),
        is_early=True,
    )  # fmt: skip
    assert (missing, superseded) == ([], [])


async def test_an_early_version_supersedes_nothing_until_its_writer_commits(
    journal: Journal,
) -> None:
    """A PutObject's holders' commit goes beside the writer's own, which may fail: the older
    version stays beside it, the newest of each key is what a takeover uploads, and a
    withdrawn early version leaves the older one as it was."""
    store = ReplicaStore(journal)
    await _commit_inline(store, 1, "k", b"acked")
    await _commit_early(store, 2, "k", b"maybe")
    assert sorted(r.seq for r in await store.for_key("bkt", "k")) == [1, 2]
    newest, older = newest_of_each_key(await store.of_owner("w", "d"))
    assert ([r.seq for r in newest], [r.seq for r in older]) == ([2], [1])
    await store.drop("w", "d", [2])  # the writer's own commit failed: withdrawn
    [kept] = await store.for_key("bkt", "k")
    assert (kept.seq, kept.body) == (1, b"acked")


async def test_an_early_newer_version_does_not_refuse_an_older_one_arriving_late(
    journal: Journal,
) -> None:
    store = ReplicaStore(journal)
    await _commit_early(store, 3, "k", b"early newer")
    await _commit_inline(store, 2, "k", b"older, committed first on its writer")
    assert sorted(r.seq for r in await store.for_key("bkt", "k")) == [2, 3]
    await _commit_inline(store, 4, "k", b"committed: supersedes both")
    assert [r.seq for r in await store.for_key("bkt", "k")] == [4]
    assert journal.figures.replica_bytes == len(b"committed: supersedes both")


async def test_newest_of_each_key_is_per_writer_and_data_dir(journal: Journal) -> None:
    store = ReplicaStore(journal)
    for owner, datadir, seq in (("w", "d", 5), ("w", "d2", 1), ("v", "d", 9)):
        meta = _meta("k", b"x")
        await store.commit(owner, datadir, seq, meta, False, [f"{owner}{datadir}{seq}"], [],
                           1.0, [meta.etag], (b"x", 1.0))  # fmt: skip
    held = [r for o, d, *_ in await store.owners() for r in await store.of_owner(o, d)]
    newest, older = newest_of_each_key(held)
    assert (len(newest), older) == (3, [])


async def test_an_owners_versions_are_read_by_sequence_number(journal: Journal) -> None:
    """A takeover round reads only the versions it claimed (``seqs``) and asks a live
    writer about the sequence numbers held, without reading the versions."""
    store = ReplicaStore(journal)
    for seq, key in ((1, "a"), (2, "b"), (3, "c")):
        await _commit_inline(store, seq, key, key.encode())
    assert [r.meta.key for r in await store.of_owner("w", "d", [1, 3])] == ["a", "c"]
    assert await store.of_owner("w", "d", [7]) == []
    assert await store.seqs_of_owner("w", "d") == [1, 2, 3]
    assert await store.seqs_of_owner("w", "other") == []


async def test_a_version_held_already_is_committed_without_its_bodies(journal: Journal) -> None:
    """Re-replication sends versions again to every holder it now chooses: one that holds
    it answers at once (nothing missing), keeps what it had, and drops a body staged for
    the second commit."""
    store = ReplicaStore(journal)
    assert await _commit_inline(store, 1, "k", b"hello") == []
    meta = _meta("k", b"hello")
    # Not staged under the new stage id, yet nothing is missing: no body is asked for.
    assert await store.commit("w", "d", 1, meta, False, ["again"], [], 11.0) == ([], [])
    await store.stage("again", "w", "bkt", "k", None, 5, meta.etag, None, 1.0, None, b"hello")
    assert await store.commit("w", "d", 1, meta, False, ["again"], [], 11.0) == ([], [])
    [replica] = await store.for_key("bkt", "k")
    assert (replica.seq, replica.body) == (1, b"hello")
    assert journal.figures.replica_bytes == 5  # the second staging was dropped
    # Another data dir of the same writer is another version.
    assert await store.commit("w", "d2", 1, meta, False, ["x"], [], 11.0) == (["x"], [])


async def test_a_body_staged_by_its_crc32c_commits_only_with_that_crc32c(
    journal: Journal,
) -> None:
    """A streamed body the holder staged without an MD5 pass (``replica/body?sum=crc32c``)
    is part of a version only if the commit names the same CRC32C; a commit that names
    none or another one finds it missing (the writer then sends it again)."""
    store = ReplicaStore(journal)
    body = b"x" * 100_000
    meta = _meta("k", body)
    await store.stage("s1", "w", "bkt", "k", "blob1", len(body), "", 1234, 1.0)
    for crcs in ([], [None], [4321]):
        missing, _ = await store.commit(
            "w", "d", 1, meta, False, ["s1"], [], 11.0, [meta.etag], expected_crc32c=crcs
        )
        assert missing == ["s1"], crcs
    missing, _ = await store.commit(
        "w", "d", 1, meta, False, ["s1"], [], 11.0, [meta.etag], expected_crc32c=[1234]
    )
    assert missing == []
    [replica] = await store.for_key("bkt", "k")
    assert replica.blob_ids == ("blob1",)
