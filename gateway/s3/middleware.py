"""The one place S3 errors become responses, plus request ids on every response.

Handlers raise ``S3Error``; this middleware renders the XML error document with the error's
status. A ``ConnectionError`` means the client went away (closed the connection in the
middle of a GET, or of an upload's body): no one is left to answer, so it is logged at info
as a client abort, and the access log records what was sent. Anything else is a bug: it is
logged once with its traceback and the client gets a plain ``InternalError`` (never a
traceback).
"""

from __future__ import annotations

import logging
import secrets

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_request import BaseRequest

from gateway import logs
from gateway.errors import InternalError, S3Error
from gateway.s3.xml import error_document

log = logging.getLogger(__name__)
# The same context variable the log formatters read (gateway.logs).
REQUEST_ID = logs.REQUEST_ID
_REQUEST_ID_KEY = "request_id"
_RESPONSE_KEY = "response"  # the response prepared for the request, once it is
_SENT_KEY = "body_bytes_sent"  # response body bytes handed to the connection so far
CLIENT_ABORTED = "client_aborted"  # set when the client closed the connection early
# The status an access log line shows for a request whose client left before any answer
# (nginx's "client closed request"): no status was sent, and S3 has none for it.
CLIENT_CLOSED_STATUS = 499


def assign_request_id(request: BaseRequest) -> str:
    """A new request id, kept on the request and in the log context."""
    request_id = secrets.token_hex(8).upper()
    request[_REQUEST_ID_KEY] = request_id
    REQUEST_ID.set(request_id)
    return request_id


def render_error(request: BaseRequest, exc: S3Error) -> web.Response:
    body = (
        b""
        if request.method == "HEAD" or exc.status == 304
        else error_document(
            exc.code,
            exc.message,
            request[_REQUEST_ID_KEY],
            {"Resource": request.path, **exc.fields},
        )
    )
    headers = {"Content-Type": "application/xml"}
    if exc.status == 503:
        headers["Retry-After"] = "1"
    return web.Response(status=exc.status, body=body, headers=headers)


@web.middleware
async def s3_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    assign_request_id(request)
    try:
        return await handler(request)
    except S3Error as exc:
        level = logging.ERROR if exc.code == "InternalError" else logging.INFO
        log.log(
            level,
            "%s %s -> %d %s: %s",
            request.method,
            request.path,
            exc.status,
            exc.code,
            exc.message,
        )
        return render_error(request, exc)
    except web.HTTPException:
        raise
    except ConnectionError as exc:  # the client's connection, the only one a handler writes
        request[CLIENT_ABORTED] = True
        prepared: web.StreamResponse | None = request.get(_RESPONSE_KEY)
        log.info(
            "client closed the connection: %s %s after %s and %d body bytes (%s)",
            request.method,
            request.path,
            f"status {prepared.status}" if prepared is not None else "no response",
            body_bytes_sent(request),
            type(exc).__name__,
        )
        # Nothing more can be sent: aiohttp finds the connection gone and drops it quietly.
        return prepared if prepared is not None else web.Response(status=CLIENT_CLOSED_STATUS)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return render_error(request, InternalError())


def note_body_sent(request: web.Request, size_bytes: int) -> None:
    """Count body bytes sent around the response writer (sendfile)."""
    if _SENT_KEY in request:
        request[_SENT_KEY] += size_bytes


def body_bytes_sent(request: web.Request) -> int:
    """Response body bytes written to the connection so far (counted once prepared)."""
    return int(request.get(_SENT_KEY, 0))


async def add_request_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare hook: S3's request-id headers on every response; keeps the
    response and counts its body bytes as they are written (for a client abort's log)."""
    request_id = request.get(_REQUEST_ID_KEY, "-")
    response.headers["x-amz-request-id"] = request_id
    response.headers["x-amz-id-2"] = request_id
    response.headers["Server"] = "gateway"
    request[_RESPONSE_KEY] = response
    request[_SENT_KEY] = 0

    def count(size_bytes: int, _output_bytes: int) -> None:
        request[_SENT_KEY] += size_bytes

    request.writer.on_body_write = count
