"""BlobStore: streamed writes with digests, no leftovers on failure, crash sweep."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.errors import EntityTooLarge
from gateway.store.blobs import BlobStore


async def chunks(*parts: bytes, fail_after: int | None = None) -> AsyncIterator[bytes]:
    for i, part in enumerate(parts):
        if fail_after is not None and i == fail_after:
            raise ConnectionResetError("client went away")
        yield part


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    s = BlobStore(tmp_path, fsync=True, piece_bytes=64 * 1024)
    s.open_store()
    return s


async def test_blobs_write_streams_and_hashes(store: BlobStore) -> None:
    parts = [bytes([i]) * 50_000 for i in range(7)]  # crosses several 64 KiB pieces
    blob = await store.write(chunks(*parts), {"md5", "crc32", "sha256"})
    data = b"".join(parts)
    assert store.path(blob.blob_id).read_bytes() == data
    assert blob.size_bytes == len(data)
    assert blob.digests["md5"] == hashlib.md5(data).digest()
    assert blob.digests["sha256"] == hashlib.sha256(data).digest()
    assert blob.digests["crc32"] == zlib.crc32(data).to_bytes(4, "big")
    assert not any((store.root / "tmp").iterdir())


async def test_blobs_failed_write_leaves_nothing(store: BlobStore) -> None:
    with pytest.raises(ConnectionResetError):
        await store.write(chunks(b"a" * 100_000, b"b" * 100_000, fail_after=1), {"md5"})
    with pytest.raises(EntityTooLarge):
        await store.write(chunks(b"a" * 10, b"b" * 10), {"md5"}, max_bytes=15)
    assert not any((store.root / "tmp").iterdir())
    assert store.used_bytes() == 0


async def test_blobs_sweep_removes_unreferenced(store: BlobStore) -> None:
    keep = await store.write(chunks(b"keep"), {"md5"})
    drop = await store.write(chunks(b"drop"), {"md5"})
    assert store.sweep({keep.blob_id}) == 1
    assert store.path(keep.blob_id).exists()
    assert not store.path(drop.blob_id).exists()


def test_blobs_open_store_empties_tmp(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "half-written").write_bytes(b"x")
    BlobStore(tmp_path).open_store()
    assert not any((tmp_path / "tmp").iterdir())
