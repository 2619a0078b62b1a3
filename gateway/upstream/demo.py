"""The embedded demo upstream: moto's S3 server on loopback, in memory.

For ``make run`` and first steps only: everything in it is lost when the gateway exits.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from typing import Any

from moto.s3.models import FakeKey, S3Backend
from moto.s3.responses import S3Response
from moto.server import ThreadedMotoServer

# Fixed credentials for the embedded server (moto accepts any); never the clients' keys.
DEMO_UPSTREAM_KEY = "demo-upstream-key"
DEMO_UPSTREAM_SECRET = "demo-upstream-secret"


class DemoUpstream:
    """An in-process S3 server. ``start()`` returns its endpoint URL; ``stop()`` ends it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port or _free_port(host)
        guard_moto()
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


def guard_moto() -> None:
    """moto's thread-safety faults that S3 does not have, guarded (idempotent): its lazy
    ETag, its conditional writes, its listing during deletes."""
    guard_moto_etag()
    guard_moto_conditional_writes()
    guard_moto_listing()


def guard_moto_etag() -> None:
    """Make moto's lazily computed object ETag thread-safe (idempotent).

    moto computes a key's ETag on first use by reading its shared body buffer without the
    key's lock. Its threaded server answers a PUT and a concurrent LIST in two threads, so
    both can read the buffer at once and cache the MD5 of interleaved reads: the flusher
    then sees an ETag that is not its body's (seen for bodies over moto's 16 MiB block).
    """
    if getattr(FakeKey, "_gateway_guarded", False):
        return

    def etag(self: Any) -> str:
        with self.lock:
            if self._etag is None:
                md5 = hashlib.md5()
                self._value_buffer.seek(0)
                while block := self._value_buffer.read(16 << 20):
                    md5.update(block)
                self._etag = md5.hexdigest()
        return f'"{self._etag}"'

    FakeKey.etag = property(etag)  # type: ignore[method-assign,assignment]
    FakeKey._gateway_guarded = True  # type: ignore[attr-defined]


_CONDITIONAL_WRITE = threading.Lock()


def guard_moto_conditional_writes() -> None:
    """Make moto's conditional writes atomic, as S3's are (idempotent).

    moto checks ``If-None-Match``/``If-Match`` and then stores the object in two steps
    without a lock, and its threaded server runs concurrent requests in threads: two of
    16 concurrent creators of one key both got 200 (seen in the suite). S3 lets exactly
    one win, and the fleet's claims and conditional-write locks rely on that. Conditional
    PUTs and completions of a key are therefore answered one at a time.
    """
    if getattr(S3Response, "_gateway_guarded", False):
        return
    unguarded = S3Response._key_response

    def key_response(self: Any, request: Any, full_url: str) -> Any:
        conditional = request.method in ("PUT", "POST") and (
            "If-None-Match" in request.headers or "If-Match" in request.headers
        )
        if not conditional:
            return unguarded(self, request, full_url)
        with _CONDITIONAL_WRITE:
            return unguarded(self, request, full_url)

    S3Response._key_response = key_response  # type: ignore[method-assign]
    S3Response._gateway_guarded = True  # type: ignore[attr-defined]


def guard_moto_listing() -> None:
    """moto lists a bucket by iterating its keys while other threads delete some: a key
    deleted in between raised KeyError, answered 500 (seen in loadtest/fleet_soak.py).
    S3 lists a consistent view; the listing is tried again instead (a few times)."""
    if getattr(S3Backend, "_gateway_guarded", False):
        return
    unguarded = S3Backend.list_objects

    def list_objects(self: Any, *args: Any, **kwargs: Any) -> Any:
        for _ in range(4):
            try:
                return unguarded(self, *args, **kwargs)
            except (KeyError, RuntimeError):  # a key deleted, or the dict changed, meanwhile
                continue
        return unguarded(self, *args, **kwargs)

    S3Backend.list_objects = list_objects  # type: ignore[method-assign]
    S3Backend._gateway_guarded = True  # type: ignore[attr-defined]
