"""The arithmetic of AWS Signature Version 4, shared by the side that verifies (``s3.auth``,
``s3.chunked``: requests from clients) and the side that signs (``upstream.direct``:
requests to the bucket). Pure functions of plain values; what a canonical request holds
(which path, which headers) is the caller's business.

Reference: https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Mapping, Sequence

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
TERMINATOR = "aws4_request"


@functools.lru_cache(maxsize=256)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The SigV4 key derived from a secret for one day, region and service. Cached: it is
    the same for every request of a client in a day (four HMACs saved per request)."""
    key = _hmac(("AWS4" + secret).encode("utf-8"), date)
    for part in (region, service, TERMINATOR):
        key = _hmac(key, part)
    return key


def hmac_hex(key: bytes, message: str) -> str:
    """Lower-case hex HMAC-SHA256 of a UTF-8 message: a SigV4 signature."""
    return _hmac(key, message).hex()


def scope(date: str, region: str, service: str) -> str:
    """``<yyyymmdd>/<region>/<service>/aws4_request``."""
    return f"{date}/{region}/{service}/{TERMINATOR}"


def canonical_headers(header_values: Mapping[str, Sequence[str]], names: Sequence[str]) -> str:
    """The canonical header lines of ``names`` (lower case, sorted): each value trimmed and
    its runs of whitespace collapsed, repeated values joined with ``,``."""
    lines = []
    for name in names:
        value = ",".join(" ".join(v.split()) for v in header_values.get(name, ()))
        lines.append(f"{name}:{value}\n")
    return "".join(lines)


def string_to_sign(amz_date: str, request_scope: str, canonical_request: str) -> str:
    digest = hashlib.sha256(canonical_request.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{ALGORITHM}\n{amz_date}\n{request_scope}\n{digest}"


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()
