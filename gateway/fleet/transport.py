"""The seam between the fleet's services and the network: what a gateway can ask a peer.

``PeerTransport`` is implemented by the peer client (``client.py``, HTTP to the peer API)
and by the fleet simulator's fake network (``tests/sim/fleet_sim.py``). Every call has a
deadline (``timeout_s``) and raises ``PeerUnavailable`` when the peer cannot be reached,
does not answer in time or answers with an error: the caller decides what that means (a
peer that does not answer is never drained, never "has nothing").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.fleet.wire import (
    DirChange,
    DrainAnswer,
    DrainRequest,
    LeaseGrant,
    LeaseRequest,
    NodeInfo,
    PeerRow,
    ReplicaCommit,
    SupersedeAnswer,
    SupersedeRequest,
)
from gateway.models import ObjectAttributes, ObjectMeta

# A GetObjectAttributes question's page of parts: (max parts, part number marker).
AttributesPage = tuple[int, int]


class PeerUnavailable(Exception):
    """A peer call failed: unreachable, timed out, refused or answered an error."""


@dataclass(frozen=True, slots=True)
class PeerHead:
    """A peer's answer about one key it holds unflushed: the version's metadata and state
    (``state``: pending, flushing or failed), or a delete (``is_delete``)."""

    node_id: str
    meta: ObjectMeta
    state: str
    acked_s: float
    is_delete: bool = False
    # GetObjectAttributes of the version, when the question asked for them (a delete: None).
    attributes: ObjectAttributes | None = None


@dataclass(frozen=True, slots=True)
class SocketSpan:
    """The next ``count`` bytes of a body, still in the peer connection's socket ``fd``:
    the protocol layer moves them to its client's socket with ``splice`` (no copy in this
    process) or reads them itself, each wait for the peer at most ``timeout_s``. The
    descriptor is valid until the body's iterator is resumed or closed."""

    fd: int
    count: int
    timeout_s: float


@dataclass(slots=True)
class PeerRead:
    """A peer's answer to a GET or HEAD of a key it holds unflushed, evaluated there against
    its version (range or part, preconditions): ``byte_range`` (start, end, total) for a
    206, ``parts_count`` for a part of a multipart object, ``is_not_modified`` for a 304;
    ``body`` the selected bytes (None for HEAD and 304), in pieces that are ``bytes`` or,
    for a read asked ``zero_copy``, one ``SocketSpan`` for the rest after what has already
    arrived. The caller MUST ``aclose`` it."""

    head: PeerHead
    byte_range: tuple[int, int, int] | None = None
    parts_count: int | None = None
    is_not_modified: bool = False
    body: AsyncIterator[bytes | SocketSpan] | None = None

    async def aclose(self) -> None:
        if self.body is not None:
            aclose = getattr(self.body, "aclose", None)
            if aclose is not None:
                await aclose()


class PeerError(Exception):
    """A peer answered a read with an S3 error (404 of a delete, 412, 416, ...)."""

    def __init__(
        self, status: int, code: str, message: str, fields: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.fields = dict(fields or {})


class PeerTransport(Protocol):
    async def hello(self, address: str, timeout_s: float) -> NodeInfo: ...

    async def lease(self, address: str, request: LeaseRequest, timeout_s: float) -> LeaseGrant: ...

    async def announce(self, address: str, change: DirChange, timeout_s: float) -> None: ...

    async def drain(self, address: str, request: DrainRequest, timeout_s: float) -> DrainAnswer: ...

    async def bye(self, address: str, node: NodeInfo, timeout_s: float) -> None: ...

    async def supersede(
        self, address: str, request: SupersedeRequest, timeout_s: float
    ) -> list[SupersedeAnswer]:
        """Ask the peer to drop its older unflushed versions of keys (``SupersedeRequest``);
        an answer per version, in order."""
        ...

    async def version(
        self,
        address: str,
        bucket: str,
        key: str,
        timeout_s: float,
        *,
        replica: bool = False,
        attributes: AttributesPage | None = None,
    ) -> PeerHead | None:
        """The peer's unflushed version (or delete) of ``key``; None if it holds none
        (``replica``: the newest replica of it the peer holds for another node;
        ``attributes``: with its GetObjectAttributes, that page of its parts)."""
        ...

    async def read(
        self,
        address: str,
        bucket: str,
        key: str,
        *,
        method: str,
        headers: Mapping[str, str],
        timeout_s: float,
        zero_copy: bool = False,
    ) -> PeerRead | None:
        """The peer's unflushed version of ``key`` (None: it holds none), read with the
        request's ``Range``, ``If-*`` and ``x-gateway-part-number`` headers. Raises
        ``PeerError`` for an S3 error of that version (a delete: 404 NoSuchKey, 412, 416).
        ``timeout_s`` bounds the answer's head; a body that stalls raises from its
        iterator. ``zero_copy``: the body may end in a ``SocketSpan`` (a transport without
        sockets never yields one)."""
        ...

    async def figures(
        self, address: str, bucket: str, paths: Sequence[str], timeout_s: float
    ) -> dict[str, dict[str, Any]]:
        """The peer's checkpoint figures of each directory in ``paths`` (by path)."""
        ...

    async def replica_body(
        self,
        address: str,
        owner: str,
        stage_id: str,
        bucket: str,
        key: str,
        upload: tuple[str, int] | None,
        body: AsyncIterator[bytes],
        timeout_s: float,
        size_bytes: int | None = None,
        by_crc32c: bool = False,
    ) -> tuple[str, int]:
        """Stream a body to a holder, which stages it durably: its MD5 (hex) and size.
        ``timeout_s`` bounds each wait on the holder, not the whole body; ``size_bytes``:
        the body's length when known (sent as Content-Length; small ones are staged in the
        holder's journal). ``by_crc32c``: the holder may check a streamed body by its
        CRC32C alone (no MD5 pass over it): then it answers ``crc32c:<value>`` for the
        MD5 (``crc32c_sum``), and the commit must name that CRC32C."""
        ...

    async def replica_commit(
        self, address: str, commit: ReplicaCommit, timeout_s: float
    ) -> list[str]:
        """Commit a version on a holder: the stage ids it lacks ([]: committed)."""
        ...

    async def replica_drop(
        self, address: str, owner: str, datadir_id: str, seqs: Sequence[int], timeout_s: float
    ) -> None:
        """Tell a holder these versions of ``owner`` are durable upstream or superseded."""
        ...

    async def replica_needed(
        self, address: str, owner: str, datadir_id: str, seqs: Sequence[int], timeout_s: float
    ) -> list[int] | None:
        """Ask a writer which of these versions of its own it still needs held (the rest
        are durable upstream or superseded there). None: it runs on another data dir now
        (those versions' writer is lost: they are taken over, never dropped)."""
        ...

    async def list_rows(
        self, address: str, bucket: str, prefix: str, after: str, limit: int, timeout_s: float
    ) -> tuple[list[PeerRow], bool]:
        """The peer's unflushed rows under ``prefix`` after ``after`` (at most ``limit``, in
        key order) and whether more follow."""
        ...


_CRC32C_SUM = "crc32c:"


def crc32c_sum(crc32c: int) -> str:
    """How a holder that staged a body by its CRC32C names what it got (``replica_body``)."""
    return f"{_CRC32C_SUM}{crc32c}"


def is_crc32c_sum(staged: str) -> bool:
    """Whether ``replica_body``'s answer is a ``crc32c_sum`` (else an MD5, hex)."""
    return staged.startswith(_CRC32C_SUM)
