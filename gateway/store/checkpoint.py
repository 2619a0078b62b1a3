"""Checkpointer: copies the journal's WAL into its database file in a background thread.

SQLite checkpoints, by default, in the connection that commits, once the WAL passes 1000
pages: the group writer would then copy megabytes and fsync the database file inside a
commit, and every write waiting for that group would wait too (a p99 spike every few dozen
64 KiB inline bodies: 10 ms on this machine). Here this thread runs a PASSIVE checkpoint
(it never blocks the writer or readers) shortly after commits, at most every
``interval_s``; an idle journal wakes it never. The writer keeps a much later automatic
checkpoint as a backstop (see ``engine.py``), which then has little left to copy. The WAL's
frames stay durable either way: a checkpoint only moves them, and a crash mid-checkpoint is
recovered by SQLite.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Checkpointer:
    """One thread with its own connection. ``note_commit`` is cheap (any thread)."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], interval_s: float = 0.05) -> None:
        self._connect = connect
        self._interval_s = interval_s
        self._committed = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="journal-checkpoint", daemon=True)
        self._thread.start()

    def note_commit(self) -> None:
        self._committed.set()

    def close(self) -> None:
        self._closing.set()
        self._committed.set()
        self._thread.join()

    def _run(self) -> None:
        conn = self._connect()
        try:
            while True:
                self._committed.wait()
                if self._closing.is_set():
                    return
                self._committed.clear()
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # the WAL keeps the data; try again later
                    log.warning("journal checkpoint failed: %s", exc)
                self._closing.wait(self._interval_s)  # at most one round per interval
        finally:
            conn.close()
