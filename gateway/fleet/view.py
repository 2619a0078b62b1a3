"""The narrow interfaces through which the services and the flusher use the fleet.

``core/`` writes and reads through ``FleetView``; ``flush/`` holds commit markers through
``MarkerHolds``. Both are implemented by ``gateway.fleet.node.Fleet``, which the
composition root builds only when peers are configured: with no peers the services get
None and never touch the fleet.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from gateway.fleet.transport import AttributesPage, PeerError, PeerHead, PeerRead, SocketSpan
from gateway.fleet.wire import PeerRow
from gateway.models import LocalObject, ObjectMeta

# A version is older than the bucket's object when that object was written this long after
# the version's acknowledgement: the bucket's clock and a gateway's differ (the takeover,
# fleet/standing.py; a node back from a restart, fleet/recovered.py).
NEWER_MARGIN_S = 2.0

__all__ = [
    "NEWER_MARGIN_S",
    "AttributesPage",
    "FleetView",
    "HoldHandle",
    "MarkerHolds",
    "PeerError",
    "PeerHead",
    "PeerRead",
    "PeerRow",
    "SocketSpan",
    "WriteReady",
]


class WriteReady(Protocol):
    def is_ready(self) -> bool:
        """True when nothing needs announcing (the usual case: no await needed)."""
        ...

    async def ready(self) -> None:
        """Return once the fleet knows this write's directory (await before the commit)."""
        ...


class Holder(Protocol):
    @property
    def node_id(self) -> str: ...


