"""Recording a flush error never raises, whatever the error's text holds (a lone surrogate
from undecodable request bytes made sqlite3 raise UnicodeEncodeError inside the flush task,
leaving the row ``flushing`` with no error)."""

from __future__ import annotations

import pytest
from fakes import claim_pending

from gateway.models import FlushState, ObjectMeta
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue

HOSTILE_ERRORS = ["caf\udce9", "\udcff\udcfe", "nul\x00byte", "\ud800 alone", "x" * 100_000]


async def _claimed(journal: Journal, key: str) -> None:
    meta = ObjectMeta(bucket="b", key=key, size_bytes=1, etag="e", last_modified_s=1.0)
    await journal.commit_put(meta, f"blob-{key}", 1.0)


@pytest.mark.parametrize("error", HOSTILE_ERRORS)
async def test_journal_records_any_error_text(journal: Journal, error: str) -> None:
    await _claimed(journal, "retried")
    await _claimed(journal, "failed")
    queue = FlushQueue(journal)
    retried, failed = await claim_pending(journal, 10, 10.0)
    await queue.retry_later(retried, error, not_before_s=1e12)
    await queue.mark_failed(failed, error)
    await _claimed(journal, "corrupt")
    [corrupt] = await claim_pending(journal, 10, 10.0)
    assert corrupt.meta.key == "corrupt"
    assert await journal.mark_corrupt(corrupt, error) == []

    expected = error.encode("utf-8", "backslashreplace").decode("utf-8")
    for key, state in [
        ("retried", FlushState.PENDING),
        ("failed", FlushState.FAILED),
        ("corrupt", FlushState.FAILED),
    ]:
        row = await journal.get("b", key)
        assert row is not None and row.state is state
        assert row.last_error == expected
