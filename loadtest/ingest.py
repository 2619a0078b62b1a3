"""Ingest bandwidth of the gateway against the disk and one core's MD5, in one run.

What it measures (all on the gateway's own filesystem, in the same run):

1. **Raw disk**: N threads each write a 64 MiB file (1 MiB writes) and fsync it, for N = 1
   and N = ``--streams``: the bandwidth a perfect writer gets.
2. **MD5**: one core hashing 64 MiB (hashlib): the ceiling of one stream's ingest, since
   every body's MD5 (its ETag) must be computed.
3. **Gateway**: the same N PutObject bodies of 64 MiB at once, through the S3 API
   (pre-signed ``UNSIGNED-PAYLOAD`` requests on raw HTTP connections, so the client costs
   only its ``sendall``), flushing paused. Each response must be 200 with the body's MD5.
   With ``--multipart`` each stream is a multipart upload of 8 MiB parts instead.

It prints bandwidths and the ratios the issue asks for: N streams against the raw disk's
N-writer bandwidth, and one stream against min(raw disk, one core's MD5), plus the
gateway's peak resident memory (``VmHWM``) and its RSS after the run.

Run: ``flock /tmp/bench.lock .venv/bin/python loadtest/ingest.py [--streams 16]``.
The client and the gateway share the machine's cores: on 2 cores the client's sends and
the gateway's receives, hashes and writes compete; the ratio is what this machine allows.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from ack_latency import GatewayProcess, admin_call, machine_facts
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

MiB = 1 << 20
KEY, SECRET, BUCKET = "bench", "bench-secret-key", "demo"
_UNSIGNED = Config(s3={"payload_signing_enabled": False})


def raw_disk(directory: Path, streams: int, size: int) -> float:
    """Bytes/s of ``streams`` threads each writing and fsyncing one ``size`` file."""
    chunk = os.urandom(MiB)

    def one(i: int) -> None:
        path = directory / f"raw-{streams}-{i}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(size // MiB):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        list(pool.map(one, range(streams)))
    took = time.perf_counter() - t0
    for i in range(streams):
        (directory / f"raw-{streams}-{i}").unlink()
    return streams * size / took


def md5_rate(size: int) -> float:
    data = os.urandom(size)
    t0 = time.perf_counter()
    hashlib.md5(data).hexdigest()
    return size / (time.perf_counter() - t0)


class Client:
    """Signed requests on one raw HTTP connection (the body sent with one sendall)."""

    def __init__(self, endpoint: str) -> None:
        parts = urllib.parse.urlsplit(endpoint)
        self.netloc = parts.netloc
        self.endpoint = endpoint
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
        self.signer = S3SigV4Auth(Credentials(KEY, SECRET), "s3", "us-east-1")

    def request(
        self, method: str, path: str, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        req = AWSRequest(
            method=method,
            url=self.endpoint + path,
            headers={
                "Host": self.netloc,
                "Content-Length": str(len(body)),
                "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
            },
        )
        req.context["client_config"] = _UNSIGNED
        self.signer.add_auth(req)
        self.conn.request(method, path, body=body, headers=dict(req.headers.items()))
        resp = self.conn.getresponse()
        payload = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload


def put_stream(endpoint: str, key: str, body: bytes, md5_hex: str, part_bytes: int) -> None:
    """One stream: a PutObject (or a multipart upload) of ``body``, checked (the expected
    MD5 is computed before the clock starts, so the client's own hashing is not timed)."""
    client = Client(endpoint)
    path = f"/{BUCKET}/{key}"
    if part_bytes <= 0:
        status, headers, payload = client.request("PUT", path, body)
        etag = headers.get("etag", "").strip('"')
        if status != 200 or etag != md5_hex:
            raise RuntimeError(f"PUT {key}: {status} {etag} {payload[:200]!r}")
        return
    status, _, payload = client.request("POST", path + "?uploads")
    upload_id = payload.split(b"<UploadId>")[1].split(b"</UploadId>")[0].decode()
    etags = []
    for n, start in enumerate(range(0, len(body), part_bytes), 1):
        piece = body[start : start + part_bytes]
        status, headers, payload = client.request(
            "PUT", f"{path}?partNumber={n}&uploadId={urllib.parse.quote(upload_id)}", piece
        )
        if status != 200:
            raise RuntimeError(f"UploadPart {key} {n}: {status} {payload[:200]!r}")
        etags.append(headers["etag"])
    doc = "".join(
        f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in enumerate(etags, 1)
    )
    body_xml = f"<CompleteMultipartUpload>{doc}</CompleteMultipartUpload>".encode()
    status, _, payload = client.request(
        "POST", f"{path}?uploadId={urllib.parse.quote(upload_id)}", body_xml
    )
    if status != 200 or b"<ETag>" not in payload:
        raise RuntimeError(f"Complete {key}: {status} {payload[:200]!r}")


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0])
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def gateway_ingest(gw: GatewayProcess, streams: int, size: int, part_bytes: int, tag: str) -> float:
    bodies = [os.urandom(size) for _ in range(streams)]
    md5s = [hashlib.md5(b).hexdigest() for b in bodies]
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], rss_kib(gw.proc.pid)[0])

    watcher = threading.Thread(target=watch)
    watcher.start()
    t0 = time.perf_counter()
    try:
        with concurrent.futures.ThreadPoolExecutor(streams) as pool:
            list(
                pool.map(
                    lambda i: put_stream(
                        gw.endpoint, f"ingest/{tag}/{i}", bodies[i], md5s[i], part_bytes
                    ),
                    range(streams),
                )
            )
    finally:
        took = time.perf_counter() - t0
        done.set()
        watcher.join()
    gateway_ingest.peak_rss_kib = max(getattr(gateway_ingest, "peak_rss_kib", 0), peak[0])  # type: ignore[attr-defined]
    return streams * size / took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--size-mib", type=int, default=64)
    p.add_argument("--multipart", action="store_true", help="8 MiB parts per stream")
    p.add_argument("--rounds", type=int, default=2, help="gateway rounds per stream count")
    p.add_argument("--gateway-arg", action="append", default=[])
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    size = args.size_mib * MiB
    part_bytes = 8 * MiB if args.multipart else 0
    work = Path(tempfile.mkdtemp(prefix=".ingest-", dir=Path.cwd()))
    gw: GatewayProcess | None = None
    result: dict[str, Any] = {"streams": args.streams, "size_mib": args.size_mib}
    try:
        data = work / "data"
        data.mkdir()
        result["machine"] = machine_facts(data)
        gw = GatewayProcess(data, work / "gateway.log", KEY, SECRET, args.gateway_arg)
        gw.wait_ready(90)
        admin_call(gw.admin, "POST", "/admin/v1/flush/pause")
        rows = []
        for n in (1, args.streams):
            raw = [raw_disk(data, n, size) for _ in range(args.rounds)]
            gws = [gateway_ingest(gw, n, size, part_bytes, f"{n}-{r}") for r in range(args.rounds)]
            rows.append((n, max(raw), max(gws), raw, gws))
        md5 = max(md5_rate(size) for _ in range(3))
        rss, hwm = rss_kib(gw.proc.pid)
        result.update(
            md5_mib_s=md5 / MiB,
            gateway_rss_mib=rss / 1024,
            gateway_peak_rss_mib=hwm / 1024,
            sampled_peak_rss_mib=getattr(gateway_ingest, "peak_rss_kib", 0) / 1024,
            rows=[
                {
                    "streams": n,
                    "raw_mib_s": r / MiB,
                    "gateway_mib_s": g / MiB,
                    "raw_runs": [x / MiB for x in rs],
                    "gateway_runs": [x / MiB for x in gs],
                }
                for n, r, g, rs, gs in rows
            ],
        )
        kind = "multipart, 8 MiB parts" if part_bytes else "single PUT"
        print(f"\nIngest of {args.size_mib} MiB bodies ({kind}), flushing paused")
        print(f"{'streams':>8} | {'raw MiB/s':>10} | {'gateway MiB/s':>14} | ratio | raw/gw runs")
        for n, r, g, rs, gs in rows:
            runs = ", ".join(f"{a / MiB:.0f}/{b / MiB:.0f}" for a, b in zip(rs, gs, strict=True))
            print(f"{n:>8} | {r / MiB:>10.0f} | {g / MiB:>14.0f} | {g / r:5.2f} | {runs}")
        one_raw, one_gw = rows[0][1], rows[0][2]
        ceiling = min(one_raw, md5)
        print(
            f"one core's MD5: {md5 / MiB:.0f} MiB/s; one stream vs min(raw, MD5) = "
            f"{one_gw / MiB:.0f} / {ceiling / MiB:.0f} = {one_gw / ceiling:.2f}"
        )
        print(f"gateway RSS {rss / 1024:.0f} MiB now, peak (VmHWM) {hwm / 1024:.0f} MiB")
        result["one_stream_vs_ceiling"] = one_gw / ceiling
        result["many_streams_vs_raw"] = rows[-1][2] / rows[-1][1]
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
    finally:
        if gw is not None:
            gw.stop(60)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
