"""Read-through cache fills and verified reads: only a whole, MD5-equal body is kept; a
partial or abandoned copy leaves nothing; a corrupt local body never streams to its end."""

from __future__ import annotations

import asyncio
import hashlib
import io
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from awscrt import checksums as crt_checksums

from gateway.clock import SystemClock
from gateway.core.cache import CacheFills, read_verified
from gateway.errors import InternalError
from gateway.models import FlushState, ObjectMeta
from gateway.store.blobs import BlobStore
from gateway.store.integrity import BodyDigest
from gateway.store.journal import Journal
from gateway.store.space import CacheSpace


class Env:
    def __init__(self, root: Path) -> None:
        self.blobs = BlobStore(root, fsync=False)
        self.blobs.open_store()
        self.journal = Journal(root / "journal.db", fsync=False)
        self.journal.open()
        clock = SystemClock()
        space = CacheSpace(
            self.journal,
            self.blobs,
            clock,
            capacity_bytes=1 << 30,
            high_fraction=0.9,
            low_fraction=0.8,
        )
        self.fills = CacheFills(self.journal, self.blobs, space, clock)

    def tee(self, meta: ObjectMeta, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        self.journal.watch(meta.bucket, meta.key)  # as ObjectService does before its GET
        return self.fills.tee(meta, chunks)

    def blob_files(self) -> list[Path]:
        return [p for p in (self.blobs.root / "blobs").rglob("*") if p.is_file()]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(tmp_path)
    yield e
    await e.fills.close()
    e.journal.close()
    e.blobs.close()


def _meta(body: bytes, key: str = "k") -> ObjectMeta:
    return ObjectMeta(
        bucket="b",
        key=key,
        size_bytes=len(body),
        etag=hashlib.md5(body).hexdigest(),
        last_modified_s=1.0,
    )


async def _pieces(body: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


async def _settle(env: Env) -> None:
    await asyncio.gather(*env.fills._tasks, return_exceptions=True)


async def test_fill_keeps_whole_md5_equal_body_as_durable(env: Env) -> None:
    body = bytes(range(256)) * 40
    served = b"".join([p async for p in env.tee(_meta(body), _pieces(body))])
    assert served == body
    await _settle(env)
    row = await env.journal.get("b", "k")
    assert row is not None and row.state is FlushState.DURABLE and row.blob_id is not None
    assert env.blobs.path(row.blob_id).read_bytes() == body


async def test_fill_of_partial_read_keeps_nothing(env: Env) -> None:
    body = b"x" * 10_000
    stream = env.tee(_meta(body), _pieces(body))
    assert len(await stream.__anext__()) == 1000
    await stream.aclose()  # type: ignore[attr-defined]  # the client went away
    await _settle(env)
    assert await env.journal.get("b", "k") is None
    assert env.blob_files() == []


async def test_fill_with_wrong_md5_keeps_nothing(env: Env) -> None:
    body = b"y" * 5000
    meta = _meta(b"something else entirely")
    meta = ObjectMeta("b", "k", len(body), meta.etag, 1.0)
    assert b"".join([p async for p in env.tee(meta, _pieces(body))]) == body
    await _settle(env)
    assert await env.journal.get("b", "k") is None
    assert env.blob_files() == []


async def test_fill_never_replaces_a_local_write(env: Env) -> None:
    body = b"old" * 1000
    stream = env.tee(_meta(body), _pieces(body))
    first = await stream.__anext__()
    blob = await env.blobs.write(_pieces(b"new"), {"md5"})
    await env.journal.commit_put(_meta(b"new"), blob.blob_id, 2.0)
    rest = b"".join([p async for p in stream])
    assert first + rest == body
    await _settle(env)
    row = await env.journal.get("b", "k")
    assert (
        row is not None and row.state is FlushState.PENDING and row.meta.etag == _meta(b"new").etag
    )
    assert env.blob_files() == [env.blobs.path(blob.blob_id)]


def test_fill_skips_multipart_etags(env: Env) -> None:
    meta = ObjectMeta("b", "k", 10, "0" * 32 + "-2", 1.0)
    assert not env.fills.wants(meta, 1 << 30)
    assert env.fills.wants(_meta(b"0123456789"), 1 << 30)


def _digest(body: bytes) -> BodyDigest:
    return BodyDigest(len(body), crt_checksums.crc32c(body), hashlib.md5(body).hexdigest())


async def test_read_verified_holds_back_last_piece_on_mismatch() -> None:
    good, bad = b"a" * 3_000_000, b"b" * 100
    reported: list[str] = []

    async def on_corrupt(message: str) -> None:
        reported.append(message)

    files = [io.BytesIO(good), io.BytesIO(bad)]
    expected = [_digest(good), BodyDigest(100, crt_checksums.crc32c(b"c" * 100), None)]
    got = b""
    with pytest.raises(InternalError):
        async for piece in read_verified(files, expected, on_corrupt):  # type: ignore[arg-type]
            got += piece
    assert len(got) < len(good) + len(bad)
    assert len(reported) == 1 and "file 2 of 2" in reported[0]
    assert all(f.closed for f in files)

    files = [io.BytesIO(good), io.BytesIO(bad)]
    expected[1] = _digest(bad)
    whole = b"".join([p async for p in read_verified(files, expected, on_corrupt)])  # type: ignore[arg-type]
    assert whole == good + bad


async def test_fill_refused_after_a_write_already_gone_from_the_journal(env: Env) -> None:
    """A delete (or write) that was flushed and dropped while the copy streamed still wins."""
    body = b"stale" * 1000
    stream = env.tee(_meta(body), _pieces(body))
    first = await stream.__anext__()
    await env.journal.commit_delete("b", "k", 2.0)
    await env.journal.run_write(lambda c: c.execute("DELETE FROM objects"))  # flushed, gone
    assert first + b"".join([p async for p in stream]) == body
    await _settle(env)
    assert await env.journal.get("b", "k") is None
    assert env.blob_files() == []
    assert env.journal._watched == {}  # released
