"""The peer API's messages: what one gateway of a fleet says to another (docs/fleet.md).

Plain frozen values with ``to_json``/``from_json`` (JSON objects), shared by the peer
client, the peer API and the fleet services. ``from_json`` raises ``WireError`` on anything
malformed, so a bad or hostile body is a 400, never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PATH_PREFIX = "/_gateway/peer/v1/"


class WireError(ValueError):
    """A peer message that is not what the protocol says; the text says which field."""


def _field(doc: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        raise WireError(f"{name}: expected {kind}, got {type(value).__name__}")
    return value


def _number(doc: Mapping[str, Any], name: str) -> float:
    value = doc.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError(f"{name}: expected a number")
    return float(value)


def _optional_str(doc: Mapping[str, Any], name: str) -> str | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, str):
        raise WireError(f"{name}: expected a string or null")
    return value


def _object(doc: Any) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise WireError("expected a JSON object")
    return doc


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """Who answers at an address: its node id, data-dir id and start (an incarnation)."""

    node_id: str
    datadir_id: str
    started_s: float
    zone: str | None = None

    @property
    def incarnation(self) -> tuple[str, float]:
        """Changes when the node restarts (``started_s``) or loses its disk (``datadir_id``)."""
        return (self.datadir_id, self.started_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "datadir_id": self.datadir_id,
            "started_s": self.started_s,
            "zone": self.zone,
        }

    @classmethod
    def from_json(cls, raw: Any) -> NodeInfo:
        doc = _object(raw)
        return cls(
            _field(doc, "node", str),
            _field(doc, "datadir_id", str),
            _number(doc, "started_s"),
            _optional_str(doc, "zone"),
        )


Dir = tuple[str, str]  # (bucket, directory prefix ending in "/" or "")


def _dirs(raw: Any, name: str) -> list[Dir]:
    if not isinstance(raw, list):
        raise WireError(f"{name}: expected a list")
    out: list[Dir] = []
    for item in raw:
        if not (
            isinstance(item, list) and len(item) == 2 and all(isinstance(i, str) for i in item)
        ):
            raise WireError(f"{name}: expected [bucket, prefix] pairs")
        out.append((item[0], item[1]))
    return out


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """M asks B for a lease on B's directory; ``port`` is M's S3 port (B reaches M at the
    request's source address and it), ``known`` the directory version of B M holds (for
    B's incarnation ``known_incarnation``)."""

    holder: NodeInfo
    port: int
    known_version: int
    known_incarnation: tuple[str, float] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "holder": self.holder.to_json(),
            "port": self.port,
            "known_version": self.known_version,
            "known_incarnation": list(self.known_incarnation) if self.known_incarnation else None,
        }

    @classmethod
    def from_json(cls, raw: Any) -> LeaseRequest:
        doc = _object(raw)
        port = _field(doc, "port", int)
        if not 0 < port < 65536:
            raise WireError("port: out of range")
        inc = doc.get("known_incarnation")
        known: tuple[str, float] | None = None
        if inc is not None:
            if not (isinstance(inc, list) and len(inc) == 2 and isinstance(inc[0], str)):
                raise WireError("known_incarnation: expected [datadir_id, started_s]")
            known = (inc[0], _number({"s": inc[1]}, "s"))
        return cls(
            NodeInfo.from_json(doc.get("holder")), port, _field(doc, "known_version", int), known
        )


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """B's answer: the lease (``lease_s`` from when B granted it), B's identity and
    directory version, and B's whole directory when the holder's copy was stale."""

    node: NodeInfo
    lease_s: float
    version: int
    snapshot: tuple[Dir, ...] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node.to_json(),
            "lease_s": self.lease_s,
            "version": self.version,
            "snapshot": None if self.snapshot is None else [list(d) for d in self.snapshot],
        }

    @classmethod
    def from_json(cls, raw: Any) -> LeaseGrant:
        doc = _object(raw)
        snap = doc.get("snapshot")
        return cls(
            NodeInfo.from_json(doc.get("node")),
            _number(doc, "lease_s"),
            _field(doc, "version", int),
            None if snap is None else tuple(_dirs(snap, "snapshot")),
        )


