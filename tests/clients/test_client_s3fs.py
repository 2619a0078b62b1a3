"""s3fs (fsspec on aiobotocore) against the gateway."""

from __future__ import annotations

from typing import Any

import pytest
import s3fs
from clientutil import MiB, multipart_etag, random_bytes, sha256, split, upstream_body
from harness import GATEWAY_ACCESS_KEY, GATEWAY_SECRET_KEY, REGION, GatewayProcess, quoted_md5


def make_fs(gw: GatewayProcess) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(
        key=GATEWAY_ACCESS_KEY,
        secret=GATEWAY_SECRET_KEY,
        client_kwargs={"endpoint_url": gw.endpoint, "region_name": REGION},
        skip_instance_cache=True,
        use_listings_cache=False,
    )


@pytest.fixture
def fs(gateway: GatewayProcess) -> s3fs.S3FileSystem:
    return make_fs(gateway)


def test_pipe_cat_ls_find_info(fs: s3fs.S3FileSystem, s3: Any, bucket: str) -> None:
    files = {
        f"{bucket}/data/a.bin": random_bytes(1000, "s3fs-a"),
        f"{bucket}/data/sub/b.bin": random_bytes(70_000, "s3fs-b"),
        f"{bucket}/data/sub/deep/c.txt": b"hello from s3fs\n",
        f"{bucket}/other.txt": b"top level",
    }
    fs.pipe(files)  # many objects, one call
    fs.pipe_file(f"{bucket}/data/single.bin", b"single")
    files[f"{bucket}/data/single.bin"] = b"single"

    for path, body in files.items():
        assert fs.cat_file(path) == body
    assert (
        fs.cat_file(f"{bucket}/data/a.bin", start=10, end=20)
        == files[f"{bucket}/data/a.bin"][10:20]
    )
    assert fs.cat([f"{bucket}/data/a.bin", f"{bucket}/other.txt"]) == {
        f"{bucket}/data/a.bin": files[f"{bucket}/data/a.bin"],
        f"{bucket}/other.txt": b"top level",
    }

    assert sorted(fs.ls(f"{bucket}/data", detail=False)) == [
        f"{bucket}/data/a.bin",
        f"{bucket}/data/single.bin",
        f"{bucket}/data/sub",
    ]
    entries = {e["name"]: e for e in fs.ls(f"{bucket}/data", detail=True)}
    assert entries[f"{bucket}/data/sub"]["type"] == "directory"
    assert entries[f"{bucket}/data/a.bin"]["size"] == 1000

    assert fs.find(f"{bucket}/data") == sorted(p for p in files if p.startswith(f"{bucket}/data/"))
    assert fs.find(bucket) == sorted(files)

    info = fs.info(f"{bucket}/data/sub/b.bin")
    assert info["type"] == "file"
    assert info["size"] == 70_000
    assert info["ETag"] == quoted_md5(files[f"{bucket}/data/sub/b.bin"])
    assert fs.info(f"{bucket}/data/sub")["type"] == "directory"
    assert fs.exists(f"{bucket}/data/sub/deep/c.txt")
    assert not fs.exists(f"{bucket}/data/nope.bin")
    with pytest.raises(FileNotFoundError):
        fs.info(f"{bucket}/data/nope.bin")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{bucket}/data/nope.bin")

    # What boto3 sees agrees with what s3fs wrote.
    got = s3.get_object(Bucket=bucket, Key="data/sub/b.bin")["Body"].read()
    assert sha256(got) == sha256(files[f"{bucket}/data/sub/b.bin"])


def test_open_write_multipart_read_back_rm(
    fs: s3fs.S3FileSystem, gateway: GatewayProcess, upstream: Any, bucket: str
) -> None:
    path = f"{bucket}/big/shard-00.bin"
    chunks = [random_bytes(1 * MiB, f"chunk{i}") for i in range(12)]
    data = b"".join(chunks)
    block = 5 * MiB  # s3fs uploads a part whenever its buffer reaches block_size
    with fs.open(path, "wb", block_size=block) as fh:
        for chunk in chunks:
            fh.write(chunk)
        # 12 MiB in 1 MiB writes with a 5 MiB block: s3fs went multipart.
        assert fh.mpu is not None

    info = fs.info(path)
    assert info["size"] == len(data)
    # s3fs flushes whole blocks as parts, the remainder as the last part.
    expected_etag = multipart_etag(split(data, block))
    assert info["ETag"] == expected_etag

    with fs.open(path, "rb", block_size=2 * MiB) as fh:
        assert sha256(fh.read()) == sha256(data)
    with fs.open(path, "rb") as fh:  # seek + partial read (ranged GET)
        fh.seek(5 * MiB - 10)
        assert fh.read(20) == data[5 * MiB - 10 : 5 * MiB + 10]

    gateway.drained(bucket=bucket)
    up_etag, up_body = upstream_body(upstream, bucket, "big/shard-00.bin")
    assert up_etag == expected_etag
    assert sha256(up_body) == sha256(data)

    fs.rm(path)
    assert not fs.exists(path)
    fs.pipe({f"{bucket}/tree/{i}.bin": b"x" * i for i in range(5)})
    fs.rm(f"{bucket}/tree", recursive=True)  # DeleteObjects
    assert fs.find(f"{bucket}/tree") == []

    gateway.drained(bucket=bucket)
    assert upstream.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
