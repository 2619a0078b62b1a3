"""gateway checkpoints: the table and the --wait verdict, from admin answers (no gateway)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.cli_checkpoints import (
    EXIT_NO_CHECKPOINT,
    EXIT_OK,
    EXIT_TIMEOUT,
    format_checkpoints,
    verdict,
)


def _ckpt(name: str, state: str, **over: Any) -> dict[str, Any]:
    text = {
        "writing": "writing",
        "complete": "complete on this node",
        "durable": "durable in the bucket",
        "held": "held: its commit marker waits behind 1 object that failed",
    }[state]
    doc: dict[str, Any] = {
        "prefix": f"ckpt/{name}/",
        "name": name,
        "complete": state != "writing",
        "durable": state == "durable",
        "state": state,
        "state_text": text,
        "reason": None,
        "pending_objects": 0,
        "pending_bytes": 0,
        "failed_objects": 0,
        "failed_bytes": 0,
        "held_objects": 0,
        "sent_bytes": 0,
        "eta_seconds": None,
    }
    doc.update(over)
    return doc


def _root(*checkpoints: dict[str, Any], bucket: str = "b") -> dict[str, Any]:
    return {"bucket": bucket, "prefix": "ckpt/", "checkpoints": list(checkpoints)}


FLUSH = {"flush_state": "running", "flush_rate_bytes_per_s": 2048.0, "eta_note": None}


def test_table_newest_first_with_states_in_words_and_the_held_reason() -> None:
    reason = "failed: ckpt/step_1/shard (NoSuchBucket); fix the cause, then `gateway retry`"
    doc = {
        **_root(
            _ckpt("step_3", "writing", pending_objects=1, pending_bytes=1536),
            _ckpt("step_2", "complete", pending_objects=2, pending_bytes=3 << 20,
                  sent_bytes=1 << 20, eta_seconds=75.0),
            # The held marker is not a pending row: 0 pending, the state says why.
            _ckpt("step_1", "held", failed_objects=1, failed_bytes=5, held_objects=1,
                  reason=reason),
            _ckpt("step_0", "durable"),
        ),
        "flush": FLUSH,
    }  # fmt: skip
    lines = format_checkpoints(doc).splitlines()
    assert lines[:3] == ["flusher running, 2.0 KiB/s", "", "s3://b/ckpt/"]
    rows = lines[3:]
    assert rows[0].split() == ["checkpoint", "pending", "failed", "ETA", "state"]
    assert rows[1].split() == ["step_3", "1", "object,", "1.5", "KiB", "-", "-", "writing"]
    assert rows[2].split()[:8] == ["step_2", "2", "objects,", "3.0", "MiB", "(1.0", "MiB", "sent)"]
    assert rows[2].endswith("1m15s  complete on this node")
    assert rows[3].split()[:6] == ["step_1", "-", "1", "object,", "5", "B"]
    assert rows[3].endswith("held: its commit marker waits behind 1 object that failed")
    assert rows[4] == "      " + reason
    assert rows[5].endswith("durable in the bucket")
    # Every state starts in the same column.
    column = rows[0].index("state")
    states = ("writing", "complete", "held")
    assert {r.index(t) for r, t in zip(rows[1:4], states, strict=True)} == {column}


def test_what_needs_an_operator_comes_first() -> None:
    flush = {
        **FLUSH,
        "flush_state": "paused",
        "eta_note": "flusher paused: `gateway resume`",
        "attention": [
            {"state": "paused", "message": "flusher paused", "command": "gateway resume"}
        ],
    }
    lines = format_checkpoints({"roots": [], "flush": flush}).splitlines()
    assert lines[0] == "PAUSED  flusher paused -> run `gateway resume`"
    assert lines[1] == "flusher paused, 2.0 KiB/s (no ETA: flusher paused: `gateway resume`)"
    assert lines[-1] == "no bucket holds anything on this gateway"


def test_a_bucket_that_cannot_be_listed_says_so() -> None:
    root = {**_root(_ckpt("step_1", "complete")), "upstream_error": "ServiceUnavailable: down"}
    text = format_checkpoints({"roots": [root], "flush": FLUSH})
    assert "the bucket cannot be listed (ServiceUnavailable: down)" in text


@pytest.mark.parametrize(
    ("roots", "code"),
    [
        ([_root(_ckpt("s2", "writing"), _ckpt("s1", "durable"))], EXIT_OK),
        ([_root(_ckpt("s2", "complete"), _ckpt("s1", "durable"))], None),
        ([_root(_ckpt("s2", "held", reason="failed: x"), _ckpt("s1", "durable"))], EXIT_TIMEOUT),
        ([_root(_ckpt("s1", "writing"))], EXIT_NO_CHECKPOINT),
        ([], EXIT_NO_CHECKPOINT),
        # Every root's newest complete checkpoint must be durable; roots without one wait
        # for nothing.
        ([_root(_ckpt("s1", "durable")), _root(_ckpt("s9", "complete"), bucket="c")], None),
        ([_root(_ckpt("s1", "durable")), _root(_ckpt("s9", "writing"), bucket="c")], EXIT_OK),
    ],
)
def test_wait_verdict(roots: list[dict[str, Any]], code: int | None) -> None:
    assert verdict({"roots": roots, "flush": FLUSH}).code == code


def test_wait_verdict_names_the_checkpoint() -> None:
    doc = _root(_ckpt("s2", "complete"), _ckpt("s1", "durable"))
    assert verdict(doc).message == "s3://b/ckpt/s2/ is complete on this node"
    held = _root(_ckpt("s2", "held", reason="failed: ckpt/s2/x (AccessDenied)"))
    assert verdict(held).message == (
        "s3://b/ckpt/s2/ is held: its commit marker waits behind 1 object that failed: "
        "failed: ckpt/s2/x (AccessDenied)"
    )
