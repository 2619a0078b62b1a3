"""The peer API's messages: what one gateway of a fleet says to another (docs/fleet.md).

Plain frozen values with ``to_json``/``from_json`` (JSON objects), shared by the peer
client, the peer API and the fleet services. ``from_json`` raises ``WireError`` on anything
malformed, so a bad or hostile body is a 400, never a traceback.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.models import ObjectMeta, meta_from_json, meta_to_json

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


def _wait_s(doc: Mapping[str, Any], most_s: float) -> float:
    """A long poll's ``wait_s``, 0 to ``most_s`` seconds."""
    wait_s = _number(doc, "wait_s")
    if not 0 <= wait_s <= most_s:
        raise WireError("wait_s: out of range")
    return wait_s


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
    # M's shares: (bucket, requests/s got through lately) of each bucket it sends to now
    # (``flush/shares.py``). Absent from an older gateway's request: none.
    shares: tuple[tuple[str, float], ...] = ()
    # M's cuts: (bucket, its own congestion events so far, the factor of the last) of the
    # same buckets (``flush/shares.py``). Absent from an older gateway's request: none.
    cuts: tuple[tuple[str, int, float], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "holder": self.holder.to_json(),
            "port": self.port,
            "known_version": self.known_version,
            "known_incarnation": list(self.known_incarnation) if self.known_incarnation else None,
            "shares": [[bucket, rate] for bucket, rate in self.shares],
            "cuts": [[bucket, events, factor] for bucket, events, factor in self.cuts],
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
            NodeInfo.from_json(doc.get("holder")),
            port,
            _field(doc, "known_version", int),
            known,
            _shares(doc.get("shares", [])),
            _cuts(doc.get("cuts", [])),
        )


_MAX_SHARES = 1024  # buckets in one report


def _shares(raw: Any) -> tuple[tuple[str, float], ...]:
    if not isinstance(raw, list) or len(raw) > _MAX_SHARES:
        raise WireError(f"shares: expected at most {_MAX_SHARES} [bucket, rate] pairs")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise WireError("shares: expected [bucket, rate] pairs")
        rate = _number({"rate": item[1]}, "rate")
        if not 0 <= rate < float("inf"):
            raise WireError("shares: a rate is a finite number >= 0")
        out.append((item[0], rate))
    return tuple(out)


def _cuts(raw: Any) -> tuple[tuple[str, int, float], ...]:
    if not isinstance(raw, list) or len(raw) > _MAX_SHARES:
        raise WireError(f"cuts: expected at most {_MAX_SHARES} [bucket, events, factor]")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)):
            raise WireError("cuts: expected [bucket, events, factor] triples")
        events = _field({"events": item[1]}, "events", int)
        factor = _number({"factor": item[2]}, "factor")
        if events < 0 or not 0 < factor <= 1:
            raise WireError("cuts: events >= 0, a factor in (0, 1]")
        out.append((item[0], events, factor))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """B's answer: the lease (``lease_s`` from when B granted it), B's identity and
    directory version, and B's whole directory when the holder's copy was stale."""

    node: NodeInfo
    lease_s: float
    version: int
    snapshot: tuple[Dir, ...] | None
    # The data dir the holder had before its current one, if B saw it change lately (the
    # window reads ask replica holders in; None: none, or an older gateway): what the
    # holder held there is gone but for its replicas.
    your_lost_datadir: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node.to_json(),
            "lease_s": self.lease_s,
            "version": self.version,
            "snapshot": None if self.snapshot is None else [list(d) for d in self.snapshot],
            "your_lost_datadir": self.your_lost_datadir,
        }

    @classmethod
    def from_json(cls, raw: Any) -> LeaseGrant:
        doc = _object(raw)
        snap = doc.get("snapshot")
        yours = doc.get("your_lost_datadir")
        if yours is not None and not isinstance(yours, str):
            raise WireError("your_lost_datadir: expected a string")
        return cls(
            NodeInfo.from_json(doc.get("node")),
            _number(doc, "lease_s"),
            _field(doc, "version", int),
            None if snap is None else tuple(_dirs(snap, "snapshot")),
            yours,
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
    # Not this node's own writes: the replicas it holds of this lost writer's (data dir's);
    # ANY_LOST_WRITER: of every writer but the ``live_writers`` ("node/data dir").
    owner: str | None = None
    owner_datadir: str | None = None
    live_writers: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "prefix": self.prefix,
            "wait_s": self.wait_s,
            "exclude_markers": self.exclude_markers,
            "owner": self.owner,
            "owner_datadir": self.owner_datadir,
            "live_writers": list(self.live_writers),
        }

    @classmethod
    def from_json(cls, raw: Any) -> DrainRequest:
        doc = _object(raw)
        wait_s = _wait_s(doc, 3600.0)
        return cls(
            _optional_str(doc, "bucket"),
            _field(doc, "prefix", str),
            wait_s,
            bool(_field(doc, "exclude_markers", bool)),
            _optional_str(doc, "owner"),
            _optional_str(doc, "owner_datadir"),
            _strings(doc.get("live_writers", [])),
        )


