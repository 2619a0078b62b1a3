"""Request bodies as ``RequestBody``: plain (as sent) or aws-chunked (decoded)."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Mapping

from aiohttp import ClientError, web
from aiohttp.http_exceptions import HttpProcessingError

from gateway.errors import (
    IncompleteBody,
    InvalidArgument,
    MalformedXML,
    MissingContentLength,
    XAmzContentSHA256Mismatch,
)
from gateway.s3.auth import AuthContext
from gateway.s3.chunked import AwsChunkedBody

_STREAMING = ("STREAMING-",)
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_TRUNCATED = (OSError, ClientError, HttpProcessingError, asyncio.IncompleteReadError)


class PlainBody:
    """The request's payload as it arrives (after HTTP Transfer-Encoding is undone)."""

    def __init__(self, request: web.Request) -> None:
        self._request = request

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._request.content.iter_any():
                yield piece
        except _TRUNCATED as exc:  # the client sent less than it promised, or went away
            raise IncompleteBody() from exc

    @property
    def trailers(self) -> Mapping[str, str]:
        return {}


def request_body(
    request: web.Request, auth: AuthContext
) -> tuple[PlainBody | AwsChunkedBody, int | None]:
    """The body to store and its decoded length when the client declared one.

    A request that frames no body (neither a Content-Length nor HTTP chunked) is
    ``MissingContentLength`` (411), aws-chunked or not: HTTP gives it no body at all, and
    S3 asks for one of the two (sigv4-streaming.html). A malformed Content-Length (empty,
    negative, not a number) never gets here: the HTTP parser answers it 400 BadRequest."""
    if request.content_length is None and not _is_http_chunked(request):
        raise MissingContentLength()
    sha = request.headers.get("x-amz-content-sha256", "")
    # The framing is aws-chunked when the payload hash names a streaming mode, or when the
    # decoded length is declared (SDKs that stream with UNSIGNED-PAYLOAD). A Content-Encoding
    # naming aws-chunked alone does not make a body chunked: S3 takes such a body as it is
    # (the coding is dropped from what it stores, see metadata.stored_headers).
    if sha.startswith(_STREAMING) or "x-amz-decoded-content-length" in request.headers:
        declared = request.headers.get("x-amz-decoded-content-length")
        if declared is None:
            raise MissingContentLength(
                "x-amz-decoded-content-length is required for aws-chunked bodies."
            )
        length = _int_header(declared, "x-amz-decoded-content-length")
        reader = request.content if request.body_exists else _empty_reader()
        return AwsChunkedBody(reader, decoded_length=length, auth=auth), length
    return PlainBody(request), request.content_length


def _is_http_chunked(request: web.Request) -> bool:
    return "chunked" in request.headers.get("Transfer-Encoding", "").lower()


def _empty_reader() -> asyncio.StreamReader:
    """An ended stream. aiohttp hands an empty body over as ``EmptyStreamReader``, whose
    ``readuntil`` raises AttributeError (aiohttp 3.14) instead of reporting the end."""
    reader = asyncio.StreamReader()
    reader.feed_eof()
    return reader


def _int_header(value: str, name: str) -> int:
    if not value.isdigit():
        raise InvalidArgument(f"{name} must be a non-negative integer.")
    return int(value)


async def read_document(
    request: web.Request, auth: AuthContext, max_bytes: int
) -> tuple[bytes, Mapping[str, str]]:
    """A small request document (XML) read to its end, with the aws-chunked trailers.

    ``StreamReader.read(n)`` may return fewer bytes than were sent, so this loops until EOF.
    Over ``max_bytes`` is ``MalformedXML`` (what S3 answers for oversized documents); a
    signed payload hash that does not match is ``XAmzContentSHA256Mismatch``."""
    body, _ = request_body(request, auth)
    raw = bytearray()
    async for piece in body.chunks():
        raw += piece
        if len(raw) > max_bytes:
            raise MalformedXML()
    sha = request.headers.get("x-amz-content-sha256", "")
    if _HEX64.fullmatch(sha) and sha.lower() != hashlib.sha256(raw).hexdigest():
        raise XAmzContentSHA256Mismatch()
    return bytes(raw), body.trailers
