"""BlobStore: streamed writes with digests, no leftovers on failure, crash sweep."""

from __future__ import annotations

import hashlib
import threading
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from awscrt import checksums as crt_checksums

from gateway.errors import EntityTooLarge
from gateway.store import blobs as blobs_module
from gateway.store.blobs import BlobStore


async def chunks(*parts: bytes, fail_after: int | None = None) -> AsyncIterator[bytes]:
    for i, part in enumerate(parts):
        if fail_after is not None and i == fail_after:
            raise ConnectionResetError("client went away")
        yield part


@pytest.fixture
def store(tmp_path: Path) -> Iterator[BlobStore]:
    s = BlobStore(tmp_path, fsync=True, piece_bytes=64 * 1024)
    s.open_store()
    yield s
    s.close()


async def test_blobs_write_streams_and_hashes(store: BlobStore) -> None:
    parts = [bytes([i]) * 50_000 for i in range(7)]  # crosses several 64 KiB pieces
    blob = await store.write(chunks(*parts), {"md5", "crc32", "sha256"})
    data = b"".join(parts)
    assert store.path(blob.blob_id).read_bytes() == data
    assert blob.size_bytes == len(data)
    assert blob.digests["md5"] == hashlib.md5(data).digest()
    assert blob.digests["sha256"] == hashlib.sha256(data).digest()
    assert blob.digests["crc32"] == zlib.crc32(data).to_bytes(4, "big")
    assert blob.crc32c == crt_checksums.crc32c(data)  # always: the stored checksum
    assert not any((store.root / "tmp").iterdir())


class _Rendezvous:
    """A hasher (and a write) that waits for the other consumers of the same piece: it can
    only get past ``update`` if they all run at the same time."""

    def __init__(self, barrier: threading.Barrier, inner: Any) -> None:
        self._barrier = barrier
        self._inner = inner

    def update(self, data: bytes | memoryview) -> None:
        if len(data) >= 64 * 1024:  # the full pieces go in parallel (not the tail)
            self._barrier.wait(timeout=5.0)
        self._inner.update(data)

    def digest(self) -> bytes:
        return bytes(self._inner.digest())


async def test_blobs_hash_and_write_each_piece_in_parallel(
    store: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MD5, SHA-256 and the file write of a piece run at once (each in its own thread): a
    consumer that waited for the others in turn would break the barrier."""
    barrier = threading.Barrier(3)
    real_new_hasher = blobs_module.new_hasher
    real_write_all = blobs_module._write_all

    def new_hasher(name: str) -> Any:
        inner = real_new_hasher(name)
        return _Rendezvous(barrier, inner) if name in ("md5", "sha256") else inner

    def write_all(fd: int, data: bytes) -> None:
        if len(data) >= 64 * 1024:
            barrier.wait(timeout=5.0)
        real_write_all(fd, data)

    monkeypatch.setattr(blobs_module, "new_hasher", new_hasher)
    monkeypatch.setattr(blobs_module, "_write_all", write_all)
    data = bytes(range(256)) * 1200  # ~300 KiB: four full pieces and a tail
    blob = await store.write(chunks(data[:100_000], data[100_000:]), {"md5", "sha256"})
    assert store.path(blob.blob_id).read_bytes() == data
    assert blob.digests["md5"] == hashlib.md5(data).digest()
    assert blob.digests["sha256"] == hashlib.sha256(data).digest()
    assert blob.crc32c == crt_checksums.crc32c(data)


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
