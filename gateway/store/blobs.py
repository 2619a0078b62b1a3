"""BlobStore: request bodies as files on local disk, named by an internal id, never by key.

Durability order for one blob (Linux rules): write to ``tmp/<id>``, ``fsync(file)``,
``rename`` into ``blobs/<id[:2]>/<id>``, ``fsync(blobs/<id[:2]>)`` so the directory entry
survives a power cut. Only then may the caller commit the journal row that references it, and
only after that COMMIT may it acknowledge. A crash before COMMIT leaves an unreferenced file,
which ``sweep`` removes at the next start; ``tmp/`` is emptied at every start.

With ``fsync=False`` (``durability=none``) both fsyncs are skipped: an acknowledged write
survives a process crash (the page cache keeps it) but not a power cut or kernel panic.

Blocking work (write, hash, fsync, rename) runs in the store's worker threads; the event loop
only moves buffers. Each piece of a body goes to the file and to every digest the request
needs at the same time, each in its own thread (hashlib and awscrt release the GIL on large
buffers), while the loop reads the next piece from the socket: one stream ingests at the
slower of the disk and one core's MD5, not at the sum of every hash and the write. Every
body is also hashed with CRC32C, the stored checksum of local integrity checks
(``integrity.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gateway.checksums import Hasher, new_hasher
from gateway.errors import EntityTooLarge, SlowDown

KiB = 1 << 10
MiB = 1 << 20
log = logging.getLogger(__name__)
# A piece smaller than this (or than the store's pieces) is hashed and written in one thread
# hop: for small bodies the hops would cost more than the parallelism saves.
_PARALLEL_MIN_BYTES = 256 * KiB
# A body this small is hashed on the loop: a thread hop would cost more (~10 µs of MD5).
_LOOP_HASH_MAX_BYTES = 16 * KiB
# Digests cheap enough (GB/s) to share one thread.
_FAST = frozenset({"crc32", "crc32c", "crc64nvme"})
# The stored checksum of every body (``integrity.py``).
FAST_CHECKSUM = "crc32c"
# The filesystem is out of space (or the user's quota): retryable, never a corrupt state.
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


@dataclass(frozen=True, slots=True)
class WrittenBlob:
    """A blob that is durable on disk (when fsync is on) but not yet referenced."""

    blob_id: str
    size_bytes: int
    digests: dict[str, bytes]  # algorithm -> raw digest (always "crc32c" among them)

    @property
    def crc32c(self) -> int:
        """The stored checksum of the body (``integrity.py``)."""
        return int.from_bytes(self.digests[FAST_CHECKSUM], "big")

    @property
    def body(self) -> None:
        """Not held in memory (see ``InlineBody``)."""
        return None

    @property
    def blob_ids(self) -> list[str]:
        return [self.blob_id]


@dataclass(frozen=True, slots=True)
class InlineBody:
    """A small body held in memory, to be stored inside the journal row (no file)."""

    body: bytes
    digests: dict[str, bytes]  # algorithm -> raw digest (always "crc32c" among them)

    @property
    def size_bytes(self) -> int:
        return len(self.body)

    @property
    def crc32c(self) -> int:
        return int.from_bytes(self.digests[FAST_CHECKSUM], "big")

    @property
    def blob_id(self) -> None:
        return None

    @property
    def blob_ids(self) -> list[str]:
        return []


# A request body once taken: a durable file, or small bytes for the journal.
Ingested = WrittenBlob | InlineBody


class BlobStore:
    """Bodies on local disk under ``root``.

    Contract: ``write`` MUST NOT return before the file and its directory entry are durable
    (when ``fsync``). Files are immutable once written. ``discard`` MUST only be called for a
    blob no committed journal row references (or no longer references). Readers open files by
    id; an unlink after a newer version commits does not disturb an already-open descriptor.
    """

    def __init__(
        self, root: Path, *, fsync: bool = True, piece_bytes: int = 1 * MiB, workers: int = 0
    ) -> None:
        self.root = root
        self.fsync = fsync
        self.piece_bytes = piece_bytes
        # Writes, hashes, fsyncs: the GIL is released in all of them, so more threads than
        # cores keep the disk and the cores busy at once.
        self._pool = ThreadPoolExecutor(
            max_workers=workers or max(4, 2 * (os.cpu_count() or 1) + 2),
            thread_name_prefix="blob-io",
        )
        self._tmp = root / "tmp"
        self._blobs = root / "blobs"
        self._dir_fds: dict[str, int] = {}
        # Called (on the loop) after a write failed with ENOSPC/EDQUOT: e.g. wake the evictor.
        self.on_disk_full: Callable[[], None] | None = None

    def open_store(self) -> None:
        """Create the layout and keep one fd per fan-out directory for cheap dir fsyncs."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._blobs.mkdir(parents=True, exist_ok=True)
        for i in range(256):
            name = f"{i:02x}"
            path = self._blobs / name
            path.mkdir(exist_ok=True)
            self._dir_fds[name] = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        if self.fsync:
            for path in (self.root, self._blobs):
                _fsync_dir(path)
        for leftover in self._tmp.iterdir():
            leftover.unlink(missing_ok=True)

    def close(self) -> None:
        for fd in self._dir_fds.values():
            os.close(fd)
        self._dir_fds.clear()
        self._pool.shutdown(wait=True)

    def path(self, blob_id: str) -> Path:
        return self._blobs / blob_id[:2] / blob_id

    async def write(
        self,
        chunks: AsyncIterator[bytes],
        algorithms: Iterable[str],
        *,
        max_bytes: int | None = None,
    ) -> WrittenBlob:
        """Stream ``chunks`` into a new blob, hashing with each algorithm in ``algorithms``.

        Raises EntityTooLarge past ``max_bytes``, and SlowDown (503, retryable) when the
        filesystem is full (ENOSPC/EDQUOT); on any exception the partial file is removed,
        so a full disk leaves nothing behind and nothing referenced is touched.
        """
        try:
            return await self._write(chunks, algorithms, max_bytes)
        except OSError as exc:
            if exc.errno not in _FULL_ERRNOS:
                raise
            log.error("local disk full writing a blob under %s: %s", self.root, exc)
            if self.on_disk_full is not None:
                self.on_disk_full()
            raise SlowDown("The gateway's local disk is full; retry shortly.") from exc

    async def _write(
        self, chunks: AsyncIterator[bytes], algorithms: Iterable[str], max_bytes: int | None
    ) -> WrittenBlob:
        blob_id = secrets.token_hex(16)
        tmp_path = self._tmp / blob_id
        hashers = {name: new_hasher(name) for name in {*algorithms, FAST_CHECKSUM}}
        parallel_min = min(_PARALLEL_MIN_BYTES, self.piece_bytes)
        loop = asyncio.get_running_loop()
        # The file is created by the first write, in a worker thread (never on the loop).
        pipeline = _Pipeline(loop, self._pool, tmp_path, hashers, parallel_min)
        size = 0
        pending: list[bytes] = []  # chunks of the next piece (not copied until it is whole)
        pending_bytes = 0
        try:
            async for chunk in chunks:
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise EntityTooLarge()
                pending.append(chunk)
                pending_bytes += len(chunk)
                if pending_bytes >= self.piece_bytes:
                    # A chunk as large as a piece (aiohttp hands over ~1 MiB) goes as is.
                    await pipeline.feed(pending[0] if len(pending) == 1 else b"".join(pending))
                    pending, pending_bytes = [], 0
            tail = b"".join(pending)
            if len(tail) >= parallel_min:
                await pipeline.feed(tail)
                tail = b""
            await pipeline.drain()
            final_path = self.path(blob_id)
            dir_fd = self._dir_fds[blob_id[:2]]
            await loop.run_in_executor(
                self._pool, self._finish, tail, pipeline, tmp_path, final_path, dir_fd
            )
        except BaseException:
            await pipeline.abandon()
            await asyncio.shield(loop.run_in_executor(self._pool, pipeline.remove))
            raise
        return WrittenBlob(blob_id, size, {n: h.digest() for n, h in hashers.items()})

    def _finish(
        self,
        tail: bytes,
        pipeline: _Pipeline,
        tmp_path: Path,
        final_path: Path,
        dir_fd: int,
    ) -> None:
        """The last (small) piece, then durability: fsync, rename, fsync(dir). One hop."""
        pipeline.consume_all(tail)
        fd = pipeline.opened()
        if self.fsync:
            os.fsync(fd)
        pipeline.close()
        os.rename(tmp_path, final_path)
        if self.fsync:
            os.fsync(dir_fd)

    async def hold(
        self, chunks: AsyncIterator[bytes], algorithms: Iterable[str], *, max_bytes: int
    ) -> InlineBody:
        """Read a small body (at most ``max_bytes``, else EntityTooLarge) into memory and
        hash it: on the loop when tiny, else in one worker thread. Nothing touches the
        disk: the journal commit that stores it is what makes it durable."""
        data = bytearray()
        async for chunk in chunks:
            data += chunk
            if len(data) > max_bytes:
                raise EntityTooLarge()
        body = bytes(data)
        hashers = {name: new_hasher(name) for name in {*algorithms, FAST_CHECKSUM}}
        if len(body) <= _LOOP_HASH_MAX_BYTES:
            _update_all(list(hashers.values()), body)
        else:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._pool, _update_all, list(hashers.values()), body)
        return InlineBody(body, {n: h.digest() for n, h in hashers.items()})

    async def link(self, blob_ids: Sequence[str]) -> list[str]:
        """New blobs sharing the bodies of ``blob_ids`` (hard links: no bytes are copied).

        Each new id names its own directory entry, so a row referencing it can be superseded
        (and its file unlinked) independently of the source's row. Returns only once every
        new entry is durable (``fsync`` of each fan-out directory involved). Raises
        FileNotFoundError if a source was unlinked meanwhile (its row was superseded); then
        nothing new is left behind. Durability order: the caller commits a row referencing
        the new ids only after this returns, and discards them if that commit fails.
        """
        if not blob_ids:
            return []
        return await asyncio.to_thread(self._link_all, list(blob_ids))

    def _link_all(self, blob_ids: list[str]) -> list[str]:
        made: list[str] = []
        try:
            for blob_id in blob_ids:
                new_id = secrets.token_hex(16)
                os.link(self.path(blob_id), self.path(new_id))
                made.append(new_id)
            if self.fsync:
                for fan_out in sorted({new_id[:2] for new_id in made}):
                    os.fsync(self._dir_fds[fan_out])
        except BaseException:
            self._unlink_all(made)
            raise
        return made

    async def read_chunks(self, blob_id: str, piece_bytes: int = 1 << 20) -> AsyncIterator[bytes]:
        """A body file's bytes in pieces (each read in a thread): a replica sent again."""
        f = await asyncio.to_thread(self.path(blob_id).open, "rb")
        try:
            while piece := await asyncio.to_thread(f.read, piece_bytes):
                yield piece
        finally:
            await asyncio.to_thread(f.close)

    async def discard(self, blob_ids: Iterable[str]) -> None:
        """Unlink blobs no committed row references. Missing files are fine (idempotent)."""
        ids = list(blob_ids)
        if ids:
            await asyncio.to_thread(self._unlink_all, ids)

    def _unlink_all(self, blob_ids: list[str]) -> None:
        for blob_id in blob_ids:
            self.path(blob_id).unlink(missing_ok=True)

    # -- scratch files: bodies written at offsets (read-through copies) ---------------------

    def open_scratch(self) -> tuple[str, int]:
        """A new empty file under ``tmp/`` for a body written piecewise at offsets (a
        read-through copy fetched in parallel ranges). Returns its future blob id and a
        read-write descriptor the caller owns. Blocking (one open)."""
        blob_id = secrets.token_hex(16)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        return blob_id, os.open(self._tmp / blob_id, flags, 0o600)

    async def publish_scratch(self, files: Sequence[tuple[str, int]]) -> None:
        """Make scratch files blobs with ``write``'s durability order: fsync each (when
        ``fsync``), rename into ``blobs/``, fsync the fan-out directories. The caller may
        commit a row referencing them only after this returns; descriptors stay valid."""
        await asyncio.to_thread(self._publish_all, list(files))

    def _publish_all(self, files: list[tuple[str, int]]) -> None:
        for blob_id, fd in files:
            if self.fsync:
                os.fsync(fd)
            os.rename(self._tmp / blob_id, self.path(blob_id))
        if self.fsync:
            for fan_out in sorted({blob_id[:2] for blob_id, _ in files}):
                os.fsync(self._dir_fds[fan_out])

    def discard_scratch(self, blob_ids: Iterable[str]) -> None:
        """Remove scratch files that no row references, published or not. Blocking."""
        for blob_id in blob_ids:
            (self._tmp / blob_id).unlink(missing_ok=True)
            self.path(blob_id).unlink(missing_ok=True)

    def sweep(self, referenced: set[str], before_ns: int | None = None) -> int:
        """Remove blob files that no journal row references (crash leftovers). Blocking.

        ``referenced`` is the journal's set at open. With ``before_ns`` (a wall-clock time
        taken before that set was read and before any write was accepted), only files whose
        inode changed before it are candidates: a blob written or hard-linked since (rename
        and link both update ctime) may be waiting for its COMMIT and MUST NOT be removed,
        so the sweep can run in the background while the gateway serves.
        """
        removed = 0
        for sub in self._blobs.iterdir():
            for entry in os.scandir(sub):
                if entry.name in referenced:
                    continue
                if before_ns is not None:
                    try:
                        if entry.stat(follow_symlinks=False).st_ctime_ns >= before_ns:
                            continue
                    except FileNotFoundError:
                        continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
        return removed

    def used_bytes(self) -> int:
        """Bytes of all blob files (a scan; for startup and tests, not the hot path).

        Hard links (copies) share one inode and are counted once, as the disk does."""
        sizes: dict[int, int] = {}
        for sub in self._blobs.iterdir():
            for entry in sub.iterdir():
                st = entry.stat()
                sizes[st.st_ino] = st.st_size
        return sum(sizes.values())