@dataclass(frozen=True, slots=True)
class Superseding:
    """One version the sender is about to upload: ``bucket/key`` acknowledged at
    ``acked_s`` by the sender's node."""

    bucket: str
    key: str
    acked_s: float

    def to_json(self) -> list[Any]:
        return [self.bucket, self.key, self.acked_s]

    @classmethod
    def from_json(cls, raw: Any) -> Superseding:
        if not (
            isinstance(raw, list)
            and len(raw) == 3
            and isinstance(raw[0], str)
            and isinstance(raw[1], str)
            and isinstance(raw[2], int | float)
            and not isinstance(raw[2], bool)
        ):
            raise WireError("version: expected [bucket, key, acked_s]")
        return cls(raw[0], raw[1], float(raw[2]))


MAX_SUPERSEDING = 1000  # versions in one supersede request


@dataclass(frozen=True, slots=True)
class SupersedeRequest:
    """``node`` is about to upload ``versions``: the receiver drops its older unflushed
    version of each key (waiting up to ``wait_s`` for an upload of it already on its way),
    so that none lands after the sender's (docs/fleet.md, "One key through two nodes")."""

    node: str
    versions: tuple[Superseding, ...]
    wait_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "versions": [v.to_json() for v in self.versions],
            "wait_s": self.wait_s,
        }

    @classmethod
    def from_json(cls, raw: Any) -> SupersedeRequest:
        doc = _object(raw)
        wait_s = _wait_s(doc, 600.0)
        versions = _field(doc, "versions", list)
        if not 0 < len(versions) <= MAX_SUPERSEDING:
            raise WireError(f"versions: expected 1 to {MAX_SUPERSEDING}")
        return cls(
            _field(doc, "node", str), tuple(Superseding.from_json(v) for v in versions), wait_s
        )


@dataclass(frozen=True, slots=True)
class SupersedeAnswer:
    """Per version: ``newer``, the receiver holds a newer version that is durable upstream
    (the sender's must not go over it); ``busy``, an upload of an older version is still
    on its way (ask again later)."""

    newer: bool = False
    busy: bool = False

    def to_json(self) -> list[bool]:
        return [self.newer, self.busy]

    @classmethod
    def from_json(cls, raw: Any) -> SupersedeAnswer:
        if not (isinstance(raw, list) and len(raw) == 2 and all(type(x) is bool for x in raw)):
            raise WireError("answer: expected [newer, busy]")
        return cls(raw[0], raw[1])


def supersede_answers(raw: Any, count: int) -> list[SupersedeAnswer]:
    """The answers to a request of ``count`` versions, in its order."""
    answers = _field(_object(raw), "answers", list)
    if len(answers) != count:
        raise WireError(f"answers: expected {count}")
    return [SupersedeAnswer.from_json(a) for a in answers]


