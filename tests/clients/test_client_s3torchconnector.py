"""s3torchconnector (AWS CRT / mountpoint-s3-client) DCP writer and reader against the gateway.

How it is pointed at a plain-http local endpoint (see README, "s3torchconnector"):
- ``S3StorageWriter``/``S3StorageReader`` take no endpoint argument; the native client reads
  ``AWS_ENDPOINT_URL`` from the environment when it is built (lazily, on first request);
- ``S3ClientConfig(force_path_style=True)``: bucket in the path, no ``<bucket>.127.0.0.1``;
- credentials come from the standard chain: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
  set to the gateway's client credentials (requests are SigV4-signed; not ``unsigned``).

What the CRT sends (mountpoint-s3-client 0.14.1): header SigV4 with
``x-amz-content-sha256: UNSIGNED-PAYLOAD`` and no ``x-amz-checksum-*``; always multipart
(CreateMultipartUpload / UploadPart / Complete), even for a few bytes; reads as ranged GETs,
the second and later ones with ``If-Match: <etag>``; DCP's rename of ``.metadata.tmp`` is a
CopyObject plus a DeleteObject.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from clientutil import MiB, multipart_etag, sha256, split, upstream_keys
from harness import (
    GATEWAY_ACCESS_KEY,
    GATEWAY_SECRET_KEY,
    REGION,
    GatewayProcess,
    read_body,
)
from s3torchconnector import S3Checkpoint, S3ClientConfig
from s3torchconnector.dcp import S3StorageReader, S3StorageWriter


@pytest.fixture
def crt_env(gateway: GatewayProcess, monkeypatch: pytest.MonkeyPatch) -> S3ClientConfig:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", gateway.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", GATEWAY_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", GATEWAY_SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    return S3ClientConfig(force_path_style=True, max_attempts=2, part_size=5 * MiB)


def test_s3checkpoint_put_get_roundtrip(
    crt_env: S3ClientConfig, gateway: GatewayProcess, s3: Any, upstream: Any, bucket: str
) -> None:
    """The plain S3Checkpoint writer/reader: one PUT (or multipart) and one GET via the CRT."""
    checkpoint = S3Checkpoint(region=REGION, endpoint=gateway.endpoint, s3client_config=crt_env)
    data = os.urandom(12 * MiB + 5)  # above part_size: the CRT uploads it as multipart
    with checkpoint.writer(f"s3://{bucket}/raw/blob.bin") as writer:
        for i in range(0, len(data), MiB):
            writer.write(data[i : i + MiB])
    with checkpoint.reader(f"s3://{bucket}/raw/blob.bin") as reader:
        assert sha256(reader.read()) == sha256(data)

    got = s3.get_object(Bucket=bucket, Key="raw/blob.bin")
    assert sha256(read_body(got)) == sha256(data)
    # The CRT always uploads multipart, cutting parts at part_size.
    assert got["ETag"] == multipart_etag(split(data, 5 * MiB))
    gateway.drained(bucket=bucket)
    up = upstream.get_object(Bucket=bucket, Key="raw/blob.bin")
    assert up["ETag"] == got["ETag"]
    assert sha256(read_body(up)) == sha256(data)


def test_dcp_save_load_via_s3torchconnector(
    crt_env: S3ClientConfig, gateway: GatewayProcess, s3: Any, upstream: Any, bucket: str
) -> None:
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    optim = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optim.step()
    state = {"model": model.state_dict(), "extra": {"step": torch.tensor(1)}}
    expected = {k: v.clone() for k, v in state["model"].items()}

    upstream.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    path = f"s3://{bucket}/crt/step_1"
    with gateway.flush_paused():
        dcp.save(state, storage_writer=S3StorageWriter(REGION, path, s3client_config=crt_env))

    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert "crt/step_1/.metadata" in keys, keys
    assert any(k.endswith(".distcp") for k in keys), keys
    # DCP wrote .metadata.tmp and renamed it (CopyObject + DeleteObject).
    assert "crt/step_1/.metadata.tmp" not in keys

    target = {
        "model": {k: torch.zeros_like(v) for k, v in expected.items()},
        "extra": {"step": torch.tensor(0)},
    }
    dcp.load(target, storage_reader=S3StorageReader(REGION, path, s3client_config=crt_env))
    for k, v in expected.items():
        assert torch.equal(target["model"][k], v), k
    assert int(target["extra"]["step"]) == 1

    gateway.drained(bucket=bucket, prefix="crt/step_1/")
    assert upstream_keys(upstream, bucket, "crt/") == keys
    for key in keys:
        assert sha256(read_body(upstream.get_object(Bucket=bucket, Key=key))) == sha256(
            read_body(s3.get_object(Bucket=bucket, Key=key))
        ), key
    # The rename happened while everything was pending: the temporary key never reached
    # the (versioned) bucket, not even as an old version or a delete marker.
    history = upstream.list_object_versions(Bucket=bucket, Prefix="crt/step_1/")
    touched = {v["Key"] for v in history.get("Versions", []) + history.get("DeleteMarkers", [])}
    assert touched == {k for k in keys if k.startswith("crt/step_1/")}
