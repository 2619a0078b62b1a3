"""AWS Signature Version 4 verification for S3: the Authorization header and presigned URLs.

Pure functions over plain values (method, raw path, raw query, headers, a credentials table and
the current time), so the protocol layer can call them with whatever its framework hands it and
tests can call them with what botocore produces.

Canonicalization follows what S3 accepts, which differs from the generic SigV4 rules:

- The canonical URI is the path as sent on the wire: S3 neither double-encodes it nor collapses
  ``//`` or dot segments. A path whose escaping is not canonical (``%7E``, lower-case hex, a raw
  ``=``) is also tried re-encoded segment by segment, which is how S3 treats such paths.
- Query names and values are percent-decoded, with ``+`` read as a space (as S3, botocore's
  presigner and aiohttp's ``request.query`` all read it), then re-encoded keeping only
  ``A-Z a-z 0-9 - _ . ~``; a parameter without ``=`` has an empty value.
- Header values are trimmed and runs of whitespace collapsed; repeated headers are joined with
  ``,`` in arrival order.

References: https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html and
https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote, unquote_to_bytes

from gateway.errors import (
    AccessDenied,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidRequest,
    RequestTimeTooSkewed,
    S3Error,
    SignatureDoesNotMatch,
)
from gateway.s3.auth_v2 import is_v2, verify_v2
from gateway.sigv4 import (
    ALGORITHM,
    TERMINATOR,
    UNSIGNED_PAYLOAD,
    canonical_headers,
    hmac_hex,
    signing_key,
    string_to_sign,
)

STREAMING_PAYLOAD = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_PAYLOAD_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
# x-amz-content-sha256 values whose aws-chunked body carries chunk signatures.
SIGNED_STREAMING = frozenset({STREAMING_PAYLOAD, STREAMING_PAYLOAD_TRAILER})
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# S3 refuses presigned URLs valid for longer than seven days.
MAX_PRESIGN_EXPIRES_S = 7 * 24 * 3600

_PAYLOAD_TOKENS = frozenset(
    {UNSIGNED_PAYLOAD, STREAMING_PAYLOAD, STREAMING_PAYLOAD_TRAILER, STREAMING_UNSIGNED_TRAILER}
)
_SERVICE = "s3"
_AMZ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
_AMZ_DATE = re.compile(r"\d{8}T\d{6}Z")
_SCOPE_DATE = re.compile(r"\d{8}")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_PRESIGN_PARAMS = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
)

# One decoded query parameter: (name, value) as bytes, so re-encoding is byte-exact.
QueryParam = tuple[bytes, bytes]


@dataclass(frozen=True, slots=True)
class AuthContext:
    """An authenticated request: who signed it and what a streaming body needs to go on verifying.

    ``signing_key`` and ``seed_signature`` let ``gateway.s3.chunked`` check chunk signatures;
    ``content_sha256`` is the x-amz-content-sha256 the signature covered (``UNSIGNED-PAYLOAD``
    for a presigned URL that did not send the header).
    """

    access_key: str
    region: str
    service: str
    scope: str  # "<yyyymmdd>/<region>/<service>/aws4_request"
    amz_date: str  # the signed timestamp, e.g. 20261122T101500Z
    signing_key: bytes
    seed_signature: str  # lower-case hex
    content_sha256: str


@dataclass(frozen=True, slots=True)
class _Claim:
    """What the client says it signed, parsed from the Authorization header or the query."""

    access_key: str
    date: str  # yyyymmdd of the credential scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    amz_date: str
    signed_at_s: float  # amz_date as a POSIX timestamp
    content_sha256: str
    expires_s: int | None = None  # presigned URLs only

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/{TERMINATOR}"


def verify_request(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    credentials: Mapping[str, str],
    now_s: float,
    max_skew_s: float = 900.0,
    *,
    region: str | None = None,
    virtual_bucket: str | None = None,
) -> AuthContext:
    """Authenticate one request signed with SigV4, by header or by presigned URL.

    ``raw_path`` is the path exactly as sent (percent-encoded, without the query), ``raw_query``
    the query string without ``?``. ``headers`` may be any mapping; names are matched without
    regard to case, and a multidict's repeated headers are all used. ``credentials`` maps access
    key ids to secret keys. ``region``, when given, is the only region a credential scope may
    name (S3 refuses a signature scoped to another region, naming the one it expects).
    Signature Version 2 (``gateway.s3.auth_v2``) is verified too; it signs the resource with
    its bucket, so ``virtual_bucket`` names the bucket a virtual-hosted request's Host holds.
    Returns the ``AuthContext`` on success and raises an ``S3Error`` otherwise; it never
    returns for an anonymous request.
    """
    header_values = _lower_headers(headers)
    if is_v2(_first(header_values, "authorization"), raw_query) and "X-Amz-Algorithm" not in {
        part.partition("=")[0] for part in raw_query.split("&")
    }:
        resource = f"/{virtual_bucket}{raw_path}" if virtual_bucket else raw_path
        access_key, amz_date = verify_v2(
            method, resource, raw_query, header_values, credentials, now_s, max_skew_s
        )
        return _v2_context(access_key, amz_date, header_values)
    params = parse_query(raw_query)
    claim = _claim(header_values, params)
    if region is not None and claim.region != region:
        raise _wrong_region(claim, region)
    secret = credentials.get(claim.access_key)
    if secret is None:
        raise InvalidAccessKeyId(AWSAccessKeyId=claim.access_key)
    if claim.expires_s is None:
        _check_skew(claim, now_s, max_skew_s)
    else:
        _check_presigned_window(claim, claim.expires_s, now_s, max_skew_s)
    key = signing_key(secret, claim.date, claim.region, claim.service)
    exclude = None if claim.expires_s is None else b"X-Amz-Signature"
    canonical_query = canonicalize_query(params, exclude=exclude)
    header_lines = canonical_headers(header_values, claim.signed_headers)
    _check_signature(key, claim, method, raw_path, canonical_query, header_lines)
    return AuthContext(
        access_key=claim.access_key,
        region=claim.region,
        service=claim.service,
        scope=claim.scope,
        amz_date=claim.amz_date,
        signing_key=key,
        seed_signature=claim.signature.lower(),
        content_sha256=claim.content_sha256,
    )


def _v2_context(
    access_key: str, amz_date: str, header_values: Mapping[str, list[str]]
) -> AuthContext:
    """A SigV2 request: no signing key (its body is never chunk-signed), the payload hash
    the client declared (checked on ingest when it is a digest)."""
    sha = _first(header_values, "x-amz-content-sha256")
    ok = sha is not None and (sha in _PAYLOAD_TOKENS or _HEX64.fullmatch(sha) is not None)
    return AuthContext(
        access_key=access_key,
        region="",
        service=_SERVICE,
        scope="",
        amz_date=amz_date,
        signing_key=b"",
        seed_signature="",
        content_sha256=sha if ok and sha is not None else UNSIGNED_PAYLOAD,
    )


def parse_query(raw_query: str) -> list[QueryParam]:
    """Split a raw query into percent-decoded (name, value) pairs, ``+`` read as a space.

    Empty segments (``a=1&&b=2``, a trailing ``&``) are skipped; ``name`` alone has value ``b""``.
    """
    pairs: list[QueryParam] = []
    for part in raw_query.split("&"):
        if part:
            name, _, value = part.partition("=")
            pairs.append((_decode_component(name), _decode_component(value)))
    return pairs


def canonicalize_query(params: Sequence[QueryParam], *, exclude: bytes | None = None) -> str:
    """The SigV4 canonical query string: encoded pairs sorted by name, then value."""
    encoded = sorted(
        (_encode_component(name), _encode_component(value))
        for name, value in params
        if name != exclude
    )
    return "&".join(f"{name}={value}" for name, value in encoded)


def _decode_component(text: str) -> bytes:
    return unquote_to_bytes(text.replace("+", " ").encode("utf-8", "surrogateescape"))


def _encode_component(raw: bytes) -> str:
    # quote() never escapes A-Z a-z 0-9 - _ . ~, and with safe="" escapes everything else.
    return quote(raw, safe="")


def _lower_headers(headers: Mapping[str, str]) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for name, value in headers.items():
        values.setdefault(name.lower(), []).append(value)
    return values


def _first(header_values: Mapping[str, list[str]], name: str) -> str | None:
    found = header_values.get(name)
    return found[0] if found else None


def _claim(header_values: Mapping[str, list[str]], params: Sequence[QueryParam]) -> _Claim:
    """Parse the request's signature claim, whichever of the two mechanisms it uses."""
    # An empty Authorization header is no signature at all (S3: 403, as anonymous).
    authorization = (_first(header_values, "authorization") or "").strip() or None
    is_presigned = any(name == b"X-Amz-Algorithm" for name, _ in params)
    if authorization is not None and is_presigned:
        raise InvalidArgument(
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter or the "
            "Authorization header should be specified",
            ArgumentName="Authorization",
        )
    if authorization is not None:
        return _header_claim(authorization, header_values)
    if is_presigned:
        return _presigned_claim(params, header_values)
    raise AccessDenied("Anonymous access is not allowed.")


