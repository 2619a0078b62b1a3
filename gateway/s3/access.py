"""The S3 listener's access log: one line per request on the ``gateway.access`` logger.

Format: the Combined Log Format, then ``key=value`` fields::

    127.0.0.1 - - [23/Nov/2026:22:40:00 +0000] "PUT /bkt/key?partNumber=1 HTTP/1.1" 200 0
    "-" "Boto3/1.43" rid=9F2C... op=UploadPart in=5242880 ms=3.1

``in=`` is the request body bytes received (with or without a Content-Length). A request
whose client closed the connection early ends with `` abort=client``: its status is the one
sent (499 if none was) and its bytes are the body bytes sent before the client left.

The user field is always ``-``, and the values of presigned-URL parameters
(``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``) are replaced by
``REDACTED``; no header is logged except Referer and User-Agent. With the JSON log format
the same figures are also attached as an ``access`` object. Turned off with
``--access-log false`` (the logger's level is raised; this middleware then costs one
level check).
"""

from __future__ import annotations

import datetime
import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway import logs
from gateway.fleet.wire import PATH_PREFIX as PEER_PATH_PREFIX
from gateway.s3.dispatch import OPERATION
from gateway.s3.middleware import CLIENT_ABORTED, body_bytes_sent

log = logging.getLogger(logs.ACCESS_LOGGER)


@web.middleware
async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost middleware: times the request and logs it once, whatever the outcome
    (an aiohttp HTTPException is logged with its status and re-raised)."""
    if not log.isEnabledFor(logging.INFO) or request.path.startswith(PEER_PATH_PREFIX):
        # Peer requests (a lease renewal a second per peer) would drown the clients' lines:
        # they are logged at debug level by the peer API when refused or failing.
        return await handler(request)
    started = datetime.datetime.now(datetime.UTC)
    loop_started_s = request.loop.time()
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        _log(request, exc.status, 0, started, request.loop.time() - loop_started_s)
        raise
    took_s = request.loop.time() - loop_started_s
    _log(request, response.status, _body_bytes(request, response), started, took_s)
    return response


def _body_bytes(request: web.Request, response: web.StreamResponse) -> int:
    """Response body bytes, as CLF's ``%b`` means them: the Content-Length when there is one
    (aiohttp's ``body_length`` also counts the status line and headers), else what a
    chunked response wrote; none for HEAD, 204 and 304; what was written before the client
    left for a client abort."""
    if request.get(CLIENT_ABORTED):
        return body_bytes_sent(request)
    if request.method == "HEAD" or response.status in (204, 304):
        return 0
    if response.content_length is not None:
        return response.content_length
    return response.body_length


def _log(
    request: web.Request, status: int, sent: int, started: datetime.datetime, took_s: float
) -> None:
    path, _, query = request.raw_path.partition("?")
    target = path + ("?" + logs.redact_query(query) if query else "")
    op = request.get(OPERATION)
    fields = {
        "remote": request.remote or "-",
        "method": request.method,
        "target": target,
        "status": status,
        "bytes_out": sent,
        # Received, not declared: uploads without Content-Length (HTTP chunked) count too.
        "bytes_in": request.content.total_bytes,
        "request_id": request.get("request_id", "-"),
        "operation": type(op).__name__ if op is not None else "-",
        "duration_ms": round(took_s * 1000, 3),
        "client_aborted": bool(request.get(CLIENT_ABORTED)),
    }
    log.info(
        '%s - - [%s] "%s %s HTTP/%d.%d" %d %d "%s" "%s" rid=%s op=%s in=%d ms=%.1f%s',
        fields["remote"],
        started.strftime("%d/%b/%Y:%H:%M:%S +0000"),
        request.method,
        target,
        request.version.major,
        request.version.minor,
        status,
        sent,
        _quote(request.headers.get("Referer", "-")),
        _quote(request.headers.get("User-Agent", "-")),
        fields["request_id"],
        fields["operation"],
        fields["bytes_in"],
        fields["duration_ms"],
        " abort=client" if fields["client_aborted"] else "",
        extra={"access": fields, "request_id": fields["request_id"]},
    )


def _quote(value: str) -> str:
    """A header value safe inside the quoted CLF fields (no quotes, no control chars)."""
    return "".join(c if c.isprintable() and c != '"' else "?" for c in value)[:256]
