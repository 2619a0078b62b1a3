"""The embedded demo upstream: moto's S3 server on loopback, in memory.

For ``make run`` and first steps only: everything in it is lost when the gateway exits.
"""

from __future__ import annotations

import socket

from moto.server import ThreadedMotoServer

# Fixed credentials for the embedded server (moto accepts any); never the clients' keys.
DEMO_UPSTREAM_KEY = "demo-upstream-key"
DEMO_UPSTREAM_SECRET = "demo-upstream-secret"


class DemoUpstream:
    """An in-process S3 server. ``start()`` returns its endpoint URL; ``stop()`` ends it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
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
