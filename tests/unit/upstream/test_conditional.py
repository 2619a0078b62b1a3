"""Conditional writes against a real S3 server (moto over http), as takeover and claims use
them: ``If-None-Match: *`` creates once (412 after), ``If-Match`` fails once the key has
changed or gone, a guarded multipart completion fails and leaves no upload open, and of
concurrent creators exactly one wins.

S3 answers a conditional write that races another one in flight with 409
ConditionalRequestConflict; moto serialises them and answers 412 to the losers. Both are
handled (409 is retried: test_classify), and the single winner is checked here."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from fakes import path_style_upstream
from harness import start_moto

from gateway.models import ObjectMeta
from gateway.upstream.classify import ConditionFailed
from gateway.upstream.client import AiobotocoreUpstream, PartSource, unchanged_since

BUCKET = "conditional"
MiB = 1 << 20


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server, url = start_moto()
    yield url
    server.stop()


@pytest.fixture
async def up(moto_url: str) -> AsyncIterator[AiobotocoreUpstream]:
    client = path_style_upstream(moto_url)
    await client.start()
    with contextlib.suppress(Exception):  # made by an earlier test of the module
        await client.create_bucket(BUCKET, None)
    yield client
    await client.close()


def _meta(key: str, body: bytes) -> ObjectMeta:
    return ObjectMeta(BUCKET, key, len(body), hashlib.md5(body).hexdigest(), time.time())


async def _put(up: AiobotocoreUpstream, key: str, body: bytes, etag: str | None) -> str:
    return await up.put_object(_meta(key, body), io.BytesIO(body), unchanged_since(etag))


async def _body(up: AiobotocoreUpstream, key: str) -> bytes:
    got = await up.get_small(BUCKET, key)
    assert got is not None
    return got


async def test_if_none_match_creates_once(up: AiobotocoreUpstream) -> None:
    assert await up.put_if_absent(BUCKET, "claim", b"first")
    assert not await up.put_if_absent(BUCKET, "claim", b"second")  # 412
    assert await _body(up, "claim") == b"first"


async def test_of_concurrent_creators_exactly_one_wins(up: AiobotocoreUpstream) -> None:
    """moto's own check-then-store raced (two winners of 16, once in the suite) until
    ``guard_moto_conditional_writes``: 12 keys raced by 16 creators each."""
    for n in range(12):
        key = f"raced/{n}"
        wins = await asyncio.gather(
            *(up.put_if_absent(BUCKET, key, f"claimant {i}".encode()) for i in range(16))
        )
        assert wins.count(True) == 1, f"{key}: {wins.count(True)} winners"
        assert await _body(up, key) == f"claimant {wins.index(True)}".encode()


async def test_if_match_fails_once_the_key_changed(up: AiobotocoreUpstream) -> None:
    old = await _put(up, "k", b"v1", None)
    await _put(up, "k", b"v2 newer", old)  # as it was: written
    with pytest.raises(ConditionFailed):
        await _put(up, "k", b"v1 again", old)  # stale: never over the newer bytes
    assert await _body(up, "k") == b"v2 newer"
    with pytest.raises(ConditionFailed):
        await _put(up, "k", b"v3", None)  # If-None-Match on a key that exists


async def test_if_match_on_a_key_gone_since_is_a_failed_condition(
    up: AiobotocoreUpstream,
) -> None:
    etag = await _put(up, "gone", b"v1", None)
    await up.delete_object(BUCKET, "gone")
    with pytest.raises(ConditionFailed):  # S3 and moto answer 404 NoSuchKey
        await _put(up, "gone", b"v1", etag)
    assert await up.get_small(BUCKET, "gone") is None


async def test_guarded_delete_keeps_a_newer_version(up: AiobotocoreUpstream) -> None:
    old = await _put(up, "d", b"old", None)
    new = await _put(up, "d", b"new", old)
    with pytest.raises(ConditionFailed):
        await up.delete_object(BUCKET, "d", unchanged_since(old))
    assert await _body(up, "d") == b"new"
    await up.delete_object(BUCKET, "d", unchanged_since(new))
    assert await up.get_small(BUCKET, "d") is None


async def test_guarded_multipart_fails_and_leaves_no_upload_open(
    up: AiobotocoreUpstream,
) -> None:
    await _put(up, "mp", b"already there", None)
    parts = [b"a" * (5 * MiB), b"b" * 1000]
    sources = [PartSource(io.BytesIO(p), len(p), hashlib.md5(p).hexdigest()) for p in parts]
    meta = _meta("mp", b"".join(parts))
    with pytest.raises(ConditionFailed):
        await up.put_multipart(meta, sources, condition=unchanged_since(None))
    assert await _body(up, "mp") == b"already there"
    assert await up.list_open_uploads(BUCKET, "mp") == []
