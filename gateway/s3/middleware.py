"""The one place S3 errors become responses, plus request ids on every response.

Handlers raise ``S3Error``; this middleware renders the XML error document with the error's
status. Anything else is a bug: it is logged once with its traceback and the client gets a
plain ``InternalError`` (never a traceback).
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
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return render_error(request, InternalError())


async def add_request_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare hook: S3's request-id headers on every response."""
    request_id = request.get(_REQUEST_ID_KEY, "-")
    response.headers["x-amz-request-id"] = request_id
    response.headers["x-amz-id-2"] = request_id
    response.headers["Server"] = "gateway"
