"""Crash soak: SIGKILL the gateway at many random acknowledgement counts under concurrent
PUT + multipart load (tests/faults/crashload.py), restart it each time and check every key;
at the end drain and compare the upstream (moto) with what clients were told.

    .venv/bin/python loadtest/crash_soak.py --kills 200 --workers 6
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "faults"), str(ROOT / "tests")]

from crashload import CrashLoad, count_blob_files, drain_and_check_upstream  # noqa: E402
from harness import GatewayProcess, start_moto, unique_bucket_name, upstream_client  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--max-acks-between", type=int, default=12)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    moto, url = start_moto()
    upstream = upstream_client(url)
    bucket = unique_bucket_name("soak")
    upstream.create_bucket(Bucket=bucket)
    with tempfile.TemporaryDirectory(prefix="gw-soak-") as tmp:
        gw = GatewayProcess(Path(tmp) / "data", url, extra_args=["--write-back-delay", "0.2"])
        gw.start()
        try:
            load = CrashLoad(gw, bucket, workers=args.workers, seed=seed, log=print)
            stats = load.run(args.kills, args.max_acks_between)
            gw.kill()
            gw.start()
            load.verify()
            s3 = gw.client()
            for upload in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                s3.abort_multipart_upload(
                    Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
            expected, open_uploads = drain_and_check_upstream(load, upstream, timeout_s=300)
            wanted = sum(2 if v.etag.endswith('-2"') else 1 for v in expected.values())
            assert count_blob_files(gw) <= wanted, (count_blob_files(gw), wanted)
        finally:
            gw.stop()
            moto.stop()
    print(f"seed={seed} {stats}; {len(expected)} objects verified upstream")
    if open_uploads:
        print(f"FAIL: upstream multipart uploads left open : {open_uploads}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
