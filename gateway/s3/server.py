"""The S3 listener's aiohttp app and runner: one catch-all route into ``dispatch``.

Requests aiohttp's own HTTP parser refuses (a header line over ``max_field_size``, more than
``max_headers`` headers, a request line over ``max_line_size``, broken framing) never reach
the middlewares, so aiohttp would answer them with a plain-text 400. ``build_s3_runner``
swaps in a request handler that renders those as S3 XML errors too. aiohttp's own access log
is off: ``gateway.s3.access`` logs every request with presigned signatures redacted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import BadHttpMessage, ContentLengthError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

import gateway.s3.handlers  # noqa: F401  (registers every handler)
from gateway.errors import (
    BadRequest,
    IncompleteBody,
    RequestHeaderSectionTooLarge,
    S3Error,
    S3NotImplemented,
)
from gateway.s3.access import access_log
from gateway.s3.dispatch import SERVICES, S3Services, dispatch
from gateway.s3.metrics import write_metrics
from gateway.s3.middleware import add_request_headers, assign_request_id, render_error, s3_errors

log = logging.getLogger(__name__)
KiB = 1 << 10
# How much of a request body aiohttp buffers before it stops reading the socket (its default
# is 64 KiB, i.e. pause at 128 KiB). A body is written and hashed one 1 MiB piece behind
# the socket: with a small buffer the socket stalls while the previous piece is hashed, and
# one stream ingested at ~40 % of the disk. Memory: up to twice this per connection.
_READ_BUFFER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Sizes aiohttp's HTTP parser enforces before any handler runs.

    ``max_line_bytes`` bounds the request line (method, path and query), ``max_field_bytes``
    one header line, ``max_headers`` their number. Over any of them the client gets
    ``400 RequestHeaderSectionTooLarge`` and the connection is closed.
    """

    max_line_bytes: int = 16 * KiB
    max_field_bytes: int = 16 * KiB
    max_headers: int = 128


def build_s3_app(
    services: S3Services, routes: Callable[[web.Application], None] | None = None
) -> web.Application:
    """The S3 app; ``routes`` adds routes that come before the S3 catch-all (the fleet's
    peer API, outside S3's namespace)."""
    # client_max_size only bounds read()/post(); bodies are streamed, never read whole.
    # access_log outermost (it sees the rendered status); then s3_errors, so a write that
    # raises an S3Error is rendered, not recorded.
    app = web.Application(
        middlewares=[access_log, s3_errors, write_metrics(services.clock)],
        client_max_size=1 << 20,
    )
    app[SERVICES] = services
    app.on_response_prepare.append(add_request_headers)
    if routes is not None:
        routes(app)
    # [\s\S]: "." would not match a newline, and a key may hold one (%0A in the path).
    app.router.add_route("*", r"/{tail:[\s\S]*}", dispatch, expect_handler=expect_continue)
    return app


async def expect_continue(request: web.Request) -> None:
    """``Expect: 100-continue`` gets its interim 100; any other expectation is ignored and the
    request served, as S3 serves it. (aiohttp's default answers it with a plain-text 417
    before any middleware runs: no S3 XML, no request id, no access-log line.)"""
    expect = request.headers.get("Expect", "").strip().lower()
    if request.version == HttpVersion11 and expect == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim answer is not the response's start


def build_s3_runner(
    services: S3Services,
    limits: HttpLimits,
    shutdown_timeout_s: float,
    routes: Callable[[web.Application], None] | None = None,
) -> web.AppRunner:
    """The runner of the S3 app: parser limits, and parse errors answered as S3 XML."""
    return _S3Runner(
        build_s3_app(services, routes),
        handle_signals=False,
        shutdown_timeout=shutdown_timeout_s,
        auto_decompress=False,
        access_log=None,  # gateway.s3.access logs each request (signatures redacted)
        max_line_size=limits.max_line_bytes,
        max_field_size=limits.max_field_bytes,
        max_headers=limits.max_headers,
        read_bufsize=_READ_BUFFER_BYTES,
    )


def parse_error(exc: BaseException | None) -> S3Error:
    """The S3 error for a request aiohttp's parser refused."""
    if isinstance(exc, LineTooLong) or (
        isinstance(exc, BadHttpMessage) and "Too many headers" in str(exc)
    ):
        return RequestHeaderSectionTooLarge()
    if isinstance(exc, ContentLengthError):  # the body ended before its Content-Length
        return IncompleteBody()
    text = str(exc)
    if "Transfer-Encoding" in text and "Content-Length" not in text:
        # A coding list not ending in chunked (``gzip``, ``chunked, gzip``): a coding the
        # gateway does not decode, as S3 answers it. (Content-Length together with
        # Transfer-Encoding stays a plain 400: that is a smuggling attempt, not a feature.)
        return S3NotImplemented(
            "A header you provided implies functionality that is not implemented",
            Header="Transfer-Encoding",
        )
    return BadRequest()


class _S3RequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, answering unparseable requests in S3 XML."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        error = parse_error(exc)
        # The parser's message may quote the offending bytes (an Authorization line): log the
        # exception's type only.
        log.info("unparseable request -> %d %s (%s)", error.status, error.code, type(exc).__name__)
        request_id = assign_request_id(request)
        response = render_error(request, error)  # no app here: add its request-id header too
        response.headers["x-amz-request-id"] = request_id
        response.force_close()
        return response


class _S3Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _S3RequestHandler(self, loop=self._loop, **self._kwargs)


class _S3Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds its Server inside Application._make_handler; re-class it (same
        # fields) so that each connection gets the S3 request handler.
        server.__class__ = _S3Server
        return server
