"""In-memory test doubles for the gateway's seams.

``FakeUpstream`` implements the ``gateway.upstream.client.Upstream`` protocol over dicts
(bucket -> key -> (body, meta)), with S3 ListObjectsV2 semantics for ``list_page``, a log of
every request, fault injection for the write calls (the flusher's side) and an optional gate
that holds uploads in flight until the test releases them.

Not thread-safe; use it from one event loop. Bodies passed to ``put_object`` and
``put_multipart`` are read synchronously (fine in tests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from gateway.core.bodies import BodySource, FileSpan
from gateway.errors import InvalidPartNumber, NoSuchBucket, NoSuchKey
from gateway.models import BucketInfo, ListEntry, LocalObject, ObjectMeta
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue
from gateway.upstream.classify import Fatal
from gateway.upstream.client import (
    AiobotocoreUpstream,
    PartSource,
    RequestRunner,
    UploadTracker,
    UpstreamHead,
    UpstreamObject,
)

# One request: (operation, bucket, key); key is "" for bucket-level calls.
Request = tuple[str, str, str]


def utf8_order(name: str) -> bytes:
    """Sort key giving S3's order: UTF-8 bytes, compared as unsigned."""
    return name.encode("utf-8")


class _Body:
    """Just enough of an aiobotocore streaming body for ``UpstreamObject``."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0
        self.closed = False

    async def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._pos + n
        piece = self._data[self._pos : end]
        self._pos += len(piece)
        return piece

    def close(self) -> None:
        self.closed = True


class RequestBody:
    """A client's request body as the services take it: ``data`` in pieces of at most
    ``piece_bytes`` (one piece by default), no trailers."""

    def __init__(self, data: bytes, piece_bytes: int = 0) -> None:
        self._data = data
        self._piece_bytes = piece_bytes or max(len(data), 1)

    async def _chunks(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self._data), self._piece_bytes):
            yield self._data[i : i + self._piece_bytes]

    def chunks(self) -> AsyncIterator[bytes]:
        return self._chunks()

    @property
    def trailers(self) -> dict[str, str]:
        return {}


async def _read_part(part: PartSource) -> bytes:
    part.body.seek(0)
    return part.body.read()


class FakeUpstream:
    """An in-memory ``Upstream``.

    - ``log`` lists every request as (op, bucket, key) in arrival order; write calls are
      logged before their fault or gate, so a faulted try is visible too.
    - ``fail_puts(*excs)`` / ``fail_deletes(*excs)`` queue exceptions raised by the next
      upload (``put_object`` or ``put_multipart``) / delete calls, one per call, in order
      (optionally only for one ``key``).
    - ``put_gate``: when set to an ``asyncio.Event``, each upload reads its body, then waits on
      the gate before storing (a put in flight). ``put_arrived`` is set when one is waiting.
    - ``overlaps`` records keys whose upload started while another upload of the same key was
      still in flight (the flusher promises this never happens).
    - ``stored`` lists (bucket, key, body) for every completed upload, in completion order.
    """

    def __init__(self, buckets: Iterable[str] = ()) -> None:
        self.buckets: dict[str, dict[str, tuple[bytes, ObjectMeta]]] = {b: {} for b in buckets}
        self.created_s: dict[str, float] = dict.fromkeys(self.buckets, time.time())
        self.log: list[Request] = []
        self.stored: list[tuple[str, str, bytes]] = []
        self.overlaps: list[tuple[str, str]] = []
        self.aborted: list[str] = []
        # upload id -> (bucket, key, initiated wall seconds): uploads open upstream that no
        # completed put_multipart made (seeded by tests: what a crash leaves behind).
        self.open_uploads: dict[str, tuple[str, str, float]] = {}
        self.put_gate: asyncio.Event | None = None
        self.put_arrived = asyncio.Event()
        self._put_faults: deque[tuple[str | None, BaseException]] = deque()
        self._delete_faults: deque[tuple[str | None, BaseException]] = deque()
        self._in_flight: dict[tuple[str, str], int] = {}
        # (bucket, key) -> part sizes of the last multipart upload of that key.
        self.multipart_parts: dict[tuple[str, str], list[int]] = {}
        # upload id -> part number -> (bytes, ETag): parts of uploads made by
        # ``create_multipart`` (the early multipart path), kept as S3 keeps them: the last
        # completed UploadPart of a number wins.
        self.upload_parts: dict[str, dict[int, tuple[bytes, str]]] = {}
        self._part_faults: deque[tuple[str | None, BaseException]] = deque()
        # When set, each upload_part waits on it after reading its body (a part in flight);
        # ``part_arrived`` is set when one is waiting.
        self.part_gate: asyncio.Event | None = None
        self.part_arrived = asyncio.Event()
        self._uploads_made = 0
        self.changed = asyncio.Event()  # set after every write call (see ``until``)
        # (upload id, part number) of an upload_part that began while another of the same
        # part was in flight (the early flusher promises this never happens).
        self.part_overlaps: list[tuple[str, int]] = []
        self._parts_in_flight: set[tuple[str, int]] = set()

    # -- test helpers ----------------------------------------------------------------------

    def add_object(
        self,
        bucket: str,
        key: str,
        body: bytes = b"",
        *,
        last_modified_s: float = 1_700_000_000.0,
        content_type: str = "binary/octet-stream",
    ) -> ObjectMeta:
        """Put an object straight into the fake (no log entry), creating the bucket."""
        meta = ObjectMeta(
            bucket=bucket,
            key=key,
            size_bytes=len(body),
            etag=hashlib.md5(body).hexdigest(),
            last_modified_s=last_modified_s,
            content_type=content_type,
        )
        self._bucket_for_seed(bucket)[key] = (body, meta)
        return meta

    def body(self, bucket: str, key: str) -> bytes | None:
        """The stored bytes of a key, or None."""
        found = self.buckets.get(bucket, {}).get(key)
        return None if found is None else found[0]

    def keys(self, bucket: str) -> list[str]:
        return sorted(self.buckets.get(bucket, {}), key=utf8_order)

    def fail_puts(self, *excs: BaseException, key: str | None = None) -> None:
        self._put_faults.extend((key, e) for e in excs)

    def fail_deletes(self, *excs: BaseException, key: str | None = None) -> None:
        self._delete_faults.extend((key, e) for e in excs)

    def fail_parts(self, *excs: BaseException, key: str | None = None) -> None:
        """Exceptions raised by the next ``upload_part`` calls (early multipart), in order."""
        self._part_faults.extend((key, e) for e in excs)

    def ops(self, op: str) -> list[Request]:
        return [r for r in self.log if r[0] == op]

    async def until(self, check: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Wait until ``check()`` holds, checking again after every write call (no polling)."""

        async def wait() -> None:
            while True:
                self.changed.clear()
                if check():
                    return
                await self.changed.wait()

        await asyncio.wait_for(wait(), timeout_s)

    # -- writes (FlushError only) ----------------------------------------------------------

    async def put_object(self, meta: ObjectMeta, body: BinaryIO | Path) -> str:
        # Read at once: the real client has the file open before the request goes out.
        data = body.read_bytes() if isinstance(body, Path) else body.read()
        return await self._store("put", meta, data, hashlib.md5(data).hexdigest())

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> bool:
        self.log.append(("abort_multipart", bucket, key))
        self.aborted.append(upload_id)
        self.open_uploads.pop(upload_id, None)
        self.upload_parts.pop(upload_id, None)
        self.changed.set()
        return True

    async def list_open_uploads(self, bucket: str, key: str) -> list[tuple[str, float]]:
        self.log.append(("list_multipart_uploads", bucket, key))
        return [
            (upload_id, initiated_s)
            for upload_id, (b, k, initiated_s) in self.open_uploads.items()
            if (b, k) == (bucket, key)
        ]

    async def put_multipart(
        self,
        meta: ObjectMeta,
        parts: Sequence[PartSource],
        track: UploadTracker | None = None,
        run: RequestRunner | None = None,
    ) -> str:
        """Parts are checked against their MD5 (BadDigest is Fatal); the ETag is S3's
        multipart ETag: md5 of the parts' binary MD5s, then ``-<number of parts>``."""
        pieces = [
            await run(p.size_bytes, functools.partial(_read_part, p))
            if run is not None
            else p.body.read()
            for p in parts
        ]
        bad = None
        for number, (piece, part) in enumerate(zip(pieces, parts, strict=True), 1):
            if len(piece) != part.size_bytes or hashlib.md5(piece).hexdigest() != part.md5_hex:
                bad = Fatal(f"BadDigest: part {number} of {meta.key} (HTTP 400)")
        digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in pieces)).hexdigest()
        etag = f"{digest}-{len(parts)}"
        upload_id = f"fake-{len(self.log)}"
        if track is not None:
            await track(upload_id, meta.bucket, meta.key, False)
        etag = await self._store("put_multipart", meta, b"".join(pieces), etag, bad)
        if track is not None:
            await track(upload_id, meta.bucket, meta.key, True)
        self.multipart_parts[(meta.bucket, meta.key)] = [len(p) for p in pieces]
        return etag

    async def _store(
        self, op: str, meta: ObjectMeta, data: bytes, etag: str, error: Fatal | None = None
    ) -> str:
        ident = (meta.bucket, meta.key)
        self.log.append((op, meta.bucket, meta.key))
        self._raise_fault(self._put_faults, meta.key)
        if meta.bucket not in self.buckets:
            raise Fatal(f"NoSuchBucket: {meta.bucket} (HTTP 404)")
        if error is not None:
            raise error
        if self._in_flight.get(ident, 0):
            self.overlaps.append(ident)
        self._in_flight[ident] = self._in_flight.get(ident, 0) + 1
        try:
            if self.put_gate is not None:
                self.put_arrived.set()
                await self.put_gate.wait()
        finally:
            self._in_flight[ident] -= 1
        stored = dataclasses.replace(meta, size_bytes=len(data), etag=etag)
        self.buckets[meta.bucket][meta.key] = (data, stored)
        self.stored.append((meta.bucket, meta.key, data))
        self.changed.set()
        return etag

    async def create_multipart(self, meta: ObjectMeta) -> str:
        self.log.append(("create_multipart", meta.bucket, meta.key))
        if meta.bucket not in self.buckets:
            raise Fatal(f"NoSuchBucket: {meta.bucket} (HTTP 404)")
        self._uploads_made += 1
        upload_id = f"early-{self._uploads_made}"
        self.open_uploads[upload_id] = (meta.bucket, meta.key, time.time())
        self.upload_parts[upload_id] = {}
        self.changed.set()
        return upload_id

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_number: int, part: PartSource
    ) -> str:
        self.log.append(("upload_part", bucket, key))
        self.changed.set()
        ident = (upload_id, part_number)
        if ident in self._parts_in_flight:
            self.part_overlaps.append(ident)
        self._parts_in_flight.add(ident)
        try:
            data = await _read_part(part)
            self._raise_fault(self._part_faults, key)
            if self.part_gate is not None:
                self.part_arrived.set()
                await self.part_gate.wait()
        finally:
            self._parts_in_flight.discard(ident)
        if upload_id not in self.open_uploads:
            raise Fatal(f"NoSuchUpload: {upload_id} (HTTP 404)")
        etag = hashlib.md5(data).hexdigest()
        if len(data) != part.size_bytes or etag != part.md5_hex:
            raise Fatal(f"BadDigest: part {part_number} of {key} (HTTP 400)")
        self.upload_parts[upload_id][part_number] = (data, etag)
        self.changed.set()
        return etag

    async def complete_multipart(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
    ) -> str:
        """S3's checks: every listed part exists with that ETag, in ascending order. The
        faults of ``fail_puts`` come first (the upload stays open, as after a 503)."""
        if any(k is None or k == key for k, _ in self._put_faults):
            self.log.append(("complete_multipart", bucket, key))
            self._raise_fault(self._put_faults, key)
        stored = self.upload_parts.get(upload_id)
        numbers = [n for n, _ in parts]
        problem = None
        if upload_id not in self.open_uploads or stored is None:
            problem = f"NoSuchUpload: {upload_id} (HTTP 404)"
        elif numbers != sorted(set(numbers)):
            problem = "InvalidPartOrder (HTTP 400)"
        elif any(n not in stored or stored[n][1] != e for n, e in parts):
            problem = "InvalidPart (HTTP 400)"
        if problem is not None or stored is None:
            self.log.append(("complete_multipart", bucket, key))
            raise Fatal(problem or "NoSuchUpload (HTTP 404)")
        pieces = [stored[n][0] for n in numbers]
        digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in pieces)).hexdigest()
        meta = ObjectMeta(bucket=bucket, key=key, size_bytes=0, etag="", last_modified_s=0.0)
        del self.open_uploads[upload_id]
        del self.upload_parts[upload_id]
        data = b"".join(pieces)
        etag = await self._store("complete_multipart", meta, data, f"{digest}-{len(parts)}")
        self.multipart_parts[(bucket, key)] = [len(p) for p in pieces]
        return etag

    async def delete_object(self, bucket: str, key: str) -> None:
        self.log.append(("delete", bucket, key))
        self._raise_fault(self._delete_faults, key)
        if bucket not in self.buckets:
            raise Fatal(f"NoSuchBucket: {bucket} (HTTP 404)")
        self.buckets[bucket].pop(key, None)  # S3 deletes are idempotent

    # -- reads (S3Error only) --------------------------------------------------------------

    async def head_object(self, bucket: str, key: str) -> ObjectMeta:
        self.log.append(("head", bucket, key))
        return self._find(bucket, key)[1]

    async def head_part(self, bucket: str, key: str, part_number: int) -> UpstreamHead:
        """Every fake object is single-part: part 1 is all of it."""
        self.log.append(("head", bucket, key))
        meta = self._find(bucket, key)[1]
        if part_number != 1:
            raise InvalidPartNumber()
        return UpstreamHead(meta, None, None)

    async def get_object(
        self,
        bucket: str,
        key: str,
        *,
        range_header: str | None = None,
        part_number: int | None = None,
        preconditions: Mapping[str, str] | None = None,
    ) -> UpstreamObject:
        """Range and preconditions are ignored (a server may ignore them): always 200."""
        self.log.append(("get", bucket, key))
        data, meta = self._find(bucket, key)
        if part_number not in (None, 1):
            raise InvalidPartNumber()
        return UpstreamObject(meta, _Body(data))

    async def list_page(
        self, bucket: str, prefix: str, delimiter: str, start_after: str, max_keys: int
    ) -> tuple[list[ListEntry], bool]:
        """ListObjectsV2: keys after ``start_after`` under ``prefix`` in UTF-8 byte order,
        keys continuing past ``delimiter`` rolled into common prefixes; at most ``max_keys``
        keys and prefixes together."""
        self.log.append(("list", bucket, prefix))
        objects = self._objects(bucket)
        after = utf8_order(start_after)
        names = sorted(
            (k for k in objects if k.startswith(prefix) and utf8_order(k) > after),
            key=utf8_order,
        )
        entries: list[ListEntry] = []
        for name in names:
            rolled = None
            if delimiter:
                cut = name.find(delimiter, len(prefix))
                rolled = None if cut < 0 else name[: cut + len(delimiter)]
            if rolled is not None:
                if entries and entries[-1].name == rolled:
                    continue
                entry = ListEntry(name=rolled, is_prefix=True)
            else:
                meta = objects[name][1]
                entry = ListEntry(name, False, meta.size_bytes, meta.etag, meta.last_modified_s)
            if len(entries) >= max_keys:
                # AWS: max-keys=0 is an empty, complete page.
                return entries, max_keys > 0
            entries.append(entry)
        return entries, False

    # -- buckets ---------------------------------------------------------------------------

    async def head_bucket(self, bucket: str) -> None:
        self.log.append(("head_bucket", bucket, ""))
        if bucket not in self.buckets:
            raise NoSuchBucket(BucketName=bucket)

    async def list_buckets(self) -> list[BucketInfo]:
        self.log.append(("list_buckets", "", ""))
        return [BucketInfo(b, self.created_s[b]) for b in sorted(self.buckets)]

    async def create_bucket(self, bucket: str, location: str | None) -> None:
        self.log.append(("create_bucket", bucket, ""))
        self.buckets.setdefault(bucket, {})
        self.created_s.setdefault(bucket, time.time())

    async def delete_bucket(self, bucket: str) -> None:
        self.log.append(("delete_bucket", bucket, ""))
        self._objects(bucket)
        del self.buckets[bucket]
        del self.created_s[bucket]

    # -- internals -------------------------------------------------------------------------

    def _bucket_for_seed(self, bucket: str) -> dict[str, tuple[bytes, ObjectMeta]]:
        self.created_s.setdefault(bucket, time.time())
        return self.buckets.setdefault(bucket, {})

    def _objects(self, bucket: str) -> dict[str, tuple[bytes, ObjectMeta]]:
        objects = self.buckets.get(bucket)
        if objects is None:
            raise NoSuchBucket(BucketName=bucket)
        return objects

    def _find(self, bucket: str, key: str) -> tuple[bytes, ObjectMeta]:
        found = self._objects(bucket).get(key)
        if found is None:
            raise NoSuchKey(Key=key)
        return found

    @staticmethod
    def _raise_fault(faults: deque[tuple[str | None, BaseException]], key: str) -> None:
        for i, (only_key, exc) in enumerate(faults):
            if only_key is None or only_key == key:
                del faults[i]
                raise exc


