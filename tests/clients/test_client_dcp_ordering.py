"""Commit ordering seen from the real bucket: a torch DCP save through s3torchconnector (the
AWS CRT client) into the gateway, whose upstream is the throttling S3 emulator
(``loadtest/emulator.py``). The emulator's request log says in which order the objects
were created upstream; its store says what they hold.

What DCP + s3torchconnector send (see test_client_s3torchconnector.py): every file as a
multipart upload (even a few bytes), ``.metadata`` last, written as ``.metadata.tmp`` and
renamed with CopyObject + DeleteObject. The gateway flushes the copy with the same part
boundaries, so upstream ``.metadata`` is created by a CompleteMultipartUpload too.

Gateway flags are the defaults: the rename comes milliseconds after the write, well inside
the 10 s ``--temp-hold`` and the 0.5 s ``--write-back-delay``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from clientutil import MiB
from harness import (
    GATEWAY_ACCESS_KEY,
    GATEWAY_SECRET_KEY,
    REGION,
    REPO_ROOT,
    GatewayProcess,
    read_body,
)
from s3torchconnector import S3ClientConfig
from s3torchconnector.dcp import S3StorageReader, S3StorageWriter

sys.path.insert(0, str(REPO_ROOT / "loadtest"))

from emulator import EmulatorThread

BUCKET = "dcp-ordering"
CREATES = ("PutObject", "CompleteMultipartUpload")
WRITES = (*CREATES, "CreateMultipartUpload", "UploadPart")


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorThread]:
    # 1 MB/s shared by all uploads: the shards are still in flight when .metadata becomes
    # eligible, so only the commit-ordering gate can keep it back.
    with EmulatorThread(latency_ms=5, bandwidth=1_000_000, buckets=[BUCKET]) as emu:
        yield emu


@pytest.fixture(scope="module")
def emu_gateway(
    emulator: EmulatorThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("dcp-ordering")
    gw = GatewayProcess(base / "data", emulator.url)
    gw.start()
    try:
        yield gw
    finally:
        crashed = gw.crashed
        gw.stop()
        if crashed:
            pytest.fail(f"gateway died during the tests:\n{gw.log_tail()}", pytrace=False)


@pytest.fixture
def crt_config(emu_gateway: GatewayProcess, monkeypatch: pytest.MonkeyPatch) -> S3ClientConfig:
    """The CRT client pointed at the gateway (it reads the endpoint from the environment)."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", emu_gateway.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", GATEWAY_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", GATEWAY_SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    return S3ClientConfig(force_path_style=True, max_attempts=2, part_size=5 * MiB)


def upstream_body(emulator: EmulatorThread, key: str) -> bytes:
    """The bytes the emulator stores for ``key`` (read in-process: no request logged)."""

    def read() -> bytes:
        body = emulator.emulator.buckets[BUCKET].objects[key].blob.body
        assert body is not None
        return bytes(body)

    return bytes(emulator.call(read))


def _end(entry: dict[str, Any]) -> float:
    """When the emulator finished serving a request (its own monotonic clock)."""
    return float(entry["t"]) + float(entry["duration_ms"]) / 1000


def test_dcp_marker_reaches_the_bucket_after_every_shard(
    crt_config: S3ClientConfig,
    emu_gateway: GatewayProcess,
    emulator: EmulatorThread,
) -> None:
    torch.manual_seed(11)
    state = {
        "model": {f"layer{i}.weight": torch.randn(256, 256 + i) for i in range(6)},
        "extra": {"step": torch.tensor(42), "scale": torch.randn(17)},
    }
    expected = {k: v.clone() for k, v in state["model"].items()}
    prefix = "ckpt/run_1/step_42"
    path = f"s3://{BUCKET}/{prefix}"
    marker = f"{prefix}/.metadata"

    # Paused: every file of the checkpoint becomes eligible at the same moment on resume.
    with emu_gateway.flush_paused():
        writer = S3StorageWriter(REGION, path, s3client_config=crt_config, thread_count=4)
        dcp.save(state, storage_writer=writer)
    emu_gateway.drained(bucket=BUCKET, prefix=f"{prefix}/", timeout=120)

    stored = emulator.call(lambda: emulator.emulator.objects(BUCKET, f"{prefix}/"))
    shards = sorted(k for k in stored if k.endswith(".distcp"))
    assert len(shards) >= 4, sorted(stored)
    assert sorted(stored) == sorted([*shards, marker])

    log = [e for e in emulator.log if e["bucket"] == BUCKET and e["key"]]
    assert not [e for e in log if ".metadata.tmp" in e["key"]]
    assert not [e for e in log if e["op"] == "CopyObject"]
    marker_log = [e for e in log if e["key"] == marker]
    created = [e for e in marker_log if e["op"] in CREATES and e["status"] == 200]
    assert len(created) == 1, marker_log
    # Before saving, DCP asks whether .metadata exists: the gateway reads through (404).
    assert {e["op"] for e in marker_log} - set(WRITES) <= {"HeadObject", "GetObject"}
    # The marker's first write request comes after every shard was complete upstream.
    marker_first = min(e["t"] for e in marker_log if e["op"] in WRITES)
    for shard in shards:
        shard_created = [
            e for e in log if e["key"] == shard and e["op"] in CREATES and e["status"] == 200
        ]
        assert len(shard_created) == 1, shard
        assert _end(shard_created[0]) <= marker_first, (shard, shard_created[0], marker_log)

    # Upstream bytes and ETags are what the gateway acknowledged and serves.
    s3 = emu_gateway.client()
    for key in [*shards, marker]:
        got = s3.get_object(Bucket=BUCKET, Key=key)
        assert got["ETag"].strip('"') == stored[key]["etag"], key
        body = upstream_body(emulator, key)
        assert body == read_body(got), key
        assert stored[key]["size"] == len(body), key

    target = {
        "model": {k: torch.zeros_like(v) for k, v in expected.items()},
        "extra": {"step": torch.tensor(0), "scale": torch.zeros(17)},
    }
    dcp.load(target, storage_reader=S3StorageReader(REGION, path, s3client_config=crt_config))
    for k, v in expected.items():
        assert torch.equal(target["model"][k], v), k
    assert int(target["extra"]["step"]) == 42
    assert torch.equal(target["extra"]["scale"], state["extra"]["scale"])
