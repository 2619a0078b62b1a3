"""Scrub: re-hash every local body against what the journal recorded for it.

``gateway verify --data-dir DIR`` runs this offline on a data directory (it also works next
to a running gateway: it only reads, through a read-only SQLite connection in WAL mode, and
a body that vanished because its row was superseded meanwhile is not reported). Each body
file (an object's single body, each part of a multipart object, each part of an upload
still open) is checked against the CRC32C stored at ingest (``integrity.py``: it proves the
file holds the bytes the client's digests were verified against). A body written before
the CRC32C was stored is checked the old way: its MD5 against the ETag (or the part's
MD5), and each stored ``x-amz-checksum-*`` value against the same bytes.

A mismatch or a missing file is a ``Problem``; the command exits non-zero when there is any.
It never modifies the data directory: repairing is the running gateway's job (a corrupt
flushed copy is dropped on the next GET; a corrupt unflushed one is marked failed).
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gateway.checksums import b64, new_hasher
from gateway.store.blobs import BlobStore
from gateway.store.integrity import BodyCheck, BodyDigest

_PIECE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Problem:
    """One body that does not match the journal."""

    where: str  # "bucket/key" (object) or "upload <id> part <n>"
    state: str  # the row's flush state, or "uploading"
    blob_id: str
    detail: str


@dataclass(slots=True)
class Report:
    checked_files: int = 0
    checked_bytes: int = 0
    problems: list[Problem] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Expect:
    where: str
    state: str
    blob_id: str
    digest: BodyDigest
    checksums: dict[str, str]  # algorithm -> base64; checked only without a CRC32C
    recheck: tuple[str, tuple[object, ...]]  # SQL proving the row still references the blob
    # SQL reading the body from the row, for a body stored inline (``blob_id`` is "inline")
    inline: tuple[str, tuple[object, ...]] | None = None


def verify_data_dir(data_dir: Path) -> Report:
    """Hash every body the journal at ``data_dir`` references. Blocking; read-only."""
    db = data_dir / "journal.db"
    if not db.exists():
        raise FileNotFoundError(f"no journal at {db}")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        report = Report()
        blobs = BlobStore(data_dir)  # only for its file layout: nothing is opened or written
        for expect in list(_expectations(conn)):
            _check(blobs, conn, expect, report)
        return report
    finally:
        conn.close()


def _expectations(conn: sqlite3.Connection) -> Iterator[_Expect]:
    rows = conn.execute(
        "SELECT bucket, key, seq, state, blob_id, parts, size_bytes, etag, checksums, crc32c, "
        "body IS NOT NULL FROM objects WHERE is_delete = 0"
    )
    for bucket, key, seq, state, blob_id, parts, size, etag, checksums, crc, inline in rows:
        recheck: tuple[str, tuple[object, ...]] = (
            "SELECT 1 FROM objects WHERE bucket = ? AND key = ? AND seq = ?",
            (bucket, key, seq),
        )
        where = f"{bucket}/{key}"
        if parts:
            for number, part in enumerate(json.loads(parts), 1):
                part_blob, part_size, part_md5 = part[:3]
                part_crc = part[4] if len(part) > 4 else None
                yield _Expect(
                    f"{where} part {number}",
                    state,
                    part_blob,
                    BodyDigest(part_size, part_crc, _md5(part_md5)),
                    {},
                    recheck,
                )
        elif blob_id or inline:
            digest = BodyDigest(size, crc, _md5(etag))
            body_sql = (
                ("SELECT body FROM objects WHERE bucket = ? AND key = ? AND seq = ?", recheck[1])
                if inline
                else None
            )
            yield _Expect(
                where,
                state,
                blob_id or "inline",
                digest,
                json.loads(checksums),
                recheck,
                body_sql,
            )
    for upload_id, number, blob_id, size, etag, checksums, crc in conn.execute(
        "SELECT upload_id, part_number, blob_id, size_bytes, etag, checksums, crc32c FROM parts"
    ):
        recheck = ("SELECT 1 FROM parts WHERE upload_id = ? AND blob_id = ?", (upload_id, blob_id))
        yield _Expect(
            f"upload {upload_id} part {number}",
            "uploading",
            blob_id,
            BodyDigest(size, crc, _md5(etag)),
            json.loads(checksums),
            recheck,
        )


def _md5(etag: str) -> str | None:
    value = etag.strip('"').lower()
    return value if len(value) == 32 and "-" not in value else None


def _check(blobs: BlobStore, conn: sqlite3.Connection, expect: _Expect, report: Report) -> None:
    # With a stored CRC32C one fast pass proves the bytes; without, MD5 and the checksums.
    check = BodyCheck(expect.digest)
    others = {} if expect.digest.crc32c is not None else expect.checksums
    hashers = {name: new_hasher(name) for name in others}
    size = 0
    try:
        for piece in _pieces(blobs, conn, expect):
            size += len(piece)
            check.update(piece)
            for hasher in hashers.values():
                hasher.update(piece)
    except FileNotFoundError:
        if conn.execute(*expect.recheck).fetchone() is not None:
            report.problems.append(_problem(expect, "body file is missing"))
        return
    report.checked_files += 1
    report.checked_bytes += size
    details = [problem] if (problem := check.problem()) is not None else []
    for name, value in sorted(others.items()):
        got = b64(hashers[name].digest())
        if got != value:
            details.append(f"{name.upper()} {got}, recorded {value}")
    if details and conn.execute(*expect.recheck).fetchone() is not None:
        report.problems.append(_problem(expect, "; ".join(details)))


def _pieces(blobs: BlobStore, conn: sqlite3.Connection, expect: _Expect) -> Iterator[bytes]:
    """The body's bytes: from its row (inline; a row gone meanwhile reads as missing) or
    from its file."""
    if expect.inline is not None:
        row = conn.execute(*expect.inline).fetchone()
        if row is None or row[0] is None:
            raise FileNotFoundError("inline body is gone")
        yield bytes(row[0])
        return
    with blobs.path(expect.blob_id).open("rb") as body:
        while piece := body.read(_PIECE_BYTES):
            yield piece


def _problem(expect: _Expect, detail: str) -> Problem:
    return Problem(expect.where, expect.state, expect.blob_id, detail)


def format_report(report: Report) -> str:
    """Human-readable lines: one per problem, then a summary."""
    lines = [f"CORRUPT {p.where} [{p.state}] blob {p.blob_id}: {p.detail}" for p in report.problems]
    lines.append(
        f"checked {report.checked_files} body files ({report.checked_bytes} bytes): "
        f"{len(report.problems)} problem(s)"
    )
    return "\n".join(lines)


def run_cli(data_dir: str) -> int:
    """``gateway verify``: 0 when every body matches, 1 on any problem, 2 if unreadable."""
    try:
        report = verify_data_dir(Path(data_dir))
    except (OSError, sqlite3.Error) as exc:
        sys.stderr.write(f"gateway verify: {exc}\n")
        return 2
    sys.stdout.write(format_report(report) + "\n")
    return 1 if report.problems else 0
