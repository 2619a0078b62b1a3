"""Splitting one large local body into upstream multipart parts (single PUTs above the
multipart threshold): S3 caps a single PUT at 5 GiB, and parts upload in parallel and
retry alone. The upstream ETag is then the multipart form, computed here to check it."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from typing import BinaryIO

from gateway.store.integrity import BodyCheck, BodyDigest
from gateway.upstream.classify import Corrupt
from gateway.upstream.client import PartSource

MiB = 1 << 20
_MIN_PART_BYTES = 16 * MiB
_MAX_PARTS = 10_000
_HASH_PIECE_BYTES = 1 * MiB


def part_size_bytes(size_bytes: int) -> int:
    """Parts of at least 16 MiB, whole MiB, and never more than 10,000 of them."""
    needed = -(-size_bytes // _MAX_PARTS)
    return max(_MIN_PART_BYTES, -(-needed // MiB) * MiB)


class FileWindow(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes of an open file from ``offset``.

    Reads use ``os.pread`` on the shared descriptor, so several windows of one file can be
    read concurrently (parts upload in parallel) without sharing a file position."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        super().__init__()
        self._fd, self._offset, self._length = fd, offset, length
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = min(max(0, base + pos), self._length)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self._length - self._pos)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._offset + self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def __len__(self) -> int:
        return self._length


def _md5s_of(windows: list[FileWindow], check: BodyCheck | None) -> list[str]:
    """Each window's MD5 hex, in one read that also feeds ``check``. Blocking."""
    md5s = []
    for window in windows:
        digest = hashlib.md5()
        window.seek(0)
        while piece := window.read(_HASH_PIECE_BYTES):
            digest.update(piece)
            if check is not None:
                check.update(piece)
        window.seek(0)
        md5s.append(digest.hexdigest())
    return md5s


async def split_parts(
    body: BinaryIO, size_bytes: int, *, require: BodyDigest | None = None
) -> tuple[list[PartSource], str]:
    """Parts over ``body`` (an open blob file) and the multipart ETag they will produce.
    With ``require`` (the body's digest from ingest), the same read checks the whole body
    against it and raises ``Corrupt`` on a mismatch: part MD5s computed from a changed file
    would otherwise let the upstream accept it."""
    step = part_size_bytes(size_bytes)
    windows = [
        FileWindow(body.fileno(), offset, min(step, size_bytes - offset))
        for offset in range(0, size_bytes, step)
    ]
    check = BodyCheck(require) if require is not None else None
    md5s = await asyncio.to_thread(_md5s_of, windows, check)
    problem = check.problem() if check is not None else None
    if problem is not None:
        raise Corrupt(f"body {problem}")
    sources = [
        PartSource(w, len(w), md5)  # type: ignore[arg-type]  # a RawIOBase is a binary file
        for w, md5 in zip(windows, md5s, strict=True)
    ]
    combined = hashlib.md5(b"".join(bytes.fromhex(m) for m in md5s)).hexdigest()
    return sources, f"{combined}-{len(sources)}"
