"""Integrity of local bodies on the read path: each body file is verified once, then trusted
until the file changes.

A GET must never serve a corrupt body as complete. Hashing every body on every read costs a
full MD5 per GET (0.3x of the disk on this project's first measurements), so the verdict is
remembered per body file, keyed by what changes when the file does: its inode, size, mtime
and ctime (``fstat`` of the descriptor the read serves from). A rewrite in place, a
truncation or a replacement changes one of them; the next read verifies again. Media rot
that changes no metadata is not seen by the memo: ``gateway verify`` (the scrub) re-hashes
everything. The memo is saved in the journal (``store/verified.py``) as it grows, so a
restarted gateway (an upgrade, a reboot) does not hash every cached file again on the first
read of a resuming job.

What each file must hash to is chosen by ``blob_checks``: the CRC-32C stored for it at
ingest (store/integrity.py says why that proves the acknowledged bytes), else the fastest
other digest recorded for it (a full-object ``x-amz-checksum-*`` value the client sent and
ingest verified; else the MD5 of its ETag), for rows written before the CRC-32C was stored
and copies fetched from the upstream.

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
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from gateway import metrics
from gateway.checksums import Hasher, new_hasher
from gateway.errors import InternalError
from gateway.models import LocalObject

log = logging.getLogger(__name__)

_HASH_PIECE_BYTES = 4 << 20
MEMO_ENTRIES = 1 << 16  # ~100 bytes each: a bounded few MiB whatever the cache holds


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
    its MD5 (the part ETag). A CRC-32C stored at ingest comes before all of them.
    """
    if local.parts:
        if all(part.crc32c is not None for part in local.parts):
            return [_crc32c_check(p.blob_id, p.crc32c) for p in local.parts if p.crc32c is not None]
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
    if local.crc32c is not None:
        return [_crc32c_check(local.blob_id, local.crc32c)]
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


def _crc32c_check(blob_id: str, crc32c: int) -> BlobCheck:
    return BlobCheck(blob_id, "crc32c", crc32c.to_bytes(4, "big"))


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


# (blob id, inode, size, mtime_ns, ctime_ns): the file as it was when it was hashed.
_FileKey = tuple[str, int, int, int, int]


class MemoStore(Protocol):
    """Where the memo outlives the process (``store.verified.VerifiedFiles``)."""

    async def load(self) -> list[_FileKey]: ...

    async def save(self, keys: Sequence[_FileKey]) -> None: ...


OnCorrupt = Callable[[str], Awaitable[None]]


class CorruptBody(InternalError):
    """A body file does not match its recorded digest (already reported). An S3
    InternalError: logged once as an error, and the response it cuts short is never
    completed."""


class _HashJob:
    """One file's hash, paced: it reads no further than ``limit`` (what readers have sent
    so far: those pages are in the page cache), so a file is read from disk once, by the
    send, and hashed right behind it. Readers raise the limit; the last piece of a read
    lifts it to the end."""

    def __init__(self, verifier: BlobVerifier, fd: int, check: BlobCheck, key: _FileKey):
        self.size = key[2]
        self.limit = 0
        self._moved = asyncio.Event()
        self.task = asyncio.create_task(
            verifier.run_job(self, fd, check, key), name=f"verify {check.blob_id}"
        )

    def allow(self, upto: int) -> None:
        if upto > self.limit:
            self.limit = min(upto, self.size)
            self._moved.set()

    async def wait_for_more(self, pos: int) -> None:
        while self.limit <= pos:
            self._moved.clear()
            await self._moved.wait()


class Verification:
    """The verification of the files one read touches (see ``BlobVerifier.start``).

    ``allow(i, upto)``: the read has sent file ``i`` up to byte ``upto`` (its hash may go
    that far). ``finish()``: hash the rest of every file now. ``wait()``: returns once
    every file matched; raises ``CorruptBody`` otherwise.
    """

    def __init__(
        self,
        jobs: list[tuple[_HashJob | None, BlobCheck]],
        owned: set[int],
        on_corrupt: OnCorrupt | None,
    ) -> None:
        self._jobs = jobs
        self._owned = owned  # indices whose hash this read started: it reports damage
        self._on_corrupt = on_corrupt

    def allow(self, index: int, upto: int) -> None:
        job = self._jobs[index][0]
        if job is not None:
            job.allow(upto)

    def finish(self) -> None:
        for job, _ in self._jobs:
            if job is not None:
                job.allow(job.size)

    async def wait(self) -> None:
        self.finish()
        for index, (job, check) in enumerate(self._jobs):
            # Shielded: a reader that goes away leaves the hash to the others (and the memo).
            if job is None or await asyncio.shield(job.task):
                continue
            message = (
                f"local corruption: body file {check.blob_id} does not match its "
                f"recorded {check.algorithm} {check.expected.hex()}"
            )
            if index in self._owned and self._on_corrupt is not None:
                await self._on_corrupt(message)
            raise CorruptBody(message)


