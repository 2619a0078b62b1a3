"""Sending a GET body: ``sendfile`` (zero-copy) for file spans on plain TCP, large reads
under TLS, ``splice`` (zero-copy, ``splice.py``) for the rest of a peer's answer on plain
TCP, reads under TLS, bytes as they come.

uvloop does not implement ``loop.sendfile`` (asyncio's native path needs its selector
transports), so aiohttp's own file response falls back to 256 KiB reads under uvloop. This
module does the zero-copy send itself: once the transport's buffer is empty (the status
line and headers are on the wire), ``os.sendfile`` runs in a worker thread on a *duplicate*
of the socket's descriptor, and the event loop waits for writability whenever the socket's
buffer is full. The duplicate matters: should the client disconnect and the loop close the
connection's descriptor meanwhile, its number may be reused by a new connection, and a
send on the old number would write into a stranger's response. A duplicate keeps the old
socket alive until we close it, so a late send only fails (EPIPE).

The threads only ever read the file (disk) and copy into the socket's buffer: the socket
is non-blocking, so a slow client holds no thread, only a writability wait on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from gateway.core.bodies import BodySource, FileSpan, read_span
from gateway.fleet.view import SocketSpan
from gateway.metrics import GET_BODY_BYTES
from gateway.s3.middleware import note_body_sent
from gateway.s3.splice import splice_socket, wait_ready

_COPY_PIECE_BYTES = 1 << 20  # TLS: read and write in 1 MiB pieces, the next read overlapped
_SENDFILE_THREADS = 8

_SENT = GET_BODY_BYTES.labels("sendfile")
_COPIED = GET_BODY_BYTES.labels("copy")
_STREAMED = GET_BODY_BYTES.labels("stream")
_SPLICED = GET_BODY_BYTES.labels("splice")

_executor_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _threads() -> ThreadPoolExecutor:
    """The sendfile threads (made on first use; not bound to any loop)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(_SENDFILE_THREADS, thread_name_prefix="sendfile")
        return _executor


async def send_body(request: web.Request, response: web.StreamResponse, source: BodySource) -> None:
    """Write every piece of ``source`` to the prepared ``response``, in order."""
    sender = _ZeroCopy.open(request)
    try:
        while (piece := await source.next_piece()) is not None:
            if isinstance(piece, bytes):
                if piece:
                    await response.write(piece)
                    _STREAMED.inc(len(piece))
            elif isinstance(piece, SocketSpan):
                await _relay(request, response, sender, piece)
            elif sender is not None:
                await sender.send(piece, lambda n: note_body_sent(request, n))
                _SENT.inc(piece.count)
            else:
                await _copy_span(response, piece)
                _COPIED.inc(piece.count)
    finally:
        if sender is not None:
            sender.close()


class _ZeroCopy:
    """sendfile into one response's socket (see the module docstring)."""

    def __init__(self, transport: asyncio.Transport, fd: int) -> None:
        self._transport = transport
        self._fd = fd
        self._loop = asyncio.get_running_loop()

    @classmethod
    def open(cls, request: web.Request) -> _ZeroCopy | None:
        """A sender for ``request``'s connection, or None where sendfile cannot work
        (TLS: the bytes are encrypted in this process; no socket at all)."""
        transport = request.transport
        if transport is None or transport.get_extra_info("ssl_object") is not None:
            return None
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        return cls(transport, os.dup(sock.fileno()))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    async def send(self, span: FileSpan, on_sent: Callable[[int], None]) -> None:
        """Send ``span`` whole; ``on_sent(n)`` after each ``n`` bytes the kernel took."""
        await self._flushed()
        offset, left = span.offset, span.count
        while left > 0:
            try:
                sent = await self._loop.run_in_executor(
                    _threads(), os.sendfile, self._fd, span.fd, offset, left
                )
            except BlockingIOError:
                await self._writable()
                continue
            if sent == 0:
                raise OSError(f"body file ended {left} bytes early")
            on_sent(sent)
            offset += sent
            left -= sent

    async def splice(self, span: SocketSpan, on_sent: Callable[[int], None]) -> None:
        """Move ``span`` whole from the peer's socket to this one (``splice.py``)."""
        await self._flushed()
        await splice_socket(span.fd, self._fd, span.count, span.timeout_s, on_sent)

    async def _flushed(self) -> None:
        """Wait until everything written through the transport (the status line and
        headers, bytes pieces) has left its buffer: sendfile's bytes must follow them. The
        loop flushes that buffer when the socket turns writable, which we wait for too."""
        while self._transport.get_write_buffer_size():
            if self._transport.is_closing():
                raise ConnectionResetError("the client went away")
            await self._writable()
            await asyncio.sleep(0)  # the transport's own writer runs in this turn

    async def _writable(self) -> None:
        await wait_ready(self._fd, is_write=True)


async def _relay(
    request: web.Request,
    response: web.StreamResponse,
    sender: _ZeroCopy | None,
    span: SocketSpan,
) -> None:
    """``span`` spliced where the client's socket is plain, else read and written."""
    if sender is not None:
        await sender.splice(span, lambda n: note_body_sent(request, n))
        _SPLICED.inc(span.count)
        return
    loop = asyncio.get_running_loop()
    with socket.socket(fileno=os.dup(span.fd)) as sock:
        left = span.count
        while left:
            data = await asyncio.wait_for(
                loop.sock_recv(sock, min(left, _COPY_PIECE_BYTES)), span.timeout_s
            )
            if not data:
                raise ConnectionResetError(f"the peer closed with {left} bytes to come")
            left -= len(data)
            await response.write(data)
    _COPIED.inc(span.count)


async def _copy_span(response: web.StreamResponse, span: FileSpan) -> None:
    """Large reads in threads, each overlapped with sending the previous one."""
    loop = asyncio.get_running_loop()
    read = read_span(span, _COPY_PIECE_BYTES)
    done = 0
    pending = loop.run_in_executor(_threads(), read, 0) if span.count else None
    while pending is not None:
        data = await pending
        done += len(data)
        pending = loop.run_in_executor(_threads(), read, done) if done < span.count else None
        try:
            await response.write(data)
        except BaseException:
            if pending is not None:
                with contextlib.suppress(BaseException):
                    await pending
            raise