class ReplicaWriter(Protocol):
    """One write's replicas (``--replicas``): the body through ``tee``, then ``staged``
    (which holders have it; strict policy: SlowDown when too few, before anything is
    committed here), then, after the local commit, ``commit`` (SlowDown when too few
    committed under the strict policy; the write then stays here, unacknowledged). A
    PutObject may ``commit(is_early=True)`` beside its local commit instead, and
    ``withdraw`` the version if the local commit fails (core/writes.py, ``EarlyCommit``)."""

    @property
    def stage_id(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def holders(self) -> Sequence[Holder]: ...

    def tee(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]: ...

    async def staged(
        self, md5_hex: str, size_bytes: int, crc32c: int | None = None
    ) -> Sequence[Holder]: ...

    def abort(self) -> None: ...

    async def commit(
        self,
        holders: Sequence[Holder],
        seq: int,
        meta: ObjectMeta,
        acked_s: float,
        *,
        is_delete: bool = False,
        stage_ids: Sequence[str] = (),
        parts: Sequence[tuple[int, str]] = (),
        resend: Callable[[str], AsyncIterator[bytes]] | None = None,
        is_early: bool = False,
        crc32cs: Sequence[int | None] = (),
    ) -> int: ...

    async def withdraw(self, seq: int) -> bool: ...


class FleetView(Protocol):
    def replicate(
        self,
        bucket: str,
        key: str,
        upload: tuple[str, int] | None = None,
        size_hint: int | None = None,
    ) -> ReplicaWriter | None:
        """The replicas of one write (None without --replicas; ``size_hint``: the body's
        length when known). Raises SlowDown when the strict policy cannot be met now."""
        ...

    def writing(self, bucket: str, key: str) -> AbstractAsyncContextManager[WriteReady]:
        """Enter before a write of ``key`` starts, leave after it is committed (or failed)."""
        ...

    async def unflushed_elsewhere(self, bucket: str) -> bool | None:
        """Whether another member holds writes in ``bucket`` not yet durable upstream (None:
        a member did not answer). For DeleteBucket: a bucket deleted under them would fail
        their acknowledged writes for ever."""
        ...

    def deciding(self, bucket: str, key: str) -> AbstractAsyncContextManager[None]:
        """Around a conditional write's last check and its commit: no other node's
        conditional write of ``key`` checks or commits meanwhile (``fleet/condlock.py``)."""
        ...

    def candidates(self, bucket: str, key: str) -> Sequence[str]:
        """Peers that may hold an unflushed version of ``key`` (cheap: no network)."""
        ...

    def copies_stale_since(self, bucket: str, key: str) -> float:
        """The last moment (monotonic) another node may have written ``key`` without this
        node knowing: a durable copy checked against the bucket before it may be stale
        (cheap: no network; ``core/freshness.py``)."""
        ...

    def prefix_candidates(self, bucket: str, prefix: str) -> Sequence[str]:
        """Peers that may hold unflushed versions under ``prefix``."""
        ...

    async def heads(
        self,
        nodes: Sequence[str],
        bucket: str,
        key: str,
        *,
        replica: bool = False,
        attributes: AttributesPage | None = None,
    ) -> list[PeerHead]:
        """The unflushed versions ``nodes`` hold of ``key``, asked in parallel; a node that
        does not answer in time is left out (counted and logged as a fallback).
        ``replica``: the newest replica of it each holds for another node.
        ``attributes``: each with its GetObjectAttributes (that page of its parts)."""
        ...

    async def read(
        self,
        node: str,
        bucket: str,
        key: str,
        method: str,
        headers: Mapping[str, str],
        *,
        replica: bool = False,
        zero_copy: bool = False,
    ) -> PeerRead | None:
        """A GET/HEAD of ``key`` on ``node`` (None: it holds no unflushed version, or does
        not answer). Raises ``PeerError`` for an S3 error of its version. ``replica``: the
        replica ``node`` holds for a writer that cannot answer, instead of its own.
        ``zero_copy``: the body may end in a ``SocketSpan`` (``PeerRead``)."""
        ...

    def replica_candidates(self, bucket: str, key: str) -> Sequence[str]:
        """With replicas, when a member cannot answer: the reachable holders of ``key``'s
        replicas (rendezvous), to read it from; else none."""
        ...

    async def rows(
        self, nodes: Sequence[str], bucket: str, prefix: str, after: str, limit: int
    ) -> tuple[list[PeerRow], str | None]:
        """The unflushed rows of ``nodes`` under ``prefix`` after ``after``, merged in key
        order (the newest acknowledgement per key), and how far they are complete: every
        row up to the returned key is in the list (None: to the end)."""
        ...

    def held_by(self, bucket: str, key: str) -> str | None:
        """Why the commit marker ``key`` is held by the fleet, if it is."""
        ...

    def replicas_short(self, bucket: str, key: str, seq: int) -> str | None:
        """``copies/wanted`` when this version was acknowledged with fewer replicas than
        ``--replicas`` (``--replica-policy degrade``) and has not got them since."""
        ...

    def stuck_reason(self, bucket: str, key: str) -> str | None:
        """``held_by`` only when the marker waits on nothing but nodes that cannot answer
        (unreachable, or back with an empty disk): then only an operator or the node's
        return releases it."""
        ...

    async def figures(
        self, bucket: str, paths: Sequence[str]
    ) -> list[tuple[str, dict[str, dict[str, Any]] | None, str | None]]:
        """Every active member's checkpoint figures of ``paths`` (their ``as_dict`` with
        ``held_by``), asked in parallel: (node, figures by path or None, error)."""
        ...


class HoldHandle(Protocol):
    @property
    def is_released(self) -> bool: ...

    @property
    def is_stuck(self) -> bool:
        """It waits only on nodes that cannot answer: time alone will not release it."""
        ...


class MarkerHolds(Protocol):
    def hold(self, bucket: str, key: str, seq: int, on_release: Callable[[], None]) -> HoldHandle:
        """Hold marker ``key`` until every member drained its directory; ``on_release``
        runs once when it may flush (maybe at once, when there is nobody to ask)."""
        ...

    def cancel(self, handle: HoldHandle) -> None:
        """The marker's version left pending: stop asking."""
        ...


class UploadOrder(Protocol):
    """One key through two nodes (docs/fleet.md): versions reach the bucket in
    acknowledgement order."""

    async def before_upload(self, obj: LocalObject) -> bool:
        """True: upload (peers dropped, or finished uploading, older versions of the key).
        False: a peer's newer version is durable upstream; drop this one. Raises a
        FlushError when a peer cannot be asked now."""
        ...


class DeleteNotes(Protocol):
    """In a fleet (docs/fleet.md, "One key through two nodes", on restarts): deletes a node
    back with its disk could not otherwise know of."""

    async def before_delete(self, obj: LocalObject) -> None:
        """Before ``obj`` goes up: a delete is noted in its key's claims if a member cannot
        be asked now. Raises a FlushError when the bucket cannot be asked."""
        ...

    async def deleted_since(self, obj: LocalObject, *, direct: bool = False) -> bool:
        """Whether a delete of ``obj``'s key newer than ``obj`` was noted (or claimed)."""
        ...


class UploadClaims(Protocol):
    """With replicas on (docs/fleet.md, "Takeover"): one uploader per version."""

    async def before_upload(self, obj: LocalObject) -> str:
        """``upload`` (this node won the claim), ``done`` (another uploaded it) or ``wait``
        (another, not lost, holds the claim). Raises a FlushError when the bucket cannot
        be asked."""
        ...

    async def after_upload(self, obj: LocalObject) -> None: ...
