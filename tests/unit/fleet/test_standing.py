"""Where a lost writer's replica stands against the bucket (gateway/fleet/standing.py): the
one decision behind "take it over" and "serve it to a read"."""

from __future__ import annotations

from gateway.fleet.claims import Version
from gateway.fleet.standing import NEWER_MARGIN_S, Standing, standing, version_of
from gateway.models import ObjectMeta
from gateway.store.replicas import Replica


def replica(etag: str = "e2", acked_s: float = 100.0, *, is_delete: bool = False) -> Replica:
    meta = ObjectMeta(bucket="b", key="k", size_bytes=3, etag=etag, last_modified_s=acked_s)
    return Replica("w", "dir-w", 7, meta, is_delete, ("blob",), (), acked_s)


def claim(etag: str, acked_s: float, owner: str = "x", seq: int = 1) -> Version:
    return Version("b", "k", acked_s, owner, f"dir-{owner}", seq, etag)


def test_a_replica_the_bucket_holds_already_is_there() -> None:
    look = standing(replica(), ("e2", 101.0), False, set())
    assert (look.standing, look.etag) == (Standing.THERE, "e2")


def test_a_replica_with_nothing_newer_anywhere_is_the_newest() -> None:
    assert standing(replica(), None, False, set()).standing is Standing.NEWEST
    older = {claim("e1", 90.0)}  # the bucket's version was claimed, and is older
    look = standing(replica(), ("e1", 95.0), False, older)
    assert (look.standing, look.etag) == (Standing.NEWEST, "e1")  # e1: the upload's guard


def test_a_newer_version_on_its_way_or_in_the_bucket_supersedes_it() -> None:
    assert standing(replica(), None, True, set()).standing is Standing.SUPERSEDED
    newer = {claim("e3", 100.5)}  # claimed by another writer, acknowledged after
    assert standing(replica(), ("e3", 101.0), False, newer).standing is Standing.SUPERSEDED


def test_a_foreign_write_supersedes_it_only_well_after_its_ack() -> None:
    """Written by something that does not claim: ordered by the bucket's clock, with a
    margin for the clocks' difference."""
    soon = ("f", 100.0 + NEWER_MARGIN_S - 0.5)
    late = ("f", 100.0 + NEWER_MARGIN_S + 0.5)
    assert standing(replica(), soon, False, set()).standing is Standing.NEWEST
    assert standing(replica(), late, False, set()).standing is Standing.SUPERSEDED


def test_a_delete_is_never_there_while_the_key_exists() -> None:
    gone = replica("", is_delete=True)
    assert version_of(gone).etag == ""
    assert standing(gone, ("", 99.0), False, set()).standing is Standing.NEWEST
    assert standing(gone, None, False, set()).standing is Standing.NEWEST
