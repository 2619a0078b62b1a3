"""AiobotocoreUpstream against a real S3 server (moto, over http): bodies are sent unsigned
(UNSIGNED-PAYLOAD) with Content-MD5, and the event loop never reads a body to sign it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import path_style_upstream
from harness import start_moto

from gateway.models import ObjectMeta
from gateway.upstream.client import AiobotocoreUpstream

BUCKET = "unsigned"


class _SpyFile(io.FileIO):
    """A body file that notes which thread reads it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "rb")
        self.readers: set[int] = set()

    def read(self, size: int = -1) -> bytes:
        self.readers.add(threading.get_ident())
        return super().read(size)

    def readinto(self, buffer: Any) -> int:
        self.readers.add(threading.get_ident())
        return super().readinto(buffer)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server, url = start_moto()
    yield url
    server.stop()


@pytest.fixture
async def upstream(moto_url: str) -> AsyncIterator[tuple[AiobotocoreUpstream, list[Any]]]:
    up = path_style_upstream(moto_url)
    await up.start()
    sent: list[Any] = []
    up._client.meta.events.register(
        "before-send.s3", lambda request, **_: sent.append(dict(request.headers.items()))
    )
    with contextlib.suppress(Exception):  # created by an earlier test of this module
        await up.create_bucket(BUCKET, None)
    yield up, sent
    await up.close()


async def test_put_object_is_unsigned_with_content_md5_and_read_off_the_loop(
    upstream: tuple[AiobotocoreUpstream, list[Any]], tmp_path: Path
) -> None:
    up, sent = upstream
    body = bytes(range(256)) * 8192  # 2 MiB
    path = tmp_path / "body"
    path.write_bytes(body)
    md5 = hashlib.md5(body).hexdigest()
    meta = ObjectMeta(BUCKET, "big", len(body), md5, time.time())
    spy = _SpyFile(path)
    try:
        etag = await up.put_object(meta, spy)  # type: ignore[arg-type]
    finally:
        spy.close()
    assert etag == md5
    [headers] = [{k.lower(): bytes(v) for k, v in h.items()} for h in sent if h.get("Content-MD5")]
    assert headers["x-amz-content-sha256"] == b"UNSIGNED-PAYLOAD"
    assert b"content-md5" in headers["authorization"]  # Content-MD5 is a signed header
    assert spy.readers and threading.get_ident() not in spy.readers  # never on the loop
    got = await up.get_object(BUCKET, "big")
    assert b"".join([p async for p in got.chunks()]) == body
