"""kill -9 of the gateway: every acknowledged write and delete survives and is flushed later."""

from __future__ import annotations

import contextlib
import http.client
import sqlite3
import time
import urllib.parse
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    error_code,
    error_status,
    object_url,
    payload,
    quoted_md5,
    read_body,
    sign_request,
    upstream_objects,
)


def _assert_readable(s3: Any, bucket: str, expected: dict[str, bytes], deleted: set[str]) -> None:
    for key, body in expected.items():
        got = s3.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body, key
        assert got["ETag"] == quoted_md5(body), key
        head = s3.head_object(Bucket=bucket, Key=key)
        assert head["ContentLength"] == len(body), key
    for key in deleted:
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=bucket, Key=key)
        assert error_code(exc.value) == "NoSuchKey", key
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert listed == sorted(expected)


def test_sigkill_keeps_acknowledged_writes(fresh_gateway: Any, upstream: Any, bucket: str) -> None:
    gw = fresh_gateway
    s3 = gw.client()
    expected: dict[str, bytes] = {}
    gw.pause_flush()
    for i in range(25):
        key = f"ckpt/step-1/shard-{i:02d}"
        expected[key] = payload(1000 * i + 1, seed=key)
        s3.put_object(Bucket=bucket, Key=key, Body=expected[key])
    for i in (3, 7, 11):  # overwritten twice
        key = f"ckpt/step-1/shard-{i:02d}"
        for version in (1, 2):
            expected[key] = payload(500 + version * 100 + i, seed=f"{key}-v{version}")
            s3.put_object(Bucket=bucket, Key=key, Body=expected[key])
    s3.put_object(Bucket=bucket, Key="ckpt/step-1/big", Body=payload(3 * 1024 * 1024, seed="b"))
    expected["ckpt/step-1/big"] = payload(3 * 1024 * 1024, seed="b")
    deleted = {"ckpt/step-1/shard-05"}
    s3.delete_object(Bucket=bucket, Key="ckpt/step-1/shard-05")
    del expected["ckpt/step-1/shard-05"]

    _assert_readable(s3, bucket, expected, deleted)
    assert upstream_objects(upstream, bucket) == {}, "flush was paused"

    gw.kill()
    gw.start()

    # Right after the restart: everything acknowledged is there (flushing may be running).
    _assert_readable(s3, bucket, expected, deleted)

    gw.resume_flush()  # pause is not persisted, but do not rely on it
    result = gw.drain(bucket=bucket, timeout=60)
    assert result["drained"] is True, result

    up = upstream_objects(upstream, bucket)
    assert sorted(up) == sorted(expected)
    for key, body in expected.items():
        got = upstream.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body, key
        assert got["ETag"] == quoted_md5(body), key
    assert gw.status()["pending_objects"] == 0


def test_sigkill_keeps_pending_delete_of_flushed_object(
    fresh_gateway: Any, upstream: Any, bucket: str
) -> None:
    gw = fresh_gateway
    s3 = gw.client()
    s3.put_object(Bucket=bucket, Key="x/keep", Body=b"keep")
    s3.put_object(Bucket=bucket, Key="x/remove", Body=b"remove")
    gw.drained(bucket=bucket)
    assert sorted(upstream_objects(upstream, bucket)) == ["x/keep", "x/remove"]

    gw.pause_flush()
    s3.delete_object(Bucket=bucket, Key="x/remove")
    s3.put_object(Bucket=bucket, Key="x/keep", Body=b"keep v2")
    gw.kill()
    # The upstream is unchanged: the delete and overwrite are only on the gateway's disk.
    assert read_body(upstream.get_object(Bucket=bucket, Key="x/remove")) == b"remove"
    assert read_body(upstream.get_object(Bucket=bucket, Key="x/keep")) == b"keep"

    gw.start()
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="x/remove")
    assert error_code(exc.value) == "NoSuchKey"
    assert read_body(s3.get_object(Bucket=bucket, Key="x/keep")) == b"keep v2"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["x/keep"]

    gw.resume_flush()
    gw.drained(bucket=bucket)
    up = upstream_objects(upstream, bucket)
    assert sorted(up) == ["x/keep"]
    assert read_body(upstream.get_object(Bucket=bucket, Key="x/keep")) == b"keep v2"
    with pytest.raises(ClientError) as exc:
        upstream.head_object(Bucket=bucket, Key="x/remove")
    assert error_status(exc.value) == 404


def test_repeated_kills(fresh_gateway: Any, upstream: Any, bucket: str) -> None:
    """Kill between rounds of writes; each restart sees every earlier round."""
    gw = fresh_gateway
    s3 = gw.client()
    expected: dict[str, bytes] = {}
    for round_no in range(3):
        gw.pause_flush()
        for i in range(5):
            key = f"r/{i}"
            expected[key] = payload(100 + round_no * 10 + i, seed=f"{round_no}-{i}")
            s3.put_object(Bucket=bucket, Key=key, Body=expected[key])
        expected[f"round-{round_no}"] = b"marker"
        s3.put_object(Bucket=bucket, Key=f"round-{round_no}", Body=b"marker")
        gw.kill()
        gw.start()
        _assert_readable(s3, bucket, expected, set())
    gw.resume_flush()
    gw.drained(bucket=bucket, timeout=60)
    up = upstream_objects(upstream, bucket)
    assert sorted(up) == sorted(expected)
    for key, body in expected.items():
        assert up[key]["ETag"] == quoted_md5(body), key
        assert read_body(upstream.get_object(Bucket=bucket, Key=key)) == body


