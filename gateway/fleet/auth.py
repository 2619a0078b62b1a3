"""Peer authentication: HMAC-SHA256 over a request, keyed by the fleet secret (pure).

A peer request carries ``x-gateway-peer-node`` (the sender's node id),
``x-gateway-peer-date`` (seconds since the epoch) and ``x-gateway-peer-signature``: hex
HMAC-SHA256 of ``METHOD\\npath\\nquery\\ndate\\nnode\\nsha256(body)`` (the body hash is
``UNSIGNED`` for a streamed body, whose own digests protect it). The receiver recomputes
it; a request whose date is more than ``MAX_SKEW_S`` away from its clock, or whose
signature differs, is refused. S3 credentials play no part: an S3 client cannot produce it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

NODE_HEADER = "x-gateway-peer-node"
DATE_HEADER = "x-gateway-peer-date"
SIGNATURE_HEADER = "x-gateway-peer-signature"
BODY_HEADER = "x-gateway-peer-body-sha256"
UNSIGNED = "UNSIGNED"
MAX_SKEW_S = 300.0
_LABEL = b"s3-gateway fleet peer secret v1"


class PeerAuthError(Exception):
    """A peer request that is not signed by a member of this fleet; the text says why."""


def derive_secret(upstream_secret_key: str) -> bytes:
    """The default fleet secret: from the gateway's own upstream credentials, which every
    gateway of one fleet shares and no S3 client of theirs holds."""
    return hmac.new(upstream_secret_key.encode(), _LABEL, hashlib.sha256).digest()


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def signature(
    secret: bytes, method: str, path: str, query: str, date: str, node: str, body_sha256: str
) -> str:
    text = "\n".join((method.upper(), path, query, date, node, body_sha256))
    return hmac.new(secret, text.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def sign(
    secret: bytes, method: str, path: str, query: str, node: str, now_s: float, body: bytes | None
) -> dict[str, str]:
    """The headers that authenticate one request (``body`` None: a streamed body)."""
    date = f"{now_s:.3f}"
    digest = UNSIGNED if body is None else body_digest(body)
    return {
        NODE_HEADER: node,
        DATE_HEADER: date,
        BODY_HEADER: digest,
        SIGNATURE_HEADER: signature(secret, method, path, query, date, node, digest),
    }


def verify(
    secret: bytes,
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    now_s: float,
    body: bytes | None,
) -> str:
    """The sender's node id if ``headers`` authenticate the request; raises
    ``PeerAuthError`` otherwise. ``body`` None: the request's body is streamed (its hash
    header must then say ``UNSIGNED``)."""
    node, date = headers.get(NODE_HEADER), headers.get(DATE_HEADER)
    given, digest = headers.get(SIGNATURE_HEADER), headers.get(BODY_HEADER)
    if not node or not date or not given or not digest:
        raise PeerAuthError("not a signed peer request")
    try:
        sent_s = float(date)
    except ValueError:
        raise PeerAuthError("bad date") from None
    if not abs(now_s - sent_s) <= MAX_SKEW_S:  # also refuses nan
        raise PeerAuthError("date too far from this node's clock")
    expected_digest = UNSIGNED if body is None else body_digest(body)
    if not hmac.compare_digest(digest, expected_digest):
        raise PeerAuthError("body does not match its signed hash")
    expected = signature(secret, method, path, query, date, node, digest)
    if not hmac.compare_digest(given, expected):
        raise PeerAuthError("bad signature")
    return node
