"""What a GET/HEAD returns: the read's options, the version's head, the body to send.

Shared by the object service, the fleet's reads (``peers.py``) and the protocol layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.core.bodies import BodySource
from gateway.core.conditions import Preconditions
from gateway.core.ranges import ByteRange, RangeSpec
from gateway.models import FlushState, ObjectMeta


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What a GET/HEAD asks for besides the key: one byte range or one part, and
    preconditions. ``range`` and ``part_number`` are never both set (S3 refuses that)."""

    range: RangeSpec | None = None
    part_number: int | None = None
    cond: Preconditions = field(default_factory=Preconditions)


@dataclass(frozen=True, slots=True)
class ObjectHead:
    """What HEAD returns: the version's metadata and where it stands in the flush.

    ``byte_range`` is set for a 206 (range or part), ``parts_count`` for a part of a
    multipart object, ``is_not_modified`` for a 304.
    """

    meta: ObjectMeta
    state: FlushState
    byte_range: ByteRange | None = None
    parts_count: int | None = None
    is_not_modified: bool = False
    node: str | None = None  # the fleet member that holds this version, if not this node
    held_by: str | None = None  # a commit marker the fleet holds: who it waits on, and why
    replicas: str | None = None  # "copies/wanted": acknowledged with fewer replicas (degrade)


@dataclass(slots=True)
class ObjectBody:
    """A GET in progress: ``source`` yields the selected bytes once (file spans or bytes,
    see bodies.py); the caller MUST ``aclose`` it, also when it stops early."""

    head: ObjectHead
    source: BodySource