def _header_claim(authorization: str, header_values: Mapping[str, list[str]]) -> _Claim:
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise AuthorizationHeaderMalformed(
            f"The authorization header is malformed; the algorithm must be {ALGORITHM}."
        )
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, _, value = part.strip().partition("=")
        fields[name] = value.strip()
    credential = fields.get("Credential")
    signed_headers = fields.get("SignedHeaders")
    signature = fields.get("Signature")
    if not credential or not signed_headers or signature is None:
        raise AuthorizationHeaderMalformed(
            "The authorization header is malformed; it needs Credential, SignedHeaders "
            "and Signature."
        )
    content_sha256 = _content_sha256(header_values, is_required=True)
    amz_date, signed_at_s = _header_date(header_values)
    scope = _parse_scope(credential, amz_date, AuthorizationHeaderMalformed)
    names = _signed_header_names(signed_headers, AuthorizationHeaderMalformed)
    return _Claim(*scope, names, signature, amz_date, signed_at_s, content_sha256)


def _presigned_claim(
    params: Sequence[QueryParam], header_values: Mapping[str, list[str]]
) -> _Claim:
    values = _presign_values(params)
    if values["X-Amz-Algorithm"] != ALGORITHM:
        raise AuthorizationQueryParametersError(f'X-Amz-Algorithm only supports "{ALGORITHM}"')
    amz_date = values["X-Amz-Date"]
    signed_at_s = _amz_timestamp(amz_date)
    if signed_at_s is None:
        raise AuthorizationQueryParametersError(
            "X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\""
        )
    expires_s = _presign_expires(values["X-Amz-Expires"])
    error = AuthorizationQueryParametersError
    scope = _parse_scope(values["X-Amz-Credential"], amz_date, error)
    names = _signed_header_names(values["X-Amz-SignedHeaders"], error)
    content_sha256 = _content_sha256(header_values, is_required=False)
    signature = values["X-Amz-Signature"]
    return _Claim(*scope, names, signature, amz_date, signed_at_s, content_sha256, expires_s)


