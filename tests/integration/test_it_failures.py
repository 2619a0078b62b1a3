"""Upstream failures: a flush that cannot succeed is visible (state, status, drain) and the
acknowledged data is never dropped."""

from __future__ import annotations

from typing import Any

from harness import flush_state, payload, quoted_md5, read_body, unique_bucket_name


def test_flush_failure_is_visible_and_data_kept(gateway_factory: Any, upstream: Any) -> None:
    gw = gateway_factory(extra_args=["--shutdown-drain-timeout", "2"])
    s3 = gw.client()
    name = unique_bucket_name("vanishing")
    upstream.create_bucket(Bucket=name)
    body = payload(3000, seed="orphan")
    gw.pause_flush()
    s3.put_object(Bucket=name, Key="orphan", Body=body)
    # The bucket disappears upstream before the object can be flushed.
    upstream.delete_bucket(Bucket=name)
    gw.resume_flush()

    result = gw.drain(bucket=name, timeout=3)
    assert result["drained"] is False
    assert result["pending_objects"] == 1
    assert result["pending_bytes"] == len(body)

    head = s3.head_object(Bucket=name, Key="orphan")
    assert flush_state(head) in ("pending", "flushing", "failed")
    got = s3.get_object(Bucket=name, Key="orphan")
    assert read_body(got) == body
    assert got["ETag"] == quoted_md5(body)

    state = gw.object_state(name, "orphan")
    assert state["state"] in ("pending", "flushing", "failed")
    assert state["attempts"] >= 1
    assert state["last_error"]
    status = gw.status()
    assert status["pending_objects"] + status["failed_objects"] >= 1
    assert status["oldest_pending_seconds"] is not None or status["failed_objects"] >= 1
