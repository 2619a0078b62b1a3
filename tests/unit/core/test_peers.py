"""Reads across nodes (core/peers.py): the newest version's source, and the next one when
a source dies between its answer and the read."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.core.peers import newest_sources, read_newest
from gateway.fleet.transport import PeerHead, PeerRead
from gateway.models import FlushState, LocalObject, ObjectMeta

BUCKET, KEY = "ckpt", "step/shard"


def _head(node: str, etag: str, acked_s: float) -> PeerHead:
    return PeerHead(node, ObjectMeta(BUCKET, KEY, 1, etag, acked_s), "pending", acked_s)


class _Fleet:
    """Candidates and replica holders that answer ``heads``; ``dead`` nodes answered
    their version, then died: their reads find nothing."""

    def __init__(self, candidates: list[PeerHead], replicas: list[PeerHead], dead: set[str]):
        self._candidates = {h.node_id: h for h in candidates}
        self._replicas = {h.node_id: h for h in replicas}
        self.dead = dead
        self.reads: list[tuple[str, bool]] = []

    def candidates(self, bucket: str, key: str) -> Sequence[str]:
        return list(self._candidates)

    def replica_candidates(self, bucket: str, key: str) -> Sequence[str]:
        return list(self._replicas)

    async def heads(
        self, nodes: Sequence[str], bucket: str, key: str, *, replica: bool = False, **kw: object
    ) -> list[PeerHead]:
        held = self._replicas if replica else self._candidates
        return [held[n] for n in nodes if n in held]

    async def read(
        self,
        node: str,
        bucket: str,
        key: str,
        method: str,
        headers: object,
        *,
        replica: bool = False,
        zero_copy: bool = False,
    ) -> PeerRead | None:
        self.reads.append((node, replica))
        if node in self.dead:
            return None
        return PeerRead((self._replicas if replica else self._candidates)[node])


def _local(etag: str, acked_s: float) -> LocalObject:
    meta = ObjectMeta(BUCKET, KEY, 1, etag, acked_s)
    return LocalObject(meta, 1, FlushState.FLUSHING, "blob", acked_s=acked_s)


async def test_a_writer_dead_after_its_answer_is_read_from_its_replica() -> None:
    """c answers its version (newer than this node's unflushed row), then dies; a holds
    its replica: the read gets c's version from a, not this node's older row."""
    fleet = _Fleet([_head("c", "new", 11.0)], [_head("a", "new", 11.0)], dead={"c"})
    found = await read_newest(fleet, BUCKET, KEY, _local("old", 10.0), "HEAD", {})  # type: ignore[arg-type]
    assert found is not None and found.head.meta.etag == "new"
    assert fleet.reads == [("c", False), ("a", True)]  # the writer first, at one version


async def test_a_holder_dead_after_its_answer_leaves_the_writers_own() -> None:
    """The same version answered by its writer a and by b's replica: b, read first by node
    order before, died; a's own answer serves (a delete: found in the soak)."""
    fleet = _Fleet([_head("a", "", 5.0)], [_head("b", "", 5.0)], dead={"b"})
    found = await read_newest(fleet, BUCKET, KEY, _local("old", 4.0), "HEAD", {})  # type: ignore[arg-type]
    assert found is not None and fleet.reads == [("a", False)]


async def test_only_versions_newer_than_this_nodes_row_are_sources() -> None:
    fleet = _Fleet([_head("b", "older", 3.0), _head("c", "newer", 9.0)], [], dead=set())
    assert await newest_sources(fleet, ["b", "c"], BUCKET, KEY, _local("mine", 5.0)) == [  # type: ignore[arg-type]
        ("c", False)
    ]
    fleet.dead = {"c"}
    assert await read_newest(fleet, BUCKET, KEY, _local("mine", 5.0), "HEAD", {}) is None  # type: ignore[arg-type]
