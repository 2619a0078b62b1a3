"""Early multipart over real sockets: boto3 -> the gateway (subprocess) -> moto.

A client's parts are in the upstream's multipart upload (moto's ListParts) before the client
completes, the object lands with the client's bytes and ETag once the gateway flushes the
completion, and a client abort leaves no upstream multipart upload behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness import GatewayProcess, payload, quoted_md5, read_body, upstream_objects

MiB = 1 << 20
KEY = "ckpt/step_3/rank_0/model.bin"
BODIES = [payload(5 * MiB, seed="p1"), payload(5 * MiB, seed="p2"), payload(4096, seed="p3")]


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll the upstream's state (never a duration) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _upstream_uploads(upstream: Any, bucket: str) -> list[dict[str, Any]]:
    return list(upstream.list_multipart_uploads(Bucket=bucket).get("Uploads", []))


def _upstream_parts(upstream: Any, bucket: str, key: str) -> dict[int, str]:
    """Part number -> ETag of the one open upstream upload of ``key`` ({} if none yet)."""
    found = [u for u in _upstream_uploads(upstream, bucket) if u["Key"] == key]
    if not found:
        return {}
    assert len(found) == 1, found
    listed = upstream.list_parts(Bucket=bucket, Key=key, UploadId=found[0]["UploadId"])
    return {p["PartNumber"]: p["ETag"] for p in listed.get("Parts", [])}


def test_parts_are_upstream_before_the_complete_and_the_object_lands_exact(
    gateway: GatewayProcess, s3: Any, upstream: Any, bucket: str
) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=KEY)["UploadId"]
    etags = [
        s3.upload_part(Bucket=bucket, Key=KEY, UploadId=upload_id, PartNumber=n, Body=body)["ETag"]
        for n, body in enumerate(BODIES, 1)
    ]
    assert etags == [quoted_md5(b) for b in BODIES]
    want = dict(enumerate(etags, 1))
    _wait_for("parts upstream", lambda: _upstream_parts(upstream, bucket, KEY) == want)
    assert KEY not in upstream_objects(upstream, bucket)  # nothing visible before Complete

    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key=KEY,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in want.items()]},
    )
    gateway.drained(bucket=bucket)

    remote = upstream.get_object(Bucket=bucket, Key=KEY)
    assert read_body(remote) == b"".join(BODIES)
    assert remote["ETag"] == done["ETag"]
    assert done["ETag"].strip('"').endswith("-3")
    assert _upstream_uploads(upstream, bucket) == []
    assert gateway.object_state(bucket, KEY)["state"] == "durable"


def test_a_client_abort_leaves_no_upstream_upload(
    gateway: GatewayProcess, s3: Any, upstream: Any, bucket: str
) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=KEY)["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key=KEY, UploadId=upload_id, PartNumber=1, Body=BODIES[0])[
        "ETag"
    ]
    _wait_for("part upstream", lambda: _upstream_parts(upstream, bucket, KEY) == {1: etag})

    s3.abort_multipart_upload(Bucket=bucket, Key=KEY, UploadId=upload_id)

    _wait_for("no upstream upload", lambda: _upstream_uploads(upstream, bucket) == [])
    assert KEY not in upstream_objects(upstream, bucket)
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
