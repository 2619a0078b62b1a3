"""A two-rank ``torch.distributed.checkpoint`` save across a fleet (docs/fleet.md): each
rank's fsspec writer on its own node's gateway (rank 0 on a, rank 1 on b), then a load
through a third gateway (c) while b still holds rank 1's shard unflushed. The upstream must
never show ``.metadata`` before both ranks' shards; the load returns equal tensors.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from dcp_fleet_worker import state
from fleetutil import fleet_of, running, until
from harness import REPO_ROOT, free_port, upstream_objects
from test_client_torch_dcp import storage_options
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

NAMES = ("a", "b", "c")


@pytest.fixture
def fleet(moto_server: str, tmp_path: Any) -> Iterator[list[Any]]:
    with running(fleet_of(tmp_path, moto_server, NAMES), NAMES) as gateways:
        yield gateways


def _save(a: Any, b: Any, path: str) -> None:
    port = free_port()
    worker = str(REPO_ROOT / "tests" / "clients" / "dcp_fleet_worker.py")
    ranks = [
        subprocess.Popen(
            [sys.executable, worker, str(rank), "2", str(port), gw.endpoint, path],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank, gw in enumerate((a, b))
    ]
    for rank, proc in enumerate(ranks):
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"rank {rank} failed:\n{out.decode(errors='replace')}"


def test_two_ranks_on_two_gateways_then_a_load_through_a_third(
    fleet: list[Any], upstream: Any, bucket: str
) -> None:
    a, b, c = fleet
    path = f"s3://{bucket}/ckpt/step_1"
    b.pause_flush()  # rank 1's shard stays on b: only the fleet fence keeps .metadata back
    _save(a, b, path)
    prefix = "ckpt/step_1/"
    marker = prefix + ".metadata"
    until(lambda: a.object_state(bucket, marker)["state"] == "pending")
    until(lambda: a.object_state(bucket, prefix + "__0_0.distcp")["state"] == "durable")
    assert marker not in upstream_objects(upstream, bucket, prefix)
    assert c.drain(bucket=bucket, prefix=prefix, wait=False)["drained"] is False

    # A resumed job loads through another node: rank 1's shard comes from b, .metadata from a.
    loaded = {k: torch.zeros_like(v) for r in (0, 1) for k, v in state(r).items()}
    dcp.load(loaded, storage_reader=FsspecReader(path, **storage_options(c)), no_dist=True)
    for rank in (0, 1):
        for key, value in state(rank).items():
            assert torch.equal(loaded[key], value), key

    b.resume_flush()
    deadline = time.monotonic() + 60
    while True:
        seen = upstream_objects(upstream, bucket, prefix)
        if marker in seen:
            shards = [k for k in seen if k.endswith(".distcp")]
            assert sorted(shards) == [prefix + "__0_0.distcp", prefix + "__1_0.distcp"], seen
            break
        assert time.monotonic() < deadline, "the marker never reached the bucket"
    assert c.drained(bucket=bucket, prefix=prefix)["drained"]
