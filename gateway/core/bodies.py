"""Bodies of GET responses as sources of pieces: spans of local files, or bytes.

The service layer decides *what* is sent and *when* (which bytes, in which order, what must
be verified before the last of them leaves); the protocol layer decides *how*: a ``FileSpan``
goes out with ``sendfile`` (zero-copy) on a plain socket and with large ``pread``s under
TLS, a ``SocketSpan`` (the rest of a peer's answer, still in its socket) with ``splice``
on a plain socket and with reads under TLS, ``bytes`` are written as they are.

Contract of a ``BodySource``: ``next_piece`` returns the body's pieces in order, then None;
a ``FileSpan``'s descriptor is valid until the next call or ``aclose``; a source that
cannot produce the rest of its body raises (the protocol layer then cuts the connection,
so the client sees a short body, never a complete wrong one). ``aclose`` releases
everything and may be called at any time, more than once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.core.integrity import Verification
from gateway.fleet.view import SocketSpan

# The last bytes of a verified read are held until verification is done: any nonzero
# amount keeps a corrupt body from being complete; one piece is what the client waits for.
_HOLD_BYTES = 1 << 20
_MAX_SPAN_BYTES = 64 << 20
_PACED_SPAN_BYTES = 8 << 20  # a verified read's hash trails its send by at most this


@dataclass(frozen=True, slots=True)
class FileSpan:
    """``count`` bytes at ``offset`` of the open file ``fd`` (read with pread/sendfile)."""

    fd: int
    offset: int
    count: int


Piece = FileSpan | SocketSpan | bytes


class BodySource(Protocol):
    async def next_piece(self) -> Piece | None: ...

    async def aclose(self) -> None: ...


class NoBody:
    """The empty body (HEAD-like answers: 304)."""

    async def next_piece(self) -> Piece | None:
        return None

    async def aclose(self) -> None:
        return None


class ChunkSource:
    """Pieces from an async iterator (an upstream stream, a peer's answer)."""

    def __init__(self, chunks: AsyncIterator[bytes] | AsyncIterator[bytes | SocketSpan]) -> None:
        self._chunks = chunks

    async def next_piece(self) -> Piece | None:
        return await anext(self._chunks, None)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._chunks.aclose()  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class Slice:
    """``count`` bytes at ``offset`` of the ``index``-th file of an object."""

    index: int
    offset: int
    count: int


def slices(sizes: Sequence[int], start: int, length: int) -> list[Slice]:
    """The pieces of the object's files (of ``sizes``, in order) that hold bytes
    ``start`` .. ``start + length - 1``."""
    out: list[Slice] = []
    file_start, end = 0, start + length
    for index, size in enumerate(sizes):
        file_end = file_start + size
        if size and file_end > start and file_start < end:
            offset = max(start, file_start) - file_start
            out.append(Slice(index, offset, min(end, file_end) - file_start - offset))
        file_start = file_end
    return out


class LocalSource:
    """A span of a local object's body files, released only once they are verified.

    ``fds`` are owned by the source (closed by ``aclose``). With a ``verification``, every
    piece but the last ``_HOLD_BYTES`` goes out at once, in pieces of at most
    ``_PACED_SPAN_BYTES``, and after each one the files' hashes may read up to what was
    sent (from the page cache: the send read it from disk); the held bytes leave only once
    ``verification.wait()`` returned. Without one (known good, or nothing to check)
    nothing is held.
    """

    def __init__(
        self, fds: list[int], pieces: list[Slice], verification: Verification | None
    ) -> None:
        self._fds = fds
        self._verification = verification
        if verification is None:
            self._spans = _held_back(pieces, 0, _MAX_SPAN_BYTES)
        else:
            self._spans = _held_back(pieces, _HOLD_BYTES, _PACED_SPAN_BYTES)
        self._next = 0
        self._sent: Slice | None = None

    async def next_piece(self) -> Piece | None:
        verification = self._verification
        if verification is not None and self._sent is not None:
            verification.allow(self._sent.index, self._sent.offset + self._sent.count)
        if self._next >= len(self._spans):
            return None
        piece, is_held = self._spans[self._next]
        if is_held and verification is not None:
            await verification.wait()  # raises on a mismatch: the held bytes never leave
        self._next += 1
        self._sent = piece
        return FileSpan(self._fds[piece.index], piece.offset, piece.count)

    async def aclose(self) -> None:
        if self._verification is not None:
            self._verification.finish()  # the hash completes for the memo, reader or not
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _held_back(
    pieces: list[Slice], hold_bytes: int, max_span_bytes: int
) -> list[tuple[Slice, bool]]:
    """``pieces`` cut to at most ``max_span_bytes`` each, with the last ``hold_bytes``
    split off and flagged as held."""
    out: list[tuple[Slice, bool]] = []
    left = sum(p.count for p in pieces)
    for piece in pieces:
        offset, count = piece.offset, piece.count
        while count > 0:
            free = left - hold_bytes  # bytes that may leave before verification
            n = min(count, max_span_bytes, free) if free > 0 else min(count, max_span_bytes)
            out.append((Slice(piece.index, offset, n), free <= 0))
            offset, count, left = offset + n, count - n, left - n
    return out


async def bytes_only(pieces: AsyncIterator[bytes | SocketSpan]) -> AsyncIterator[bytes]:
    """``pieces`` of a read that was not asked for spans (``zero_copy``): bytes only."""
    async for piece in pieces:
        if not isinstance(piece, bytes):
            raise TypeError("a span where only bytes were asked for")
        yield piece


def read_span(span: FileSpan, piece_bytes: int) -> Callable[[int], bytes]:
    """A blocking reader of ``span`` in pieces: call with the bytes already read."""

    def read(done: int) -> bytes:
        n = min(piece_bytes, span.count - done)
        data = os.pread(span.fd, n, span.offset + done)
        if len(data) != n:
            raise OSError(f"body file ended {span.count - done - len(data)} bytes early")
        return data

    return read


async def open_files(paths: Sequence[os.PathLike[str] | str]) -> list[int]:
    """Open every body file up front (read-only), so a later unlink (a newer version
    committing, an eviction) cannot cut a read short. All or nothing."""
    return await asyncio.to_thread(_open_all, list(paths))


def _open_all(paths: list[os.PathLike[str] | str]) -> list[int]:
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds
