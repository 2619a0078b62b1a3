"""Write-back ordering promises, observed on the upstream while the gateway flushes:
last writer wins, commit markers last, renames (copy + delete) never expose the temporary key.

The watchers poll the upstream listing back to back while the flush runs (no sleeps) and check
an invariant on every snapshot; the final state is checked after the drain.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harness import flush_state, payload, quoted_md5, read_body, upstream_objects

MiB = 1024 * 1024

Snapshot = dict[str, dict[str, Any]]


def watch_flush(
    gateway: Any,
    upstream: Any,
    bucket: str,
    check: Callable[[Snapshot], None],
    timeout: float = 60,
) -> tuple[int, Snapshot]:
    """Resume flushing, then check ``check`` on upstream snapshots until drained.

    Returns the number of snapshots taken and the final one.
    """
    gateway.resume_flush()
    deadline = time.monotonic() + timeout
    snapshots = 0
    while True:
        drained = gateway.drain(bucket=bucket, wait=False)["drained"]
        snapshot = upstream_objects(upstream, bucket)
        check(snapshot)
        snapshots += 1
        if drained:
            return snapshots, snapshot
        assert time.monotonic() < deadline, "flush did not finish"


def test_overwrites_racing_the_flush(gateway: Any, upstream: Any, bucket: str) -> None:
    """Overwrite keys while earlier versions are being uploaded: the upstream ends with the
    last acknowledged version of every key, and never goes back to an older one."""
    s3 = gateway.client()
    failed_before = gateway.status()["failed_objects"]
    final: dict[str, bytes] = {}
    for round_no in range(6):
        for i in range(4):
            key = f"race/{i}"
            size = 3 * MiB if round_no % 2 == 0 else 1000 + round_no
            final[key] = payload(size, seed=f"{key}-{round_no}")
            s3.put_object(Bucket=bucket, Key=key, Body=final[key])
    gateway.drained(bucket=bucket, timeout=90)
    up = upstream_objects(upstream, bucket)
    assert sorted(up) == sorted(final)
    for key, body in final.items():
        got = upstream.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body, key
        assert got["ETag"] == quoted_md5(body), key
        assert read_body(s3.get_object(Bucket=bucket, Key=key)) == body
        assert flush_state(s3.head_object(Bucket=bucket, Key=key)) == "durable"
    # A superseded version is not a failure.
    assert gateway.status()["failed_objects"] == failed_before


def test_delete_racing_the_flush(gateway: Any, upstream: Any, bucket: str) -> None:
    """Delete large objects right after writing them (their upload may be in flight): none of
    them may survive upstream."""
    s3 = gateway.client()
    keys = [f"gone/{i}" for i in range(5)]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=payload(4 * MiB, seed=key))
    s3.put_object(Bucket=bucket, Key="kept", Body=b"kept")
    for key in keys:
        s3.delete_object(Bucket=bucket, Key=key)
    gateway.drained(bucket=bucket, timeout=90)
    assert sorted(upstream_objects(upstream, bucket)) == ["kept"]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["kept"]


def test_parallel_writers_same_keys_final_state(gateway: Any, upstream: Any, bucket: str) -> None:
    """After concurrent writers finish, gateway and upstream agree on every key, and no
    superseded version is reported as a failed flush."""
    failed_before = gateway.status()["failed_objects"]

    def writer(n: int) -> None:
        client = gateway.client()
        for i in range(10):
            key = f"shared/{i % 3}"
            client.put_object(Bucket=bucket, Key=key, Body=payload(50_000 + n, seed=f"{n}-{i}"))

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(writer, range(6)))
    s3 = gateway.client()
    served = {
        f"shared/{i}": read_body(s3.get_object(Bucket=bucket, Key=f"shared/{i}")) for i in range(3)
    }
    gateway.drained(bucket=bucket, timeout=90)
    for key, body in served.items():
        assert read_body(s3.get_object(Bucket=bucket, Key=key)) == body
        got = upstream.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body, key
        assert flush_state(s3.head_object(Bucket=bucket, Key=key)) == "durable"
    assert gateway.status()["failed_objects"] == failed_before


def test_commit_marker_flushed_last(gateway: Any, upstream: Any, bucket: str) -> None:
    """torch.distributed.checkpoint writes `.metadata` last: the upstream never shows it
    before every shard acknowledged earlier under the same prefix."""
    s3 = gateway.client()
    prefix = "ckpt/step-100/"
    shards = {
        f"{prefix}__{i}_0.distcp": payload(256 * 1024 + i, seed=f"shard{i}") for i in range(8)
    }
    # The last shard is large: with parallel uploads a tiny marker would overtake it.
    shards[f"{prefix}__8_0.distcp"] = payload(24 * MiB, seed="big shard")
    with gateway.flush_paused():
        for key, body in shards.items():
            s3.put_object(Bucket=bucket, Key=key, Body=body)
        s3.put_object(Bucket=bucket, Key=prefix + ".metadata", Body=b"torch metadata")
        s3.put_object(Bucket=bucket, Key="other/_SUCCESS", Body=b"")
        seen_marker_early: list[int] = []

        def check(snapshot: Snapshot) -> None:
            if prefix + ".metadata" in snapshot:
                missing = [k for k in shards if k not in snapshot]
                if missing:
                    seen_marker_early.append(len(missing))

        snapshots, final = watch_flush(gateway, upstream, bucket, check)
    assert not seen_marker_early, (
        f"marker visible upstream while shards missing: {seen_marker_early}"
    )
    assert sorted(final) == sorted([*shards, prefix + ".metadata", "other/_SUCCESS"])
    assert snapshots >= 1


def test_success_marker_flushed_last(gateway: Any, upstream: Any, bucket: str) -> None:
    s3 = gateway.client()
    parts = {f"out/part-{i:05d}": payload(128 * 1024, seed=f"part{i}") for i in range(8)}
    parts["out/part-00008"] = payload(24 * MiB, seed="big part")
    with gateway.flush_paused():
        for key, body in parts.items():
            s3.put_object(Bucket=bucket, Key=key, Body=body)
        s3.put_object(Bucket=bucket, Key="out/_SUCCESS", Body=b"")
        early: list[int] = []

        def check(snapshot: Snapshot) -> None:
            if "out/_SUCCESS" in snapshot and any(k not in snapshot for k in parts):
                early.append(sum(k not in snapshot for k in parts))

        _, final = watch_flush(gateway, upstream, bucket, check)
    assert not early, early
    assert sorted(final) == sorted([*parts, "out/_SUCCESS"])


def test_rename_by_copy_and_delete(gateway: Any, upstream: Any, bucket: str) -> None:
    """Write to a temporary key, copy to the final key, delete the temporary key (how S3
    writers emulate rename): the temporary key never reaches the upstream."""
    s3 = gateway.client()
    bodies = {f"ckpt/model-{i}.pt": payload(MiB + 3 * i, seed=f"model{i}") for i in range(6)}
    with gateway.flush_paused():
        for final_key, body in bodies.items():
            tmp = final_key + ".tmp"
            s3.put_object(Bucket=bucket, Key=tmp, Body=body)
            copied = s3.copy_object(
                Bucket=bucket, Key=final_key, CopySource={"Bucket": bucket, "Key": tmp}
            )
            assert copied["CopyObjectResult"]["ETag"] == quoted_md5(body)
            s3.delete_object(Bucket=bucket, Key=tmp)
        listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
        assert listed == sorted(bodies)
        leaked: set[str] = set()

        def check(snapshot: Snapshot) -> None:
            leaked.update(k for k in snapshot if k.endswith(".tmp"))

        _, final = watch_flush(gateway, upstream, bucket, check)
    assert not leaked, f"temporary keys reached the upstream: {sorted(leaked)}"
    assert sorted(final) == sorted(bodies)
    for key, body in bodies.items():
        got = upstream.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body
        assert got["ETag"] == quoted_md5(body)
