"""The fleet's remembered members and this data dir's identity, in the journal
(``fleet_members``, ``datadir_identity``; see docs/fleet.md)."""

from __future__ import annotations

import sqlite3
import uuid
from dataclasses import dataclass

from gateway.store.journal import Journal


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """What is remembered of a member across restarts."""

    node_id: str
    address: str
    datadir_id: str | None
    has_left: bool = False


class MemberTable:
    """``MemberStore`` over the journal. Every call is one short transaction."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    async def datadir_id(self) -> str:
        """This data dir's id, drawn (and made durable) the first time it is asked."""

        def op(conn: sqlite3.Connection) -> str:
            row = conn.execute("SELECT datadir_id FROM datadir_identity WHERE id = 1").fetchone()
            if row is not None:
                return str(row[0])
            fresh = uuid.uuid4().hex
            conn.execute("INSERT INTO datadir_identity (id, datadir_id) VALUES (1, ?)", (fresh,))
            return fresh

        return await self._journal.run_write(op)

    async def load_members(self) -> list[MemberRecord]:
        def op(conn: sqlite3.Connection) -> list[MemberRecord]:
            rows = conn.execute(
                "SELECT node_id, address, datadir_id, has_left FROM fleet_members ORDER BY node_id"
            ).fetchall()
            return [MemberRecord(str(n), str(a), d, bool(left)) for n, a, d, left in rows]

        return await self._journal.run_read(op)

    async def save_member(self, record: MemberRecord) -> None:
        await self._journal.run_write(
            lambda c: c.execute(
                "INSERT INTO fleet_members (node_id, address, datadir_id, has_left) "
                "VALUES (?, ?, ?, ?) ON CONFLICT(node_id) DO UPDATE SET address = "
                "excluded.address, datadir_id = excluded.datadir_id, has_left = excluded.has_left",
                (record.node_id, record.address, record.datadir_id, int(record.has_left)),
            )
        )

    async def delete_member(self, node_id: str) -> None:
        await self._journal.run_write(
            lambda c: c.execute("DELETE FROM fleet_members WHERE node_id = ?", (node_id,))
        )
