"""Local integrity checks: the stored CRC32C first, the MD5 for rows from before it, and
``gateway verify`` on both kinds of rows."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from awscrt import checksums as crt_checksums

from gateway.models import FlushState, LocalObject, ObjectMeta, PartRef
from gateway.store.blobs import BlobStore
from gateway.store.integrity import BodyCheck, BodyDigest, body_digests, check_bytes, check_fd
from gateway.store.journal import Journal
from gateway.store.verify import verify_data_dir

BODY = b"the acknowledged bytes" * 1000


def _digest(body: bytes, *, crc: bool = True, md5: bool = True) -> BodyDigest:
    return BodyDigest(
        len(body),
        crt_checksums.crc32c(body) if crc else None,
        hashlib.md5(body).hexdigest() if md5 else None,
    )


def test_check_prefers_the_stored_crc32c() -> None:
    assert check_bytes(BODY, _digest(BODY)) is None
    flipped = bytearray(BODY)
    flipped[1234] ^= 0x01
    problem = check_bytes(bytes(flipped), _digest(BODY))
    assert problem is not None and problem.startswith("CRC32C")
    # A wrong MD5 beside a right CRC32C is not looked at: the CRC is what proves the bytes.
    assert check_bytes(BODY, BodyDigest(len(BODY), crt_checksums.crc32c(BODY), "0" * 32)) is None


def test_check_falls_back_to_md5_for_older_rows() -> None:
    assert check_bytes(BODY, _digest(BODY, crc=False)) is None
    problem = check_bytes(BODY[:-1] + b"!", _digest(BODY, crc=False))
    assert problem is not None and problem.startswith("MD5")


def test_check_reports_a_short_or_long_body() -> None:
    assert check_bytes(BODY[:-1], _digest(BODY)) == f"size {len(BODY) - 1}, recorded {len(BODY)}"
    assert check_bytes(BODY + b"x", _digest(BODY, crc=False)) is not None


def test_check_without_any_digest_only_counts_bytes() -> None:
    digest = BodyDigest(len(BODY), None, None)
    assert not digest.is_checkable
    assert check_bytes(b"x" * len(BODY), digest) is None


def test_check_fd_reads_from_the_start_whatever_the_position(tmp_path: Path) -> None:
    path = tmp_path / "body"
    path.write_bytes(BODY)
    with path.open("rb") as f:
        f.seek(100)  # an upload may have read part of it: pread ignores the position
        assert check_fd(f.fileno(), _digest(BODY)) is None
    path.write_bytes(BODY[:500] + b"?" + BODY[501:])
    with path.open("rb") as f:
        assert check_fd(f.fileno(), _digest(BODY)) is not None


def test_incremental_check_matches_one_pass() -> None:
    check = BodyCheck(_digest(BODY))
    for i in range(0, len(BODY), 777):
        check.update(memoryview(BODY)[i : i + 777])
    assert check.problem() is None


def test_body_digests_of_rows() -> None:
    meta = ObjectMeta("b", "k", len(BODY), hashlib.md5(BODY).hexdigest(), 1.0)
    single = LocalObject(meta, 1, FlushState.PENDING, "blob", crc32c=7)
    assert body_digests(single) == [BodyDigest(len(BODY), 7, meta.etag)]
    parts = (PartRef("p1", 5, "a" * 32, None, 11), PartRef("p2", 6, "b" * 32))
    multi = LocalObject(
        ObjectMeta("b", "k", 11, "c" * 32 + "-2", 1.0), 2, FlushState.PENDING, None, parts=parts
    )
    assert body_digests(multi) == [BodyDigest(5, 11, "a" * 32), BodyDigest(6, None, "b" * 32)]
    tomb = LocalObject(ObjectMeta("b", "k", 0, "", 1.0), 3, FlushState.PENDING, None, True)
    assert body_digests(tomb) == []
    inline = LocalObject(meta, 4, FlushState.PENDING, None, crc32c=7, body=BODY)
    assert body_digests(inline) == [BodyDigest(len(BODY), 7, meta.etag)]


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[Journal, BlobStore]]:
    blobs = BlobStore(tmp_path, fsync=False)
    blobs.open_store()
    journal = Journal(tmp_path / "journal.db", fsync=False)
    journal.open()
    yield journal, blobs
    journal.close()
    blobs.close()


async def test_verify_uses_the_crc_and_still_checks_rows_from_before_it(
    stores: tuple[Journal, BlobStore], tmp_path: Path
) -> None:
    journal, blobs = stores
    ids = {}
    for key in ("new", "old"):
        blob = await blobs.write(_one(BODY), {"md5"})
        meta = ObjectMeta("b", key, len(BODY), blob.digests["md5"].hex(), 1.0)
        await journal.commit_put(meta, blob.blob_id, 1.0, crc32c=blob.crc32c)
        ids[key] = blob.blob_id
    # "old" as a row written before the CRC32C was stored.
    await journal.run_write(
        lambda c: c.execute("UPDATE objects SET crc32c = NULL WHERE key = 'old'")
    )
    assert verify_data_dir(tmp_path).problems == []
    for blob_id in ids.values():
        path = blobs.path(blob_id)
        raw = bytearray(path.read_bytes())
        raw[4321] ^= 0x40
        path.write_bytes(bytes(raw))
    problems = {p.where: p.detail for p in verify_data_dir(tmp_path).problems}
    assert problems["b/new"].startswith("CRC32C")
    assert problems["b/old"].startswith("MD5")


def test_crc_column_added_to_an_old_journal(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    journal = Journal(db, fsync=False)
    journal.open()
    journal.close()
    conn = sqlite3.connect(db)
    for table, column in (("objects", "crc32c"), ("objects", "body"), ("parts", "crc32c")):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    conn.commit()
    conn.close()
    reopened = Journal(db, fsync=False)
    reopened.open()  # migrated again
    reopened.close()
    conn = sqlite3.connect(db)
    try:
        have = {r[1] for r in conn.execute("PRAGMA table_info(objects)")}
        assert {"crc32c", "body"} <= have
        assert "crc32c" in {r[1] for r in conn.execute("PRAGMA table_info(parts)")}
    finally:
        conn.close()
    assert os.path.exists(db)
