"""Peer messages and peer authentication (pure): what a hostile or broken peer request
becomes (a WireError, a PeerAuthError), and what a good one round-trips to."""

from __future__ import annotations

import pytest

from gateway.fleet import auth
from gateway.fleet.membership import DnsPeers, StaticPeers, parse_peers
from gateway.fleet.wire import (
    DirChange,
    DrainAnswer,
    DrainRequest,
    LeaseGrant,
    LeaseRequest,
    NodeInfo,
    PeerRow,
    ReplicaCommit,
    WireError,
)
from gateway.models import ObjectMeta

NODE = NodeInfo("a", "d1", 12.5, "zone-1")
META = ObjectMeta("bkt", "ckpt/1/a", 5, "5d41402abc4b2a76b9719d911017c592", 3.0)
COMMIT = ReplicaCommit("a", "d1", 7, META, False, ("s1",), (), 3.0)


@pytest.mark.parametrize(
    "message",
    [
        NODE,
        LeaseRequest(NODE, 9000, 7, ("d2", 3.0)),
        LeaseRequest(NODE, 9000, 0, None),
        LeaseRequest(NODE, 9000, 0, None, (("bkt", 12.5), ("other", 0.0))),
        LeaseRequest(NODE, 9000, 0, None, (("bkt", 12.5),), (("bkt", 3, 0.8),)),
        LeaseGrant(NODE, 3.0, 9, (("bkt", "ckpt/1/"), ("bkt", ""))),
        LeaseGrant(NODE, 3.0, 9, None),
        LeaseGrant(NODE, 3.0, 9, None, "d0"),
        DirChange("a", ("d1", 12.5), "bkt", "ckpt/1/", 4, True),
        DrainRequest("bkt", "ckpt/1/", 10.0, exclude_markers=True),
        DrainRequest(None, "", 0.0),
        DrainAnswer(NODE, False, 3, 300, 1, 0),
        DrainRequest("bkt", "p/", 0.0, True, "*", live_writers=("a/d1", "b/d2")),
        COMMIT,
        ReplicaCommit("a", "d1", 7, META, False, ("s1",), (), 3.0, b"hello\x00\xff"),
        ReplicaCommit("a", "d1", 8, META, True, (), (), 3.0),
        ReplicaCommit("a", "d1", 9, META, False, ("s1", "s2"), (), 3.0, crc32cs=(7, None)),
    ],
)
def test_messages_round_trip(message: object) -> None:
    assert type(message).from_json(message.to_json()) == message  # type: ignore[attr-defined]


def test_a_grant_of_an_older_gateway_tells_of_no_lost_data_dir() -> None:
    doc = LeaseGrant(NODE, 3.0, 9, None).to_json()
    del doc["your_lost_datadir"]
    assert LeaseGrant.from_json(doc).your_lost_datadir is None
    with pytest.raises(WireError):
        LeaseGrant.from_json({**doc, "your_lost_datadir": 7})


def test_a_lease_request_without_shares_has_none() -> None:
    """An older gateway's renewal (no ``shares``): it reports nothing."""
    doc = LeaseRequest(NODE, 9000, 0, None).to_json()
    del doc["shares"]
    del doc["cuts"]
    assert LeaseRequest.from_json(doc).shares == ()
    assert LeaseRequest.from_json(doc).cuts == ()


def test_peer_rows_round_trip() -> None:
    row = PeerRow("k", 3, "e", 1.0, 2.0, True)
    assert PeerRow.from_json(row.to_json()) == row


