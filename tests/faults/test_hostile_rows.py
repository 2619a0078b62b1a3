"""Hostile journal rows against a real gateway and a real upstream (moto over sockets).

An older gateway acknowledged headers the upstream client later refuses (non-ASCII or
undecodable metadata, garbage Expires, control characters, names that are not HTTP
tokens): its data dir holds such rows, some left ``flushing`` by a crash. Here every hostile
header of headercases.py is written into a data dir's journal with the gateway's own store
classes, as that gateway would have, beside clean rows; then a gateway is started on it.

What must hold: every row ends durable upstream (exact bytes) or ``failed`` with its error,
never an endless retry or a row stuck ``flushing``; the clean rows and a clean checkpoint
flush all the same; a checkpoint's marker behind a failed shard is held (never uploaded
without it) and reported as such; ``drain`` answers at once with the failed count rather than
at its timeout; status and metrics agree; SIGTERM does not wait on them; and a restart on
the same journal starts and flushes new writes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fakes import claim_pending
from harness import GatewayProcess, read_body, unique_bucket_name
from headercases import CASES, VALUES, HeaderCase, is_utf8

from gateway.models import FlushState, LocalObject, ObjectMeta, PartRef
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal

BODY = b"an acknowledged body that must not be lost"
CLEAN_ROWS = 20
DRAIN_TIMEOUT_S = 120.0
SHUTDOWN_DRAIN_S = 60.0


async def _chunks() -> AsyncIterator[bytes]:
    yield BODY


def _meta(bucket: str, key: str, etag: str, case: HeaderCase | None) -> ObjectMeta:
    meta = ObjectMeta(
        bucket=bucket, key=key, size_bytes=len(BODY), etag=etag, last_modified_s=time.time()
    )
    return dataclasses.replace(meta, **case.fields()) if case else meta


async def _seed(data_dir: Path, bucket: str) -> None:
    """Rows as an older gateway left them: hostile single and multipart versions, a
    tombstone of a key with control characters, checkpoints, clean rows; some of them left
    ``flushing`` by a crash."""
    blobs = BlobStore(data_dir, fsync=False)
    blobs.open_store()
    journal = Journal(data_dir / "journal.db", fsync=False)
    journal.open()
    md5 = hashlib.md5(BODY).hexdigest()
    mpu_etag = hashlib.md5(bytes.fromhex(md5)).hexdigest() + "-1"
    try:

        async def put(key: str, case: HeaderCase | None = None) -> None:
            blob = await blobs.write(_chunks(), {"md5"})
            await journal.commit_put(_meta(bucket, key, md5, case), blob.blob_id, time.time())

        for case in CASES:
            if case.field == "content-type" and not is_utf8(case.value):
                continue  # a plain text column: no journal can hold it (ingest answers 500)
            await put(f"rows/{case.ident}", case)
        for value in VALUES:  # CreateMultipartUpload carries the headers
            case = HeaderCase("x-amz-meta-a", value)
            blob = await blobs.write(_chunks(), {"md5"})
            part = PartRef(blob.blob_id, len(BODY), md5)
            meta = _meta(bucket, f"mpu/{case.ident}", mpu_etag, case)
            await journal.commit_copy(meta, None, (part,), time.time())
        await put("rows/del-ctl\x01\x7f")
        await journal.commit_delete(bucket, "rows/del-ctl\x01\x7f", time.time())
        # A checkpoint with one unsendable shard: its marker must be held, not uploaded.
        await put("ckpt/bad/shard-0")
        await put("ckpt/bad/shard-1", HeaderCase("x-amz-meta-a", "caf\udce9"))
        await put("ckpt/bad/.metadata")
        for i in range(CLEAN_ROWS):
            await put(f"clean/{i:03d}")
        await put("ckpt/good/shard-0", HeaderCase("x-amz-meta-a", "plain"))
        await put("ckpt/good/.metadata")
        # A crash of that gateway left these mid-upload.
        await claim_pending(journal, len(CASES) // 3, time.time() + 1)
    finally:
        journal.close()
        blobs.close()


def _rows(data_dir: Path, bucket: str) -> list[LocalObject]:
    """Every row of the journal (read after the gateway stopped)."""

    async def read() -> list[LocalObject]:
        journal = Journal(data_dir / "journal.db", fsync=False)
        journal.open()
        try:
            rows: list[LocalObject] = []
            for prefix in ("rows/", "mpu/", "ckpt/", "clean/", "after/"):
                rows += await journal.scan(bucket, prefix, "", 10_000)
            return rows
        finally:
            journal.close()

    return asyncio.run(read())


def _upstream_body(upstream: Any, bucket: str, key: str) -> bytes | None:
    try:
        return read_body(upstream.get_object(Bucket=bucket, Key=key))
    except upstream.exceptions.NoSuchKey:
        return None


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_hostile_rows_end_durable_or_failed_and_nothing_wedges(
    moto_server: str, upstream: Any, tmp_path: Path
) -> None:
    bucket = unique_bucket_name("hostile-rows")
    upstream.create_bucket(Bucket=bucket)
    data_dir = tmp_path / "data"
    asyncio.run(_seed(data_dir, bucket))
    gw = GatewayProcess(
        data_dir,
        moto_server,
        extra_args=[
            "--write-back-delay",
            "0",
            "--shutdown-drain-timeout",
            f"{SHUTDOWN_DRAIN_S:g}",
        ],
    )
    gw.start()
    try:
        started = time.monotonic()
        answer = gw.drain(bucket=bucket, timeout=DRAIN_TIMEOUT_S)
        # Answered once nothing but failed objects (and the marker behind one) was left.
        assert time.monotonic() - started < DRAIN_TIMEOUT_S / 2, answer
        assert answer["drained"] is False
        assert answer["failed_objects"] > 0 and answer["held_objects"] == 1, answer
        assert answer["pending_objects"] == answer["failed_objects"] + 1, answer

        status = gw.status()
        assert status["failed_objects"] == answer["failed_objects"]
        assert status["flushing_objects"] == 0
        assert status["last_error"]
        metrics = gw.admin_request("GET", "/metrics").body.decode()
        assert _metric(metrics, "gateway_failed_objects") == answer["failed_objects"]

        shard = gw.object_state(bucket, "ckpt/bad/shard-1")
        assert shard["state"] == "failed" and "x-amz-meta-a" in shard["last_error"]
        assert gw.object_state(bucket, "ckpt/bad/.metadata")["state"] == "pending"

        # SIGTERM waits for nothing that only an operator can unstick.
        started = time.monotonic()
        assert gw.stop(timeout=SHUTDOWN_DRAIN_S + 30) == 0
        assert time.monotonic() - started < SHUTDOWN_DRAIN_S / 2

        # A restart on the same journal starts, keeps the failures, and flushes new writes.
        gw.start()
        gw.client().put_object(Bucket=bucket, Key="after/restart", Body=BODY)
        assert gw.drain(bucket=bucket, prefix="after/", timeout=30)["drained"] is True
        again = gw.drain(bucket=bucket, timeout=DRAIN_TIMEOUT_S)
        assert again["failed_objects"] == answer["failed_objects"], again
    finally:
        gw.stop()

    rows = {row.meta.key: row for row in _rows(data_dir, bucket)}
    failed = [row for row in rows.values() if row.state is FlushState.FAILED]
    assert len(failed) == answer["failed_objects"]
    for row in failed:
        assert row.last_error and row.attempts >= 1, row
        assert _upstream_body(upstream, bucket, row.meta.key) is None
    for key, row in rows.items():
        if key == "ckpt/bad/.metadata":
            assert row.state is FlushState.PENDING  # held behind its failed shard
            assert _upstream_body(upstream, bucket, key) is None
        elif row.state is not FlushState.FAILED:
            assert row.state is FlushState.DURABLE, row
            assert _upstream_body(upstream, bucket, key) == BODY, key
    # Deliberately hostile rows failed; the clean ones and the clean checkpoint did not.
    assert {f"clean/{i:03d}" for i in range(CLEAN_ROWS)} <= {
        k for k, r in rows.items() if r.state is FlushState.DURABLE
    }
    assert rows["ckpt/good/.metadata"].state is FlushState.DURABLE
    assert rows["rows/" + HeaderCase("x-amz-meta-a", "café").ident].state is FlushState.FAILED
    # S3 keeps any Expires string: it is sent as a raw header, not a botocore timestamp.
    assert rows["rows/" + HeaderCase("expires", "garbage").ident].state is FlushState.DURABLE
    # The tombstone of a key with control characters: failed with its error, or applied.
    tombstone = rows.get("rows/del-ctl\x01\x7f")
    assert tombstone is None or (tombstone.state is FlushState.FAILED and tombstone.is_delete)
