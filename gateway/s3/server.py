"""The S3 listener's aiohttp app: one catch-all route into ``dispatch``."""

from __future__ import annotations

from aiohttp import web

import gateway.s3.handlers  # noqa: F401  (registers every handler)
from gateway.s3.access import access_log
from gateway.s3.dispatch import SERVICES, S3Services, dispatch
from gateway.s3.metrics import write_metrics
from gateway.s3.middleware import add_request_headers, s3_errors


def build_s3_app(services: S3Services) -> web.Application:
    # client_max_size only bounds read()/post(); bodies are streamed, never read whole.
    # access_log outermost (it sees the rendered status); then s3_errors, so a write that
    # raises an S3Error is rendered, not recorded.
    app = web.Application(
        middlewares=[access_log, s3_errors, write_metrics(services.clock)],
        client_max_size=1 << 20,
    )
    app[SERVICES] = services
    app.on_response_prepare.append(add_request_headers)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app
