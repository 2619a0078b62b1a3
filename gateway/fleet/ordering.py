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

A peer that cannot be asked, or is still uploading an older version, makes the upload wait
(retried with the flusher's backoff); a peer that stays unreachable stops being a
candidate once its lease runs out (``lease_s``), as for reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from gateway.fleet.membership import Membership
from gateway.fleet.transport import PeerTransport, PeerUnavailable
from gateway.fleet.wire import SupersedeAnswer, SupersedeRequest
from gateway.models import LocalObject
from gateway.upstream.classify import Retryable

# How long a peer may wait for its own upload of an older version before answering busy.
_PEER_WAIT_S = 5.0


class UploadOrder:
    """The flusher's side (``view.UploadOrder``): ``before_upload`` for every version."""

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

    async def before_upload(self, obj: LocalObject) -> bool:
        """True: upload ``obj`` (no peer will upload an older version of its key after
        it). False: a peer's newer version is durable upstream; ``obj`` must not go over
        it. Raises Retryable when a peer cannot be asked or is still uploading."""
        nodes = self._candidates(obj.meta.bucket, obj.meta.key)
        if not nodes:
            return True
        request = SupersedeRequest(
            obj.meta.bucket, obj.meta.key, obj.acked_s, self._node_id, _PEER_WAIT_S
        )
        answers = await asyncio.gather(*(self._ask(node, request) for node in nodes))
        busy = [node for node, answer in zip(nodes, answers, strict=True) if answer.busy]
        if busy:
            raise Retryable(f"{', '.join(busy)} still uploading an older version of the key")
        return not any(answer.newer for answer in answers)

    async def _ask(self, node: str, request: SupersedeRequest) -> SupersedeAnswer:
        member = self._membership.get(node)
        if member is None:  # left the fleet since it was listed
            return SupersedeAnswer()
        try:
            return await self._transport.supersede(
                member.address, request, self._timeout_s + request.wait_s
            )
        except PeerUnavailable as exc:
            raise Retryable(f"peer {node} not asked about older versions: {exc}") from None
