"""How upstream write failures are classified for the flusher (gateway/upstream/classify.py)."""

from __future__ import annotations

import aiohttp
import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from gateway.errors import InvalidRequest, SlowDown
from gateway.models import ObjectMeta
from gateway.upstream.classify import (
    ConditionFailed,
    Corrupt,
    Fatal,
    Retryable,
    Throttled,
    for_flush,
    printable,
    unsendable,
)


def _client_error(code: str, status: int) -> ClientError:
    response = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}},
    }
    return ClientError(response, "PutObject")  # type: ignore[arg-type]


@pytest.mark.parametrize("code", ["BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"])
def test_digest_refusals_are_local_corruption(code: str) -> None:
    got = for_flush(_client_error(code, 400))
    assert isinstance(got, Corrupt) and isinstance(got, Fatal)
    assert str(got).startswith(f"local corruption: {code}:")


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("AccessDenied", 403, Fatal),
        ("SlowDown", 503, Throttled),
        ("InternalError", 500, Retryable),
        ("PreconditionFailed", 412, ConditionFailed),  # a conditional write lost
        ("ConditionalRequestConflict", 409, Retryable),  # raced one in flight: ask again
    ],
)
def test_other_refusals_keep_their_class(code: str, status: int, kind: type) -> None:
    got = for_flush(_client_error(code, status))
    assert type(got) is kind


@pytest.mark.parametrize(
    "exc",
    [
        # botocore refuses before anything is sent: non-ASCII metadata, a garbage Expires.
        ParamValidationError(report='Non ascii characters found in S3 metadata for key "a"'),
        RuntimeError('Unable to calculate correct timezone offset for "99999999999999999999"'),
        # aiohttp refuses a header it cannot send (wrapped by aiobotocore).
        HTTPClientError(error=ValueError("Forbidden control character detected in headers")),
        HTTPClientError(error=TypeError("List of (name,value) pairs expected.")),
        UnicodeEncodeError("utf-8", "caf\udce9", 3, 4, "surrogates not allowed"),
        AttributeError("a bug of ours"),
        InvalidRequest("a local refusal"),
    ],
)
def test_what_retrying_cannot_cure_is_fatal(exc: Exception) -> None:
    got = for_flush(exc)
    assert type(got) is Fatal
    assert type(exc).__name__ in str(got)


@pytest.mark.parametrize(
    "exc",
    [
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
        HTTPClientError(error=aiohttp.ServerDisconnectedError()),
        NoCredentialsError(),
        aiohttp.ClientConnectionError("reset"),
        TimeoutError(),
        ConnectionResetError(104, "reset"),
        SlowDown("the local disk is full"),
    ],
)
def test_transient_failures_are_retried(exc: Exception) -> None:
    assert type(for_flush(exc)) is Retryable


def test_a_flush_error_keeps_its_class() -> None:
    fatal = Fatal("x")
    assert for_flush(fatal) is fatal


def test_error_text_is_always_storable() -> None:
    got = str(for_flush(UnicodeEncodeError("utf-8", "caf\udce9", 3, 4, "surrogates")))
    got.encode("utf-8")  # no lone surrogate left
    assert "\\udce9" in got
    assert printable("a\x00b\x1b[31m\nc\td") == "a\\x00b\\x1b[31m\nc\td"
    long = printable("m" * 5000)
    assert len(long) < 1100 and long.endswith("(4000 more characters)")


def _meta(**kwargs: object) -> ObjectMeta:
    return ObjectMeta(bucket="b", key="k", size_bytes=1, etag="e", last_modified_s=0, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("meta", "reason"),
    [
        (_meta(user_metadata={"a b": "v"}), "not a valid HTTP header name"),
        (_meta(user_metadata={"clé": "v"}), "not a valid HTTP header name"),
        (_meta(user_metadata={"a": "x\r\ny: z"}), "x-amz-meta-a value"),
        (_meta(user_metadata={"a": "caf\udce9"}), "x-amz-meta-a value"),
        (_meta(headers={"cache-control": "a\x00b"}), "cache-control value"),
        (_meta(content_type="text/\x7f"), "content-type value"),
        (_meta(checksums={"crc32": "\udcff"}), "x-amz-checksum-crc32 value"),
    ],
)
def test_unsendable_headers_are_named(meta: ObjectMeta, reason: str) -> None:
    got = unsendable(meta)
    assert got is not None and reason in got
    got.encode("utf-8")


def test_sendable_headers_pass() -> None:
    meta = _meta(
        user_metadata={"a": "plain\tvalue", "": "empty name", "x_y.z~": "ok"},
        headers={"content-disposition": 'attachment; filename="café"', "expires": "garbage"},
    )
    # Non-ASCII metadata values and garbage dates are botocore's to refuse (then Fatal).
    assert unsendable(meta) is None
