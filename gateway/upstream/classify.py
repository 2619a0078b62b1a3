"""What an upstream failure means: for the flusher (retry, back off, give up) and for
read-through calls (the upstream's S3 error passed to the client as it is).

For the flusher the question is whether trying again can cure it. Only failures known to be
transient are retried: throttles, 5xx answers, the transport (connection, timeout, lost
answer) and credentials still to come. Everything else ends as ``Fatal`` (the object is
``failed``, with its error, until an operator retries it): a 4xx answer, a parameter botocore
refuses before anything is sent, a header the HTTP client cannot encode, a local bug. An
endless retry of such an object would hold back its checkpoint's commit marker, every drain
and every shutdown for ever, and say nothing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping

import aiohttp
from botocore import exceptions as boto
from botocore.exceptions import ClientError
from botocore.parsers import ResponseParserError

from gateway.errors import InternalError, S3Error, ServiceUnavailable, upstream_error
from gateway.models import ObjectMeta

_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "503",
    }
)
_RETRYABLE_CODES = frozenset(
    {
        "InternalError",
        "RequestTimeout",
        "ServiceUnavailable",
        "RequestTimeTooSkewed",
        "ExpiredToken",
        "OperationAborted",
    }
)


class FlushError(Exception):
    """An upload attempt failed. Never reaches S3 clients."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Throttled(FlushError):
    """503 SlowDown and kin: back off and slow the lane down."""


class Retryable(FlushError):
    """A transient failure (5xx, timeout, connection error): back off and try again."""


class Fatal(FlushError):
    """A permanent failure (AccessDenied, NoSuchBucket, ...): mark failed, keep the data."""


class ConditionFailed(Fatal):
    """412 PreconditionFailed of a conditional write (If-None-Match, If-Match): the key's
    state in the bucket is not what the write required (the fleet's claims, docs/fleet.md)."""


class Corrupt(Fatal):
    """The local body no longer matches its acknowledged digest: found before sending, or
    the upstream re-hashed what we sent against the Content-MD5/checksum sent with it. Never
    retried (that would only resend bad bytes); the message starts with ``local corruption``."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"local corruption: {detail}")


# Upstream refusals of a body whose digest does not match what we sent with it.
_DIGEST_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"})


# botocore failures that a later try can cure: the transport (connection refused or reset,
# timeouts, a lost or short answer) and credentials not available yet (an instance role or
# a web identity token being refreshed). HTTPClientError also wraps local refusals of the
# HTTP client (a header it will not send): its inner error decides (``_is_transient``).
_TRANSIENT_BOTOCORE = (
    boto.ConnectionError,
    boto.HTTPClientError,
    boto.IncompleteReadError,
    boto.ChecksumError,
    boto.FlexibleChecksumError,
    boto.NoCredentialsError,
    boto.CredentialRetrievalError,
    boto.MetadataRetrievalError,
    boto.TokenRetrievalError,
    boto.CapacityNotAvailableError,
    # An answer that could not be parsed (cut short, or a proxy's error page): a 5xx in
    # all but name, cured by the next try as often as a 5xx is.
    ResponseParserError,
)
# Failures of the network or the local disk (OSError includes TimeoutError, ENOSPC, ...).
_TRANSIENT_IO = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
_MAX_ERROR_CHARS = 1000  # what is kept of one error's text (a refused value may be 2 KB)


def for_flush(exc: BaseException) -> FlushError:
    """Classify an exception raised by an upstream write (or on the way to it): throttled,
    retryable when a later try can cure it, else fatal. Never raises; the message is always
    printable and storable (``printable``)."""
    if isinstance(exc, FlushError):
        return exc
    if isinstance(exc, ClientError):
        return _for_answer(exc)
    text = describe(exc)
    if isinstance(exc, S3Error):  # a local refusal: SlowDown when the disk is full, ...
        return Retryable(text) if exc.status >= 500 else Fatal(text)
    if _is_transient(exc):
        return Retryable(text)
    return Fatal(f"not retryable: {text}")


def _for_answer(exc: ClientError) -> FlushError:
    err = exc.response.get("Error", {})
    meta = exc.response.get("ResponseMetadata", {})
    status = int(meta.get("HTTPStatusCode", 0) or 0)
    code = str(err.get("Code", status))
    message = printable(f"{code}: {err.get('Message', '')} (HTTP {status})")
    retry_after = _retry_after(meta.get("HTTPHeaders", {}))
    if code in _THROTTLE_CODES or status in (429, 503):
        return Throttled(message, retry_after_s=retry_after)
    if code == "PreconditionFailed" or status == 412:
        return ConditionFailed(message)
    if code == "ConditionalRequestConflict":  # concurrent conditional writes: try again
        return Retryable(message, retry_after_s=retry_after)
    if code in _RETRYABLE_CODES or status >= 500 or status in (408, 0):
        return Retryable(message, retry_after_s=retry_after)
    if code in _DIGEST_CODES:
        return Corrupt(message)
    return Fatal(message)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, boto.HTTPClientError):
        inner = exc.kwargs.get("error")
        # aiohttp refuses a control character or an unencodable header with ValueError or
        # TypeError (wrapped by aiobotocore): the same request is refused every time.
        return not isinstance(inner, ValueError | TypeError)
    return isinstance(exc, (*_TRANSIENT_BOTOCORE, *_TRANSIENT_IO))


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, printable (see ``printable``)."""
    return printable(f"{type(exc).__name__}: {exc}")


