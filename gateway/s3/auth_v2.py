"""AWS Signature Version 2 for S3: ``Authorization: AWS <key>:<signature>`` and query-string
(``AWSAccessKeyId``, ``Signature``, ``Expires``) authentication.

S3 still verifies these, and boto3 makes such URLs by default: ``generate_presigned_url`` on
a client without an explicit ``signature_version`` signs with SigV2 in us-east-1. The string
to sign is the one botocore's ``HmacV1Auth`` / ``HmacV1QueryAuth`` sign (and S3 documents):

    VERB \\n Content-MD5 \\n Content-Type \\n Date-or-Expires \\n
    x-amz-* headers (lower-cased names, sorted, ``name:value`` lines) CanonicalizedResource

where the resource is ``/bucket/key`` as sent (``/bucket`` prefixed for virtual-hosted
requests) followed by the subresources of ``SIGNED_SUBRESOURCES`` present, sorted, values
percent-decoded. The signature is base64(HMAC-SHA1(secret, string)). A header-signed request
must be dated within the allowed skew (``x-amz-date`` wins over ``Date``, which is then
signed as empty); a query-signed one is valid until ``Expires`` (POSIX seconds).

Pure functions, no framework: table-tested with what botocore itself signs.
Reference: https://docs.aws.amazon.com/AmazonS3/latest/userguide/RESTAuthentication.html
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import unquote

from gateway.errors import (
    AccessDenied,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidRequest,
    RequestTimeTooSkewed,
    SignatureDoesNotMatch,
)

ALGORITHM_PREFIX = "AWS "
QUERY_PARAMS = ("AWSAccessKeyId", "Signature", "Expires")
# Query parameters that are part of the signed resource (botocore HmacV1Auth.QSAOfInterest).
SIGNED_SUBRESOURCES = frozenset(
    {
        "accelerate",
        "acl",
        "cors",
        "defaultObjectAcl",
        "location",
        "logging",
        "partNumber",
        "policy",
        "requestPayment",
        "torrent",
        "versioning",
        "versionId",
        "versions",
        "website",
        "uploads",
        "uploadId",
        "response-content-type",
        "response-content-language",
        "response-expires",
        "response-cache-control",
        "response-content-disposition",
        "response-content-encoding",
        "delete",
        "lifecycle",
        "tagging",
        "restore",
        "storageClass",
        "notification",
        "replication",
        "analytics",
        "metrics",
        "inventory",
        "select",
        "select-type",
        "object-lock",
    }
)
_ISO = "%Y%m%dT%H%M%SZ"


def is_v2(authorization: str | None, raw_query: str) -> bool:
    """Whether a request carries a SigV2 signature (header or query)."""
    if authorization is not None:
        return authorization.startswith(ALGORITHM_PREFIX)
    names = {part.partition("=")[0] for part in raw_query.split("&")}
    return "AWSAccessKeyId" in names or "Signature" in names


def verify_v2(
    method: str,
    resource_path: str,
    raw_query: str,
    headers: Mapping[str, Sequence[str]],
    credentials: Mapping[str, str],
    now_s: float,
    max_skew_s: float,
) -> tuple[str, str]:
    """Authenticate a SigV2 request; returns (access key, the request's timestamp as
    ``yyyymmddThhmmssZ``) or raises the S3Error S3 answers.

    ``resource_path`` is the path as sent, ``/bucket`` prefixed for a virtual-hosted
    request; ``headers`` maps lower-cased names to every value received."""
    query = _query_pairs(raw_query)
    authorization = _first(headers, "authorization")
    if authorization is not None:
        access_key, signature = _header_credential(authorization)
        date_line, signed_at_s = _header_date(headers)
        if abs(signed_at_s - now_s) > max_skew_s:
            raise RequestTimeTooSkewed(
                RequestTime=_first(headers, "x-amz-date") or _first(headers, "date") or "",
                ServerTime=_iso(now_s),
                MaxAllowedSkewMilliseconds=str(int(max_skew_s * 1000)),
            )
        amz = _amz_headers(headers, ())
    else:
        access_key, signature, date_line, signed_at_s = _query_credential(query, now_s)
        amz = _amz_headers(headers, query)
    _refuse_signed_streaming(headers)
    secret = credentials.get(access_key)
    if secret is None:
        raise InvalidAccessKeyId(AWSAccessKeyId=access_key)
    head = (
        method.upper(),
        _standard(headers, query, "content-md5"),
        _standard(headers, query, "content-type"),
        date_line,
        *amz,
    )
    tried = []
    for path in _resource_paths(resource_path):
        string_to_sign = "\n".join((*head, _resource(path, query)))
        if hmac.compare_digest(sign_v2(secret, string_to_sign).encode(), signature.encode()):
            return access_key, _iso(signed_at_s)
        tried.append(string_to_sign)
    raise SignatureDoesNotMatch(
        AWSAccessKeyId=access_key,
        StringToSign=tried[0],
        SignatureProvided=signature,
        StringToSignBytes=" ".join(f"{b:02x}" for b in tried[0].encode()),
    )


def sign_v2(secret: str, string_to_sign: str) -> str:
    """base64(HMAC-SHA1(secret, string_to_sign)), as botocore's HmacV1Auth signs."""
    digest = hmac.new(
        secret.encode("utf-8"), string_to_sign.encode("utf-8", "surrogateescape"), hashlib.sha1
    ).digest()
    return base64.b64encode(digest).decode("ascii")


