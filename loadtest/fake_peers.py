"""Simulated fleet members for benchmarks: N fake gateways in one process (a thread with its
own event loop), each answering the peer API (docs/fleet.md) as a member that holds nothing
unflushed, and each holding a lease on the gateway under test (renewed every second, as a
real member does), so that gateway must announce every new directory to all of them.

They speak the real protocol (``gateway.fleet.wire``; their own requests signed with the
fleet secret by the real ``PeerClient``) but keep no data: a read is "not held", a drain is
"drained". ``announce(gateway, bucket, prefix)`` makes the first of them announce a
directory, so the gateway under test has one candidate for reads under it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from typing import Any

from aiohttp import web

from gateway.clock import SystemClock
from gateway.fleet.client import HELD_HEADER, PeerClient
from gateway.fleet.wire import (
    PATH_PREFIX,
    DirChange,
    DrainAnswer,
    LeaseGrant,
    LeaseRequest,
    NodeInfo,
)


class _FakePeer:
    def __init__(self, index: int, port: int) -> None:
        self.info = NodeInfo(f"fake{index:02d}", uuid.uuid4().hex, SystemClock().wall())
        self.port = port
        self.version = 0
        self.dirs: set[tuple[str, str]] = set()

    async def op(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        name = request.match_info["op"]
        if name == "hello":
            return web.json_response(self.info.to_json())
        if name == "lease":
            grant = LeaseGrant(self.info, 3.0, self.version, tuple(sorted(self.dirs)))
            return web.json_response(grant.to_json())
        if name == "drain":
            return web.json_response(DrainAnswer(self.info, True, 0, 0).to_json())
        if name == "version":
            return web.json_response({"head": None})
        if name == "rows":
            return web.json_response({"rows": [], "truncated": False})
        if name == "figures":
            return web.json_response({"paths": {}})
        return web.Response(status=204)  # directory, bye

    async def read(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=404, headers={HELD_HEADER: "none"})


class FakePeers:
    """``count`` fake members on free ports of 127.0.0.1 (see the module docstring)."""

    def __init__(self, count: int, ports: list[int], secret: bytes) -> None:
        self.peers = [_FakePeer(i, ports[i]) for i in range(count)]
        self._secret = secret
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._clients: list[PeerClient] = []

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p.port}" for p in self.peers]

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    def start(self, gateway_address: str) -> FakePeers:
        """Serve, then hold a lease on the gateway at ``gateway_address`` (renewed)."""
        self._thread.start()
        self._run(self._start(gateway_address))
        return self

    async def _start(self, gateway_address: str) -> None:
        for peer in self.peers:
            app = web.Application()
            app.router.add_route("POST", PATH_PREFIX + "{op}", peer.op)
            app.router.add_route("*", PATH_PREFIX + "object", peer.read)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", peer.port).start()
            self._runners.append(runner)
        for peer in self.peers:
            client = PeerClient(peer.info.node_id, self._secret, SystemClock())
            self._clients.append(client)
            self._tasks.append(asyncio.ensure_future(self._renew(peer, client, gateway_address)))

    async def _renew(self, peer: _FakePeer, client: PeerClient, address: str) -> None:
        # Members are not synchronised: each renews at its own phase of the second.
        await asyncio.sleep(int(peer.info.node_id[4:]) / len(self.peers))
        while True:
            try:
                request = LeaseRequest(peer.info, peer.port, 0, None)
                await client.lease(address, request, 2.0)
            except Exception:  # the gateway is not up yet, or going: try again
                pass
            await asyncio.sleep(1.0)

    def announce(self, gateway_address: str, bucket: str, prefix: str) -> None:
        """The first fake member says it holds unflushed versions under ``prefix``."""
        peer = self.peers[0]
        peer.version += 1
        peer.dirs.add((bucket, prefix))
        inc = peer.info.incarnation
        change = DirChange(peer.info.node_id, inc, bucket, prefix, peer.version, True)
        self._run(self._clients[0].announce(gateway_address, change, 5.0))

    def stop(self) -> None:
        async def close() -> None:
            for task in self._tasks:
                task.cancel()
            for client in self._clients:
                await client.close()
            for runner in self._runners:
                await runner.cleanup()

        self._run(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def describe(peers: FakePeers) -> str:
    return json.dumps({"fake_peers": len(peers.peers), "first": peers.addresses[:2]})