class _Pipeline:
    """The consumers of one body's pieces: the file write, one thread per slow digest (MD5,
    SHA-256, SHA-1) and one for the fast ones (CRCs). Consumers run in parallel with each
    other; each one sees the pieces in order (a piece waits for that consumer's previous
    one), so at most two pieces per body are in memory."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pool: ThreadPoolExecutor,
        path: Path,
        hashers: dict[str, Hasher],
        parallel_min_bytes: int,
    ) -> None:
        self.loop = loop
        self._pool = pool
        self._path = path
        self._fd: int | None = None  # set by the first write (a worker thread)
        self._parallel_min_bytes = parallel_min_bytes
        fast = [h for name, h in hashers.items() if name in _FAST]
        slow = [h for name, h in hashers.items() if name not in _FAST]
        self._consumers: list[Callable[[bytes], None]] = [
            lambda data: _write_all(self.opened(), data)
        ]
        if fast:
            self._consumers.append(lambda data: _update_all(fast, data))
        self._consumers.extend(h.update for h in slow)
        self._pending: list[asyncio.Future[None] | None] = [None] * len(self._consumers)

    async def feed(self, piece: bytes) -> None:
        if len(piece) < self._parallel_min_bytes:
            await self.drain()
            await self.loop.run_in_executor(self._pool, self.consume_all, piece)
            return
        for i, consume in enumerate(self._consumers):
            previous = self._pending[i]
            if previous is not None:
                await previous
            self._pending[i] = self.loop.run_in_executor(self._pool, consume, piece)

    def consume_all(self, piece: bytes) -> None:
        """In a worker thread: every consumer, one after the other (a small piece)."""
        if piece:
            for consume in self._consumers:
                consume(piece)

    async def drain(self) -> None:
        for i, pending in enumerate(self._pending):
            if pending is not None:
                self._pending[i] = None
                await pending

    def opened(self) -> int:
        """The temporary file's descriptor, created on first use (in a worker thread)."""
        if self._fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            self._fd = os.open(self._path, flags, 0o600)
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def remove(self) -> None:
        """After a failure (worker thread): nothing of the body is left behind."""
        with contextlib.suppress(OSError):
            self.close()
        self._path.unlink(missing_ok=True)

    async def abandon(self) -> None:
        """After a failure: let the threads finish with the pieces they hold."""
        for pending in self._pending:
            if pending is not None:
                with contextlib.suppress(BaseException):
                    await pending


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _update_all(hashers: Sequence[Hasher], data: bytes) -> None:
    for hasher in hashers:
        hasher.update(data)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_bodies(blobs: BlobStore, blob_ids: Sequence[str]) -> list[BinaryIO]:
    """Open every body file of a version (blocking: call in a thread); none is left open
    when one is missing (FileNotFoundError)."""
    opened: list[BinaryIO] = []
    try:
        for blob_id in blob_ids:
            opened.append(blobs.path(blob_id).open("rb"))
    except BaseException:
        close_bodies(opened)
        raise
    return opened


def close_bodies(files: Sequence[BinaryIO]) -> None:
    for f in files:
        with contextlib.suppress(OSError):
            f.close()
