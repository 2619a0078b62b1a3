"""Verify-once reads: a body file is hashed once and trusted until its inode, size, mtime or
ctime changes; concurrent readers share one hash; a mismatch is reported once and keeps
the held-back last piece of a read from ever leaving."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.core.bodies import FileSpan, LocalSource, Slice, slices
from gateway.core.integrity import BlobCheck, BlobVerifier, CorruptBody

MiB = 1 << 20


@pytest.fixture
async def verifier() -> AsyncIterator[BlobVerifier]:
    v = BlobVerifier()
    yield v
    await v.close()


def _file(tmp_path: Path, data: bytes, name: str = "blob") -> tuple[int, BlobCheck]:
    path = tmp_path / name
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY), BlobCheck(name, hashlib.md5(data).hexdigest())


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

        _rewrite(tmp_path, "blob", b"\x00")
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
    bad = BlobCheck(check.blob_id, hashlib.md5(b"other").hexdigest())
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


async def test_local_source_holds_back_the_last_piece_until_verified(
    tmp_path: Path, verifier: BlobVerifier
) -> None:
    data = os.urandom(3 * MiB)
    fd, check = _file(tmp_path, data)
    gate = asyncio.Event()

    async def verified() -> None:
        await gate.wait()
        await verifier.verify([(fd, check)])

    source = LocalSource([fd], [Slice(0, 0, len(data))], verified())
    first = await source.next_piece()
    assert isinstance(first, FileSpan) and first.count == 2 * MiB
    held = asyncio.ensure_future(source.next_piece())
    await asyncio.sleep(0.01)
    assert not held.done()  # the last MiB waits for the hash
    gate.set()
    last = await held
    assert isinstance(last, FileSpan)
    assert _read(first) + _read(last) == data
    assert await source.next_piece() is None
    await source.aclose()


async def test_local_source_never_completes_a_corrupt_body(
    tmp_path: Path, verifier: BlobVerifier
) -> None:
    data = os.urandom(MiB + 10)
    fd, check = _file(tmp_path, data)
    bad = BlobCheck(check.blob_id, hashlib.md5(b"not it").hexdigest())
    source = LocalSource([fd], [Slice(0, 5, 100)], verifier.verify([(fd, bad)]))
    with pytest.raises(CorruptBody):
        await source.next_piece()  # a small range is held back whole
    await source.aclose()
    with pytest.raises(OSError):
        os.fstat(fd)  # released


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