@pytest.mark.parametrize(
    ("kind", "doc"),
    [
        (NodeInfo, None),
        (NodeInfo, []),
        (NodeInfo, {"node": 1, "datadir_id": "d", "started_s": 0}),
        (NodeInfo, {"node": "a", "datadir_id": "d", "started_s": True}),
        (LeaseRequest, {"holder": NODE.to_json(), "port": 70000, "known_version": 0}),
        (LeaseRequest, {"holder": NODE.to_json(), "port": 1, "known_version": 0, "shares": {}}),
        (
            LeaseRequest,
            {"holder": NODE.to_json(), "port": 1, "known_version": 0, "shares": [["b", -1]]},
        ),
        (
            LeaseRequest,
            {"holder": NODE.to_json(), "port": 1, "known_version": 0, "shares": [[1, 2.0]]},
        ),
        *(
            (LeaseRequest, {"holder": NODE.to_json(), "port": 1, "known_version": 0, "cuts": c})
            for c in ({}, [["b", 1]], [["b", -1, 0.8]], [["b", 1, 1.5]], [["b", 1.5, 0.8]])
        ),
        (
            LeaseRequest,
            {"holder": NODE.to_json(), "port": 1, "known_version": 0, "known_incarnation": ["x"]},
        ),
        (
            LeaseGrant,
            {"node": NODE.to_json(), "lease_s": 3, "version": 1, "snapshot": [["only-one"]]},
        ),
        (
            DirChange,
            {
                "node": "a",
                "incarnation": "x",
                "bucket": "b",
                "prefix": "",
                "version": 1,
                "added": True,
            },
        ),
        (DrainRequest, {"bucket": None, "prefix": "", "wait_s": -1, "exclude_markers": False}),
        (DrainRequest, {"bucket": None, "prefix": "", "wait_s": 1e9, "exclude_markers": False}),
        (DrainAnswer, {"node": NODE.to_json(), "drained": "yes"}),
        (PeerRow, ["k", "3", "e", 1, 2, False]),
        (
            DrainRequest,
            {
                "bucket": None,
                "prefix": "",
                "wait_s": 0,
                "exclude_markers": False,
                "live_writers": "a/d1",
            },
        ),
        (ReplicaCommit, {**COMMIT.to_json(), "body": "not base64!"}),
        (ReplicaCommit, {**COMMIT.to_json(), "body": "QUJD" * 30_000}),  # over 64 KiB
        (ReplicaCommit, {**COMMIT.to_json(), "stage_ids": ["s1", "s2"], "body": "QUJD"}),
        (ReplicaCommit, {**COMMIT.to_json(), "crc32cs": [1, 2]}),  # more than stage ids
        (ReplicaCommit, {**COMMIT.to_json(), "crc32cs": [1 << 32]}),
        (ReplicaCommit, {**COMMIT.to_json(), "crc32cs": ["7"]}),
    ],
)
def test_malformed_messages_are_wire_errors(kind: type, doc: object) -> None:
    with pytest.raises(WireError):
        kind.from_json(doc)  # type: ignore[attr-defined]


SECRET = auth.derive_secret("upstream secret")


def test_a_signed_request_verifies_and_names_its_sender() -> None:
    headers = auth.sign(SECRET, "POST", "/p", "a=1", "node-a", 1000.0, b"{}")
    assert auth.verify(SECRET, "POST", "/p", "a=1", headers, 1000.5, b"{}") == "node-a"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"secret": b"another"}, "bad signature"),
        ({"method": "GET"}, "bad signature"),
        ({"path": "/q"}, "bad signature"),
        ({"query": "a=2"}, "bad signature"),
        ({"body": b"{ }"}, "body"),
        ({"now_s": 1000.0 + auth.MAX_SKEW_S + 1}, "date"),
        ({"now_s": 1000.0 - auth.MAX_SKEW_S - 1}, "date"),
    ],
)
def test_anything_changed_after_signing_is_refused(change: dict[str, object], why: str) -> None:
    headers = auth.sign(SECRET, "POST", "/p", "a=1", "node-a", 1000.0, b"{}")
    args: dict[str, object] = {
        "secret": SECRET,
        "method": "POST",
        "path": "/p",
        "query": "a=1",
        "now_s": 1000.0,
        "body": b"{}",
    }
    args.update(change)
    with pytest.raises(auth.PeerAuthError, match=why):
        auth.verify(
            args["secret"],
            args["method"],
            args["path"],
            args["query"],  # type: ignore[arg-type]
            headers,
            args["now_s"],
            args["body"],  # type: ignore[arg-type]
        )


def test_missing_or_mangled_headers_are_refused() -> None:
    good = auth.sign(SECRET, "GET", "/p", "", "a", 1000.0, b"")
    for name in good:
        headers = {k: v for k, v in good.items() if k != name}
        with pytest.raises(auth.PeerAuthError):
            auth.verify(SECRET, "GET", "/p", "", headers, 1000.0, b"")
    for date in ("nan", "inf", "yesterday"):
        with pytest.raises(auth.PeerAuthError):
            auth.verify(SECRET, "GET", "/p", "", {**good, auth.DATE_HEADER: date}, 1000.0, b"")


def test_the_derived_secret_is_not_the_upstream_secret_and_depends_on_it() -> None:
    assert SECRET != b"upstream secret"
    assert auth.derive_secret("upstream secret") == SECRET
    assert auth.derive_secret("another") != SECRET


def test_peers_parse_as_static_lists_or_dns_names() -> None:
    assert parse_peers("a:9000, http://b:9001/,https://[::1]:9002") == StaticPeers(
        ("a:9000", "b:9001", "[::1]:9002")
    )
    assert parse_peers("dns:gw-peers.ns.svc:9000") == DnsPeers("gw-peers.ns.svc", 9000)
    for bad in ("", "a", "a:", "a:0", "a:70000", "dns:name", "dns::9000", ","):
        with pytest.raises(ValueError):
            parse_peers(bad)
