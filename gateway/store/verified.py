"""The verify-once memo of body files, kept in the journal so that it outlives a restart.

A read verifies each body file once against its recorded digest and then trusts it until
the file changes (``core/integrity.py``). Without this table every gateway restart (an
upgrade, a node reboot) made the first read of every cached file hash it again, which is
exactly when a resuming job reads its whole checkpoint back. The key of an entry is what
changes when the file does (its inode, size, mtime and ctime), so a file rewritten,
truncated or replaced since is verified again; what the memo cannot see (media rot that
changes no metadata) it could not see in a running gateway either: ``gateway verify``
re-hashes everything.

Losing entries only costs a re-verification: they are saved in the background, in batches,
and the table keeps the newest ``limit`` of them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gateway.store.journal import Journal

# (blob id, inode, size, mtime_ns, ctime_ns)
FileKey = tuple[str, int, int, int, int]


class VerifiedFiles:
    """The ``verified_files`` table: ``load`` the newest entries, ``save`` more."""

    def __init__(self, journal: Journal, limit: int) -> None:
        self._journal = journal
        self._limit = limit

    async def load(self) -> list[FileKey]:
        """The newest ``limit`` entries, oldest first."""

        def op(conn: sqlite3.Connection) -> list[FileKey]:
            rows = conn.execute(
                "SELECT blob_id, ino, size_bytes, mtime_ns, ctime_ns FROM verified_files "
                "ORDER BY id DESC LIMIT ?",
                (self._limit,),
            ).fetchall()
            return [(str(b), int(i), int(s), int(m), int(c)) for b, i, s, m, c in reversed(rows)]

        return await self._journal.run_admin_read(op)

    async def save(self, keys: Sequence[FileKey]) -> None:
        """Add ``keys`` (newest last) and drop what falls beyond ``limit``."""

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO verified_files (blob_id, ino, size_bytes, mtime_ns, ctime_ns) "
                "VALUES (?, ?, ?, ?, ?)",
                keys,
            )
            conn.execute(
                "DELETE FROM verified_files WHERE id <= (SELECT MAX(id) FROM verified_files) - ?",
                (self._limit,),
            )

        if keys:
            await self._journal.run_write(op)
