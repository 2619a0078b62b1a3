"""Versions acknowledged with fewer replicas than ``--replicas`` asked for (``--replica-
policy degrade``): the object's state says so (``x-gateway-replicas: 0/1`` on its reads,
``replicas`` in the admin's object state) until the version is durable upstream, replaced,
or sent to enough holders after all (re-replication tops it up: fleet/rereplication.py).

One row per key in ``short_copies`` (the newest version's), kept in memory too so that a
read asks nothing of SQLite. Loop-bound.
"""

from __future__ import annotations

import sqlite3

from gateway.store.journal import Journal


class ShortCopies:
    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._short: dict[tuple[str, str], tuple[int, int, int]] = {}  # -> seq, copies, wanted

    async def load(self) -> None:
        """What the journal holds (at start, before anything reads or writes)."""

        def op(conn: sqlite3.Connection) -> list[tuple[str, str, int, int, int]]:
            return conn.execute(
                "SELECT bucket, key, seq, copies, wanted FROM short_copies"
            ).fetchall()

        self._short = {
            (b, k): (int(s), int(c), int(w)) for b, k, s, c, w in await self._journal.run_read(op)
        }

    def of(self, bucket: str, key: str, seq: int) -> tuple[int, int] | None:
        """(copies, wanted) of this version when it has fewer than it should, else None."""
        found = self._short.get((bucket, key))
        if found is None or found[0] != seq:
            return None
        return found[1], found[2]

    def versions(self) -> list[tuple[str, str, int]]:
        """Every version recorded short: (bucket, key, seq)."""
        return [(b, k, s) for (b, k), (s, _, _) in self._short.items()]

    async def note(self, bucket: str, key: str, seq: int, copies: int, wanted: int) -> None:
        """``seq`` of ``key`` is here with ``copies`` of ``wanted`` replicas (acknowledged
        so, or committed and refused)."""

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO short_copies (bucket, key, seq, copies, wanted) "
                "VALUES (?, ?, ?, ?, ?)",
                (bucket, key, seq, copies, wanted),
            )

        current = self._short.get((bucket, key))
        if current is not None and current[0] > seq:
            return  # a newer version's record stands
        self._short[(bucket, key)] = (seq, copies, wanted)
        await self._journal.run_write(op)

    async def clear(self, bucket: str, key: str, seq: int) -> None:
        """``seq`` of ``key`` has its copies now, or needs none (durable, replaced)."""
        if self.of(bucket, key, seq) is None:
            return
        del self._short[(bucket, key)]

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM short_copies WHERE bucket = ? AND key = ? AND seq = ?",
                (bucket, key, seq),
            )

        await self._journal.run_write(op)
