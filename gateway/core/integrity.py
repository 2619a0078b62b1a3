"""Integrity of local bodies on the read path: each body file is verified once, then trusted
until the file changes.

A GET must never serve a corrupt body as complete. Hashing every body on every read costs a
full MD5 per GET (0.3x of the disk on this project's first measurements), so the verdict is
remembered per body file, keyed by what changes when the file does: its inode, size, mtime
and ctime (``fstat`` of the descriptor the read serves from). A rewrite in place, a
truncation or a replacement changes one of them; the next read verifies again. Media rot
that changes no metadata is not seen by the memo: ``gateway verify`` (the scrub) re-hashes
everything, and the memo is empty after every restart.

What each file must hash to is chosen by ``blob_checks``: the fastest digest recorded for
it (a full-object ``x-amz-checksum-*`` value the client sent and ingest verified, e.g. the
CRC-32 boto3 sends by default; else the MD5 of its ETag). That function is the seam for a
CRC-32C recorded for every blob at ingest: return it there and every first read verifies
at CRC-32C speed; the memo, the single-flight hash and the hold-back of the last piece
(bodies.py) stay as they are.

Loop affinity: ``BlobVerifier`` lives on the event loop; hashing runs in its own threads, so
a burst of first reads never starves the default executor that ingest writes use.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gateway import metrics
from gateway.checksums import new_hasher
from gateway.errors import InternalError
from gateway.models import LocalObject

log = logging.getLogger(__name__)

_HASH_PIECE_BYTES = 4 << 20
_MEMO_ENTRIES = 1 << 16  # ~100 bytes each: a bounded few MiB whatever the cache holds


# Stored digests, fastest to compute first (one core here: CRC-32C ~50 GB/s with awscrt,
# CRC-32 ~4 GB/s, SHA-1 ~1.8 GB/s, MD5 ~0.7 GB/s). Every one of them was checked against
# the bytes at ingest (or against the upstream's ETag when fetched), so any will do.
_FASTEST_FIRST = ("crc32c", "crc64nvme", "crc32", "sha1", "md5", "sha256")


@dataclass(frozen=True, slots=True)
class BlobCheck:
    """What one body file must hash to: ``algorithm`` (``md5`` or an ``x-amz-checksum``
    algorithm) and the raw digest it must give."""

    blob_id: str
    algorithm: str
    expected: bytes


def blob_checks(local: LocalObject) -> list[BlobCheck] | None:
    """The check of each body file of ``local``, in body order, with the fastest digest
    recorded for it; None when a file has no recorded digest (nothing is then verified).

    A single body file: a full-object ``x-amz-checksum-*`` value stored at ingest, else the
    MD5 of a plain ETag. A part: its own checksum in the object's checksum algorithm, else
    its MD5 (the part ETag). A CRC-32C recorded for every blob at ingest slots in here.
    """
    if local.parts:
        algorithm = (
            next(iter(local.meta.checksums), None) if len(local.meta.checksums) == 1 else None
        )
        checks = []
        for part in local.parts:
            stored = _b64(part.checksum) if algorithm and part.checksum else None
            if algorithm is not None and stored is not None:
                checks.append(BlobCheck(part.blob_id, algorithm, stored))
            elif (md5 := _md5(part.etag.strip('"'))) is not None:
                checks.append(BlobCheck(part.blob_id, "md5", md5))
            else:
                return None
        return checks
    if local.blob_id is None:
        return None
    for algorithm in _FASTEST_FIRST:
        if algorithm == "md5":
            md5 = _md5(local.meta.etag)
            if md5 is not None:
                return [BlobCheck(local.blob_id, "md5", md5)]
            continue
        value = local.meta.checksums.get(algorithm, "")
        stored = _b64(value) if "-" not in value else None  # full-object values only
        if stored is not None:
            return [BlobCheck(local.blob_id, algorithm, stored)]
    return None


def _md5(etag: str) -> bytes | None:
    try:
        return bytes.fromhex(etag) if len(etag) == 32 else None
    except ValueError:
        return None


def _b64(value: str) -> bytes | None:
    try:
        return base64.b64decode(value, validate=True) or None
    except binascii.Error:
        return None  # not a digest we can check against: the next one is used


def digest_matches(fd: int, check: BlobCheck) -> bool:
    """Blocking: does the whole file behind ``fd`` hash to ``check``? Reads with ``pread``
    (the descriptor's offset is left alone; a reader may share it)."""
    hasher = new_hasher(check.algorithm)
    offset = 0
    while piece := os.pread(fd, _HASH_PIECE_BYTES, offset):
        hasher.update(piece)
        offset += len(piece)
    return hasher.digest() == check.expected


# (blob id, inode, size, mtime_ns, ctime_ns): the file as it was when it was hashed.
_FileKey = tuple[str, int, int, int, int]
OnCorrupt = Callable[[str], Awaitable[None]]


class CorruptBody(InternalError):
    """A body file does not match its recorded digest (already reported). An S3
    InternalError: logged once as an error, and the response it cuts short is never
    completed."""


class BlobVerifier:
    """Verify-once memo of body files, with one hash per file at a time (single-flight).

    Contract: ``verify`` MUST NOT return normally unless every listed file, as its
    descriptor sees it now, hashed to its check (now or earlier with identical inode, size,
    mtime and ctime). On a mismatch it raises ``CorruptBody`` and the ``on_corrupt`` of the
    caller that started that hash runs once. ``close`` cancels hashes still running.
    """

    def __init__(self, threads: int = 2) -> None:
        self._good: OrderedDict[_FileKey, None] = OrderedDict()
        self._running: dict[_FileKey, asyncio.Task[bool]] = {}
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="verify")
        self.hashed_bytes = 0  # bytes hashed so far (tests and the read benchmark read it)

    def is_known_good(self, fd: int, check: BlobCheck) -> bool:
        key = _file_key(fd, check)
        if key in self._good:
            self._good.move_to_end(key)
            return True
        return False

    def note_good(self, fd: int, check: BlobCheck) -> None:
        """Record a file as verified (its bytes were just hashed elsewhere: a fill)."""
        self._remember(_file_key(fd, check))

    async def verify(
        self, files: list[tuple[int, BlobCheck]], on_corrupt: OnCorrupt | None = None
    ) -> None:
        """Verify each (descriptor, check); see the class contract."""
        for fd, check in files:
            key = _file_key(fd, check)
            if key in self._good:
                continue
            task = self._running.get(key)
            is_owner = task is None
            if task is None:
                task = self._start(fd, check, key)
            # Shielded: a reader that goes away leaves the hash to the others (and the memo).
            if not await asyncio.shield(task):
                message = (
                    f"local corruption: body file {check.blob_id} does not match its "
                    f"recorded {check.algorithm} {check.expected.hex()}"
                )
                if is_owner and on_corrupt is not None:
                    await on_corrupt(message)
                raise CorruptBody(message)

    def _start(self, fd: int, check: BlobCheck, key: _FileKey) -> asyncio.Task[bool]:
        task = asyncio.create_task(self._hash(fd, check, key), name=f"verify {check.blob_id}")
        self._running[key] = task

        def forget(_: asyncio.Task[bool]) -> None:
            self._running.pop(key, None)

        task.add_done_callback(forget)
        return task

    async def close(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _hash(self, fd: int, check: BlobCheck, key: _FileKey) -> bool:
        # Our own descriptor: the reader that asked may close its own before we finish.
        own = os.dup(fd)
        try:
            loop = asyncio.get_running_loop()
            is_good = await loop.run_in_executor(self._executor, digest_matches, own, check)
        finally:
            with contextlib.suppress(OSError):
                os.close(own)
        self.hashed_bytes += key[2]
        metrics.READ_VERIFIED_BYTES.inc(key[2])
        if is_good:
            self._remember(key)
        return is_good

    def _remember(self, key: _FileKey) -> None:
        self._good[key] = None
        self._good.move_to_end(key)
        while len(self._good) > _MEMO_ENTRIES:
            self._good.popitem(last=False)


def _file_key(fd: int, check: BlobCheck) -> _FileKey:
    st = os.fstat(fd)
    return (check.blob_id, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
