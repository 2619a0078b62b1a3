"""One key written through two nodes: versions reach the bucket in acknowledgement order
(docs/fleet.md, "One key through two nodes").

Reads order a key's unflushed versions by acknowledgement (``core/peers.py``), but each
node uploads its own when its flusher gets to it: an older version pending on a slow node
would land after, and over, a newer one another node has already uploaded, and that node's
reads would serve it meanwhile. So before this node uploads a version, every peer that may
hold one of the key (the same candidates a read asks) is told: a peer holding an older
unflushed version drops it, first letting an upload of it already on its way finish; a
peer holding a newer version that is already durable answers so, and this node drops its
own instead of putting it over the newer one. A peer holding a newer version still pending
lets this one go: its own upload comes later and asks the same.

The versions about to go up are told to each peer in batches: what the flusher starts
within ``_BATCH_S`` goes in one request per peer (at most ``MAX_SUPERSEDING``), so a
checkpoint of many small objects written through many nodes costs a request per peer per
batch, not per object.

A peer that cannot be asked, or is still uploading an older version, makes the upload wait
(retried with the flusher's backoff); a peer that stays unreachable stops being a
candidate once its lease runs out (``lease_s``), as for reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from gateway.fleet.membership import Membership
from gateway.fleet.transport import PeerTransport, PeerUnavailable
from gateway.fleet.wire import MAX_SUPERSEDING, SupersedeAnswer, SupersedeRequest, Superseding
from gateway.models import FlushState, LocalObject
from gateway.upstream.classify import Retryable

# How long a peer may wait for its own upload of an older version before answering busy.
_PEER_WAIT_S = 5.0
TAKEOVER_WAIT_S = _PEER_WAIT_S  # ... and this node, for a version it takes over
_BATCH_S = 0.002  # versions told to one peer together: what arrives within this

_Waiter = tuple[Superseding, "asyncio.Future[SupersedeAnswer]"]
# This node's own row of a key giving way to a version about to go up (``give_way``).
Withdraw = Callable[[LocalObject, float], Awaitable[bool]]


def held_answer(
    acked_s: float, node_id: str, is_durable: bool, asker: str, version: Superseding
) -> SupersedeAnswer | None:
    """The answer of a peer holding a version of the key (acknowledged at ``acked_s`` by
    itself, ``node_id``; ``is_durable`` upstream) to ``asker`` about to upload ``version``;
    None: the peer's version is older and unflushed, and must be withdrawn. Versions are
    ordered as reads order them: acknowledgement, then node id."""
    if (acked_s, node_id) > (version.acked_s, asker):
        return SupersedeAnswer(newer=is_durable)
    if is_durable:  # went up before the asker's: the asker's goes over it
        return SupersedeAnswer()
    return None


async def give_way(
    row: LocalObject | None,
    node_id: str,
    asker: str,
    version: Superseding,
    withdraw: Withdraw | None,
    wait_s: float,
) -> SupersedeAnswer:
    """The answer of ``node_id``, holding ``row`` of the key, to ``asker`` about to upload
    ``version``: its newer version, or its older unflushed one withdrawn (``withdraw``,
    waiting up to ``wait_s`` for an upload of it already on its way: ``busy`` if that
    does not end)."""
    if row is None or withdraw is None:
        return SupersedeAnswer()
    is_durable = row.state is FlushState.DURABLE
    answer = held_answer(row.acked_s, node_id, is_durable, asker, version)
    if answer is not None:
        return answer
    return SupersedeAnswer(busy=not await withdraw(row, wait_s))


class UploadOrder:
    """The flusher's side (``view.UploadOrder``): ``before_upload`` for every version.
    Loop-bound."""

    def __init__(
        self,
        node_id: str,
        candidates: Callable[[str, str], Sequence[str]],
        membership: Membership,
        transport: PeerTransport,
        timeout_s: float,
    ) -> None:
        self._node_id = node_id
        self._candidates = candidates
        self._membership = membership
        self._transport = transport
        self._timeout_s = timeout_s
        # (peer, asker) -> versions not sent yet
        self._batches: dict[tuple[str, str], list[_Waiter]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0  # supersede requests sent (tests, status)
        # This node's own row of a key, asked as a peer would be, for a version taken over
        # from here (``before_takeover``; set by the composition root).
        self.here: Callable[[str, Superseding], Awaitable[SupersedeAnswer]] | None = None

    async def before_upload(self, obj: LocalObject) -> bool:
        """True: upload ``obj`` (no peer will upload an older version of its key after
        it). False: a peer's newer version is durable upstream; ``obj`` must not go over
        it. Raises Retryable when a peer cannot be asked or is still uploading."""
        version = Superseding(obj.meta.bucket, obj.meta.key, obj.acked_s)
        return await self._in_order(version, self._node_id, here=False)

    async def before_takeover(self, version: Superseding, owner: str) -> bool:
        """A lost writer's (``owner``'s) version about to be taken over from here goes up
        as its writer's would: the key's candidates give way, asked in the writer's name
        (reads order versions so), and so does this node's own row of the key. Without
        it, an older version pending here or on a peer went up after the taken-over one,
        over it (found by the real-socket test of a lost writer's newer version, on a
        busy machine: the takeover came before the holder's own older upload)."""
        return await self._in_order(version, owner, here=True)

    async def _in_order(self, version: Superseding, asker: str, *, here: bool) -> bool:
        nodes = list(self._candidates(version.bucket, version.key))
        try:
            answers = list(
                await asyncio.gather(*(self._ask(node, version, asker) for node in nodes))
            )
            if here and self.here is not None:
                nodes.append(self._node_id)
                answers.append(await self.here(asker, version))
        except PeerUnavailable as exc:
            raise Retryable(f"a peer was not asked about older versions: {exc}") from None
        busy = [node for node, answer in zip(nodes, answers, strict=True) if answer.busy]
        if busy:
            raise Retryable(f"{', '.join(busy)} still uploading an older version of the key")
        return not any(answer.newer for answer in answers)

    def _ask(self, node: str, version: Superseding, asker: str) -> asyncio.Future[SupersedeAnswer]:
        """The peer's answer about ``version``, sent with the others of its batch."""
        future: asyncio.Future[SupersedeAnswer] = asyncio.get_running_loop().create_future()
        to = (node, asker)
        batch = self._batches.get(to)
        if batch is None:
            batch = self._batches[to] = []
            task = asyncio.get_running_loop().create_task(self._send_after(to, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        batch.append((version, future))
        if len(batch) >= MAX_SUPERSEDING:
            del self._batches[to]  # full: its task sends it; the next version starts anew
        return future

    async def _send_after(self, to: tuple[str, str], batch: list[_Waiter]) -> None:
        await asyncio.sleep(_BATCH_S)
        if self._batches.get(to) is batch:
            del self._batches[to]
        await self._send(to, batch)

    async def _send(self, to: tuple[str, str], batch: list[_Waiter]) -> None:
        node, asker = to
        member = self._membership.get(node)
        try:
            if member is None:  # left the fleet since it was listed: it holds nothing
                answers = [SupersedeAnswer() for _ in batch]
            else:
                request = SupersedeRequest(asker, tuple(v for v, _ in batch), _PEER_WAIT_S)
                self.requests += 1
                answers = await self._transport.supersede(
                    member.address, request, self._timeout_s + _PEER_WAIT_S
                )
        except Exception as exc:  # every waiter hears of it
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)
