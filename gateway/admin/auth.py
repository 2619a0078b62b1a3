"""Bearer-token protection of the admin listener.

The admin API can pause flushing and reveals what is pending, so when it listens on anything
but loopback it MUST require ``Authorization: Bearer <token>``. ``/healthz`` and ``/readyz``
stay open because kubelet probes cannot send a token. The token comes from
``--admin-token`` / ``GATEWAY_ADMIN_TOKEN`` or ``--admin-token-file`` (a mounted Secret); the
CLI (``gateway status`` / ``gateway drain``) sends ``GATEWAY_ADMIN_TOKEN``.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gateway.config import is_loopback

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
_SCHEME = "bearer "


class AdminTokenError(ValueError):
    """The admin token is missing or unreadable where one is required."""


def resolve_admin_token(listen_host: str, token: str | None, token_file: Path | None) -> str | None:
    """The token the admin API requires, or None when it needs none (loopback, no token).

    A token given on loopback is enforced too. Raises ``AdminTokenError`` when the listener is
    not on loopback and no token is configured, or the token file is unreadable or empty."""
    if token is None and token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise AdminTokenError(f"admin token file {token_file}: {exc.strerror}") from None
        if not token:
            raise AdminTokenError(f"admin token file {token_file} is empty")
    if token is None and not is_loopback(listen_host):
        raise AdminTokenError(
            f"the admin API listens on {listen_host}, not loopback: set --admin-token, "
            "GATEWAY_ADMIN_TOKEN or --admin-token-file"
        )
    return token or None


def bearer_auth(token: str) -> Middleware:
    """An aiohttp middleware: 401 unless ``Authorization: Bearer <token>`` (constant-time
    compare), except for the open probe paths."""
    expected = token.encode("utf-8")

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        if not _is_authorized(request.headers.get("Authorization", ""), expected):
            log.info("admin %s %s -> 401", request.method, request.path)
            return web.json_response(
                {"error": "unauthorized", "message": "Authorization: Bearer <token> required"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="gateway-admin"'},
            )
        return await handler(request)

    return middleware


def _is_authorized(header: str, expected: bytes) -> bool:
    if header[: len(_SCHEME)].lower() != _SCHEME:
        return False
    provided = header[len(_SCHEME) :].strip().encode("utf-8", "surrogateescape")
    return hmac.compare_digest(provided, expected)
