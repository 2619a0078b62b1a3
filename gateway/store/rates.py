"""The request rates the flusher learnt of each bucket, kept across restarts
(``bucket_rates``; ``flush/memory.py`` decides what and when)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from gateway.store.journal import Journal


class RateTable:
    """Every call is one short transaction on the journal's threads."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    async def load(self, since_wall_s: float) -> dict[str, float]:
        """Bucket -> rate of the records made at or after ``since_wall_s``."""

        def op(conn: sqlite3.Connection) -> dict[str, float]:
            rows = conn.execute(
                "SELECT bucket, rate_per_s FROM bucket_rates WHERE recorded_s >= ?",
                (since_wall_s,),
            ).fetchall()
            return {str(bucket): float(rate) for bucket, rate in rows}

        return await self._journal.run_read(op)

    async def save(self, rates: Mapping[str, float], now_wall_s: float) -> None:
        """Record ``rates`` as of ``now_wall_s`` (other buckets' records are kept)."""
        rows = [(bucket, rate, now_wall_s) for bucket, rate in rates.items()]

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO bucket_rates (bucket, rate_per_s, recorded_s) VALUES (?, ?, ?) "
                "ON CONFLICT(bucket) DO UPDATE SET rate_per_s = excluded.rate_per_s, "
                "recorded_s = excluded.recorded_s",
                rows,
            )

        if rows:
            await self._journal.run_write(op)
