"""The body files of one read-through fill, addressed by object offset.

A fill's copy is one scratch file per body file (one, or one per part of a multipart
object: fill_layout.py). Writes, reads and hashing address the *object's* offsets and are
mapped here onto the files. Blocking methods (``create``, ``write``, ``hash``, ``discard``)
run in the fill's threads; ``span`` and ``close`` are cheap and run on the loop. Writes of
different chunks run concurrently (different offsets, ``pwrite``); ``hash`` is called in
object order, one call at a time.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import os
from collections.abc import Sequence

from gateway.core.bodies import FileSpan
from gateway.store.blobs import BlobStore

_MAX_IOVECS = 512  # below IOV_MAX (1024 on Linux)


class FillFiles:
    def __init__(self, blobs: BlobStore, opened: list[tuple[str, int]], sizes: Sequence[int]):
        self._blobs = blobs
        self.blob_ids = [blob_id for blob_id, _ in opened]
        self.fds = [fd for _, fd in opened]
        self._sizes = list(sizes)
        self._starts = [0, *itertools.accumulate(self._sizes)][:-1]
        self._md5s = [hashlib.md5() for _ in self._sizes]
        self._is_closed = False
        # Each file is written by exactly one ranged GET, front to back (the fetch grid
        # matches the files): its MD5 is then taken from the bytes as they are written,
        # in parallel across files, and ``hash`` is not needed.
        self.is_hashed_inline = False

    def matches_grid(self, chunk_bytes: int) -> bool:
        """Whether fetch chunks of ``chunk_bytes`` fall exactly on the files."""
        return all(size == chunk_bytes for size in self._sizes[:-1]) and (
            self._sizes[-1] <= chunk_bytes
        )

    @classmethod
    def create(cls, blobs: BlobStore, sizes: Sequence[int]) -> FillFiles:
        """One new scratch file per size (all or none)."""
        opened: list[tuple[str, int]] = []
        try:
            for _ in sizes:
                opened.append(blobs.open_scratch())
        except BaseException:
            for _, fd in opened:
                os.close(fd)
            blobs.discard_scratch(b for b, _ in opened)
            raise
        return cls(blobs, opened, sizes)

    def _locate(self, pos: int) -> int:
        """Index of the file holding object byte ``pos`` (empty files never hold one)."""
        index = bisect.bisect_right(self._starts, pos) - 1
        while self._sizes[index] == 0 and index + 1 < len(self._sizes):
            index += 1
        return index

    def write(self, pos: int, pieces: list[bytes]) -> None:
        """Write ``pieces`` (in order) at object offset ``pos``: one ``pwritev`` when they
        fall in one file, else piecewise across the files."""
        total = sum(len(p) for p in pieces)
        if len(pieces) > _MAX_IOVECS:
            pieces = [b"".join(pieces)]
        index = self._locate(pos)
        offset = pos - self._starts[index]
        if self.is_hashed_inline:
            md5 = self._md5s[index]  # this file's only writer: bytes come in order
            for piece in pieces:
                md5.update(piece)
        if total <= self._sizes[index] - offset:
            written = os.pwritev(self.fds[index], pieces, offset)
            if written == total:
                return
            pieces, pos = [b"".join(pieces)[written:]], pos + written  # short write: rare
        view = memoryview(b"".join(pieces))
        while view:
            index = self._locate(pos)
            offset = pos - self._starts[index]
            n = min(len(view), self._sizes[index] - offset)
            written = os.pwrite(self.fds[index], view[:n], offset)
            view, pos = view[written:], pos + written

    def span(self, pos: int, stop: int) -> FileSpan:
        """Object bytes from ``pos`` to at most ``stop - 1``, within one file."""
        index = self._locate(pos)
        offset = pos - self._starts[index]
        return FileSpan(self.fds[index], offset, min(stop - pos, self._sizes[index] - offset))

    def hash(self, pos: int, end: int) -> None:
        """Feed object bytes ``[pos, end)`` (already written) to their files' MD5s (when
        they are not hashed inline)."""
        while pos < end:
            index = self._locate(pos)
            offset = pos - self._starts[index]
            n = min(end - pos, self._sizes[index] - offset)
            data = os.pread(self.fds[index], n, offset)
            if len(data) != n:
                raise OSError(f"read-through copy: file {index} is short")
            self._md5s[index].update(data)
            pos += n

    def digests(self) -> list[bytes]:
        return [md5.digest() for md5 in self._md5s]

    def published(self) -> list[tuple[str, int]]:
        return list(zip(self.blob_ids, self.fds, strict=True))

    def discard(self) -> None:
        """Unlink the files (open descriptors keep their bytes for readers still on them)."""
        self._blobs.discard_scratch(self.blob_ids)

    @property
    def is_closed(self) -> bool:
        return self._is_closed

    def close(self) -> None:
        if self._is_closed:
            return
        self._is_closed = True
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
