"""The throttling S3 emulator (loadtest/emulator.py), driven by boto3 over real sockets.

Nothing here asserts a duration: throttles are checked through what the emulator answers
and logs, and the token-bucket arithmetic with an injected clock.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import sys
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

from emulator import EmulatorThread, PrefixLimiter, TokenBucket, parse_size, prefix_of
from harness import aws_chunked_unsigned

BUCKET = "emu"


def client(url: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
    )


def get_json(url: str, method: str = "GET") -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorThread]:
    with EmulatorThread(latency_ms=0, buckets=[BUCKET], min_part_size=0) as server:
        yield server


@pytest.fixture(scope="module")
def s3(emu: EmulatorThread) -> Any:
    return client(emu.url)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- arithmetic -----------------------------------------------------------------------------


def test_token_bucket_take_refill_and_burst_cap() -> None:
    clock = FakeClock()
    tb = TokenBucket(rate=2.0, burst=3.0, clock=clock)
    assert [tb.try_take() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.5  # one token back
    assert tb.try_take() and not tb.try_take()
    clock.now += 100  # refill stops at the burst
    assert tb.available() == 3.0


def test_token_bucket_reserve_paces_in_order() -> None:
    clock = FakeClock()
    tb = TokenBucket(rate=1000.0, burst=500.0, clock=clock)  # 1000 B/s
    assert tb.reserve(500) == 0.0  # the burst is free
    assert tb.reserve(1000) == pytest.approx(1.0)  # then 1 s per 1000 B
    assert tb.reserve(500) == pytest.approx(1.5)  # queued behind the previous reservation
    clock.now += 1.5
    assert tb.reserve(0) == pytest.approx(0.0)


def test_prefix_of_and_limiter_per_prefix() -> None:
    assert prefix_of("ckpt/step_1/rank_0/shard_0", 3) == "ckpt/step_1/rank_0/"
    assert prefix_of("ckpt/step_1/rank_0/a/b", 3) == "ckpt/step_1/rank_0/"
    assert prefix_of("ckpt/x", 3) == "ckpt/"
    assert prefix_of("top", 3) == ""
    assert prefix_of("a/b/c", 0) == ""
    clock = FakeClock()
    lim = PrefixLimiter(rate=1.0, depth=2, clock=clock)
    assert lim.allow("b", "p/1/x") and not lim.allow("b", "p/1/y")
    assert lim.allow("b", "p/2/x")  # another prefix has its own budget
    assert lim.allow("other", "p/1/x")  # and another bucket
    clock.now += 1.0
    assert lim.allow("b", "p/1/z")
    assert PrefixLimiter(rate=0, depth=3).allow("b", "k")  # 0 = unlimited


def test_parse_size() -> None:
    assert parse_size("10MB") == 10e6
    assert parse_size("8MiB") == 8 * 2**20
    assert parse_size("1500") == 1500


# -- S3 over boto3 --------------------------------------------------------------------------


def test_put_get_head_delete_roundtrip(s3: Any) -> None:
    body = b"checkpoint bytes " * 1000
    put = s3.put_object(
        Bucket=BUCKET,
        Key="rt/a b+c.bin",
        Body=body,
        ContentType="application/x-test",
        Metadata={"step": "7"},
    )
    etag = '"' + hashlib.md5(body).hexdigest() + '"'
    assert put["ETag"] == etag
    got = s3.get_object(Bucket=BUCKET, Key="rt/a b+c.bin")
    assert got["Body"].read() == body
    assert (got["ETag"], got["ContentType"], got["Metadata"]) == (
        etag,
        "application/x-test",
        {"step": "7"},
    )
    part = s3.get_object(Bucket=BUCKET, Key="rt/a b+c.bin", Range="bytes=10-19")
    assert part["Body"].read() == body[10:20]
    assert part["ContentRange"] == f"bytes 10-19/{len(body)}"
    head = s3.head_object(Bucket=BUCKET, Key="rt/a b+c.bin")
    assert (head["ContentLength"], head["ETag"]) == (len(body), etag)
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="rt/")["Contents"]
    assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [("rt/a b+c.bin", len(body), etag)]
    s3.delete_object(Bucket=BUCKET, Key="rt/a b+c.bin")
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=BUCKET, Key="rt/a b+c.bin")
    assert err.value.response["Error"]["Code"] == "NoSuchKey"


def test_bad_content_md5_is_rejected(s3: Any) -> None:
    wrong = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=BUCKET, Key="md5/x", Body=b"data", ContentMD5=wrong)
    assert err.value.response["Error"]["Code"] == "BadDigest"


def test_list_v2_delimiter_and_pagination(s3: Any) -> None:
    keys = ["ls/a/1", "ls/a/2", "ls/b", "ls/c/1", "ls/d"]
    for key in keys:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix="ls/", Delimiter="/", PaginationConfig={"PageSize": 2}
    )
    seen = []
    for page in pages:
        seen += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        seen += [o["Key"] for o in page.get("Contents", [])]
    assert sorted(seen) == ["ls/a/", "ls/b", "ls/c/", "ls/d"]
    after = s3.list_objects_v2(Bucket=BUCKET, Prefix="ls/", StartAfter="ls/b")
    assert [o["Key"] for o in after["Contents"]] == ["ls/c/1", "ls/d"]


def test_multipart_etag_and_upload_listing(s3: Any) -> None:
    parts = [b"a" * 1000, b"b" * 1000, b"c" * 10]
    up = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/obj", Metadata={"m": "1"})
    listed = s3.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in listed] == [("mp/obj", up["UploadId"])]
    done = []
    for n, data in enumerate(parts, start=1):
        r = s3.upload_part(
            Bucket=BUCKET, Key="mp/obj", UploadId=up["UploadId"], PartNumber=n, Body=data
        )
        assert r["ETag"] == '"' + hashlib.md5(data).hexdigest() + '"'
        done.append({"PartNumber": n, "ETag": r["ETag"]})
    result = s3.complete_multipart_upload(
        Bucket=BUCKET, Key="mp/obj", UploadId=up["UploadId"], MultipartUpload={"Parts": done}
    )
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    assert result["ETag"] == f'"{digest}-3"'
    got = s3.get_object(Bucket=BUCKET, Key="mp/obj")
    assert got["Body"].read() == b"".join(parts)
    assert (got["ETag"], got["Metadata"]) == (f'"{digest}-3"', {"m": "1"})
    second = s3.get_object(Bucket=BUCKET, Key="mp/obj", PartNumber=2)
    assert second["Body"].read() == parts[1] and second["PartsCount"] == 3
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=BUCKET)
    other = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/aborted")
    s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/aborted", UploadId=other["UploadId"])
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=BUCKET)


def test_copy_object_keeps_etag_and_metadata(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key="cp/src", Body=b"copy me", Metadata={"k": "v"})
    r = s3.copy_object(Bucket=BUCKET, Key="cp/dst", CopySource={"Bucket": BUCKET, "Key": "cp/src"})
    assert r["CopyObjectResult"]["ETag"] == '"' + hashlib.md5(b"copy me").hexdigest() + '"'
    got = s3.get_object(Bucket=BUCKET, Key="cp/dst")
    assert (got["Body"].read(), got["Metadata"]) == (b"copy me", {"k": "v"})


def test_aws_chunked_body_with_trailer_is_decoded(emu: EmulatorThread) -> None:
    data = bytes(range(256)) * 700
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    headers = {
        "Content-Encoding": "aws-chunked",
        "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "x-amz-decoded-content-length": str(len(data)),
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    for trailer, status in ((crc, 200), ("AAAAAA==", 400)):
        framed = aws_chunked_unsigned(data, 50_000, {"x-amz-checksum-crc32": trailer})
        conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=10)
        conn.request("PUT", f"/{BUCKET}/chunked/{status}", body=framed, headers=headers)
        resp = conn.getresponse()
        text = resp.read()
        conn.close()
        assert resp.status == status, text
    stored = emu.emulator.objects(BUCKET, "chunked/")
    assert stored == {
        "chunked/200": {"size": len(data), "etag": hashlib.md5(data).hexdigest(), "parts": 0}
    }


def test_request_log_and_control_endpoints(emu: EmulatorThread, s3: Any) -> None:
    get_json(emu.url + "/_emulator/log", "DELETE")
    s3.put_object(Bucket=BUCKET, Key="log/one", Body=b"12345")
    s3.get_object(Bucket=BUCKET, Key="log/one")["Body"].read()
    with pytest.raises(ClientError):
        s3.head_object(Bucket=BUCKET, Key="log/missing")
    log = get_json(emu.url + "/_emulator/log")
    assert log == emu.log
    summary = [(e["method"], e["op"], e["bucket"], e["key"], e["status"]) for e in log]
    assert summary == [
        ("PUT", "PutObject", BUCKET, "log/one", 200),
        ("GET", "GetObject", BUCKET, "log/one", 200),
        ("HEAD", "HeadObject", BUCKET, "log/missing", 404),
    ]
    assert (log[0]["bytes_in"], log[1]["bytes_out"], log[2]["code"]) == (5, 5, "NoSuchKey")
    assert log[0]["ts"] <= log[1]["ts"] <= log[2]["ts"]
    stats = get_json(emu.url + "/_emulator/stats")
    assert stats["requests"] == 3
    assert stats["by_op"]["PutObject"] == {"200": 1}
    assert stats["bytes_in"] == 5
    objects = get_json(emu.url + f"/_emulator/objects?bucket={BUCKET}&prefix=log/")
    assert objects == {
        "log/one": {"size": 5, "etag": hashlib.md5(b"12345").hexdigest(), "parts": 0}
    }
    get_json(emu.url + "/_emulator/log", "DELETE")
    assert emu.log == [] and emu.stats()["requests"] == 0


# -- throttles ------------------------------------------------------------------------------


def test_slowdown_when_prefix_rate_exceeded_other_prefix_unaffected(tmp_path: Path) -> None:
    log_file = tmp_path / "requests.jsonl"
    # 0.01 req/s: a prefix gets one request (the burst) and no refill during the test.
    with EmulatorThread(
        latency_ms=0, prefix_rate=0.01, prefix_depth=3, buckets=[BUCKET], log_path=str(log_file)
    ) as server:
        s3 = client(server.url)
        s3.put_object(Bucket=BUCKET, Key="ckpt/step_1/rank_0/shard_0", Body=b"a")
        with pytest.raises(ClientError) as err:
            s3.put_object(Bucket=BUCKET, Key="ckpt/step_1/rank_0/shard_1", Body=b"b")
        assert err.value.response["Error"]["Code"] == "SlowDown"
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        s3.put_object(Bucket=BUCKET, Key="ckpt/step_1/rank_1/shard_0", Body=b"c")
        with pytest.raises(ClientError):  # reads of the throttled prefix count too
            s3.get_object(Bucket=BUCKET, Key="ckpt/step_1/rank_0/shard_0")
        assert s3.list_objects_v2(Bucket=BUCKET)["KeyCount"] == 2  # lists are not limited
        log = server.log
        stats = server.stats()
    assert [(e["prefix"], e["status"], e["code"]) for e in log[:4]] == [
        ("ckpt/step_1/rank_0/", 200, None),
        ("ckpt/step_1/rank_0/", 503, "SlowDown"),
        ("ckpt/step_1/rank_1/", 200, None),
        ("ckpt/step_1/rank_0/", 503, "SlowDown"),
    ]
    assert stats["slowdown"] == 2 and stats["by_status"]["503"] == 2
    assert [json.loads(line) for line in log_file.read_text().splitlines()] == log
    # Each limited request says when the limiter answered: after it arrived (``t``).
    assert all(e["t_limit"] >= e["t"] for e in log if e["key"])
    assert all(e["t_limit"] is None for e in log if not e["key"])


def test_latency_bandwidth_and_discarded_bodies_are_applied() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    with EmulatorThread(
        latency_ms=5, bandwidth=50e6, store_bodies=False, buckets=[BUCKET]
    ) as server:
        s3 = client(server.url)
        s3.put_object(Bucket=BUCKET, Key="big/x", Body=body)
        got = s3.get_object(Bucket=BUCKET, Key="big/x")
        data = got["Body"].read()
        log, config = server.log, server.stats()["config"]
    assert (config["latency_ms"], config["bandwidth"], config["store_bodies"]) == (5, 50e6, False)
    assert [e["latency_ms"] for e in log] == [5, 5]
    assert all(e["duration_ms"] >= 4.5 for e in log)  # a lower bound, not a timing claim
    # A discarded body comes back as zeros of the right length, with the original ETag.
    assert data == bytes(len(body))
    assert got["ETag"] == '"' + hashlib.md5(body).hexdigest() + '"'
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-emulator-body"] == "discarded"
    assert (log[0]["bytes_in"], log[1]["bytes_out"]) == (len(body), len(body))


def test_bucket_operations(s3: Any) -> None:
    s3.create_bucket(Bucket="emu-new")
    s3.head_bucket(Bucket="emu-new")
    assert "emu-new" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.put_object(Bucket="emu-new", Key="k", Body=b"x")
    with pytest.raises(ClientError) as err:
        s3.delete_bucket(Bucket="emu-new")
    assert err.value.response["Error"]["Code"] == "BucketNotEmpty"
    s3.delete_object(Bucket="emu-new", Key="k")
    s3.delete_bucket(Bucket="emu-new")
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket="emu-new", Key="k", Body=b"x")
    assert err.value.response["Error"]["Code"] == "NoSuchBucket"
