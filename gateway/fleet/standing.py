"""Where a lost writer's replica stands against the bucket (docs/fleet.md, "Takeover":
the uploads, and reads): still the newest version of its key, the version the bucket holds
already, or superseded by a newer one there or on its way there.

The takeover uploads a replica only while it is the newest; a replica read serves it only
while it is not superseded. One decision for both, from one look at the bucket (the key's
ETag and LastModified) and one at its claims (``claims.py``): a read must never serve what
the takeover would refuse to upload as older.
"""

from __future__ import annotations

import enum
from collections.abc import Set
from dataclasses import dataclass

from gateway.fleet.claims import Version
from gateway.fleet.view import NEWER_MARGIN_S
from gateway.store.replicas import Replica


class Standing(enum.Enum):
    NEWEST = "newest"  # not in the bucket, nothing newer there or on its way
    THERE = "there"  # the bucket holds this very version (its writer uploaded it)
    SUPERSEDED = "superseded"  # a newer version is in the bucket, or on its way there


@dataclass(frozen=True, slots=True)
class Look:
    """What one look found: the standing, and the bucket's ETag then (None: no object),
    the guard of an upload that follows it (If-Match / If-None-Match)."""

    standing: Standing
    etag: str | None
    why: str = ""


def version_of(replica: Replica) -> Version:
    """A replica as the version its claims are named by."""
    meta = replica.meta
    etag = "" if replica.is_delete else meta.etag
    return Version(
        meta.bucket, meta.key, replica.acked_s, replica.owner, replica.datadir_id, replica.seq, etag
    )


def standing(
    replica: Replica,
    state: tuple[str, float] | None,
    newer_on_its_way: bool,
    claimed: Set[Version],
) -> Look:
    """``replica`` against the bucket's ``state`` of its key ((ETag, LastModified) or None)
    and the claims of the key (``Claims.look``)."""
    version = version_of(replica)
    etag = None if state is None else state[0]
    if state is not None and state[0] == replica.meta.etag and not replica.is_delete:
        return Look(Standing.THERE, etag)
    if newer_on_its_way:
        return Look(Standing.SUPERSEDED, etag, "a newer version is on its way")
    # A newer version already in the bucket, whoever claimed it: even a claimant lost to
    # this node (a writer cut off from it, not from the bucket) got it there.
    if state is not None and any(c.etag == state[0] and c.is_newer_than(version) for c in claimed):
        return Look(Standing.SUPERSEDED, etag, "the bucket holds a newer version")
    # Written by something that does not claim (not a gateway with replicas on): ordered
    # by the bucket's clock against the acknowledgement.
    foreign = state is not None and state[0] not in {c.etag for c in claimed}
    if foreign and state is not None and state[1] > replica.acked_s + NEWER_MARGIN_S:
        return Look(Standing.SUPERSEDED, etag, "the bucket holds a newer version")
    return Look(Standing.NEWEST, etag)