def _wrong_region(claim: _Claim, region: str) -> S3Error:
    """S3's answer to a credential scoped to another region (header and streaming signatures
    share the header's scope; presigned URLs name theirs in X-Amz-Credential)."""
    wrong = f"the region '{claim.region}' is wrong; expecting '{region}'"
    if claim.expires_s is None:
        return AuthorizationHeaderMalformed(
            f"The authorization header is malformed; {wrong}", Region=region
        )
    return AuthorizationQueryParametersError(
        f"Error parsing the X-Amz-Credential parameter; {wrong}", Region=region
    )


def _presign_values(params: Sequence[QueryParam]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in params:
        text_name = name.decode("latin-1")
        if text_name in _PRESIGN_PARAMS and text_name not in found:
            try:
                found[text_name] = value.decode("utf-8")
            except UnicodeDecodeError:
                raise AuthorizationQueryParametersError(f"{text_name} is not valid UTF-8") from None
    if any(name not in found for name in _PRESIGN_PARAMS):
        raise AuthorizationQueryParametersError()
    return found


def _presign_expires(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise AuthorizationQueryParametersError(
            "X-Amz-Expires should be a number of seconds, between 1 and 604800."
        )
    expires_s = int(text)
    if expires_s > MAX_PRESIGN_EXPIRES_S:
        raise AuthorizationQueryParametersError(
            f"X-Amz-Expires must be less than a week (in seconds) that is; {MAX_PRESIGN_EXPIRES_S}"
        )
    return expires_s


def _parse_scope(
    credential: str, amz_date: str, error: Callable[[str], S3Error]
) -> tuple[str, str, str, str]:
    """(access key, date, region, service) from ``AKID/yyyymmdd/region/s3/aws4_request``."""
    parts = credential.rsplit("/", 4)
    if len(parts) != 5 or not parts[0] or not _SCOPE_DATE.fullmatch(parts[1]) or not parts[2]:
        raise error(
            "The Credential is malformed; expecting "
            '"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request".'
        )
    access_key, date, region, service, terminator = parts
    if terminator != TERMINATOR:
        raise error(f'The credential scope must end with "{TERMINATOR}", not "{terminator}".')
    if service != _SERVICE:
        raise error(f'The credential scope names service "{service}"; expecting "{_SERVICE}".')
    if date != amz_date[:8]:
        raise error(f"The credential date {date} is not the date of the request, {amz_date}.")
    return access_key, date, region, service


def _signed_header_names(signed_headers: str, error: Callable[[str], S3Error]) -> tuple[str, ...]:
    names = tuple(signed_headers.lower().split(";"))
    if not all(names):
        raise error("SignedHeaders is malformed.")
    if "host" not in names:
        raise error("The host header must be signed.")
    return names


def _header_date(header_values: Mapping[str, list[str]]) -> tuple[str, float]:
    """The request's timestamp (ISO 8601 basic form, POSIX seconds) from x-amz-date, else Date."""
    invalid = AccessDenied("AWS authentication requires a valid Date or x-amz-date header")
    amz_date = _first(header_values, "x-amz-date")
    if amz_date is not None:
        timestamp_s = _amz_timestamp(amz_date)
        if timestamp_s is None:
            raise invalid
        return amz_date, timestamp_s
    date = _first(header_values, "date")
    if date is None:
        raise invalid
    try:
        parsed = parsedate_to_datetime(date)
    except (TypeError, ValueError):
        raise invalid from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).strftime(_AMZ_DATE_FORMAT), parsed.timestamp()


def _amz_timestamp(amz_date: str) -> float | None:
    """POSIX seconds of ``YYYYMMDDTHHMMSSZ`` (fields read directly: strptime is slow)."""
    if not _AMZ_DATE.fullmatch(amz_date):
        return None
    try:
        stamp = datetime(
            int(amz_date[0:4]),
            int(amz_date[4:6]),
            int(amz_date[6:8]),
            int(amz_date[9:11]),
            int(amz_date[11:13]),
            int(amz_date[13:15]),
            tzinfo=UTC,
        )
    except ValueError:
        return None
    return stamp.timestamp()


def _iso(timestamp_s: float) -> str:
    return datetime.fromtimestamp(timestamp_s, UTC).strftime(_AMZ_DATE_FORMAT)


def _content_sha256(header_values: Mapping[str, list[str]], *, is_required: bool) -> str:
    value = _first(header_values, "x-amz-content-sha256")
    if value is None:
        if is_required:
            raise InvalidRequest("Missing required header for this request: x-amz-content-sha256")
        return UNSIGNED_PAYLOAD
    if value not in _PAYLOAD_TOKENS and not _HEX64.fullmatch(value):
        raise InvalidArgument(
            "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER, "
            "STREAMING-AWS4-HMAC-SHA256-PAYLOAD(-TRAILER), or a valid sha256 value.",
            ArgumentName="x-amz-content-sha256",
            ArgumentValue=value,
        )
    return value


def _check_skew(claim: _Claim, now_s: float, max_skew_s: float) -> None:
    if abs(claim.signed_at_s - now_s) > max_skew_s:
        raise RequestTimeTooSkewed(
            RequestTime=claim.amz_date,
            ServerTime=_iso(now_s),
            MaxAllowedSkewMilliseconds=str(int(max_skew_s * 1000)),
        )


def _check_presigned_window(claim: _Claim, expires_s: int, now_s: float, max_skew_s: float) -> None:
    """A presigned URL is valid from X-Amz-Date (less the allowed skew) for X-Amz-Expires."""
    expires_at_s = claim.signed_at_s + expires_s
    if now_s > expires_at_s:
        raise AccessDenied(
            "Request has expired",
            **{"X-Amz-Expires": str(expires_s), "Expires": _iso(expires_at_s)},
            ServerTime=_iso(now_s),
        )
    if claim.signed_at_s - now_s > max_skew_s:
        raise AccessDenied("Request is not valid yet", ServerTime=_iso(now_s))


def _canonical_uris(raw_path: str) -> list[str]:
    """The path as sent, then (if it differs) the same path re-encoded segment by segment."""
    path = raw_path or "/"
    segments = path.split("/")
    reencoded = "/".join(_encode_component(_decode_component_path(s)) for s in segments)
    return [path] if reencoded == path else [path, reencoded]


def _decode_component_path(segment: str) -> bytes:
    # In a path '+' is a literal plus: only query strings use it for a space.
    return unquote_to_bytes(segment.encode("utf-8", "surrogateescape"))


def _check_signature(
    key: bytes,
    claim: _Claim,
    method: str,
    raw_path: str,
    canonical_query: str,
    canonical_headers: str,
) -> None:
    provided = claim.signature.lower()
    is_well_formed = _HEX64.fullmatch(provided) is not None
    attempts = []
    for uri in _canonical_uris(raw_path):
        canonical_request = "\n".join(
            (
                method,
                uri,
                canonical_query,
                canonical_headers,
                ";".join(claim.signed_headers),
                claim.content_sha256,
            )
        )
        to_sign = string_to_sign(claim.amz_date, claim.scope, canonical_request)
        if is_well_formed and hmac.compare_digest(hmac_hex(key, to_sign), provided):
            return
        attempts.append((canonical_request, to_sign))
    canonical_request, to_sign = attempts[0]
    raise SignatureDoesNotMatch(
        AWSAccessKeyId=claim.access_key,
        StringToSign=to_sign,
        SignatureProvided=claim.signature,
        CanonicalRequest=canonical_request,
    )
