"""The upstream a data dir's versions were acknowledged for: its record, read and changed.

Every unflushed row of a journal is owed to one upstream: the one it was acknowledged for.
The journal records which (table ``upstream``, one row): ``DEMO`` for the embedded,
in-memory demo upstream, or a real endpoint's URL, normalised (``normalise_endpoint``).
Start-up (``gateway/startup.py``) compares it with the upstream it is given before anything
else touches the journal, and decides; this module only reads and writes.

- ``inspect`` reads, through a read-only connection, the record and what the journal holds
  (unflushed versions and deletes, multipart uploads in progress, cached copies): a start
  that refuses leaves the journal as it was.
- ``record`` writes the record, and with ``renew`` first forgets what the journal knows of
  the previous upstream: its cached copies (``durable`` rows: the upstream's bytes, which
  the next one does not hold), the buckets known to exist there, and the multipart uploads
  the flusher had opened there. One transaction: after a crash either all of it happened or
  none. Unflushed rows and uploads in progress are never touched. The dropped copies' body
  files are unreferenced from then on: the start's background sweep removes them.

Both run before ``Journal.open()`` (which loads the figures from what is left), on their own
connection, while the caller holds the data dir's lock.
"""

from __future__ import annotations

import sqlite3
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from gateway.store.tables import ensure_schema

DEMO = "demo"  # the record of the embedded demo upstream (a URL always has "://")
JOURNAL_NAME = "journal.db"
_UNFLUSHED = "state IN ('pending', 'flushing', 'failed')"  # the (state, seq) index's runs


def normalise_endpoint(url: str) -> str:
    """One spelling per endpoint: scheme and host lower-case, default port and trailing
    slashes dropped (``HTTPS://S3.example.com:443/`` -> ``https://s3.example.com``)."""
    parts = urllib.parse.urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    port = parts.port
    if port is not None and (scheme, port) not in (("http", 80), ("https", 443)):
        host = f"{host}:{port}"
    return urllib.parse.urlunsplit((scheme, host, parts.path.rstrip("/"), parts.query, ""))


@dataclass(frozen=True, slots=True)
class Contents:
    """What a data dir's journal holds, as far as its upstream is concerned."""

    upstream: str | None  # the record: DEMO, an endpoint URL, or None (none kept)
    unflushed_objects: int  # versions and deletes not durable upstream (failed included)
    unflushed_bytes: int
    uploads: int  # multipart uploads in progress: acknowledged parts, no object yet
    upload_bytes: int
    has_cached: bool  # durable rows: copies of objects the upstream holds
    buckets: tuple[str, ...]  # of the unflushed rows and the uploads (if asked), sorted

    @property
    def has_unflushed(self) -> bool:
        """Anything acknowledged that the upstream does not hold yet."""
        return bool(self.unflushed_objects or self.uploads)

    @property
    def is_empty(self) -> bool:
        return not (self.has_unflushed or self.has_cached)


NOTHING = Contents(None, 0, 0, 0, 0, False, ())


def inspect(data_dir: Path, *, with_buckets: bool = False) -> Contents:
    """Read the journal of ``data_dir`` without changing it (read-only; NOTHING when there
    is no journal yet); ``with_buckets``: list the buckets of what is unflushed too (a scan
    of the backlog). Raises ``sqlite3.DatabaseError`` for a file that is not one."""
    path = data_dir / JOURNAL_NAME
    if not path.exists():
        return NOTHING
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        return _contents(conn, with_buckets)
    finally:
        conn.close()


def _contents(conn: sqlite3.Connection, with_buckets: bool) -> Contents:
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "objects" not in tables:
        return NOTHING
    upstream = None
    if "upstream" in tables:
        row = conn.execute("SELECT endpoint FROM upstream WHERE id = 1").fetchone()
        upstream = None if row is None else str(row[0])
    objects, size = conn.execute(
        f"SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM objects WHERE {_UNFLUSHED}"
    ).fetchone()
    cached = conn.execute("SELECT 1 FROM objects WHERE state = 'durable' LIMIT 1").fetchone()
    buckets: set[str] = set()
    if with_buckets:
        unflushed_buckets = f"SELECT DISTINCT bucket FROM objects WHERE {_UNFLUSHED}"
        buckets.update(r[0] for r in conn.execute(unflushed_buckets))
    uploads, upload_bytes = 0, 0
    if "uploads" in tables:
        uploads = conn.execute("SELECT COUNT(*) FROM uploads").fetchone()[0]
        upload_bytes = conn.execute("SELECT COALESCE(SUM(size_bytes), 0) FROM parts").fetchone()[0]
        if with_buckets:
            buckets.update(r[0] for r in conn.execute("SELECT DISTINCT bucket FROM uploads"))
    return Contents(
        upstream=upstream,
        unflushed_objects=int(objects),
        unflushed_bytes=int(size),
        uploads=int(uploads),
        upload_bytes=int(upload_bytes),
        has_cached=cached is not None,
        buckets=tuple(sorted(str(b) for b in buckets)),
    )


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What ``record(..., renew=True)`` forgot of the previous upstream."""

    cached_objects: int
    cached_bytes: int
    buckets: int
    upstream_uploads: int  # multipart uploads the flusher had opened there (crash leftovers)


def record(data_dir: Path, upstream: str, *, renew: bool, fsync: bool = True) -> Forgotten:
    """Make ``upstream`` the data dir's record (creating the journal if there is none);
    with ``renew``, first forget the previous upstream's cached copies, known buckets and
    upstream uploads, in the same transaction. Unflushed rows and uploads in progress are
    kept. Returns what was forgotten."""
    conn = sqlite3.connect(data_dir / JOURNAL_NAME, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {'FULL' if fsync else 'OFF'}")
        conn.execute("PRAGMA busy_timeout = 10000")
        ensure_schema(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            forgotten = _forget(conn) if renew else Forgotten(0, 0, 0, 0)
            conn.execute(
                "INSERT OR REPLACE INTO upstream (id, endpoint, recorded_s) VALUES (1, ?, ?)",
                (upstream, time.time()),
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return forgotten
    finally:
        conn.close()


def _forget(conn: sqlite3.Connection) -> Forgotten:
    """Inside the transaction: drop what belongs to the previous upstream alone."""
    objects, size = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM objects WHERE state = 'durable'"
    ).fetchone()
    conn.execute("DELETE FROM objects WHERE state = 'durable'")
    buckets = conn.execute("DELETE FROM buckets").rowcount
    uploads = conn.execute("DELETE FROM upstream_uploads").rowcount
    return Forgotten(int(objects), int(size), max(0, buckets), max(0, uploads))
