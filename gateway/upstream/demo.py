"""The embedded demo upstream: moto's S3 server on loopback, in memory.

For ``make run`` and first steps only: everything in it is lost when the gateway exits.
"""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Callable
from typing import Any

from moto.s3.models import FakeKey
from moto.server import ThreadedMotoServer

# Fixed credentials for the embedded server (moto accepts any); never the clients' keys.
DEMO_UPSTREAM_KEY = "demo-upstream-key"
DEMO_UPSTREAM_SECRET = "demo-upstream-secret"


_ETAG_LOCK = threading.Lock()


def make_moto_etag_thread_safe() -> None:
    """Serialize moto's lazy ETag computation (idempotent).

    moto computes a key's ETag on first use by seeking its shared body buffer to 0 and
    reading it; two server threads doing so at once (a PUT's response and a listing or HEAD
    running beside it) interleave their reads and cache a wrong MD5. The bytes stored are
    right, the ETag reported is not: about one 24 MiB PUT in five with a listing running,
    which the flusher then (rightly) refuses as a mismatch. Real S3 has no such race."""
    prop: Any = FakeKey.__dict__["etag"]
    if getattr(prop.fget, "_gateway_locked", False):
        return
    original: Callable[[Any], str] = prop.fget

    @functools.wraps(original)
    def etag(self: Any) -> str:
        with _ETAG_LOCK:
            return original(self)

    etag._gateway_locked = True  # type: ignore[attr-defined]
    FakeKey.etag = property(etag)  # type: ignore[assignment]


class DemoUpstream:
    """An in-process S3 server. ``start()`` returns its endpoint URL; ``stop()`` ends it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        make_moto_etag_thread_safe()
        self._host = host
        self._port = port or _free_port(host)
        self._server = ThreadedMotoServer(ip_address=host, port=self._port, verbose=False)

    @property
    def endpoint_url(self) -> str:
        return f"http://{self._host}:{self._port}"

    def start(self) -> str:
        self._server.start()
        return self.endpoint_url

    def stop(self) -> None:
        self._server.stop()


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
