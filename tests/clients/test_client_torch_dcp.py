"""torch.distributed.checkpoint through fsspec (s3fs) against the gateway.

Single process, no process group: DCP runs its no-dist path. The writer gets s3fs's options
as keyword arguments (``FsspecWriter(path, **storage_options)`` hands them to
``fsspec.url_to_fs``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from clientutil import sha256, upstream_keys
from harness import GATEWAY_ACCESS_KEY, GATEWAY_SECRET_KEY, REGION, GatewayProcess, read_body
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def storage_options(gw: GatewayProcess) -> dict[str, Any]:
    return {
        "key": GATEWAY_ACCESS_KEY,
        "secret": GATEWAY_SECRET_KEY,
        "client_kwargs": {"endpoint_url": gw.endpoint, "region_name": REGION},
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }


def make_model_and_optimizer(seed: int) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    # One step so Adam has state (exp_avg, exp_avg_sq, step) to checkpoint.
    x = torch.randn(8, 64)
    model(x).pow(2).mean().backward()
    optim.step()
    optim.zero_grad()
    return model, optim


def snapshot(model: Any, optim: Any) -> dict[str, Any]:
    """A deep copy of the FQN-keyed model + optimizer state (for exact comparison)."""
    msd, osd = get_state_dict(model, optim)
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)
        elif isinstance(value, torch.Tensor):
            out[prefix] = value.detach().clone()
        else:
            out[prefix] = value

    walk("model", msd)
    walk("optim", osd)
    return out


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype, k
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_dcp_save_load_via_fsspec(
    gateway: GatewayProcess, s3: Any, upstream: Any, bucket: str
) -> None:
    path = f"s3://{bucket}/ckpt/step_1"
    model, optim = make_model_and_optimizer(seed=1)
    saved = snapshot(model, optim)
    msd, osd = get_state_dict(model, optim)
    # Versioned upstream: any upload of a temporary key would leave a trace.
    upstream.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    with gateway.flush_paused():  # everything DCP writes stays pending until the save is done
        dcp.save(
            {"model": msd, "optim": osd},
            storage_writer=FsspecWriter(path, **storage_options(gateway)),
        )

    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert "ckpt/step_1/.metadata" in keys
    assert any(k.endswith(".distcp") for k in keys), keys

    # A different model (other seed): loading must overwrite every tensor and step.
    model2, optim2 = make_model_and_optimizer(seed=2)
    before = snapshot(model2, optim2)
    assert any(
        isinstance(v, torch.Tensor) and not torch.equal(v, before[k])
        for k, v in saved.items()
        if k.startswith("model.")
    )
    msd2, osd2 = get_state_dict(model2, optim2)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, storage_reader=FsspecReader(path, **storage_options(gateway)))
    set_state_dict(model2, optim2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert_same(saved, snapshot(model2, optim2))

    # The commit marker (.metadata) reaches the bucket, and only with its shards.
    gateway.drained(bucket=bucket, prefix="ckpt/step_1/")
    assert upstream_keys(upstream, bucket, "ckpt/") == keys
    for key in keys:
        ours = read_body(s3.get_object(Bucket=bucket, Key=key))
        theirs = read_body(upstream.get_object(Bucket=bucket, Key=key))
        assert sha256(ours) == sha256(theirs), key
    # DCP writes .metadata.tmp and renames it (copy + delete) while it is still pending:
    # only the final keys ever reached the bucket, each exactly once.
    history = upstream.list_object_versions(Bucket=bucket, Prefix="ckpt/")
    assert history.get("DeleteMarkers", []) == []
    assert sorted(v["Key"] for v in history.get("Versions", [])) == keys
