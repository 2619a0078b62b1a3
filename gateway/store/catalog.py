"""What the journal holds, by bucket and by commit marker: the reads behind ``gateway
checkpoints`` when no bucket or prefix is given (admin pool; never beside GETs)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gateway.store.journal import Journal

# A loose index scan: one B-tree seek per bucket, however many rows each holds (the table
# is clustered on (bucket, key)), instead of a pass over every row for DISTINCT.
_BUCKETS_SQL = """
WITH RECURSIVE names(name) AS (
    SELECT MIN(bucket) FROM objects
    UNION ALL
    SELECT (SELECT MIN(bucket) FROM objects WHERE bucket > names.name)
    FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL
"""


async def buckets_with_rows(journal: Journal) -> list[str]:
    """Every bucket the journal holds a row for (pending, failed, or durable and cached),
    sorted."""

    def op(conn: sqlite3.Connection) -> list[str]:
        return [str(name) for (name,) in conn.execute(_BUCKETS_SQL)]

    return await journal.run_admin_read(op)


async def marker_keys(
    journal: Journal, bucket: str | None, patterns: Sequence[str], limit: int
) -> list[tuple[str, str]]:
    """(bucket, key) of up to ``limit`` live rows (not deletes) whose file name matches one
    of the commit-marker ``patterns`` (SQLite GLOB: ``*``, ``?``, ``[...]``), in key order.
    One pass over the bucket's rows (or every row): callers cache the answer."""
    if not patterns:
        return []
    globs = [g for p in patterns for g in (p, "*/" + p)]
    sql = "SELECT bucket, key FROM objects WHERE is_delete = 0 AND ("
    sql += " OR ".join("key GLOB ?" for _ in globs) + ")"
    args: list[object] = list(globs)
    if bucket is not None:
        sql += " AND bucket = ?"
        args.append(bucket)
    sql += " ORDER BY bucket, key LIMIT ?"
    args.append(limit)

    def op(conn: sqlite3.Connection) -> list[tuple[str, str]]:
        return [(str(b), str(k)) for b, k in conn.execute(sql, args)]

    return await journal.run_admin_read(op)
