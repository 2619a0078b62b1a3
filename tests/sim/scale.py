"""The simulator at S3's scale, from the command line (not a test: the cases that run in
``make test`` are in test_sim_scale.py). Each case writes a checkpoint of small objects
into every gateway at t=0, one partition shared by all (``ckpt/``, a fresh bucket), and
prints the drain against the minimum, the 503s, the gateways' finish spread and Jain's
index, and each gateway's window of requests in flight at the end.

    PYTHONPATH=. .venv/bin/python tests/sim/scale.py --rates 60,600,3500 \\
        --gateways 1,8,64 --drain-s 40 --seeds 1,2

``--objects N`` writes N objects per gateway; by default each case is sized so that its
minimum drain is ``--drain-s`` seconds (at least 64 objects per gateway).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from s3sim import Net, Result, S3Model, run

RANKS = 8  # per gateway: one 8-GPU node each


def case(
    rate: float,
    gateways: int,
    objects: int,
    seed: int,
    *,
    burst: float = 0.0,
    net: Net | None = None,
    **opts: object,
) -> Result:
    """One checkpoint of ``objects`` per gateway against one partition of ``rate``."""
    shards = max(1, objects // RANKS)
    s3 = S3Model(rate_per_s=rate, depth=1, burst=burst)
    return run(s3, gateways=gateways, ranks=RANKS, shards=shards, seed=seed, net=net, **opts)


def objects_for(rate: float, gateways: int, drain_s: float) -> int:
    return max(64, int(rate * drain_s / gateways))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rates", default="60,600,3500")
    p.add_argument("--gateways", default="1,8,64")
    p.add_argument("--objects", type=int, default=0, help="per gateway (0: from --drain-s)")
    p.add_argument("--drain-s", type=float, default=40.0)
    p.add_argument("--burst", type=float, default=0.0, help="partition bucket (0: 1 s)")
    p.add_argument("--seeds", default="1")
    args = p.parse_args(argv)
    print("rate/s gateways objects/gw | drain/min  503%  503%>3s  last/first  Jain | windows")
    for rate in (float(r) for r in args.rates.split(",")):
        for gateways in (int(g) for g in args.gateways.split(",")):
            objects = args.objects or objects_for(rate, gateways, args.drain_s)
            for seed in (int(s) for s in args.seeds.split(",")):
                started = time.monotonic()
                r = case(rate, gateways, objects, seed, burst=args.burst)
                windows = sorted(r.windows)
                print(
                    f"{rate:6g} {gateways:8d} {objects:10d} | {r.ratio:8.2f}x "
                    f"{100 * r.share_503:5.2f} {100 * r.share_503_after:7.2f}  "
                    f"{r.finish_spread:10.2f} {r.jain:5.3f} | {windows[0]}-{windows[-1]} "
                    f"(seed {seed}, {r.drain_s:.1f} s simulated, "
                    f"{time.monotonic() - started:.1f} s)",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