async def claim_pending(journal: Journal, limit: int, now_s: float) -> list[LocalObject]:
    """Claim up to ``limit`` pending rows eligible at ``now_s`` (wall), oldest first, as a
    flusher without lanes or holds would: for tests of the journal itself."""
    seqs = await journal.run_read(
        lambda conn: [
            int(r[0])
            for r in conn.execute(
                "SELECT seq FROM objects WHERE state = 'pending' AND not_before_s <= ? "
                "ORDER BY seq LIMIT ?",
                (now_s, limit),
            )
        ]
    )
    return await FlushQueue(journal).claim(seqs)


async def until_changed(
    journal: Journal, check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0
) -> None:
    """Wait until ``check()`` holds, checking again after every committed journal change
    (no polling, no sleep)."""
    changed = asyncio.Event()
    journal.add_listener(changed.set)

    async def wait() -> None:
        while True:
            changed.clear()  # before checking: a change during the check is not lost
            if await check():
                return
            await changed.wait()

    try:
        await asyncio.wait_for(wait(), timeout_s)
    finally:
        journal.remove_listener(changed.set)


async def source_bytes(source: BodySource) -> bytes:
    """Every byte a GET's body source yields (file spans read with pread), then closed."""
    out = bytearray()
    try:
        while (piece := await source.next_piece()) is not None:
            if isinstance(piece, FileSpan):
                out += os.pread(piece.fd, piece.count, piece.offset)
            else:
                out += piece
    finally:
        await source.aclose()
    return bytes(out)


def path_style_upstream(
    url: str, region: str = "us-east-1", access_key: str = "k", secret_key: str = "s"
) -> AiobotocoreUpstream:
    """The real upstream client for a test server at ``url`` (path-style addressing)."""
    return AiobotocoreUpstream(
        endpoint_url=url,
        region=region,
        addressing_style="path",
        access_key=access_key,
        secret_key=secret_key,
    )
