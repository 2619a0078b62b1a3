"""Early multipart uploads: the upstream upload of a local multipart upload starts with its
first acknowledged part, and each part is sent as it lands, so a multipart object reaches
the bucket max(client upload, transfer) after it began instead of their sum.

Life of one early upload (``EarlyUpload``), driven by ``MultipartService``'s
``PartListener`` calls (this class implements it) and by the flusher:

- first part acked: an intent row, then CreateMultipartUpload, then the upload's own row
  (``UpstreamUploads``, as for every flush), held open so no sweep aborts it;
- each part acked: sent with its local part number, file and MD5 (so the final ETag,
  md5-of-part-md5s-N, is the one the client saw). Sends of one part number are serialized
  (a re-uploaded part waits for the older send to finish, and a send whose part was
  replaced meanwhile is skipped), and each records the ETag the upstream answered; at the
  end S3's own CompleteMultipartUpload refuses a listed ETag it does not hold, so an older
  send can never become the part S3 uses;
- the client's Complete: the early upload is bound to the object row's seq and parts the
  client left out are no longer sent. Nothing is visible upstream yet: the flusher claims
  the row as any other (write-back delay, commit markers, drain fences unchanged) and then
  ``complete`` sends what is missing and CompleteMultipartUpload with the chosen parts;
- the client's abort, a newer version of the key (``supersede``, at claim; ``reconcile``,
  at each sweep) or a failure of the completion that retrying cannot cure: the upstream
  upload is aborted and its rows forgotten; the object (if any) flushes the ordinary way.

Keys the flusher holds back on purpose are never started early (``skip``): temp names (a
rename usually follows, and a temp key never reaches the bucket) and commit markers (no
request for a marker leaves before its checkpoint's shards are durable upstream).

Every request goes through the flusher's flow control (``RequestGate``: pause, lane
admission, global slots and tokens, retries on throttles), ordered as work acknowledged at
the upload's first part (the journal's last seq then), so early parts take their turn among
the lane's objects by age. A crash leaves at most recorded uploads, which the sweep at the
next start aborts; parts acked before it are then sent at completion (a part acked after
the restart starts a new early upload).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol, TypeVar

from gateway.clock import Clock
from gateway.flush.orphans import UpstreamUploads
from gateway.models import FlushState, LocalObject, ObjectMeta
from gateway.store.blobs import BlobStore
from gateway.store.integrity import BodyDigest, check_fd
from gateway.store.journal import Journal
from gateway.store.uploads import Part, Upload
from gateway.upstream.classify import Corrupt, Fatal, FlushError, Retryable, Throttled
from gateway.upstream.client import PartSource, Upstream

log = logging.getLogger(__name__)
T = TypeVar("T")
_PART_CONCURRENCY = 64  # parts of one early upload sent at once (open part files; the
# gate's window bounds the requests in flight)


class RequestGate(Protocol):
    """The flusher's flow control, for requests that belong to no claimed row."""

    def early_request(
        self, bucket: str, key: str, order: int, size_bytes: int, send: Callable[[], Awaitable[T]]
    ) -> Awaitable[T]:
        """Send through pause, admission, slots and tokens, retrying throttles and
        transient errors; raises the last ``FlushError`` when it gives up."""
        ...


@dataclass(slots=True)
class _Slot:
    """One part number: the newest local part, what the upstream holds, the send chain."""

    latest: Part
    sent_etag: str | None = None  # ETag the last finished UploadPart of this number got
    task: asyncio.Task[None] | None = None


@dataclass(eq=False, slots=True)
class EarlyUpload:
    upload: Upload
    order: int  # the journal's last seq at the first part: its place among the lane's work
    created: asyncio.Task[str | None]  # the upstream upload id; None if it could not be
    slots: dict[int, _Slot] = field(default_factory=dict)
    limit: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(_PART_CONCURRENCY))
    seq: int | None = None  # the object row, once the client completed
    chosen: list[Part] = field(default_factory=list)
    is_closed: bool = False  # being aborted or completed: no more sends


