"""The uploader's side of "one key through two nodes" (``fleet/ordering.py``): which peers
are asked before an upload, and what their answers make of it. The peers' side and the
whole over real sockets: tests/integration/test_it_fleet.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.fleet.membership import Member
from gateway.fleet.ordering import UploadOrder
from gateway.fleet.transport import PeerUnavailable
from gateway.fleet.wire import SupersedeAnswer, SupersedeRequest, Superseding
from gateway.models import FlushState, LocalObject, ObjectMeta
from gateway.upstream.classify import Retryable


def _row(key: str = "ckpt/latest", acked_s: float = 100.0) -> LocalObject:
    meta = ObjectMeta("b", key, 3, "0" * 32, acked_s)
    return LocalObject(meta, seq=7, state=FlushState.FLUSHING, blob_id=None, acked_s=acked_s)


ROW = _row()


class _Members:
    def __init__(self, *names: str) -> None:
        self.members = {n: Member(n, f"{n}.peers:9000") for n in names}

    def get(self, node_id: str) -> Member | None:
        return self.members.get(node_id)


class _Transport:
    """Answers per address: a SupersedeAnswer for every version, or an exception."""

    def __init__(self, answers: dict[str, SupersedeAnswer | Exception]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, SupersedeRequest]] = []

    async def supersede(
        self, address: str, request: SupersedeRequest, timeout_s: float
    ) -> list[SupersedeAnswer]:
        self.asked.append((address, request))
        answer = self.answers[address]
        if isinstance(answer, Exception):
            raise answer
        return [answer for _ in request.versions]


def _order(candidates: Sequence[str], transport: _Transport, members: _Members) -> UploadOrder:
    def listed(bucket: str, key: str) -> Sequence[str]:
        assert bucket == "b" and key.startswith("ckpt/")
        return candidates

    fake: Any = members
    return UploadOrder("me", listed, fake, transport, timeout_s=2.0)  # type: ignore[arg-type]


async def test_nobody_listing_the_key_is_asked_and_the_upload_goes() -> None:
    transport = _Transport({})
    assert await _order([], transport, _Members("x")).before_upload(ROW)
    assert transport.asked == []


async def test_every_candidate_is_told_of_the_version_and_it_goes_when_none_is_newer() -> None:
    transport = _Transport(
        {"x.peers:9000": SupersedeAnswer(), "y.peers:9000": SupersedeAnswer(newer=False)}
    )
    assert await _order(["x", "y"], transport, _Members("x", "y")).before_upload(ROW)
    assert sorted(address for address, _ in transport.asked) == ["x.peers:9000", "y.peers:9000"]
    request = transport.asked[0][1]
    assert request.node == "me"
    assert request.versions == (Superseding("b", "ckpt/latest", 100.0),)


async def test_a_newer_durable_version_on_a_peer_drops_this_one() -> None:
    transport = _Transport(
        {"x.peers:9000": SupersedeAnswer(), "y.peers:9000": SupersedeAnswer(newer=True)}
    )
    assert not await _order(["x", "y"], transport, _Members("x", "y")).before_upload(ROW)


@pytest.mark.parametrize(
    "answer", [SupersedeAnswer(busy=True), PeerUnavailable("connection refused")]
)
async def test_a_peer_busy_or_not_answering_makes_the_upload_wait(
    answer: SupersedeAnswer | Exception,
) -> None:
    transport = _Transport({"x.peers:9000": SupersedeAnswer(), "y.peers:9000": answer})
    with pytest.raises(Retryable):
        await _order(["x", "y"], transport, _Members("x", "y")).before_upload(ROW)


async def test_a_candidate_that_left_the_fleet_is_not_asked() -> None:
    transport = _Transport({"x.peers:9000": SupersedeAnswer()})
    assert await _order(["x", "gone"], transport, _Members("x")).before_upload(ROW)
    assert [address for address, _ in transport.asked] == ["x.peers:9000"]


async def test_versions_starting_together_go_to_each_peer_in_one_request() -> None:
    """A flusher starting 2,500 uploads at once: one request per peer per 1,000 versions
    (the batch's bound), not one per version; every version gets its own answer."""
    transport = _Transport({"x.peers:9000": SupersedeAnswer(), "y.peers:9000": SupersedeAnswer()})
    order = _order(["x", "y"], transport, _Members("x", "y"))
    rows = [_row(f"ckpt/{i}", 100.0 + i) for i in range(2500)]
    assert all(await asyncio.gather(*(order.before_upload(r) for r in rows)))
    assert order.requests == len(transport.asked) == 6
    sizes = sorted(len(request.versions) for _, request in transport.asked)
    assert sizes == [500, 500, 1000, 1000, 1000, 1000]
    told = {v.key for _, request in transport.asked for v in request.versions}
    assert told == {r.meta.key for r in rows}


async def test_a_failed_request_fails_every_version_of_its_batch() -> None:
    transport = _Transport({"x.peers:9000": PeerUnavailable("reset")})
    order = _order(["x"], transport, _Members("x"))
    results = await asyncio.gather(
        *(order.before_upload(_row(f"ckpt/{i}")) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, Retryable) for r in results)
    assert len(transport.asked) == 1


async def test_a_takeover_asks_in_its_writers_name_and_this_nodes_own_row_too() -> None:
    """A version taken over from here goes up as its lost writer's would: the candidates
    are asked in the writer's name (reads order versions by it), and this node's own row
    of the key gives way as well; a newer durable one here stops the takeover."""
    transport = _Transport({"x.peers:9000": SupersedeAnswer()})
    order = _order(["x"], transport, _Members("x"))
    asked_here: list[tuple[str, Superseding]] = []
    here_answer = SupersedeAnswer()

    async def here(asker: str, version: Superseding) -> SupersedeAnswer:
        asked_here.append((asker, version))
        return here_answer

    order.here = here
    version = Superseding("b", "ckpt/k", 50.0)
    assert await order.before_takeover(version, "lost")
    assert [(a, r.node, r.versions) for a, r in transport.asked] == [
        ("x.peers:9000", "lost", (version,))
    ]
    assert asked_here == [("lost", version)]
    here_answer = SupersedeAnswer(newer=True)
    assert not await order.before_takeover(version, "lost")
    here_answer = SupersedeAnswer(busy=True)
    with pytest.raises(Retryable):
        await order.before_takeover(version, "lost")
    assert await order.before_upload(ROW) and len(asked_here) == 3  # its own: not asked
