"""Records of upstream multipart uploads the flusher has begun and not yet finished.

A record is written before CreateMultipartUpload is sent (an intent) and by the upload's id
once it exists, and removed when the upload is completed or aborted, so a crash can never
abandon an upload upstream: the next start aborts whatever is left (``flush/orphans.py``).
"""

from __future__ import annotations

from gateway.store.journal import Journal


class UpstreamUploadRecords:
    """The journal's ``upstream_uploads`` table."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    async def record_upstream_upload(
        self, upload_id: str, bucket: str, key: str, created_s: float
    ) -> None:
        """Remember an upstream multipart upload before its parts are sent (crash safety)."""
        await self._journal.run_write(
            lambda c: c.execute(
                "INSERT OR REPLACE INTO upstream_uploads VALUES (?, ?, ?, ?)",
                (upload_id, bucket, key, created_s),
            )
        )

    async def forget_upstream_upload(self, upload_id: str) -> None:
        await self._journal.run_write(
            lambda c: c.execute("DELETE FROM upstream_uploads WHERE upload_id = ?", (upload_id,))
        )

    async def upstream_uploads(self) -> list[tuple[str, str, str]]:
        """(upload_id, bucket, key) of every upstream upload not known to be finished."""
        return [(u, b, k) for u, b, k, _ in await self.upstream_upload_records()]

    async def upstream_upload_records(self) -> list[tuple[str, str, str, float]]:
        """(upload_id, bucket, key, created_s) of every recorded upstream upload or intent."""
        rows = await self._journal.run_admin_read(
            lambda c: c.execute(
                "SELECT upload_id, bucket, key, created_s FROM upstream_uploads"
            ).fetchall()
        )
        return [(str(u), str(b), str(k), float(t)) for u, b, k, t in rows]