# (name as sent, value percent-decoded or None when the parameter has no '=').
_Pairs = Sequence[tuple[str, str | None]]


def _query_pairs(raw_query: str) -> list[tuple[str, str | None]]:
    """The query as botocore's canonical_resource reads it: names as sent, values
    percent-decoded, ``name`` alone (no ``=``) kept apart from ``name=``."""
    pairs: list[tuple[str, str | None]] = []
    for part in raw_query.split("&"):
        if part:
            name, sep, value = part.partition("=")
            pairs.append((name, unquote(value) if sep else None))
    return pairs


def _first(headers: Mapping[str, Sequence[str]], name: str) -> str | None:
    found = headers.get(name)
    return found[0] if found else None


def _header_credential(authorization: str) -> tuple[str, str]:
    access_key, sep, signature = authorization[len(ALGORITHM_PREFIX) :].strip().rpartition(":")
    if not sep or not access_key or not signature:
        raise InvalidArgument(
            "AWS authorization header is invalid.  Expected AwsAccessKeyId:signature",
            ArgumentName="Authorization",
            ArgumentValue=authorization,
        )
    return access_key, signature


def _header_date(headers: Mapping[str, Sequence[str]]) -> tuple[str, float]:
    """The Date line of the string to sign and the request's time. With x-amz-date the
    line is empty (x-amz-date is signed among the x-amz-* headers)."""
    amz_date = _first(headers, "x-amz-date")
    value = amz_date if amz_date is not None else _first(headers, "date")
    parsed = _http_date(value)
    if parsed is None:
        raise AccessDenied("AWS authentication requires a valid Date or x-amz-date header")
    return ("" if amz_date is not None else (value or "").strip()), parsed


def _http_date(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        try:  # x-amz-date may also be ISO 8601 basic
            parsed = datetime.strptime(value.strip(), _ISO)
        except ValueError:
            return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    # S3 takes a date before the epoch as no date at all (AccessDenied), not as skew.
    return parsed.timestamp() if parsed.year >= 1970 else None


def _query_credential(query: _Pairs, now_s: float) -> tuple[str, str, str, float]:
    values: dict[str, str] = {}
    for name, value in query:
        if name in QUERY_PARAMS:
            values.setdefault(name, value or "")
    if any(not values.get(name) for name in QUERY_PARAMS):
        raise AccessDenied(
            "Query-string authentication requires the Signature, Expires and "
            "AWSAccessKeyId parameters"
        )
    expires = values["Expires"]
    if not expires.isascii() or not expires.isdigit():
        raise AccessDenied(f"Invalid date (should be seconds since epoch): {expires}")
    expires_s = int(expires)
    if now_s > expires_s:
        raise AccessDenied("Request has expired", Expires=_iso(expires_s), ServerTime=_iso(now_s))
    return values["AWSAccessKeyId"], values["Signature"], expires, float(expires_s)


def _amz_headers(headers: Mapping[str, Sequence[str]], query: _Pairs) -> list[str]:
    """``name:value`` lines of the x-amz-* headers, sorted; values trimmed, repeats joined
    with ``,``. A query-signed URL may carry them as query parameters (botocore moves them
    there)."""
    found = {
        name: ",".join(v.strip() for v in values)
        for name, values in headers.items()
        if name.startswith("x-amz-")
    }
    for name, value in query:
        lowered = name.lower()
        if lowered.startswith("x-amz-") and lowered not in found:
            found[lowered] = (value or "").strip()
    return [f"{name}:{found[name]}" for name in sorted(found)]


def _standard(headers: Mapping[str, Sequence[str]], query: _Pairs, name: str) -> str:
    value = _first(headers, name)
    if value is None:
        value = next((v or "" for n, v in query if n.lower() == name), "")
    return value.strip()


def _resource_paths(path: str) -> list[str]:
    """The resource as sent, and for a bucket addressed without its trailing slash
    (``/bucket``) also ``/bucket/``: S3 names a bucket's resource so, and botocore signs it
    so (its auth_path) while sending ``/bucket``."""
    bucket, sep, _ = path[1:].partition("/")
    return [path, path + "/"] if bucket and not sep else [path]


def _resource(path: str, query: _Pairs) -> str:
    signed = sorted(((n, v) for n, v in query if n in SIGNED_SUBRESOURCES), key=lambda p: p[0])
    if not signed:
        return path
    return path + "?" + "&".join(n if v is None else f"{n}={v}" for n, v in signed)


def _refuse_signed_streaming(headers: Mapping[str, Sequence[str]]) -> None:
    sha = _first(headers, "x-amz-content-sha256") or ""
    if sha.startswith("STREAMING-AWS4-"):
        raise InvalidRequest(
            "Chunk signatures (STREAMING-AWS4-HMAC-SHA256-PAYLOAD) require "
            "AWS4-HMAC-SHA256 authentication."
        )


def _iso(timestamp_s: float) -> str:
    return datetime.fromtimestamp(timestamp_s, UTC).strftime(_ISO)