ANY_LOST_WRITER = "*"


def _strings(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw) or len(raw) > 4096:
        raise WireError("expected a list of at most 4,096 strings")
    return tuple(raw)


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


@dataclass(frozen=True, slots=True)
class ReplicaCommit:
    """The writer commits a version on a holder: its identity (writer, data dir, seq), its
    metadata, and the staged bodies it is made of (in part order; none for a delete). A
    small single body may come with it (``body``, staged by the same commit: one request,
    one fsync on the holder). ``is_early``: sent beside the writer's own journal commit,
    which may still fail (a PutObject's: docs/fleet.md, "Node loss")."""

    owner: str
    datadir_id: str
    seq: int
    meta: ObjectMeta
    is_delete: bool
    stage_ids: tuple[str, ...]
    parts: tuple[tuple[int, str], ...]  # (size, etag) of each part of a multipart object
    acked_s: float
    body: bytes | None = None
    is_early: bool = False  # sent beside the writer's own commit (store/replicas.py)
    # The CRC32C of each staged body, in stage_ids' order (None: not known), for bodies a
    # holder staged by their CRC32C alone (``replica/body?sum=crc32c``: no MD5 pass).
    crc32cs: tuple[int | None, ...] = ()

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "owner": self.owner,
            "datadir_id": self.datadir_id,
            "seq": self.seq,
            "meta": meta_to_json(self.meta),
            "is_delete": self.is_delete,
            "stage_ids": list(self.stage_ids),
            "parts": [list(p) for p in self.parts],
            "acked_s": self.acked_s,
        }
        if self.body is not None:
            doc["body"] = base64.b64encode(self.body).decode("ascii")
        if self.is_early:
            doc["is_early"] = True
        if self.crc32cs:
            doc["crc32cs"] = list(self.crc32cs)
        return doc

    @classmethod
    def from_json(cls, raw: Any) -> ReplicaCommit:
        doc = _object(raw)
        ids, parts = doc.get("stage_ids"), doc.get("parts")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise WireError("stage_ids: expected strings")
        if not isinstance(parts, list) or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and isinstance(p[1], str)
            for p in parts
        ):
            raise WireError("parts: expected [size, etag] pairs")
        try:
            meta = meta_from_json(_object(doc.get("meta")))
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"meta: {exc}") from None
        return cls(
            _field(doc, "owner", str),
            _field(doc, "datadir_id", str),
            _field(doc, "seq", int),
            meta,
            _field(doc, "is_delete", bool),
            tuple(ids),
            tuple((int(a), str(b)) for a, b in parts),
            _number(doc, "acked_s"),
            _body(doc, len(ids)),
            _field(doc, "is_early", bool) if "is_early" in doc else False,
            _crc32cs(doc.get("crc32cs", []), len(ids)),
        )


def _crc32cs(raw: Any, stage_ids: int) -> tuple[int | None, ...]:
    if (
        not isinstance(raw, list)
        or len(raw) > stage_ids
        or not all(
            c is None or (isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 1 << 32)
            for c in raw
        )
    ):
        raise WireError("crc32cs: expected a CRC32C (or null) per stage id")
    return tuple(raw)


def _body(doc: Mapping[str, Any], stage_ids: int) -> bytes | None:
    raw = doc.get("body")
    if raw is None:
        return None
    if not isinstance(raw, str) or len(raw) > 4 * (INLINE_BODY_MAX_BYTES // 3 + 1):
        raise WireError(f"body: expected base64 of at most {INLINE_BODY_MAX_BYTES} bytes")
    if stage_ids != 1:
        raise WireError("body: only with one stage id")
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError as exc:
        raise WireError(f"body: {exc}") from None


INLINE_BODY_MAX_BYTES = 64 << 10  # a body this small travels with its replica commit
