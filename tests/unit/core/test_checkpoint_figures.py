"""A checkpoint's state in words from its figures, and figures that add up across nodes."""

from __future__ import annotations

from gateway.core.checkpoint_figures import (
    COMPLETE,
    DURABLE,
    HELD,
    WRITING,
    CheckpointFigures,
    FailedObject,
    state_of,
)

SHARD = FailedObject("ckpt/step_1/shard", "NoSuchBucket")


def test_states_in_words() -> None:
    pending = CheckpointFigures(unflushed_objects=2, unflushed_bytes=10)
    assert state_of(False, pending).state == WRITING
    assert state_of(False, CheckpointFigures()).text == "writing"
    assert state_of(True, pending).text == "complete on this node"
    assert state_of(True, pending).state == COMPLETE
    assert state_of(True, CheckpointFigures()).text == "durable in the bucket"
    assert state_of(True, CheckpointFigures()).state == DURABLE


def test_a_marker_held_behind_a_failed_shard_is_held_with_the_command() -> None:
    held = CheckpointFigures(
        unflushed_objects=2,
        unflushed_bytes=9,
        failed_objects=1,
        failed_bytes=5,
        held_objects=1,
        held_bytes=4,
        failures=(SHARD,),
    )
    state = state_of(True, held)
    assert state.state == HELD
    assert state.text == "held: its commit marker waits behind 1 object that failed"
    assert state.reason == (
        "failed: ckpt/step_1/shard (NoSuchBucket); fix the cause, then `gateway retry`"
    )
    # The held marker is not pending: pending, failed and held are disjoint.
    assert (held.pending_objects, held.pending_bytes) == (0, 0)


def test_failures_beyond_those_named_are_counted() -> None:
    figures = CheckpointFigures(
        unflushed_objects=5,
        unflushed_bytes=50,
        failed_objects=5,
        failed_bytes=50,
        failures=(SHARD,),
    )
    state = state_of(True, figures)
    assert state.text == "held: 5 objects failed"
    assert state.reason is not None and "ckpt/step_1/shard (NoSuchBucket), 4 more;" in state.reason
    assert state_of(False, figures).state == WRITING  # no marker yet: still writing, reason kept
    assert state_of(False, figures).reason == state.reason


def test_figures_add_up_across_nodes() -> None:
    a = CheckpointFigures(3, 300, 1, 100, 0, 0, 50, (SHARD,))
    b = CheckpointFigures(2, 20, 0, 0, 1, 4, 0, ())
    total = a + b
    assert total == CheckpointFigures(5, 320, 1, 100, 1, 4, 50, (SHARD,))
    assert (total.pending_objects, total.pending_bytes) == (3, 216)
    assert total.remaining_bytes == 166  # 50 bytes of it already sent
    assert state_of(True, total).state == HELD
    assert state_of(True, CheckpointFigures() + CheckpointFigures()).state == DURABLE