class BlobVerifier:
    """Verify-once memo of body files, with one hash per file at a time (single-flight).

    Contract: a ``Verification``'s ``wait`` (and ``verify``) MUST NOT return normally unless
    every listed file, as its descriptor sees it now, hashed to its check (now or earlier
    with identical inode, size, mtime and ctime). On a mismatch it raises ``CorruptBody``
    and the ``on_corrupt`` of the read that started that hash runs once. ``close`` cancels
    hashes still running.
    """

    def __init__(self, threads: int = 2, store: MemoStore | None = None) -> None:
        self._good: OrderedDict[_FileKey, None] = OrderedDict()
        self._running: dict[_FileKey, _HashJob] = {}
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="verify")
        self._store = store
        self._unsaved: list[_FileKey] = []
        self._saver: asyncio.Task[None] | None = None
        self.hashed_bytes = 0  # bytes hashed so far (tests and the read benchmark read it)

    async def load(self) -> None:
        """Start from the saved memo (at start, before serving)."""
        if self._store is not None:
            for key in await self._store.load():
                self._good[key] = None
            self._trim()

    def is_known_good(self, fd: int, check: BlobCheck) -> bool:
        key = _file_key(fd, check)
        if key in self._good:
            self._good.move_to_end(key)
            return True
        return False

    def note_good(self, fd: int, check: BlobCheck) -> None:
        """Record a file as verified (its bytes were just hashed elsewhere: a fill)."""
        self._remember(_file_key(fd, check))

    def start(
        self, files: list[tuple[int, BlobCheck]], on_corrupt: OnCorrupt | None = None
    ) -> Verification:
        """Begin verifying each (descriptor, check) of one read: known good files are
        skipped, a hash already running for a file is joined, others start paced."""
        jobs: list[tuple[_HashJob | None, BlobCheck]] = []
        owned: set[int] = set()
        for index, (fd, check) in enumerate(files):
            key = _file_key(fd, check)
            job = None if key in self._good else self._running.get(key)
            if job is None and key not in self._good:
                job = _HashJob(self, fd, check, key)
                self._running[key] = job
                owned.add(index)
            jobs.append((job, check))
        return Verification(jobs, owned, on_corrupt)

    async def verify(
        self, files: list[tuple[int, BlobCheck]], on_corrupt: OnCorrupt | None = None
    ) -> None:
        """Verify each (descriptor, check) at once, unpaced; see the class contract."""
        await self.start(files, on_corrupt).wait()

    async def close(self) -> None:
        """Cancel hashes still running; save what the memo learnt since the last save."""
        tasks = [job.task for job in self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._saver is not None:
            await self._saver
        await self._save()

    async def run_job(self, job: _HashJob, fd: int, check: BlobCheck, key: _FileKey) -> bool:
        # Our own descriptor: the reader that asked may close its own before we finish.
        own = os.dup(fd)
        try:
            hasher = new_hasher(check.algorithm)
            loop = asyncio.get_running_loop()
            pos = 0
            try:
                while pos < job.size:
                    await job.wait_for_more(pos)
                    n = min(_HASH_PIECE_BYTES, job.limit - pos)
                    await loop.run_in_executor(self._executor, _feed, hasher, own, pos, n)
                    pos += n
                is_good = hasher.digest() == check.expected and os.fstat(own).st_size == pos
            except OSError as exc:  # cut short under us (truncated): not the recorded body
                log.warning("verifying %s: %s", check.blob_id, exc)
                is_good = False
        finally:
            self._running.pop(key, None)
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
        self._trim()
        if self._store is not None:
            self._unsaved.append(key)
            if self._saver is None:
                self._saver = asyncio.create_task(self._save_all(), name="save verified")

    def _trim(self) -> None:
        while len(self._good) > MEMO_ENTRIES:
            self._good.popitem(last=False)

    async def _save_all(self) -> None:
        """Save batches until nothing is left (what arrives meanwhile joins the next)."""
        try:
            while self._unsaved:
                await self._save()
        finally:
            self._saver = None

    async def _save(self) -> None:
        batch, self._unsaved = self._unsaved, []
        if not batch or self._store is None:
            return
        try:
            await self._store.save(batch)
        except Exception as exc:  # only costs a re-verification after a restart
            log.warning("could not save %d verified body files: %s", len(batch), exc)


def _feed(hasher: Hasher, fd: int, pos: int, count: int) -> None:
    """Blocking: hash ``count`` bytes of ``fd`` at ``pos`` (pread: no shared offset)."""
    data = os.pread(fd, count, pos)
    if len(data) != count:
        raise OSError(f"body file ended {count - len(data)} bytes early")
    hasher.update(data)


def _file_key(fd: int, check: BlobCheck) -> _FileKey:
    st = os.fstat(fd)
    return (check.blob_id, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
