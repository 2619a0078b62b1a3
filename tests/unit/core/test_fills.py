"""Read-through fills against an in-memory upstream that honours Range and If-Match: a
whole, checked copy is kept; a wrong, partial, overtaken or unaffordable one is not; a
whole reader's last piece waits for the check. Layout and coverage are pure and
table-tested. (Over real sockets with the emulator: tests/integration/test_it_fills.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from fakes import FakeUpstream, _Body

from gateway.clock import SystemClock
from gateway.core.bodies import FileSpan
from gateway.core.fill import FillConfig
from gateway.core.fill_layout import Coverage, Layout, digest_matches, layout
from gateway.core.fills import FillManager
from gateway.core.integrity import BlobVerifier
from gateway.errors import PreconditionFailed
from gateway.models import FlushState
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.space import CacheSpace
from gateway.upstream.client import UpstreamHead, UpstreamObject

KiB = 1024


class RangedUpstream(FakeUpstream):
    """FakeUpstream whose GET honours ``Range`` and ``If-Match``; ``gate`` (when set)
    holds every ranged GET after the first until released."""

    def __init__(self) -> None:
        super().__init__(["b"])
        self.gate: asyncio.Event | None = None
        self.ranges: list[str | None] = []
        self.part_bytes: int | None = None  # set: objects are multipart with such parts

    async def head_part(self, bucket: str, key: str, part_number: int) -> UpstreamHead:
        data, meta = self._find(bucket, key)
        if self.part_bytes is None:
            return await super().head_part(bucket, key, part_number)
        end = min(len(data), self.part_bytes) - 1
        return UpstreamHead(meta, f"bytes 0-{end}/{len(data)}", -(-len(data) // self.part_bytes))

    def add_multipart(self, key: str, body: bytes, part_bytes: int, *, wrong: bool = False) -> None:
        """``body`` as an object uploaded in parts of ``part_bytes`` (its ETag: the MD5 of
        the part MD5s, ``-N``; ``wrong``: of other bytes)."""
        meta = self.add_object("b", key, body)
        parts = [body[i : i + part_bytes] for i in range(0, len(body), part_bytes)]
        if wrong:
            parts[-1] = b"x" + parts[-1][1:]
        digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
        etag = f"{digest}-{len(parts)}"
        self.buckets["b"][key] = (body, dataclasses.replace(meta, etag=etag))
        self.part_bytes = part_bytes

    async def get_object(
        self,
        bucket: str,
        key: str,
        *,
        range_header: str | None = None,
        part_number: int | None = None,
        preconditions: Mapping[str, str] | None = None,
    ) -> UpstreamObject:
        self.ranges.append(range_header)
        if self.gate is not None and len(self.ranges) > 1:
            await self.gate.wait()
        data, meta = self._find(bucket, key)
        if preconditions and preconditions.get("If-Match", f'"{meta.etag}"') != f'"{meta.etag}"':
            raise PreconditionFailed()
        if range_header is None:
            return UpstreamObject(meta, _Body(data))
        first, last = (int(v) for v in range_header[6:].split("-"))
        last = min(last, len(data) - 1)
        rng = f"bytes {first}-{last}/{len(data)}"
        return UpstreamObject(meta, _Body(data[first : last + 1]), rng)


class Env:
    def __init__(self, root: Path, capacity_bytes: int = 1 << 30) -> None:
        self.blobs = BlobStore(root, fsync=False)
        self.blobs.open_store()
        self.journal = Journal(root / "journal.db", fsync=False)
        self.journal.open()
        self.upstream = RangedUpstream()
        self.space = CacheSpace(
            self.journal,
            self.blobs,
            SystemClock(),
            capacity_bytes=capacity_bytes,
            high_fraction=0.9,
            low_fraction=0.8,
        )
        self.verifier = BlobVerifier()
        config = FillConfig(part_bytes=4 * KiB, fill_concurrency=3, request_concurrency=4)
        self.fills = FillManager(
            self.journal,
            self.blobs,
            self.upstream,
            self.space,
            SystemClock(),
            self.verifier,
            config,
        )

    def body_files(self) -> list[Path]:
        root = self.blobs.root
        return [
            p
            for p in root.rglob("*")
            if p.is_file() and p.relative_to(root).parts[0] in ("blobs", "tmp")
        ]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(tmp_path)
    yield e
    await e.fills.close()
    await e.verifier.close()
    e.journal.close()
    e.blobs.close()


async def _read_all(reader: object) -> bytes:
    out = b""
    while (piece := await reader.next_piece()) is not None:  # type: ignore[attr-defined]
        assert isinstance(piece, FileSpan)
        out += os.pread(piece.fd, piece.count, piece.offset)
    await reader.aclose()  # type: ignore[attr-defined]
    return out


async def test_fill_in_parallel_chunks_keeps_a_checked_copy(env: Env) -> None:
    body = os.urandom(10 * KiB + 7)
    env.upstream.add_object("b", "k", body)
    fill = env.fills.start("b", "k")
    meta = await fill.head()
    assert meta.size_bytes == len(body) and fill.is_serving
    assert await _read_all(fill.reader(0, len(body))) == body
    await fill.done()
    assert fill.is_committed
    assert env.upstream.ranges == ["bytes=0-4095", "bytes=4096-8191", "bytes=8192-10246"]
    row = await env.journal.get("b", "k")
    assert row is not None and row.state is FlushState.DURABLE and row.blob_id is not None
    assert env.blobs.path(row.blob_id).read_bytes() == body
    assert env.fills.current("b", "k") is None
    assert env.space.filling_bytes == 0


async def test_a_copy_that_fails_its_check_is_served_but_not_kept(env: Env) -> None:
    """An ETag that is not the body's MD5 (SSE-KMS does that): readers get the bytes the
    upstream sent, as a direct GET would; the copy is dropped."""
    body = os.urandom(9 * KiB)
    meta = env.upstream.add_object("b", "k", body)
    wrong = dataclasses.replace(meta, etag=hashlib.md5(b"else").hexdigest())
    env.upstream.buckets["b"]["k"] = (body, wrong)
    fill = env.fills.start("b", "k")
    await fill.head()
    assert await _read_all(fill.reader(0, len(body))) == body
    assert await _read_all(fill.reader(100, 1000)) == body[100:1100]
    await fill.done()
    assert not fill.is_committed
    assert await env.journal.get("b", "k") is None
    assert env.body_files() == []


async def test_local_write_during_fill_is_never_replaced(env: Env) -> None:
    env.upstream.add_object("b", "k", os.urandom(12 * KiB))
    env.upstream.gate = asyncio.Event()
    fill = env.fills.start("b", "k")
    await fill.head()
    new = b"new"

    async def chunks() -> AsyncIterator[bytes]:
        yield new

    blob = await env.blobs.write(chunks(), {"md5"})
    newer = dataclasses.replace(
        await env.upstream.head_object("b", "k"), size_bytes=3, etag=hashlib.md5(new).hexdigest()
    )
    await env.journal.commit_put(newer, blob.blob_id, 2.0)
    env.upstream.gate.set()
    await fill.done()
    assert not fill.is_committed
    row = await env.journal.get("b", "k")
    assert row is not None and row.state is FlushState.PENDING and row.meta.etag == newer.etag
    assert [p.name for p in env.body_files()] == [blob.blob_id]
    assert env.journal._watched == {}


async def test_fill_that_does_not_fit_serves_nobody_and_reserves_nothing(tmp_path: Path) -> None:
    env = Env(tmp_path, capacity_bytes=10 * KiB)  # high watermark 9 KiB
    try:
        env.upstream.add_object("b", "k", os.urandom(9 * KiB + 1))
        fill = env.fills.start("b", "k")
        await fill.head()
        assert not fill.is_serving
        await fill.done()
        assert env.space.filling_bytes == 0 and env.body_files() == []
        assert env.upstream.ranges == ["bytes=0-4095"]  # only the first answer's headers
    finally:
        await env.fills.close()
        await env.verifier.close()
        env.journal.close()
        env.blobs.close()


async def test_upstream_change_mid_fill_fails_readers_and_keeps_nothing(env: Env) -> None:
    env.upstream.add_object("b", "k", os.urandom(12 * KiB))
    env.upstream.gate = asyncio.Event()
    fill = env.fills.start("b", "k")
    await fill.head()
    reader = fill.reader(0, 12 * KiB)
    env.upstream.add_object("b", "k", b"replaced")
    env.upstream.gate.set()
    with pytest.raises(PreconditionFailed):
        await _read_all(reader)
    await fill.done()
    assert not fill.is_committed and env.body_files() == []


@pytest.mark.parametrize("part_kib", [4, 3])  # on the fetch grid (hashed inline), or not
async def test_multipart_copy_is_kept_part_by_part(env: Env, part_kib: int) -> None:
    body = os.urandom(10 * KiB + 5)
    env.upstream.add_multipart("k", body, part_kib * KiB)
    fill = env.fills.start("b", "k")
    await fill.head()
    assert await _read_all(fill.reader(0, len(body))) == body
    await fill.done()
    assert fill.is_committed
    row = await env.journal.get("b", "k")
    assert row is not None and row.blob_id is None
    parts = [env.blobs.path(p.blob_id).read_bytes() for p in row.parts]
    assert b"".join(parts) == body and len(parts[0]) == part_kib * KiB
    assert [p.etag for p in row.parts] == [hashlib.md5(p).hexdigest() for p in parts]


@pytest.mark.parametrize("part_kib", [4, 3])
async def test_multipart_copy_with_a_wrong_part_is_not_kept(env: Env, part_kib: int) -> None:
    body = os.urandom(10 * KiB + 5)
    env.upstream.add_multipart("k", body, part_kib * KiB, wrong=True)
    fill = env.fills.start("b", "k")
    await fill.head()
    assert await _read_all(fill.reader(0, len(body))) == body
    await fill.done()
    assert not fill.is_committed and env.body_files() == []


async def test_a_second_range_read_of_a_key_is_shared(env: Env) -> None:
    assert not env.fills.is_shared_range("b", "k")
    assert env.fills.is_shared_range("b", "k")
    assert not env.fills.is_shared_range("b", "other")


@pytest.mark.parametrize(
    ("etag", "size", "part_one", "want"),
    [
        ("0" * 32, 10, None, Layout((10,), True)),
        ("a" * 32 + "-3", 25, 10, Layout((10, 10, 5), True)),
        ("a" * 32 + "-3", 30, 10, Layout((10, 10, 10), True)),
        ("a" * 32 + "-3", 31, 10, Layout((31,), False)),  # parts are not equal
        ("a" * 32 + "-3", 20, 10, Layout((20,), False)),
        ("a" * 32 + "-1", 7, 7, Layout((7,), True)),
        ("a" * 32 + "-2", 7, None, Layout((7,), False)),
        ("not-an-md5", 7, None, Layout((7,), False)),
    ],
)
def test_layout_of_a_copy(etag: str, size: int, part_one: int | None, want: Layout) -> None:
    assert layout(etag, size, part_one) == want


def test_digest_matches_plain_and_multipart() -> None:
    a, b = hashlib.md5(b"a").digest(), hashlib.md5(b"b").digest()
    assert digest_matches(hashlib.md5(b"a").hexdigest(), [a])
    assert digest_matches(hashlib.md5(a + b).hexdigest() + "-2", [a, b])
    assert not digest_matches(hashlib.md5(a + b).hexdigest() + "-2", [b, a])
    assert not digest_matches(hashlib.md5(b"a").hexdigest(), [a, b])


def test_coverage_runs_of_arrived_bytes() -> None:
    cov = Coverage(25, 10)
    assert cov.chunks == 3 and cov.available_end(0) == 0
    cov.add(1, 10)  # the middle chunk first
    assert cov.available_end(0) == 0 and cov.available_end(12) == 20
    cov.add(0, 4)
    assert cov.available_end(0) == 4 and cov.available_end(4) == 4
    cov.add(0, 6)
    assert cov.available_end(0) == 20 and not cov.is_complete
    cov.add(2, 5)
    assert cov.available_end(3) == 25 and cov.is_complete and cov.arrived_bytes == 25
    empty = Coverage(0, 10)
    assert empty.is_complete and empty.available_end(0) == 0
