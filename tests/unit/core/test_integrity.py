"""Verify-once reads: a body file is hashed once and trusted until its inode, size, mtime or
ctime changes; concurrent readers share one hash; a mismatch is reported once and keeps
the held-back last piece of a read from ever leaving."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import zlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from gateway.core.bodies import FileSpan, LocalSource, Slice, slices
from gateway.core.integrity import BlobCheck, BlobVerifier, CorruptBody, blob_checks
from gateway.models import FlushState, LocalObject, ObjectMeta, PartRef

MiB = 1 << 20


@pytest.fixture
async def verifier() -> AsyncIterator[BlobVerifier]:
    v = BlobVerifier()
    yield v
    await v.close()


def _file(tmp_path: Path, data: bytes, name: str = "blob") -> tuple[int, BlobCheck]:
    path = tmp_path / name
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY), BlobCheck(name, "md5", hashlib.md5(data).digest())


def _rewrite(tmp_path: Path, name: str, data: bytes) -> None:
    """Change the file in place (same inode): mtime and ctime move."""
    path = tmp_path / name
    st = path.stat()
    with path.open("r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


async def test_verifier_hashes_once_until_the_file_changes(
    tmp_path: Path, verifier: BlobVerifier
) -> None:
    data = os.urandom(3 * MiB + 1)
    fd, check = _file(tmp_path, data)
    try:
        assert not verifier.is_known_good(fd, check)
        await verifier.verify([(fd, check)])
        await verifier.verify([(fd, check)])
        assert verifier.hashed_bytes == len(data)
        assert verifier.is_known_good(fd, check)

        _rewrite(tmp_path, "blob", bytes([data[0] ^ 0xFF]))  # always a different byte
        assert not verifier.is_known_good(fd, check)
        reports: list[str] = []

        async def report(message: str) -> None:
            reports.append(message)

        with pytest.raises(CorruptBody):
            await verifier.verify([(fd, check)], report)
        assert verifier.hashed_bytes == 2 * len(data)
        assert len(reports) == 1 and "local corruption" in reports[0]
    finally:
        os.close(fd)


async def test_concurrent_readers_share_one_hash_and_one_report(
    tmp_path: Path, verifier: BlobVerifier
) -> None:
    data = os.urandom(2 * MiB)
    fd, check = _file(tmp_path, data)
    bad = BlobCheck(check.blob_id, "md5", hashlib.md5(b"other").digest())
    reports: list[str] = []

    async def report(message: str) -> None:
        reports.append(message)

    try:
        results = await asyncio.gather(
            *(verifier.verify([(fd, bad)], report) for _ in range(5)), return_exceptions=True
        )
        assert all(isinstance(r, CorruptBody) for r in results)
        assert verifier.hashed_bytes == len(data)
        assert len(reports) == 1
    finally:
        os.close(fd)


def _read(span: FileSpan) -> bytes:
    return os.pread(span.fd, span.count, span.offset)


async def test_local_source_hash_trails_the_send_and_holds_the_last_piece(
    tmp_path: Path, verifier: BlobVerifier
) -> None:
    data = os.urandom(20 * MiB)
    fd, check = _file(tmp_path, data)
    source = LocalSource([fd], [Slice(0, 0, len(data))], verifier.start([(fd, check)]))
    got = b""
    first = await source.next_piece()
    assert isinstance(first, FileSpan) and first.count == 8 * MiB
    got += _read(first)
    await asyncio.sleep(0.05)
    assert verifier.hashed_bytes == 0  # nothing sent yet: the hash waits for the send
    while (piece := await source.next_piece()) is not None:
        assert isinstance(piece, FileSpan)
        got += _read(piece)
    assert got == data and verifier.hashed_bytes == len(data)
    assert verifier.is_known_good(fd, check)
    await source.aclose()


async def test_local_source_never_completes_a_corrupt_body(
    tmp_path: Path, verifier: BlobVerifier
) -> None:
    data = os.urandom(MiB + 10)
    fd, check = _file(tmp_path, data)
    bad = BlobCheck(check.blob_id, "md5", hashlib.md5(b"not it").digest())
    source = LocalSource([fd], [Slice(0, 5, 100)], verifier.start([(fd, bad)]))
    with pytest.raises(CorruptBody):
        await source.next_piece()  # a small range is held back whole
    await source.aclose()
    with pytest.raises(OSError):
        os.fstat(fd)  # released


async def test_a_reader_leaving_lets_the_hash_finish_for_the_memo(
    tmp_path: Path, verifier: BlobVerifier
) -> None:
    data = os.urandom(12 * MiB)
    fd, check = _file(tmp_path, data)
    source = LocalSource([os.dup(fd)], [Slice(0, 0, len(data))], verifier.start([(fd, check)]))
    assert await source.next_piece() is not None
    await source.aclose()  # gone after one piece
    for _ in range(200):
        if verifier.is_known_good(fd, check):
            break
        await asyncio.sleep(0.01)
    assert verifier.is_known_good(fd, check)
    os.close(fd)


@pytest.mark.parametrize(
    ("sizes", "start", "length", "want"),
    [
        ([10], 0, 10, [Slice(0, 0, 10)]),
        ([10], 3, 4, [Slice(0, 3, 4)]),
        ([5, 5, 3], 4, 3, [Slice(0, 4, 1), Slice(1, 0, 2)]),
        ([5, 5, 3], 5, 8, [Slice(1, 0, 5), Slice(2, 0, 3)]),
        ([5, 0, 5], 0, 10, [Slice(0, 0, 5), Slice(2, 0, 5)]),
        ([0], 0, 0, []),
    ],
)
def test_slices_cover_exactly_the_range(
    sizes: list[int], start: int, length: int, want: list[Slice]
) -> None:
    assert slices(sizes, start, length) == want


def _row(etag: str, checksums: dict[str, str], parts: tuple[PartRef, ...] = ()) -> LocalObject:
    meta = ObjectMeta("b", "k", 10, etag, 1.0, checksums=checksums)
    return LocalObject(meta, 1, FlushState.PENDING, None if parts else "blob", parts=parts)


def test_blob_checks_pick_the_fastest_stored_digest() -> None:
    md5 = hashlib.md5(b"x").hexdigest()
    crc32, crc32c = base64.b64encode(b"\x01\x02\x03\x04").decode(), "AAAAAQ=="
    sha = base64.b64encode(bytes(32)).decode()
    assert blob_checks(_row(md5, {})) == [BlobCheck("blob", "md5", bytes.fromhex(md5))]
    assert blob_checks(_row(md5, {"sha256": sha, "crc32": crc32})) == [
        BlobCheck("blob", "crc32", b"\x01\x02\x03\x04")
    ]
    assert blob_checks(_row(md5, {"crc32": crc32, "crc32c": crc32c}))[0].algorithm == "crc32c"
    # A composite value is not the file's own digest; an unreadable one is skipped.
    assert blob_checks(_row(md5, {"crc32": crc32 + "-2", "crc32c": "!!"}))[0].algorithm == "md5"
    assert blob_checks(_row(md5 + "-2", {})) is None  # no whole-object digest at all


def test_blob_checks_of_parts_use_the_part_checksums_else_their_md5() -> None:
    p1, p2 = hashlib.md5(b"1").hexdigest(), hashlib.md5(b"2").hexdigest()
    parts = (PartRef("a", 5, p1, "AAAAAQ=="), PartRef("b", 5, p2, "AAAAAg=="))
    checks = blob_checks(_row("x" * 32 + "-2", {"crc32c": "AAAAAw==-2"}, parts))
    assert checks == [BlobCheck("a", "crc32c", b"\0\0\0\1"), BlobCheck("b", "crc32c", b"\0\0\0\2")]
    plain = blob_checks(_row("x" * 32 + "-2", {}, parts))
    assert plain == [
        BlobCheck("a", "md5", bytes.fromhex(p1)),
        BlobCheck("b", "md5", bytes.fromhex(p2)),
    ]


async def test_verifier_checks_a_crc(tmp_path: Path, verifier: BlobVerifier) -> None:
    data = os.urandom(MiB)
    path = tmp_path / "crc"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        good = BlobCheck("crc", "crc32", zlib.crc32(data).to_bytes(4, "big"))
        await verifier.verify([(fd, good)])
        bad = BlobCheck("crc2", "crc32", (zlib.crc32(data) ^ 1).to_bytes(4, "big"))
        with pytest.raises(CorruptBody, match="recorded crc32"):
            await verifier.verify([(fd, bad)])
    finally:
        os.close(fd)


class _Memo:
    """A MemoStore in memory (the journal's table is tested in tests/unit/store)."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, int, int, int, int]] = []

    async def load(self) -> list[tuple[str, int, int, int, int]]:
        return list(self.saved)

    async def save(self, keys: Sequence[tuple[str, int, int, int, int]]) -> None:
        self.saved.extend(keys)


async def test_memo_outlives_the_verifier_until_the_file_changes(tmp_path: Path) -> None:
    data = os.urandom(MiB + 3)
    fd, check = _file(tmp_path, data)
    memo = _Memo()
    try:
        first = BlobVerifier(store=memo)
        await first.verify([(fd, check)])
        await first.close()  # saves what it learnt
        assert len(memo.saved) == 1

        second = BlobVerifier(store=memo)
        await second.load()
        assert second.is_known_good(fd, check)  # a restarted gateway trusts it ...
        await second.verify([(fd, check)])
        assert second.hashed_bytes == 0
        _rewrite(tmp_path, "blob", bytes([data[0] ^ 0xFF]))
        assert not second.is_known_good(fd, check)  # ... until the file changes
        with pytest.raises(CorruptBody):
            await second.verify([(fd, check)])
        await second.close()
    finally:
        os.close(fd)