def test_sigterm_then_restart(fresh_gateway: Any, upstream: Any, bucket: str) -> None:
    """A graceful stop loses nothing either; what is left flushes after the restart."""
    gw = fresh_gateway
    s3 = gw.client()
    gw.pause_flush()
    bodies = {f"t/{i}": payload(2000 + i, seed=f"t{i}") for i in range(10)}
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    rc = gw.stop(timeout=90)
    assert rc == 0, f"exit status {rc} after SIGTERM:\n{gw.log_tail()}"
    gw.start()
    _assert_readable(s3, bucket, bodies, set())
    gw.resume_flush()
    gw.drained(bucket=bucket)
    up = upstream_objects(upstream, bucket)
    assert sorted(up) == sorted(bodies)
    for key, body in bodies.items():
        assert up[key]["ETag"] == quoted_md5(body)


def _start_partial_put(gw: Any, bucket: str, key: str, total: int, sent: bytes) -> Any:
    """Start a signed PUT announcing ``total`` bytes and send only ``sent``; return the open
    connection (the request is still in progress)."""
    req = sign_request(
        "PUT",
        object_url(gw.endpoint, bucket, key),
        headers={"Content-Length": str(total)},
        content_sha256="UNSIGNED-PAYLOAD",
    )
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    url = urllib.parse.urlsplit(req.url)
    conn.putrequest("PUT", url.path, skip_host=True)
    headers = dict(req.headers)
    # HTTP/1.1 requires Host (aiohttp refuses a request without one, and would then close
    # the connection under the body still being sent); it is part of what was signed.
    if not any(name.lower() == "host" for name in headers):
        headers["Host"] = url.netloc
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    conn.send(sent)
    return conn


def test_sigkill_during_upload_leaves_previous_version(
    fresh_gateway: Any, upstream: Any, bucket: str
) -> None:
    """Nothing half-written is ever visible: a PUT cut by kill -9 leaves the old version."""
    gw = fresh_gateway
    s3 = gw.client()
    old = payload(4096, seed="old")
    s3.put_object(Bucket=bucket, Key="half", Body=old)
    total = 8 * 1024 * 1024
    conn = _start_partial_put(gw, bucket, "half", total, payload(total // 2, seed="new"))
    conn.sock.settimeout(0.5)
    gw.kill()
    conn.close()
    gw.start()
    got = s3.get_object(Bucket=bucket, Key="half")
    assert read_body(got) == old
    assert got["ETag"] == quoted_md5(old)
    gw.drained(bucket=bucket)
    assert read_body(upstream.get_object(Bucket=bucket, Key="half")) == old


def test_client_disconnect_during_upload(fresh_gateway: Any, bucket: str) -> None:
    gw = fresh_gateway
    s3 = gw.client()
    s3.put_object(Bucket=bucket, Key="cut", Body=b"v1")
    total = 4 * 1024 * 1024
    conn = _start_partial_put(gw, bucket, "cut", total, payload(total // 3, seed="cut"))
    conn.close()
    # A later complete request on a fresh connection is served; the cut one left nothing.
    assert read_body(s3.get_object(Bucket=bucket, Key="cut")) == b"v1"
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="never")
    assert error_status(exc.value) == 404
    s3.put_object(Bucket=bucket, Key="after-cut", Body=b"fine")
    assert read_body(s3.get_object(Bucket=bucket, Key="after-cut")) == b"fine"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == [
        "after-cut",
        "cut",
    ]


def test_sigkill_while_flushing(fresh_gateway: Any, upstream: Any, bucket: str) -> None:
    """Kill while uploads are in flight: after the restart the flush resumes and the upstream
    ends with exactly the acknowledged bytes."""
    gw = fresh_gateway
    s3 = gw.client()
    bodies = {f"inflight/{i}": payload(6 * 1024 * 1024 + i, seed=f"if{i}") for i in range(4)}
    gw.pause_flush()
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    gw.resume_flush()
    gw.kill()
    gw.start()
    gw.resume_flush()
    gw.drained(bucket=bucket, timeout=60)
    up = upstream_objects(upstream, bucket)
    assert sorted(up) == sorted(bodies)
    for key, body in bodies.items():
        got = upstream.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body, key
        assert got["ETag"] == quoted_md5(body), key


def test_upstream_upload_created_but_not_recorded_is_aborted_at_start(
    fresh_gateway: Any, upstream: Any, bucket: str
) -> None:
    """The state a kill between CreateMultipartUpload and recording its id leaves behind:
    only the flusher's intent row, and an upload open in the bucket. The next start aborts
    that upload, and leaves other keys' uploads alone."""
    gw = fresh_gateway
    gw.stop()
    lost = upstream.create_multipart_upload(Bucket=bucket, Key="ckpt/big.pt")["UploadId"]
    other = upstream.create_multipart_upload(Bucket=bucket, Key="ckpt/big.pt.other")["UploadId"]
    with contextlib.closing(sqlite3.connect(gw.data_dir / "journal.db")) as conn:
        conn.execute(
            "INSERT INTO upstream_uploads VALUES (?, ?, ?, ?)",
            ("intent:killed-here", bucket, "ckpt/big.pt", time.time()),
        )
        conn.commit()
    gw.start()

    def open_ids() -> set[str]:
        uploads = upstream.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        return {u["UploadId"] for u in uploads}

    deadline = time.monotonic() + 30
    while lost in open_ids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_ids() == {other}
    upstream.abort_multipart_upload(Bucket=bucket, Key="ckpt/big.pt.other", UploadId=other)
