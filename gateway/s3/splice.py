"""Moving a peer's answer to our client's socket without copying it through this process.

A cross-node GET relays a body from the peer's connection to the client's. Read into bytes
and written out again, every byte is copied twice by this process's one event-loop thread
(and allocated once); with ``splice(2)`` the kernel moves the pages from one socket to a
pipe and from the pipe to the other socket, and the loop only waits.

Both sockets are non-blocking and every ``splice`` is asked not to block, so the relay runs
on the event loop itself (no thread to stop when the client goes away): it moves what is
ready, yields, and waits for the socket it needs (the client's while the pipe holds bytes
it did not take, else the peer's). It works on *duplicated* descriptors, the caller's, so
a connection closed meanwhile by the loop only makes a call fail (``streaming.py``). A peer
that sends nothing for ``timeout_s`` or closes early raises: the client's connection is
then cut, never completed short.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable

_PIPE_BYTES = 1 << 20  # pipe capacity asked for (the default, 64 KiB, wakes 16x as often)
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


async def splice_socket(
    src_fd: int, dst_fd: int, count: int, timeout_s: float, on_sent: Callable[[int], None]
) -> None:
    """Move exactly ``count`` bytes from socket ``src_fd`` to socket ``dst_fd``;
    ``on_sent(n)`` after each ``n`` bytes the destination took."""
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):  # a smaller pipe only costs wake-ups
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        capacity = fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ)
        relay = _Relay(src_fd, dst_fd, read_end, write_end, capacity, count)
        while relay.left_bytes:
            took = relay.fill()
            gave = relay.empty()
            if gave:
                on_sent(gave)
            if took or gave:
                await asyncio.sleep(0)  # other requests run between pieces
            elif relay.in_pipe_bytes:
                await wait_ready(dst_fd, is_write=True)
            else:
                try:
                    await asyncio.wait_for(wait_ready(src_fd, is_write=False), timeout_s)
                except TimeoutError:
                    raise TimeoutError(f"the peer sent nothing for {timeout_s:g} s") from None
    finally:
        os.close(read_end)
        os.close(write_end)


class _Relay:
    """The two halves of one relay through a pipe; each call moves what is ready."""

    def __init__(
        self, src_fd: int, dst_fd: int, read_end: int, write_end: int, capacity: int, count: int
    ) -> None:
        self._src, self._dst = src_fd, dst_fd
        self._read_end, self._write_end = read_end, write_end
        self._capacity_bytes = capacity
        self._to_read_bytes = count  # still in the peer's socket
        self.in_pipe_bytes = 0

    @property
    def left_bytes(self) -> int:
        return self._to_read_bytes + self.in_pipe_bytes

    def fill(self) -> int:
        """Peer socket to pipe, as much as there is room for; 0 when nothing is ready."""
        room = self._capacity_bytes - self.in_pipe_bytes
        if not self._to_read_bytes or room <= 0:
            return 0
        try:
            n = os.splice(self._src, self._write_end, min(self._to_read_bytes, room), flags=_FLAGS)
        except BlockingIOError:
            return 0
        if n == 0:
            raise ConnectionResetError(f"the peer closed with {self._to_read_bytes} bytes to come")
        self._to_read_bytes -= n
        self.in_pipe_bytes += n
        return n

    def empty(self) -> int:
        """Pipe to client socket; 0 when the client's socket is full."""
        if not self.in_pipe_bytes:
            return 0
        try:
            n = os.splice(self._read_end, self._dst, self.in_pipe_bytes, flags=_FLAGS)
        except BlockingIOError:
            return 0
        self.in_pipe_bytes -= n
        return n


async def wait_ready(fd: int, *, is_write: bool) -> None:
    """Until ``fd`` is writable (``is_write``) or readable (or in error: the next call
    says which)."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def ready() -> None:
        if not waiter.done():
            waiter.set_result(None)

    add, remove = (
        (loop.add_writer, loop.remove_writer) if is_write else (loop.add_reader, loop.remove_reader)
    )
    add(fd, ready)
    try:
        await waiter
    finally:
        remove(fd)
