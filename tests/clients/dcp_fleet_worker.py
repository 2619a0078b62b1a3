"""One rank of a multi-process ``torch.distributed.checkpoint`` save (gloo, CPU) whose
storage writer points at its own node's gateway (test_client_dcp_fleet.py runs it).

Each rank checkpoints a tensor of its own and a replicated one; rank 0 writes the commit
marker (``.metadata``) after DCP's barrier. Usage:
``python dcp_fleet_worker.py RANK WORLD MASTER_PORT ENDPOINT PATH``.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

ACCESS_KEY = "GWTESTACCESSKEY00001"
SECRET_KEY = "gw-test-secret/0123456789abcdefghijklmnopqrst"


def state(rank: int) -> dict[str, torch.Tensor]:
    """What rank ``rank`` saves: its own tensor and the replicated one (deterministic)."""
    own = torch.Generator().manual_seed(1000 + rank)
    shared = torch.Generator().manual_seed(7)
    return {
        f"rank{rank}.weight": torch.randn(256, 64, generator=own),
        "shared.bias": torch.randn(64, generator=shared),
    }


def main() -> None:
    rank, world, port, endpoint, path = sys.argv[1:6]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=int(world)
    )
    options = {
        "key": ACCESS_KEY,
        "secret": SECRET_KEY,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }
    dcp.save(state(int(rank)), storage_writer=FsspecWriter(path, **options))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