@dataclass(frozen=True, slots=True)
class DirChange:
    """B holds unflushed versions under ``dir`` (``added``) or no longer does, as of B's
    directory version ``version`` (B's incarnation ``incarnation``)."""

    node_id: str
    incarnation: tuple[str, float]
    bucket: str
    prefix: str
    version: int
    added: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "incarnation": list(self.incarnation),
            "bucket": self.bucket,
            "prefix": self.prefix,
            "version": self.version,
            "added": self.added,
        }

    @classmethod
    def from_json(cls, raw: Any) -> DirChange:
        doc = _object(raw)
        inc = doc.get("incarnation")
        if not (isinstance(inc, list) and len(inc) == 2 and isinstance(inc[0], str)):
            raise WireError("incarnation: expected [datadir_id, started_s]")
        return cls(
            _field(doc, "node", str),
            (inc[0], _number({"s": inc[1]}, "s")),
            _field(doc, "bucket", str),
            _field(doc, "prefix", str),
            _field(doc, "version", int),
            _field(doc, "added", bool),
        )


@dataclass(frozen=True, slots=True)
class DrainRequest:
    """Is everything this node acknowledged so far under bucket/prefix durable upstream?
    Wait up to ``wait_s``. ``exclude_markers``: commit markers do not count (a marker's
    fence asks this: markers of one directory on two nodes must not wait on each other)."""

    bucket: str | None
    prefix: str
    wait_s: float
    exclude_markers: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "prefix": self.prefix,
            "wait_s": self.wait_s,
            "exclude_markers": self.exclude_markers,
        }

    @classmethod
    def from_json(cls, raw: Any) -> DrainRequest:
        doc = _object(raw)
        wait_s = _number(doc, "wait_s")
        if not 0 <= wait_s <= 3600:
            raise WireError("wait_s: out of range")
        return cls(
            _optional_str(doc, "bucket"),
            _field(doc, "prefix", str),
            wait_s,
            bool(_field(doc, "exclude_markers", bool)),
        )


@dataclass(frozen=True, slots=True)
class DrainAnswer:
    """One node's answer to a drain: its figures of what is not durable yet."""

    node: NodeInfo
    drained: bool
    pending_objects: int
    pending_bytes: int
    failed_objects: int = 0
    held_objects: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node.to_json(),
            "drained": self.drained,
            "pending_objects": self.pending_objects,
            "pending_bytes": self.pending_bytes,
            "failed_objects": self.failed_objects,
            "held_objects": self.held_objects,
        }

    @classmethod
    def from_json(cls, raw: Any) -> DrainAnswer:
        doc = _object(raw)
        return cls(
            NodeInfo.from_json(doc.get("node")),
            _field(doc, "drained", bool),
            _field(doc, "pending_objects", int),
            _field(doc, "pending_bytes", int),
            _field(doc, "failed_objects", int),
            _field(doc, "held_objects", int),
        )

    @property
    def is_stuck(self) -> bool:
        """Nothing is left there that moves without an operator (failed, or held behind)."""
        return not self.drained and self.failed_objects + self.held_objects >= self.pending_objects


@dataclass(frozen=True, slots=True)
class PeerRow:
    """One unflushed row of a peer in a listing: a version or a delete (a tombstone)."""

    key: str
    size_bytes: int
    etag: str
    last_modified_s: float
    acked_s: float
    is_delete: bool

    def to_json(self) -> list[Any]:
        return [
            self.key,
            self.size_bytes,
            self.etag,
            self.last_modified_s,
            self.acked_s,
            self.is_delete,
        ]

    @classmethod
    def from_json(cls, raw: Any) -> PeerRow:
        if not (isinstance(raw, list) and len(raw) == 6):
            raise WireError("row: expected [key, size, etag, last_modified_s, acked_s, delete]")
        key, size, etag, modified, acked, is_delete = raw
        if not (isinstance(key, str) and isinstance(size, int) and isinstance(etag, str)):
            raise WireError("row: bad key, size or etag")
        return cls(
            key,
            size,
            etag,
            _number({"m": modified}, "m"),
            _number({"a": acked}, "a"),
            bool(is_delete),
        )
