"""Replicas this node holds for other gateways of its fleet (docs/fleet.md, "Node loss"),
in the journal: ``replica_bodies`` (staged or committed bodies) and ``replicas`` (committed
versions). Every call is one short transaction; bodies are blob files of the node's own
store, counted as pinned bytes (``PartsChange(is_replica=True)``) like unflushed data.

Durability order, as for the node's own writes: a body's blob is written and fsynced
before ``stage`` commits its row; a version is committed (``commit``) only when every body
it names is staged here; blob files of dropped replicas are unlinked by the caller only
after the call returns.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.models import ObjectMeta, meta_from_json, meta_to_json
from gateway.store.journal import Journal
from gateway.store.rows import PartsChange, prefix_bytes


@dataclass(frozen=True, slots=True)
class Replica:
    """One committed version held for its writer ``owner`` (data dir ``datadir_id``)."""

    owner: str
    datadir_id: str
    seq: int
    meta: ObjectMeta
    is_delete: bool
    blob_ids: tuple[str, ...]  # in part order; one for a single body; none for a delete
    parts: tuple[tuple[int, str], ...]  # (size, etag) of each part of a multipart object
    acked_s: float
    is_uploaded: bool = False
    body: bytes | None = None  # a small single body kept in the journal (no file)

    @property
    def version(self) -> tuple[str, str, int]:
        return (self.owner, self.datadir_id, self.seq)


_COLUMNS = (
    "r.owner, r.datadir_id, r.seq, r.meta, r.is_delete, r.stage_ids, r.parts, r.acked_s, r.uploaded"
)


def newest_of_each_key(held: Sequence[Replica]) -> tuple[list[Replica], list[Replica]]:
    """The newest version of each key of each writer among ``held``, and the older ones
    (kept beside an early commit's version, which may never have been acknowledged)."""
    newest: dict[tuple[str, str, str, str], Replica] = {}
    for replica in held:
        key = (replica.owner, replica.datadir_id, replica.meta.bucket, replica.meta.key)
        if key not in newest or newest[key].seq < replica.seq:
            newest[key] = replica
    chosen = {id(r) for r in newest.values()}
    return [r for r in held if id(r) in chosen], [r for r in held if id(r) not in chosen]


def _replica(conn: sqlite3.Connection, row: tuple[Any, ...]) -> Replica:
    owner, datadir, seq, meta, is_delete, stage_ids, parts, acked_s, uploaded = row
    ids = json.loads(stage_ids)
    blobs = []
    inline: bytes | None = None
    for stage_id in ids:
        found = conn.execute(
            "SELECT blob_id, body FROM replica_bodies WHERE stage_id = ?", (stage_id,)
        ).fetchone()
        if found is not None and found[0] is not None:
            blobs.append(str(found[0]))
        elif found is not None and found[1] is not None:
            inline = bytes(found[1])
    return Replica(
        str(owner),
        str(datadir),
        int(seq),
        meta_from_json(json.loads(meta)),
        bool(is_delete),
        tuple(blobs),
        tuple((int(a), str(b)) for a, b in json.loads(parts or "[]")),
        float(acked_s),
        bool(uploaded),
        inline,
    )


class ReplicaStore:
    """The replicas table (see the module docstring)."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    async def stage(
        self,
        stage_id: str,
        owner: str,
        bucket: str,
        key: str,
        blob_id: str | None,
        size_bytes: int,
        md5: str,
        crc32c: int | None,
        now_s: float,
        upload: tuple[str, int] | None = None,
        body: bytes | None = None,
    ) -> list[str]:
        """Record a durable body: its blob file, or (small) ``body`` itself, durable with
        this commit (``upload``: its multipart upload id and part number). Returns the blob
        of a body staged before under the same id (a retry), to unlink."""

        def op(conn: sqlite3.Connection) -> list[str]:
            stale = self._drop_staged(conn, [stage_id])
            conn.execute(
                "INSERT INTO replica_bodies (stage_id, owner, bucket, key, upload_id, "
                "part_number, blob_id, size_bytes, md5, crc32c, created_s, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    stage_id,
                    owner,
                    bucket,
                    key,
                    upload[0] if upload else None,
                    upload[1] if upload else None,
                    blob_id,
                    size_bytes,
                    md5,
                    crc32c,
                    now_s,
                    body,
                ),
            )
            self._journal.record(PartsChange(size_bytes, is_replica=True))
            return stale

        return await self._journal.run_write(op)

    async def commit(
        self,
        owner: str,
        datadir_id: str,
        seq: int,
        meta: ObjectMeta,
        is_delete: bool,
        stage_ids: Sequence[str],
        parts: Sequence[tuple[int, str]],
        acked_s: float,
        expected_md5: Sequence[str | None] = (),
        inline: tuple[bytes, float] | None = None,
        *,
        is_early: bool = False,
        expected_crc32c: Sequence[int | None] = (),
    ) -> tuple[list[str], list[str]]:
        """Commit a version whose bodies are staged here (each hashing to its
        ``expected_md5``, when given; a body staged by its CRC32C alone, with no MD5, to
        its ``expected_crc32c``, which must be given). Returns the stage ids that are
        missing or differ (then nothing is committed), and the blobs of the older versions
        of the same key from the same writer it supersedes (dropped; unlink them after). A
        version older than one already held (their commits crossed) is not kept: its
        bodies' blobs.
        ``inline``: (body, now) of a small single body staged by this same commit.

        A version held already (the same writer, data dir and seq) is committed: nothing
        is missing, and bodies staged for this commit are dropped.

        ``is_early``: the writer sent this commit beside its own, which may yet fail: it
        supersedes nothing, and a newer early version does not supersede this one (the
        older versions go when the writer says they are not needed, or at a takeover,
        which uploads the newest of each key: ``newest_of_each_key``)."""
        wanted = dict(zip(stage_ids, [*expected_md5, *([None] * len(stage_ids))], strict=False))
        crcs = dict(zip(stage_ids, expected_crc32c, strict=False))

        def is_held(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(
                    "SELECT 1 FROM replicas WHERE owner = ? AND datadir_id = ? AND seq = ?",
                    (owner, datadir_id, seq),
                ).fetchone()
                is not None
            )

        def uncommitted(conn: sqlite3.Connection, stage_id: str) -> bool:
            row = conn.execute(
                "SELECT 1 FROM replica_bodies WHERE stage_id = ? AND owner = ? AND committed = 0",
                (stage_id, owner),
            ).fetchone()
            return row is not None

        def staged(conn: sqlite3.Connection, stage_id: str) -> bool:
            row = conn.execute(
                "SELECT md5, crc32c FROM replica_bodies WHERE stage_id = ? AND owner = ?",
                (stage_id, owner),
            ).fetchone()
            if row is None:
                return False
            if not row[0]:  # staged by its CRC32C: the commit must name the same one
                crc = crcs.get(stage_id)
                return crc is not None and row[1] is not None and int(row[1]) == crc
            md5 = wanted.get(stage_id)
            return md5 is None or str(row[0]) == md5

        def op(conn: sqlite3.Connection) -> tuple[list[str], list[str]]:
            if is_held(conn):  # sent again (re-replication): its bodies need not come
                return [], self._drop_staged(conn, [s for s in stage_ids if uncommitted(conn, s)])
            if inline is not None:
                body, now_s = inline
                md5 = hashlib.md5(body).hexdigest()
                if wanted.get(stage_ids[0]) not in (None, md5):
                    return list(stage_ids), []  # damaged on the way: not staged
                stale = self._drop_staged(conn, stage_ids[:1])
                conn.execute(
                    "INSERT INTO replica_bodies (stage_id, owner, bucket, key, size_bytes, "
                    "md5, created_s, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (stage_ids[0], owner, meta.bucket, meta.key, len(body), md5, now_s, body),
                )
                self._journal.record(PartsChange(len(body), is_replica=True))
                assert not stale  # an inline body never had a file
            missing = [s for s in stage_ids if not staged(conn, s)]
            if missing:
                return missing, []
            held = conn.execute(
                "SELECT seq, is_early FROM replicas WHERE owner = ? AND datadir_id = ? "
                "AND bucket = ? AND key = ? AND seq != ?",
                (owner, datadir_id, meta.bucket, meta.key, seq),
            ).fetchall()
            if any(s > seq and not early for s, early in held):
                return [], self._drop_staged(conn, stage_ids)  # a newer one committed first
            older = [] if is_early else [int(s) for s, _ in held if s < seq]
            superseded = self._drop(conn, owner, datadir_id, older)
            conn.execute(
                "INSERT OR IGNORE INTO replicas (owner, datadir_id, seq, bucket, key, is_delete, "
                "meta, stage_ids, parts, size_bytes, acked_s, is_early) VALUES (?, ?, ?, ?, ?, "
                "?, ?, ?, ?, ?, ?, ?)",
                (
                    owner,
                    datadir_id,
                    seq,
                    meta.bucket,
                    meta.key,
                    int(is_delete),
                    json.dumps(meta_to_json(meta)),
                    json.dumps(list(stage_ids)),
                    json.dumps([list(p) for p in parts]) if parts else None,
                    0 if is_delete else meta.size_bytes,
                    acked_s,
                    int(is_early),
                ),
            )
            for stage_id in stage_ids:
                conn.execute(
                    "UPDATE replica_bodies SET committed = 1 WHERE stage_id = ?", (stage_id,)
                )
            return [], superseded

        return await self._journal.run_write(op)

    def _drop_staged(self, conn: sqlite3.Connection, stage_ids: Sequence[str]) -> list[str]:
        """Inside an op: drop staged bodies; their blob ids."""
        blobs: list[str] = []
        for stage_id in stage_ids:
            body = conn.execute(
                "SELECT blob_id, size_bytes FROM replica_bodies WHERE stage_id = ?", (stage_id,)
            ).fetchone()
            if body is not None:
                if body[0] is not None:
                    blobs.append(str(body[0]))
                conn.execute("DELETE FROM replica_bodies WHERE stage_id = ?", (stage_id,))
                self._journal.record(PartsChange(-int(body[1]), is_replica=True))
        return blobs

    def _drop(
        self, conn: sqlite3.Connection, owner: str, datadir_id: str, seqs: Sequence[int]
    ) -> list[str]:
        """Inside an op: drop these versions and their bodies; their blob ids."""
        blobs: list[str] = []
        for seq in seqs:
            row = conn.execute(
                "SELECT stage_ids FROM replicas WHERE owner = ? AND datadir_id = ? AND seq = ?",
                (owner, datadir_id, seq),
            ).fetchone()
            if row is None:
                continue
            blobs += self._drop_staged(conn, json.loads(row[0]))
            conn.execute(
                "DELETE FROM replicas WHERE owner = ? AND datadir_id = ? AND seq = ?",
                (owner, datadir_id, seq),
            )
        return blobs

    async def drop(self, owner: str, datadir_id: str, seqs: Sequence[int]) -> list[str]:
        """Drop versions (durable upstream or superseded on their writer); blobs to unlink."""
        return await self._journal.run_write(lambda c: self._drop(c, owner, datadir_id, seqs))

    async def drop_stale_staged(self, before_s: float) -> list[str]:
        """Bodies staged before ``before_s`` and never committed (their write was not
        acknowledged); blobs to unlink."""

        def op(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT stage_id, blob_id, size_bytes FROM replica_bodies "
                "WHERE committed = 0 AND created_s < ?",
                (before_s,),
            ).fetchall()
            for stage_id, _, size in rows:
                conn.execute("DELETE FROM replica_bodies WHERE stage_id = ?", (stage_id,))
                self._journal.record(PartsChange(-int(size), is_replica=True))
            return [str(r[1]) for r in rows if r[1] is not None]

        return await self._journal.run_write(op)

    async def mark_uploaded(self, owner: str, datadir_id: str, seq: int) -> None:
        await self._journal.run_write(
            lambda c: c.execute(
                "UPDATE replicas SET uploaded = 1 WHERE owner = ? AND datadir_id = ? AND seq = ?",
                (owner, datadir_id, seq),
            )
        )

    async def of_owner(
        self, owner: str, datadir_id: str | None = None, seqs: Sequence[int] | None = None
    ) -> list[Replica]:
        """The versions held for ``owner`` (of one data dir, or all; only ``seqs``, if
        given), oldest first."""

        def op(conn: sqlite3.Connection) -> list[Replica]:
            sql = f"SELECT {_COLUMNS} FROM replicas r WHERE r.owner = ?"
            args: list[Any] = [owner]
            if datadir_id is not None:
                sql += " AND r.datadir_id = ?"
                args.append(datadir_id)
            if seqs is not None:
                sql += f" AND r.seq IN ({','.join('?' * len(seqs))})"
                args.extend(seqs)
            rows = conn.execute(sql + " ORDER BY r.seq", args).fetchall()
            return [_replica(conn, r) for r in rows]

        return await self._journal.run_read(op)

    async def seqs_of_owner(self, owner: str, datadir_id: str) -> list[int]:
        """The sequence numbers of the versions held for ``owner``'s data dir (what
        ``of_owner`` reads, without parsing each: a holder asks a live writer about them
        all every half minute)."""
        return await self._journal.run_read(
            lambda conn: [
                int(seq)
                for (seq,) in conn.execute(
                    "SELECT seq FROM replicas WHERE owner = ? AND datadir_id = ? ORDER BY seq",
                    (owner, datadir_id),
                )
            ]
        )

    async def for_key(self, bucket: str, key: str) -> list[Replica]:
        """Every version of ``key`` held here, newest acknowledgement first."""

        def op(conn: sqlite3.Connection) -> list[Replica]:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM replicas r WHERE r.bucket = ? AND r.key = ? "
                "ORDER BY r.acked_s DESC",
                (bucket, key),
            ).fetchall()
            return [_replica(conn, r) for r in rows]

        return await self._journal.run_read(op)

    async def pending_under(
        self, owner: str, datadir_id: str | None, bucket: str | None, prefix: str
    ) -> tuple[int, int]:
        """Versions held for ``owner`` under bucket/prefix not uploaded yet (a fence)."""

        def op(conn: sqlite3.Connection) -> tuple[int, int]:
            sql = (
                "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM replicas WHERE owner = ? "
                "AND uploaded = 0 AND substr(CAST(key AS BLOB), 1, ?) = ?"
            )
            args: list[Any] = [owner, *prefix_bytes(prefix)]
            if datadir_id is not None:
                sql += " AND datadir_id = ?"
                args.append(datadir_id)
            if bucket is not None:
                sql += " AND bucket = ?"
                args.append(bucket)
            count, size = conn.execute(sql, args).fetchone()
            return int(count), int(size)

        return await self._journal.run_read(op)

    async def owners(self) -> list[tuple[str, str, int, int, float]]:
        """(owner, data dir, versions, bytes, newest acknowledgement) of every writer
        replicas are held for."""

        def op(conn: sqlite3.Connection) -> list[tuple[str, str, int, int, float]]:
            rows = conn.execute(
                "SELECT owner, datadir_id, COUNT(*), COALESCE(SUM(size_bytes), 0), "
                "MAX(acked_s) FROM replicas GROUP BY owner, datadir_id ORDER BY owner"
            ).fetchall()
            return [(str(o), str(d), int(n), int(b), float(t)) for o, d, n, b, t in rows]

        return await self._journal.run_read(op)
