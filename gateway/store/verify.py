"""Scrub: re-hash every local body against what the journal recorded for it.

``gateway verify --data-dir DIR`` runs this offline on a data directory (it also works next
to a running gateway: it only reads, through a read-only SQLite connection in WAL mode, and
a body that vanished because its row was superseded meanwhile is not reported). Checked:

- an object version with one body file: its MD5 against the ETag, and each stored
  ``x-amz-checksum-*`` value against the same bytes;
- a multipart object: each part file's MD5 against the part's recorded MD5;
- a part of a multipart upload still open: its MD5 and stored checksums.

A mismatch or a missing file is a ``Problem``; the command exits non-zero when there is any.
It never modifies the data directory: repairing is the running gateway's job (a corrupt
flushed copy is dropped on the next GET; a corrupt unflushed one is marked failed).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gateway.checksums import b64, new_hasher
from gateway.store.blobs import BlobStore

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
    size_bytes: int
    md5_hex: str | None  # None: not recorded (e.g. an ETag that is not an MD5)
    checksums: dict[str, str]  # algorithm -> base64
    recheck: tuple[str, tuple[object, ...]]  # SQL proving the row still references the blob


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
        "SELECT bucket, key, seq, state, blob_id, parts, size_bytes, etag, checksums "
        "FROM objects WHERE is_delete = 0"
    )
    for bucket, key, seq, state, blob_id, parts, size, etag, checksums in rows:
        recheck: tuple[str, tuple[object, ...]] = (
            "SELECT 1 FROM objects WHERE bucket = ? AND key = ? AND seq = ?",
            (bucket, key, seq),
        )
        where = f"{bucket}/{key}"
        if parts:
            for number, (part_blob, part_size, part_md5, _) in enumerate(json.loads(parts), 1):
                yield _Expect(
                    f"{where} part {number}",
                    state,
                    part_blob,
                    part_size,
                    _md5(part_md5),
                    {},
                    recheck,
                )
        elif blob_id:
            yield _Expect(where, state, blob_id, size, _md5(etag), json.loads(checksums), recheck)
    for upload_id, number, blob_id, size, etag, checksums in conn.execute(
        "SELECT upload_id, part_number, blob_id, size_bytes, etag, checksums FROM parts"
    ):
        recheck = ("SELECT 1 FROM parts WHERE upload_id = ? AND blob_id = ?", (upload_id, blob_id))
        yield _Expect(
            f"upload {upload_id} part {number}",
            "uploading",
            blob_id,
            size,
            _md5(etag),
            json.loads(checksums),
            recheck,
        )


def _md5(etag: str) -> str | None:
    value = etag.strip('"').lower()
    return value if len(value) == 32 and "-" not in value else None


def _check(blobs: BlobStore, conn: sqlite3.Connection, expect: _Expect, report: Report) -> None:
    algorithms = {"md5", *expect.checksums}
    hashers = {name: new_hasher(name) for name in algorithms}
    size = 0
    try:
        with blobs.path(expect.blob_id).open("rb") as body:
            while piece := body.read(_PIECE_BYTES):
                size += len(piece)
                for hasher in hashers.values():
                    hasher.update(piece)
    except FileNotFoundError:
        if conn.execute(*expect.recheck).fetchone() is not None:
            report.problems.append(_problem(expect, "body file is missing"))
        return
    report.checked_files += 1
    report.checked_bytes += size
    details = []
    if size != expect.size_bytes:
        details.append(f"size {size}, recorded {expect.size_bytes}")
    md5 = hashers["md5"].digest().hex()
    if expect.md5_hex is not None and md5 != expect.md5_hex:
        details.append(f"MD5 {md5}, recorded {expect.md5_hex}")
    for name, value in sorted(expect.checksums.items()):
        got = b64(hashers[name].digest())
        if got != value:
            details.append(f"{name.upper()} {got}, recorded {value}")
    if details and conn.execute(*expect.recheck).fetchone() is not None:
        report.problems.append(_problem(expect, "; ".join(details)))


def _problem(expect: _Expect, detail: str) -> Problem:
    return Problem(expect.where, expect.state, expect.blob_id, detail)


def md5_of_file(body: BinaryIO) -> str:
    """MD5 hex of a whole open file, read from its start with ``pread`` (the file position
    is not used). Blocking."""
    md5 = hashlib.md5()
    offset = 0
    while piece := os.pread(body.fileno(), _PIECE_BYTES, offset):
        md5.update(piece)
        offset += len(piece)
    return md5.hexdigest()


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