class EarlyUploads:
    """Implements ``core.multipart.PartListener``. Use from the event loop only."""

    def __init__(
        self,
        journal: Journal,
        blobs: BlobStore,
        upstream: Upstream,
        uploads: UpstreamUploads,
        gate: RequestGate,
        clock: Clock,
        skip: Callable[[str], bool] = lambda key: False,
    ) -> None:
        self._journal, self._blobs, self._upstream = journal, blobs, upstream
        self._skip = skip
        self._uploads, self._gate, self._clock = uploads, gate, clock
        self._by_upload: dict[str, EarlyUpload] = {}  # still open locally
        self._by_seq: dict[int, EarlyUpload] = {}  # completed locally, not yet flushed
        self._tasks: set[asyncio.Task[Any]] = set()
        # Set once the start-up sweep is done: a create before it could race the sweep
        # of an intent left for the same key.
        self.ready = asyncio.Event()

    @property
    def open_count(self) -> int:
        return len(self._by_upload) + len(self._by_seq)

    # -- PartListener ----------------------------------------------------------------------

    def part_stored(self, upload: Upload, part: Part) -> None:
        if self._skip(upload.key):
            return
        early = self._by_upload.get(upload.upload_id)
        if early is None:
            early = self._begin(upload)
        if early.is_closed:
            return
        slot = early.slots.get(part.part_number)
        if slot is None:
            slot = early.slots[part.part_number] = _Slot(part)
        slot.latest = part
        previous = slot.task
        slot.task = self._spawn(self._send_part(early, slot, part, previous), "early part")

    def upload_completed(self, upload: Upload, row: LocalObject, chosen: Sequence[Part]) -> None:
        early = self._by_upload.pop(upload.upload_id, None)
        if early is None:
            return
        early.seq, early.chosen = row.seq, list(chosen)
        self._by_seq[row.seq] = early
        numbers = {p.part_number for p in chosen}
        for number, slot in early.slots.items():
            if number not in numbers and slot.task is not None:
                slot.task.cancel()  # left out by the client: S3 drops it at completion

    def upload_aborted(self, upload: Upload) -> None:
        early = self._by_upload.pop(upload.upload_id, None)
        if early is not None:
            self._spawn(self._abort(early), "early abort")

    # -- the flusher's side ----------------------------------------------------------------

    def supersede(self, bucket: str, key: str, seq: int) -> None:
        """A version ``seq`` of the key was claimed: older early uploads can never be used."""
        for old_seq, early in list(self._by_seq.items()):
            if old_seq < seq and (early.upload.bucket, early.upload.key) == (bucket, key):
                del self._by_seq[old_seq]
                self._spawn(self._abort(early), "early abort")

    async def reconcile(self) -> None:
        """Abort early uploads whose object row is gone, replaced or failed (at each sweep:
        a newer version that is never claimed, such as a temp key's tombstone, or a row
        failed before its upload began, leaves them; a failed row retried later flushes the
        ordinary way)."""
        for seq, early in list(self._by_seq.items()):
            row = await self._journal.get(early.upload.bucket, early.upload.key)
            unused = row is None or row.seq != seq or row.state == FlushState.FAILED
            if unused and self._by_seq.get(seq) is early:
                del self._by_seq[seq]
                await self._abort(early)

    async def complete(self, obj: LocalObject) -> str | None:
        """Finish the early upload of ``obj`` (a claimed multipart row): send the parts the
        upstream lacks, then CompleteMultipartUpload with the chosen ones. Returns its ETag,
        or None when there is no usable early upload (flush it the ordinary way).

        Raises ``Corrupt`` (a part's file changed: the flush fails visibly) and the
        throttles and transient errors the gate gave up on (the early upload is kept for
        the row's next try); any other failure aborts it and raises ``Retryable``, so the
        row's next try uploads it anew (the ordinary way)."""
        early = self._by_seq.pop(obj.seq, None)
        if early is None:
            return None
        if [p.blob_id for p in early.chosen] != [p.blob_id for p in obj.parts]:
            await self._abort(early)  # not the row the completion made: never guess
            return None
        upload_id = await _result(early.created)
        if upload_id is None:
            await self._abort(early)
            return None
        early.is_closed = True
        try:
            etag = await self._finish(early, upload_id)
        except Corrupt:
            await self._abort(early)
            raise
        except (Retryable, Throttled, asyncio.CancelledError):
            early.is_closed = False
            self._by_seq[obj.seq] = early  # the row's next try goes on from here
            raise
        except FlushError as exc:
            await self._abort(early)
            raise Retryable(f"early multipart upload failed, uploading anew: {exc}") from exc
        await self._uploads.track(upload_id, early.upload.bucket, early.upload.key, True)
        return etag

    async def wait_idle(self) -> None:
        """Until no early task (create, part, abort) is running: for tests and status."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def close(self) -> None:
        """Cancel every early task (shutdown); recorded uploads wait for the next sweep."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    # -- internals -------------------------------------------------------------------------

    def _spawn(self, work: Awaitable[T], name: str) -> asyncio.Task[T]:
        task = asyncio.ensure_future(work)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)
        return task

    def _begin(self, upload: Upload) -> EarlyUpload:
        created = self._spawn(self._create(upload, self._journal.last_seq), "early create")
        early = EarlyUpload(upload, self._journal.last_seq, created)
        self._by_upload[upload.upload_id] = early
        return early

    async def _create(self, upload: Upload, order: int) -> str | None:
        """Intent row, CreateMultipartUpload, the upload's row; None if it failed (a create
        that may have happened is left to the sweep through its intent)."""
        await self.ready.wait()
        bucket, key = upload.bucket, upload.key
        meta = ObjectMeta(
            bucket=bucket,
            key=key,
            size_bytes=0,
            etag="",
            last_modified_s=upload.created_s,
            content_type=upload.content_type,
            user_metadata=upload.user_metadata,
            headers=upload.headers,
        )
        intent = await self._uploads.begin(bucket, key)
        try:
            upload_id = await self._gate.early_request(
                bucket, key, order, 0, lambda: self._upstream.create_multipart(meta)
            )
            await self._uploads.track(upload_id, bucket, key, False)
        except FlushError as exc:
            log.warning("early multipart upload of %s/%s not started: %s", bucket, key, exc)
            self._uploads.abandon(intent)
            return None
        except BaseException:
            self._uploads.abandon(intent)
            raise
        await self._uploads.end(intent)
        return upload_id

    async def _send_part(
        self, early: EarlyUpload, slot: _Slot, part: Part, previous: asyncio.Task[None] | None
    ) -> None:
        """Send ``part`` once every older send of its number is over, unless it has been
        replaced meanwhile (the newer part's own send follows) or the upload is closing."""
        if previous is not None:
            await asyncio.wait([previous])
        upload_id = await _result(early.created)
        if upload_id is None or early.is_closed or slot.latest is not part:
            return
        async with early.limit:
            try:
                slot.sent_etag = await self._upload_part(early, upload_id, part)
            except FileNotFoundError:
                return  # replaced or aborted locally: nothing of it is needed any more
            except FlushError as exc:  # sent again at completion if it is chosen
                slot.sent_etag = None
                log.info(
                    "early part %d of %s/%s not sent yet: %s",
                    part.part_number,
                    early.upload.bucket,
                    early.upload.key,
                    exc,
                )

    async def _upload_part(self, early: EarlyUpload, upload_id: str, part: Part) -> str:
        """Check the part's file against its acked digest, send it; the answered ETag."""
        bucket, key = early.upload.bucket, early.upload.key
        body: BinaryIO = await asyncio.to_thread(self._blobs.path(part.blob_id).open, "rb")
        try:
            digest = BodyDigest(part.size_bytes, part.crc32c, part.etag)
            problem = await asyncio.to_thread(check_fd, body.fileno(), digest)
            if problem is not None:
                raise Corrupt(f"body {problem}")
            source = PartSource(body, part.size_bytes, part.etag)
            number = part.part_number
            return await self._gate.early_request(
                bucket,
                key,
                early.order,
                part.size_bytes,
                lambda: self._upstream.upload_part(bucket, key, upload_id, number, source),
            )
        finally:
            await asyncio.to_thread(body.close)

    async def _finish(self, early: EarlyUpload, upload_id: str) -> str:
        """Wait for the chosen parts' sends, send those the upstream lacks, complete."""
        waiting = [
            slot.task
            for p in early.chosen
            if (slot := early.slots.get(p.part_number)) is not None and slot.task is not None
        ]
        if waiting:
            await asyncio.wait(waiting)

        async def ensure(part: Part) -> None:
            slot = early.slots.get(part.part_number)
            if slot is not None and slot.sent_etag == part.etag:
                return
            async with early.limit:
                etag = await self._upload_part(early, upload_id, part)
            if etag != part.etag:
                raise Fatal(f"upstream ETag {etag} of part {part.part_number} is not {part.etag}")

        try:
            async with asyncio.TaskGroup() as group:
                for part in early.chosen:
                    group.create_task(ensure(part))
        except* FileNotFoundError as group:
            raise Fatal(f"local part missing: {group.exceptions[0]}") from None
        except* FlushError as group:
            raise group.exceptions[0] from None
        bucket, key = early.upload.bucket, early.upload.key
        listed = [(p.part_number, p.etag) for p in early.chosen]
        return await self._gate.early_request(
            bucket,
            key,
            early.order,
            0,
            lambda: self._upstream.complete_multipart(bucket, key, upload_id, listed),
        )

    async def _abort(self, early: EarlyUpload) -> None:
        """Stop its sends and abort it upstream; its row is forgotten once it is gone (a
        failed abort leaves it to the sweep)."""
        early.is_closed = True
        tasks = [s.task for s in early.slots.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        upload_id = await _result(early.created)
        if upload_id is None:
            return
        bucket, key = early.upload.bucket, early.upload.key
        gone = False
        with contextlib.suppress(FlushError):
            gone = await self._gate.early_request(
                bucket,
                key,
                early.order,
                0,
                lambda: self._upstream.abort_multipart(bucket, key, upload_id),
            )
        if gone:
            await self._uploads.track(upload_id, bucket, key, True)
        else:
            self._uploads.abandon(upload_id)


async def _result(created: asyncio.Task[str | None]) -> str | None:
    """The upload id a create task made, None if it failed or was cancelled."""
    await asyncio.wait([created])
    if created.cancelled() or created.exception() is not None:
        return None
    return created.result()


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("early multipart task %s failed", task.get_name(), exc_info=task.exception())
