"""Many clients at once and large bodies: acknowledged bytes are exact, locally and upstream."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harness import list_all_keys, payload, quoted_md5, read_body, upstream_objects

MiB = 1024 * 1024


def test_concurrent_puts_of_distinct_keys(gateway: Any, upstream: Any, bucket: str) -> None:
    bodies = {
        f"par/{t:02d}/{i:02d}": payload(1000 + 37 * i + t, seed=f"{t}-{i}")
        for t in range(16)
        for i in range(8)
    }
    keys = sorted(bodies)

    def worker(thread_no: int) -> list[str]:
        client = gateway.client()
        etags = []
        for key in keys[thread_no::16]:
            etags.append(client.put_object(Bucket=bucket, Key=key, Body=bodies[key])["ETag"])
        return etags

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(worker, range(16)))
    for thread_no, etags in enumerate(results):
        assert etags == [quoted_md5(bodies[k]) for k in keys[thread_no::16]]

    s3 = gateway.client()
    assert list_all_keys(s3, bucket, MaxKeys=50) == keys
    gateway.drained(bucket=bucket, timeout=60)
    up = upstream_objects(upstream, bucket)
    assert sorted(up) == keys
    for key in keys:
        assert up[key]["ETag"] == quoted_md5(bodies[key]), key


def test_concurrent_overwrites_of_one_key(gateway: Any, upstream: Any, bucket: str) -> None:
    """Racing writers: whatever version ends up visible is one of the acknowledged ones, and
    after the drain the upstream holds exactly the version the gateway serves."""
    versions = {i: payload(20_000 + i, seed=f"race-{i}") for i in range(16)}

    def worker(i: int) -> str:
        client = gateway.client()
        etag: str = client.put_object(Bucket=bucket, Key="race", Body=versions[i])["ETag"]
        return etag

    with ThreadPoolExecutor(8) as pool:
        etags = list(pool.map(worker, range(16)))
    assert etags == [quoted_md5(versions[i]) for i in range(16)]
    s3 = gateway.client()
    served = read_body(s3.get_object(Bucket=bucket, Key="race"))
    assert served in versions.values()
    gateway.drained(bucket=bucket)
    assert read_body(s3.get_object(Bucket=bucket, Key="race")) == served
    got = upstream.get_object(Bucket=bucket, Key="race")
    assert read_body(got) == served
    assert got["ETag"] == quoted_md5(served)


def test_large_single_put(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    body = payload(48 * MiB + 11, seed="large")
    digest = hashlib.md5(body).hexdigest()
    put = s3.put_object(Bucket=bucket, Key="large/blob", Body=body)
    assert put["ETag"] == f'"{digest}"'
    got = s3.get_object(Bucket=bucket, Key="large/blob")
    assert hashlib.md5(read_body(got)).hexdigest() == digest
    assert got["ContentLength"] == len(body)
    gateway.drained(bucket=bucket, timeout=120)
    up = upstream.get_object(Bucket=bucket, Key="large/blob")
    # Single PUT upstream too: the ETag the client saw is the upstream's.
    assert up["ETag"] == f'"{digest}"'
    assert hashlib.md5(read_body(up)).hexdigest() == digest