def printable(text: str) -> str:
    """``text`` made safe to log, store and show: unencodable characters (lone surrogates
    from undecodable request bytes) become backslash escapes, control characters (but
    newline and tab) too, and the text is cut at ``_MAX_ERROR_CHARS``."""
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8")
    safe = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), safe)
    if len(safe) > _MAX_ERROR_CHARS:
        safe = safe[:_MAX_ERROR_CHARS] + f"... ({len(safe) - _MAX_ERROR_CHARS} more characters)"
    return safe


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# An HTTP field name (RFC 9110 token): what a user metadata name must be to be sent.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A field value the HTTP client can send: visible ASCII, spaces and tabs. (botocore refuses
# non-ASCII user metadata itself; other system headers may carry UTF-8.)
_UNSENDABLE_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\ud800-\udfff]")


def unsendable(meta: ObjectMeta) -> str | None:
    """Why ``meta`` can never be sent upstream, or None. Checked before an upload so that
    what no upstream could receive fails at once, with a reason, rather than after a
    timeout: a metadata name that is not an HTTP token (an upstream may not even answer
    such a request), or a value holding control characters or undecodable bytes (lone
    surrogates). A journal written by a gateway that did not check these at ingest can
    hold them."""
    for name in meta.user_metadata:
        if not _TOKEN.fullmatch(f"x-amz-meta-{name}"):
            return printable(f"user metadata name {name!r} is not a valid HTTP header name")
    fields: Mapping[str, str] = {
        **{f"x-amz-meta-{k}": v for k, v in meta.user_metadata.items()},
        **meta.headers,
        "content-type": meta.content_type,
        **{f"x-amz-checksum-{k}": v for k, v in meta.checksums.items()},
    }
    for name, value in fields.items():
        if _UNSENDABLE_VALUE.search(value):
            return printable(f"{name} value {value!r} holds characters HTTP cannot carry")
    return None


def for_client(exc: BaseException) -> S3Error:
    """Translate an exception of a read-through or pass-through call for the S3 client."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500) or 500)
        code = str(err.get("Code", ""))
        if code.isdigit():
            # HEAD responses carry no body: botocore reports the status as the code.
            code = {
                404: "NoSuchKey",
                403: "AccessDenied",
                400: "InvalidRequest",
                412: "PreconditionFailed",
                304: "NotModified",
            }.get(int(code), "InternalError")
        message = str(err.get("Message", ""))
        if status >= 500:
            # Say whose error it is: the client and the log otherwise see a bare 500.
            operation = getattr(exc, "operation_name", "a request")
            message = f"The upstream bucket answered {code} (HTTP {status}) to {operation}: "
            message += str(err.get("Message", "")) or "no detail"
        return upstream_error(code, status, message)
    if isinstance(exc, ResponseParserError):
        return InternalError(f"The upstream bucket's answer could not be read: {exc}")
    return ServiceUnavailable(f"upstream unavailable: {type(exc).__name__}")


def _retry_after(headers: dict[str, str]) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
