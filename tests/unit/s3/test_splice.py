"""The zero-copy relay of a peer's answer (gateway/s3/splice.py) over real loopback TCP
sockets: exact bytes, a peer that closes early or goes silent, a client that goes away, a
client slower than the peer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator

import pytest

from gateway.s3.splice import splice_socket


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        near = socket.create_connection(server.getsockname())
        far, _ = server.accept()
    return near, far


@pytest.fixture
def sockets() -> Iterator[dict[str, socket.socket]]:
    """peer -> src (what the gateway reads), dst -> client (what the client reads)."""
    peer, src = _tcp_pair()
    dst, client = _tcp_pair()
    for s in (src, dst):
        s.setblocking(False)
    out = {"peer": peer, "src": src, "dst": dst, "client": client}
    yield out
    for s in out.values():
        s.close()


async def _relay(socks: dict[str, socket.socket], count: int, timeout_s: float = 5.0) -> int:
    sent: list[int] = []
    await splice_socket(socks["src"].fileno(), socks["dst"].fileno(), count, timeout_s, sent.append)
    return sum(sent)


def _read_all(sock: socket.socket, count: int, piece: int = 1 << 16) -> bytes:
    out = bytearray()
    while len(out) < count:
        got = sock.recv(min(piece, count - len(out)))
        if not got:
            break
        out += got
    return bytes(out)


async def test_moves_exactly_the_span_and_no_byte_after_it(
    sockets: dict[str, socket.socket],
) -> None:
    body = os.urandom(9 << 20)
    after = b"NEXT-RESPONSE"  # what follows the span on the peer's connection stays there
    loop = asyncio.get_running_loop()
    writer = loop.run_in_executor(None, sockets["peer"].sendall, body + after)
    reader = loop.run_in_executor(None, _read_all, sockets["client"], len(body))
    assert await _relay(sockets, len(body)) == len(body)
    await writer
    assert await reader == body
    sockets["src"].setblocking(True)
    assert sockets["src"].recv(100) == after


async def test_a_client_slower_than_the_peer_gets_every_byte(
    sockets: dict[str, socket.socket],
) -> None:
    body = os.urandom(4 << 20)
    loop = asyncio.get_running_loop()

    def slow_read() -> bytes:
        out = bytearray()
        while len(out) < len(body):
            out += sockets["client"].recv(8192)
        return bytes(out)

    writer = loop.run_in_executor(None, sockets["peer"].sendall, body)
    reader = loop.run_in_executor(None, slow_read)
    await _relay(sockets, len(body))
    await writer
    assert await reader == body


async def test_a_peer_that_closes_early_raises(sockets: dict[str, socket.socket]) -> None:
    sockets["peer"].sendall(b"x" * 1000)
    sockets["peer"].close()
    loop = asyncio.get_running_loop()
    reader = loop.run_in_executor(None, _read_all, sockets["client"], 1000)
    with pytest.raises(ConnectionResetError, match="bytes to come"):
        await _relay(sockets, 5000)
    assert await reader == b"x" * 1000


async def test_a_silent_peer_times_out(sockets: dict[str, socket.socket]) -> None:
    sockets["peer"].sendall(b"y" * 10)
    with pytest.raises(TimeoutError, match="sent nothing"):
        await _relay(sockets, 100, timeout_s=0.3)


async def test_a_client_that_goes_away_raises(sockets: dict[str, socket.socket]) -> None:
    sockets["client"].close()
    body = os.urandom(8 << 20)
    loop = asyncio.get_running_loop()
    writer = loop.run_in_executor(None, sockets["peer"].sendall, body)
    with pytest.raises(OSError):
        await _relay(sockets, len(body))
    # The peer's sendall is blocked on a full window: shutdown wakes it (close would not).
    sockets["peer"].shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        await asyncio.wait_for(writer, 10)


class _Written:
    """Stands for the aiohttp response of a TLS connection (no socket to splice into)."""

    def __init__(self) -> None:
        self.data = bytearray()

    async def write(self, data: bytes) -> None:
        self.data += data


async def test_without_a_plain_client_socket_the_span_is_read_and_written(
    sockets: dict[str, socket.socket],
) -> None:
    from gateway.fleet.view import SocketSpan
    from gateway.s3.streaming import _relay

    body = os.urandom(3 << 20)
    loop = asyncio.get_running_loop()
    writer = loop.run_in_executor(None, sockets["peer"].sendall, body + b"after")
    response = _Written()
    span = SocketSpan(sockets["src"].fileno(), len(body), 5.0)
    await _relay(None, response, None, span)  # type: ignore[arg-type]
    await writer
    assert bytes(response.data) == body
    sockets["peer"].close()
    with pytest.raises(ConnectionResetError, match="bytes to come"):
        await _relay(None, _Written(), None, SocketSpan(sockets["src"].fileno(), 100, 5.0))  # type: ignore[arg-type]
