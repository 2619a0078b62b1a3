"""Upstream multipart uploads the flusher opened: recorded so that none is left to accrue cost.

A multipart flush writes, in this order: an *intent* row (before CreateMultipartUpload, when
the upload id is not known yet), the upload's own row (as soon as the id is known), then
removes both once the upload is completed or aborted. A crash can therefore leave:

- an upload row: the sweep aborts that upload by id;
- an intent row alone (killed between CreateMultipartUpload and the journal write): the
  sweep lists the upstream's open uploads of exactly that key and aborts those no task of
  this process has open. Their ``Initiated`` time is not used to tell ours from others':
  upstreams' clocks differ from ours and some S3 implementations report a constant there.
  Another writer's multipart upload of the same key straight to the bucket would be
  aborted too (its CompleteMultipartUpload then fails with NoSuchUpload, nothing is lost
  silently): a key written through the gateway belongs to write-back, whose version
  replaces the other writer's anyway (last writer wins).

Early multipart uploads (``early.py``, opened while the client still uploads parts) are
recorded the same way and held open (``is_open``) until completed or aborted.

Contract: ``sweep`` MUST NOT abort an upload a running flush task or an early upload holds
(``is_open``), nor, for a left-over intent, any upload of a key whose CreateMultipartUpload
is in flight now (its id is not known yet); a row is forgotten only once its upload is known
to be gone, so a failed abort is retried at the next sweep.
"""

from __future__ import annotations

import logging
import uuid

from gateway.clock import Clock
from gateway.store.journal import Journal
from gateway.store.records import UpstreamUploadRecords
from gateway.upstream.classify import FlushError
from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)
INTENT_PREFIX = "intent:"


class UpstreamUploads:
    """The journal's record of upstream uploads, and the sweep that aborts abandoned ones."""

    def __init__(self, journal: Journal, upstream: Upstream, clock: Clock) -> None:
        self._records = UpstreamUploadRecords(journal)
        self._upstream = upstream
        self._clock = clock
        self._open: set[str] = set()
        self._intents: dict[str, tuple[str, str]] = {}  # open intents: (bucket, key)
        # Ids finished (completed, aborted, intents ended) since the last sweep began.
        self._finished: set[str] = set()

    def is_open(self, upload_id: str) -> bool:
        return upload_id in self._open

    async def begin(self, bucket: str, key: str) -> str:
        """Record the intent to create an upload of ``key``; returns the intent's id."""
        intent = INTENT_PREFIX + uuid.uuid4().hex
        self._open.add(intent)
        self._intents[intent] = (bucket, key)
        await self._records.record_upstream_upload(intent, bucket, key, self._clock.wall())
        return intent

    async def end(self, intent: str) -> None:
        """The upload begun as ``intent`` is completed or aborted (its own row is gone)."""
        self._open.discard(intent)
        self._intents.pop(intent, None)
        self._finished.add(intent)
        await self._records.forget_upstream_upload(intent)

    def abandon(self, upload_id: str) -> None:
        """No task holds ``upload_id`` (an upload or an intent) any more, but it may still
        exist upstream (an abort or a create that failed): its row stays for the sweep."""
        self._open.discard(upload_id)
        self._intents.pop(upload_id, None)

    async def track(self, upload_id: str, bucket: str, key: str, done: bool) -> None:
        """``UploadTracker`` for ``Upstream.put_multipart``: the upload's own row."""
        if done:
            self._open.discard(upload_id)
            self._finished.add(upload_id)
            await self._records.forget_upstream_upload(upload_id)
        else:
            self._open.add(upload_id)
            await self._records.record_upstream_upload(upload_id, bucket, key, self._clock.wall())

    async def sweep(self) -> None:
        """Abort every recorded upload, or upload matching a recorded intent, that no task
        holds open. Uploads known by id go first, so an intent finds only the unknown ones."""
        # Finished before this sweep (their rows may still be being deleted as it reads)
        # or during it: the upload is gone, never to be aborted.
        earlier, self._finished = self._finished, set()
        records = await self._records.upstream_upload_records()
        records.sort(key=lambda r: r[0].startswith(INTENT_PREFIX))
        for upload_id, bucket, key, _ in records:
            if upload_id in self._open or upload_id in self._finished or upload_id in earlier:
                continue
            if upload_id.startswith(INTENT_PREFIX):
                gone = await self._abort_unknown(bucket, key)
            else:
                gone = await self._upstream.abort_multipart(bucket, key, upload_id)
                if gone:
                    log.info(
                        "aborted abandoned upstream upload %s of %s/%s", upload_id, bucket, key
                    )
            if gone:
                await self._records.forget_upstream_upload(upload_id)

    async def _abort_unknown(self, bucket: str, key: str) -> bool:
        """Abort the open uploads of exactly ``key`` that no task holds; True when none is
        left (the intent can be forgotten). While a create of that key is in flight, its
        upload's id is not known yet: the intent waits for the next sweep."""
        if (bucket, key) in self._intents.values():
            return False
        try:
            found = await self._upstream.list_open_uploads(bucket, key)
        except FlushError as exc:
            log.warning("cannot list upstream uploads of %s/%s yet: %s", bucket, key, exc)
            return False
        gone = True
        for upload_id, _ in found:
            if upload_id in self._open:
                continue
            if await self._upstream.abort_multipart(bucket, key, upload_id):
                log.info("aborted unrecorded upstream upload %s of %s/%s", upload_id, bucket, key)
            else:
                gone = False
        return gone
