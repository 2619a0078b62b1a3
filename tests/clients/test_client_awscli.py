"""The AWS CLI (v1, ``python -m awscli``) against the gateway, as a subprocess.

The CLI gets the gateway's client credentials through the environment and a throwaway
config file that pins the transfer settings the assertions depend on (8 MiB multipart
threshold and chunk size), so a user's ~/.aws never leaks in.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clientutil import MiB, file_sha256, multipart_etag, random_bytes, sha256, split, upstream_body
from harness import GatewayProcess, quoted_md5, read_body

CLI_TIMEOUT_S = 120

CONFIG = """\
[default]
region = us-east-1
s3 =
    multipart_threshold = 8MB
    multipart_chunksize = 8MB
    max_concurrent_requests = 4
    addressing_style = path
"""


@pytest.fixture
def cli(gateway: GatewayProcess, aws_env: dict[str, str], tmp_path: Path):
    config = tmp_path / "aws-config"
    config.write_text(CONFIG)
    env = dict(aws_env, AWS_CONFIG_FILE=str(config))

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "awscli", *args, "--endpoint-url", gateway.endpoint]
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    return run


def test_cp_up_and_down_multipart(
    cli: Any, gateway: GatewayProcess, s3: Any, upstream: Any, bucket: str, tmp_path: Path
) -> None:
    data = random_bytes(20 * MiB + 12345, "cli-cp")
    src = tmp_path / "weights.bin"
    src.write_bytes(data)

    out = cli("s3", "cp", str(src), f"s3://{bucket}/ckpt/weights.bin", "--no-progress")
    # The CLI prints the source relative to its working directory.
    assert out.stdout.startswith("upload: ")
    assert out.stdout.rstrip().endswith(f"weights.bin to s3://{bucket}/ckpt/weights.bin")

    expected_etag = multipart_etag(split(data, 8 * MiB))  # three parts: "-3"
    head = s3.head_object(Bucket=bucket, Key="ckpt/weights.bin")
    assert head["ETag"] == expected_etag
    assert head["ContentLength"] == len(data)

    dst = tmp_path / "down" / "weights.bin"
    cli("s3", "cp", f"s3://{bucket}/ckpt/weights.bin", str(dst), "--no-progress")
    assert file_sha256(dst) == sha256(data)

    gateway.drained(bucket=bucket)
    up_etag, up_body = upstream_body(upstream, bucket, "ckpt/weights.bin")
    assert up_etag == expected_etag
    assert sha256(up_body) == sha256(data)


def _make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "a.txt": b"alpha\n",
        "nested/b.bin": random_bytes(300_000, "sync-b"),
        "nested/deeper/c.bin": random_bytes(9 * MiB, "sync-c"),  # multipart
        "with space/d e.txt": b"spaces in names\n",
        "empty.dat": b"",
    }
    for rel, body in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    return files


def test_sync_twice_uploads_nothing_the_second_time(
    cli: Any, gateway: GatewayProcess, s3: Any, upstream: Any, bucket: str, tmp_path: Path
) -> None:
    root = tmp_path / "tree"
    files = _make_tree(root)

    first = cli("s3", "sync", str(root), f"s3://{bucket}/run1/", "--no-progress")
    uploaded = sorted(line for line in first.stdout.splitlines() if line.startswith("upload:"))
    assert len(uploaded) == len(files), first.stdout

    for rel, body in files.items():
        got = s3.get_object(Bucket=bucket, Key=f"run1/{rel}")
        assert sha256(read_body(got)) == sha256(body), rel

    # Nothing changed locally: sizes and mtimes match the listing, so nothing is sent.
    gateway.drained(bucket=bucket)
    before = gateway.status()
    second = cli("s3", "sync", str(root), f"s3://{bucket}/run1/", "--no-progress")
    assert second.stdout.strip() == ""
    after = gateway.status()
    assert after["pending_objects"] == 0  # no write was accepted ...
    assert after["flushed_objects"] == before["flushed_objects"]  # ... nor flushed

    for rel, body in files.items():
        etag, up = upstream_body(upstream, bucket, f"run1/{rel}")
        assert sha256(up) == sha256(body), rel
        if len(body) < 8 * MiB:
            assert etag == quoted_md5(body), rel
        else:
            assert etag == multipart_etag(split(body, 8 * MiB)), rel

    # Sync back down into an empty directory: the same tree, byte for byte.
    back = tmp_path / "back"
    cli("s3", "sync", f"s3://{bucket}/run1/", str(back), "--no-progress")
    for rel, body in files.items():
        assert file_sha256(back / rel) == sha256(body), rel


def test_ls_recursive_and_rm_recursive(
    cli: Any, gateway: GatewayProcess, s3: Any, upstream: Any, bucket: str
) -> None:
    bodies = {f"ls/{i % 3}/obj-{i:02d}.bin": random_bytes(1000 + i, f"ls{i}") for i in range(12)}
    bodies["other/keep.txt"] = b"keep me"
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)

    out = cli("s3", "ls", f"s3://{bucket}/ls/", "--recursive")
    listed: dict[str, int] = {}
    for line in out.stdout.splitlines():
        # "2026-11-22 05:10:14       1003 ls/0/obj-03.bin"
        _date, _time, size, key = line.split(None, 3)
        listed[key] = int(size)
    assert listed == {k: len(v) for k, v in bodies.items() if k.startswith("ls/")}

    out = cli("s3", "ls", f"s3://{bucket}/")  # top level: common prefixes only
    assert sorted(line.split()[-1] for line in out.stdout.splitlines()) == ["ls/", "other/"]

    out = cli("s3", "rm", f"s3://{bucket}/ls/", "--recursive")
    deleted = sorted(line.split(f"s3://{bucket}/", 1)[1] for line in out.stdout.splitlines())
    assert deleted == sorted(k for k in bodies if k.startswith("ls/"))

    assert cli("s3", "ls", f"s3://{bucket}/ls/", "--recursive", check=False).stdout == ""
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["other/keep.txt"]

    gateway.drained(bucket=bucket)
    assert sorted(o["Key"] for o in upstream.list_objects_v2(Bucket=bucket)["Contents"]) == [
        "other/keep.txt"
    ]


def test_s3api_copy_object(
    cli: Any, gateway: GatewayProcess, s3: Any, upstream: Any, bucket: str
) -> None:
    body = random_bytes(2 * MiB + 1, "copy-src")
    s3.put_object(Bucket=bucket, Key="src/obj.bin", Body=body, Metadata={"origin": "cli-test"})

    out = cli(
        "s3api",
        "copy-object",
        "--bucket",
        bucket,
        "--key",
        "dst/copy.bin",
        "--copy-source",
        f"{bucket}/src/obj.bin",
        "--output",
        "json",
    )
    result = json.loads(out.stdout)
    assert result["CopyObjectResult"]["ETag"] == quoted_md5(body)

    got = s3.get_object(Bucket=bucket, Key="dst/copy.bin")
    assert sha256(read_body(got)) == sha256(body)
    assert got["ETag"] == quoted_md5(body)
    assert got["Metadata"] == {"origin": "cli-test"}  # default MetadataDirective=COPY

    gateway.drained(bucket=bucket)
    etag, up = upstream_body(upstream, bucket, "dst/copy.bin")
    assert etag == quoted_md5(body)
    assert sha256(up) == sha256(body)
