"""What an upstream failure means: for the flusher (retry, back off, give up) and for
read-through calls (the upstream's S3 error passed to the client as it is)."""

from __future__ import annotations

import asyncio

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from gateway.errors import InternalError, S3Error, ServiceUnavailable, upstream_error

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

    lane_noted = False  # set once the flusher's lane has counted it (counted once only)


class Retryable(FlushError):
    """A transient failure (5xx, timeout, connection error): back off and try again."""


class Fatal(FlushError):
    """A permanent failure (AccessDenied, NoSuchBucket, ...): mark failed, keep the data."""


class Corrupt(Fatal):
    """The local body no longer matches its acknowledged digest: found before sending, or
    the upstream re-hashed what we sent against the Content-MD5/checksum sent with it. Never
    retried (that would only resend bad bytes); the message starts with ``local corruption``."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"local corruption: {detail}")


# Upstream refusals of a body whose digest does not match what we sent with it.
_DIGEST_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"})


def for_flush(exc: BaseException) -> FlushError:
    """Classify an exception raised by an upstream write."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        meta = exc.response.get("ResponseMetadata", {})
        status = int(meta.get("HTTPStatusCode", 0) or 0)
        code = str(err.get("Code", status))
        message = f"{code}: {err.get('Message', '')} (HTTP {status})"
        retry_after = _retry_after(meta.get("HTTPHeaders", {}))
        if code in _THROTTLE_CODES or status in (429, 503):
            return Throttled(message, retry_after_s=retry_after)
        if code in _RETRYABLE_CODES or status >= 500 or status in (408, 0):
            return Retryable(message, retry_after_s=retry_after)
        if code in _DIGEST_CODES:
            return Corrupt(message)
        return Fatal(message)
    if isinstance(exc, BotoCoreError | aiohttp.ClientError | asyncio.TimeoutError | OSError):
        return Retryable(f"{type(exc).__name__}: {exc}")
    return Retryable(f"unexpected {type(exc).__name__}: {exc}")


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
