"""One fetch per node: concurrent GETs of a remote object share one upstream transfer made
of parallel ranged GETs, the copy lands in the cache, a lone range read fetches only its
range, and a local write during the transfer wins.

The upstream is the throttling emulator (loadtest/emulator.py) over real sockets: its
request log counts every upstream request and byte, so "one fetch" is measured, not
assumed. Bandwidth limits stretch a transfer so that readers really overlap; nothing here
asserts a duration.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import IncompleteReadError, ResponseStreamingError
from harness import (
    GatewayProcess,
    payload,
    quoted_md5,
    read_body,
    s3_client,
    stop_all,
    unique_bucket_name,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

from emulator import EmulatorThread
from urllib3.exceptions import HTTPError as Urllib3Error

KiB = 1024
MiB = 1024 * KiB
_TRUNCATED = (IncompleteReadError, ResponseStreamingError, Urllib3Error)


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    with EmulatorThread(latency_ms=0, min_part_size=5 * MiB) as server:
        yield server


@pytest.fixture
def origin(emu: EmulatorThread) -> Any:
    return s3_client(emu.url, access_key="k", secret_key="s", retries=3)


@pytest.fixture
def ebucket(origin: Any) -> str:
    name = unique_bucket_name("fill")
    origin.create_bucket(Bucket=name)
    return name


@pytest.fixture
def gw_factory(emu: EmulatorThread, tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def make(*extra: str) -> GatewayProcess:
        gateway = GatewayProcess(tmp_path / f"data{len(started)}", emu.url, extra_args=extra)
        started.append(gateway)
        return gateway.start()

    try:
        yield make
    finally:
        stop_all(started)


@pytest.fixture
def gw(gw_factory: Callable[..., GatewayProcess]) -> GatewayProcess:
    return gw_factory()


def _gets(emu: EmulatorThread, key: str) -> list[dict[str, Any]]:
    return [e for e in emu.log if e["op"] == "GetObject" and e["key"] == key]


def _upstream_bytes(emu: EmulatorThread, key: str) -> int:
    return sum(int(e["bytes_out"]) for e in _gets(emu, key))


def _together(n: int, fn: Callable[[int], bytes]) -> list[bytes]:
    """Run ``fn(i)`` in ``n`` threads released at once; their results in order."""
    barrier = threading.Barrier(n)
    out: list[bytes | BaseException] = [b""] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except BaseException as exc:  # re-raised below, in the test's thread
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for result in out:
        if isinstance(result, BaseException):
            raise result
    return [r for r in out if isinstance(r, bytes)]


def _wait_state(gw: GatewayProcess, bucket: str, key: str, state: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = gw.admin_request("GET", f"/admin/v1/objects/{bucket}/{key}")
        if got.status == 200 and got.json()["state"] == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"{key} never became {state}")


def test_eight_readers_of_one_remote_object_cost_the_bucket_one_read(
    emu: EmulatorThread, origin: Any, ebucket: str, gw: GatewayProcess
) -> None:
    body = payload(20 * MiB + 123, seed="shard")
    origin.put_object(Bucket=ebucket, Key="ckpt/step_1/shard", Body=body)
    emu.emulator.configure(bandwidth=20 * MiB)  # about a second: the readers overlap
    s3 = gw.client()
    clients = [gw.client() for _ in range(8)]

    def read(i: int) -> bytes:
        got = clients[i].get_object(Bucket=ebucket, Key="ckpt/step_1/shard")
        assert got["ETag"] == quoted_md5(body)
        return read_body(got)

    assert all(b == body for b in _together(8, read))
    _wait_state(gw, ebucket, "ckpt/step_1/shard", "durable")  # every GET is logged by now
    gets = _gets(emu, "ckpt/step_1/shard")
    assert _upstream_bytes(emu, "ckpt/step_1/shard") == len(body)  # 1.00x
    assert len(gets) == 3  # 8 MiB ranged GETs: 0-8, 8-16, 16-20 MiB
    assert all(e["range"] and e["status"] == 206 for e in gets)
    # The ranged GETs ran side by side, not one after the other.
    starts = sorted(e["ts"] for e in gets)
    assert any(e["ts_end"] > starts[-1] for e in gets if e["ts"] < starts[-1])

    emu.emulator.configure(bandwidth=0)
    again = s3.get_object(Bucket=ebucket, Key="ckpt/step_1/shard")
    assert read_body(again) == body
    assert len(_gets(emu, "ckpt/step_1/shard")) == 3  # the next reader reads the cache


def test_parallel_ranged_fetch_of_a_multipart_object_is_exact(
    emu: EmulatorThread, origin: Any, ebucket: str, gw: GatewayProcess
) -> None:
    parts = [payload(7 * MiB, seed=f"mp{i}") for i in range(3)] + [payload(MiB + 1, seed="end")]
    whole = b"".join(parts)
    upload = origin.create_multipart_upload(Bucket=ebucket, Key="mp/obj")
    etags = [
        origin.upload_part(
            Bucket=ebucket, Key="mp/obj", UploadId=upload["UploadId"], PartNumber=n, Body=p
        )["ETag"]
        for n, p in enumerate(parts, 1)
    ]
    origin.complete_multipart_upload(
        Bucket=ebucket,
        Key="mp/obj",
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    etag = origin.head_object(Bucket=ebucket, Key="mp/obj")["ETag"]
    s3 = gw.client()
    got = s3.get_object(Bucket=ebucket, Key="mp/obj")
    assert got["ETag"] == etag and got["ContentLength"] == len(whole)
    data = read_body(got)
    assert hashlib.md5(data).hexdigest() == hashlib.md5(whole).hexdigest()
    # Kept part by part (each part's MD5 checked against the ETag), served locally after.
    _wait_state(gw, ebucket, "mp/obj", "durable")
    gets = _gets(emu, "mp/obj")
    assert len(gets) == 3 and _upstream_bytes(emu, "mp/obj") == len(whole)
    assert [p.stat().st_size for p in gw.blob_files(ebucket, "mp/obj")] == [len(p) for p in parts]
    ranged = s3.get_object(Bucket=ebucket, Key="mp/obj", Range=f"bytes={7 * MiB - 5}-{14 * MiB}")
    assert read_body(ranged) == whole[7 * MiB - 5 : 14 * MiB + 1]
    assert len(_gets(emu, "mp/obj")) == 3


def test_lone_range_read_fetches_only_its_range(
    emu: EmulatorThread, origin: Any, ebucket: str, gw: GatewayProcess
) -> None:
    body = payload(12 * MiB, seed="lone")
    origin.put_object(Bucket=ebucket, Key="one/obj", Body=body)
    s3 = gw.client()
    got = s3.get_object(Bucket=ebucket, Key="one/obj", Range="bytes=1000-1999")
    assert read_body(got) == body[1000:2000]
    assert got["ContentRange"] == f"bytes 1000-1999/{len(body)}"
    assert _upstream_bytes(emu, "one/obj") == 1000
    assert gw.admin_request("GET", f"/admin/v1/objects/{ebucket}/one/obj").status == 404


def test_concurrent_range_reads_fetch_the_object_once_plus_one_range(
    emu: EmulatorThread, origin: Any, ebucket: str, gw: GatewayProcess
) -> None:
    body = payload(16 * MiB, seed="ranges")
    origin.put_object(Bucket=ebucket, Key="r/obj", Body=body)
    emu.emulator.configure(bandwidth=16 * MiB)
    clients = [gw.client() for _ in range(8)]
    spans = [(i * 2 * MiB + 17, (i + 1) * 2 * MiB - 1) for i in range(8)]

    def read(i: int) -> bytes:
        a, b = spans[i]
        return read_body(clients[i].get_object(Bucket=ebucket, Key="r/obj", Range=f"bytes={a}-{b}"))

    got = _together(8, read)
    assert got == [body[a : b + 1] for a, b in spans]
    _wait_state(gw, ebucket, "r/obj", "durable")  # the fill's last GETs are logged by now
    largest = max(b - a + 1 for a, b in spans)
    assert len(body) <= _upstream_bytes(emu, "r/obj") <= len(body) + largest


def test_local_write_during_a_fill_wins(
    emu: EmulatorThread, origin: Any, ebucket: str, gw: GatewayProcess
) -> None:
    old = payload(12 * MiB, seed="old")
    origin.put_object(Bucket=ebucket, Key="w/obj", Body=old)
    emu.emulator.configure(bandwidth=8 * MiB)  # 1.5 s to fetch
    s3 = gw.client()
    stream = s3.get_object(Bucket=ebucket, Key="w/obj")["Body"]
    first = stream.read(MiB)
    new = payload(64 * KiB, seed="new")
    s3.put_object(Bucket=ebucket, Key="w/obj", Body=new)
    assert first + stream.read() == old  # the reader that began before the write
    got = s3.get_object(Bucket=ebucket, Key="w/obj")
    assert read_body(got) == new and got["ETag"] == quoted_md5(new)
    emu.emulator.configure(bandwidth=0)
    gw.drained(bucket=ebucket)
    assert read_body(s3.get_object(Bucket=ebucket, Key="w/obj")) == new
    assert read_body(origin.get_object(Bucket=ebucket, Key="w/obj")) == new


def test_object_replaced_upstream_mid_fill_is_cut_never_mixed(
    emu: EmulatorThread, origin: Any, ebucket: str, gw_factory: Callable[..., GatewayProcess]
) -> None:
    gw = gw_factory("--read-part-size", "1MiB")  # 24 ranged GETs, 8 at a time
    old = payload(24 * MiB, seed="v1")
    new = payload(3 * KiB, seed="v2")
    origin.put_object(Bucket=ebucket, Key="x/obj", Body=old)
    emu.emulator.configure(bandwidth=8 * MiB)
    s3 = gw.client()
    stream = s3.get_object(Bucket=ebucket, Key="x/obj")["Body"]
    first = stream.read(MiB)
    origin.put_object(Bucket=ebucket, Key="x/obj", Body=new)  # ranged GETs after: 412
    with pytest.raises(_TRUNCATED):
        stream.read()
    assert first == old[:MiB]
    assert any(e["status"] == 412 for e in _gets(emu, "x/obj"))
    assert gw.admin_request("GET", f"/admin/v1/objects/{ebucket}/x/obj").status == 404
    emu.emulator.configure(bandwidth=0)
    fresh = s3.get_object(Bucket=ebucket, Key="x/obj")
    assert read_body(fresh) == new and fresh["ETag"] == quoted_md5(new)


def test_reads_draw_on_the_flush_bandwidth_budget(
    emu: EmulatorThread, origin: Any, ebucket: str, gw_factory: Callable[..., GatewayProcess]
) -> None:
    """--flush-bandwidth is the upstream budget of reads too: 12 MiB at 4 MiB/s (a 4 MiB
    burst) cannot be fetched in less than about 2 s, however fast the upstream is."""
    gw = gw_factory("--flush-bandwidth", "4MiB", "--read-part-size", "2MiB")
    body = payload(12 * MiB, seed="budget")
    origin.put_object(Bucket=ebucket, Key="b/obj", Body=body)
    assert read_body(gw.client().get_object(Bucket=ebucket, Key="b/obj")) == body
    starts = sorted(e["ts"] for e in _gets(emu, "b/obj"))
    assert len(starts) == 6 and starts[-1] - starts[0] >= 1.0  # a lower bound only


def test_shutdown_during_a_fill_leaves_nothing_behind(
    emu: EmulatorThread, origin: Any, ebucket: str, gw: GatewayProcess
) -> None:
    body = payload(16 * MiB, seed="stop")
    origin.put_object(Bucket=ebucket, Key="s/obj", Body=body)
    emu.emulator.configure(bandwidth=2 * MiB)  # eight seconds to fetch
    started = gw.admin_request("POST", f"/admin/v1/prefetch?bucket={ebucket}&prefix=s/")
    assert started.status == 202
    deadline = time.monotonic() + 10
    while not _gets(emu, "s/obj") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gw.stop() == 0  # the fill is cancelled: nothing waits for it
    assert "Traceback" not in gw.log_tail(300)
    emu.emulator.configure(bandwidth=0)
    gw.start()
    assert gw.admin_request("GET", f"/admin/v1/objects/{ebucket}/s/obj").status == 404
    assert not any((gw.data_dir / "tmp").iterdir())
    assert read_body(gw.client().get_object(Bucket=ebucket, Key="s/obj")) == body


def test_a_copy_that_does_not_match_its_etag_is_served_and_not_kept(
    tmp_path: Path,
) -> None:
    """The emulator without bodies answers zeros under the ETag of what was written: a
    body that does not hash to its ETag, as an SSE-KMS object's. Readers get what the
    upstream sends (as from S3 directly); the copy is not kept, and reads stay upstream."""
    with EmulatorThread(latency_ms=0, store_bodies=False) as emu:
        origin = s3_client(emu.url, access_key="k", secret_key="s", retries=3)
        origin.create_bucket(Bucket="enc")
        origin.put_object(Bucket="enc", Key="kms/obj", Body=payload(10 * MiB, seed="kms"))
        gw = GatewayProcess(tmp_path / "data", emu.url).start()
        try:
            got = gw.client().get_object(Bucket="enc", Key="kms/obj")
            assert read_body(got) == bytes(10 * MiB)
            assert got["ETag"] == quoted_md5(payload(10 * MiB, seed="kms"))
            deadline = time.monotonic() + 30
            while "not kept" not in gw.log_tail(50) and time.monotonic() < deadline:
                time.sleep(0.05)  # the fill's end is logged
            assert "not kept" in gw.log_tail(50)
            assert gw.admin_request("GET", "/admin/v1/objects/enc/kms/obj").status == 404
        finally:
            gw.stop()
