"""moto's S3 key computes its ETag lazily from a shared buffer without its lock; two
threads asking at once (a PUT's response and a concurrent LIST) could cache the MD5 of
interleaved reads, so a flush of a >16 MiB body looked corrupted. The guard serialises it."""

from __future__ import annotations

import hashlib
import os
import threading

from moto.s3.models import FakeKey

from gateway.upstream.demo import guard_moto_etag


def test_moto_etag_is_right_when_computed_by_many_threads_at_once() -> None:
    guard_moto_etag()
    body = os.urandom(40 << 20)  # several of moto's 16 MiB read blocks, spilled to disk
    expected = f'"{hashlib.md5(body).hexdigest()}"'
    key = FakeKey("k", body, "123456789012", "us-east-1")
    for _ in range(8):
        key._etag = None  # as after a fresh PUT
        seen: list[str] = []
        threads = [threading.Thread(target=_append_etag, args=(key, seen)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [expected] * 4


def _append_etag(key: FakeKey, seen: list[str]) -> None:
    seen.append(key.etag)
