"""VerifiedFiles: the verify-once memo's table keeps the newest entries, in order."""

from __future__ import annotations

from pathlib import Path

from gateway.store.journal import Journal
from gateway.store.verified import VerifiedFiles


async def test_saved_entries_load_back_newest_kept(journal: Journal, tmp_path: Path) -> None:
    table = VerifiedFiles(journal, limit=3)
    assert await table.load() == []
    keys = [(f"blob-{i}", 100 + i, 4096, 10**9 + i, 2 * 10**9 + i) for i in range(5)]
    await table.save(keys[:2])
    await table.save(keys[2:])
    await table.save([])
    assert await table.load() == keys[2:]  # the newest three, oldest first
    journal.close()
    reopened = Journal(tmp_path / "j.db", fsync=False)
    reopened.open()
    try:
        assert await VerifiedFiles(reopened, limit=10).load() == keys[2:]
    finally:
        reopened.close()
