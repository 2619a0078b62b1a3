"""The data dir's lock and a start's footprint: what a failed start created is removed,
what was there before is never touched (real directories, real flocks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.store import datadir


def _create_like_a_start(data_dir: Path) -> None:
    (data_dir / "journal.db").write_bytes(b"new journal")
    (data_dir / "blobs" / "00").mkdir(parents=True)
    (data_dir / "blobs" / "00" / "0012").write_bytes(b"body")


def test_undo_removes_a_data_dir_the_start_made_with_its_parents(tmp_path: Path) -> None:
    data_dir = tmp_path / "a" / "b" / "data"
    footprint = datadir.Footprint(data_dir)
    lock = footprint.take_lock()
    _create_like_a_start(data_dir)
    footprint.undo()
    lock.release()
    assert list(tmp_path.iterdir()) == []


def test_undo_keeps_what_an_existing_data_dir_held(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    (data_dir / "blobs").mkdir(parents=True)
    (data_dir / "blobs" / "old").write_bytes(b"old body")
    (data_dir / "notes").write_text("kept")
    footprint = datadir.Footprint(data_dir)
    lock = footprint.take_lock()
    (data_dir / "journal.db").write_bytes(b"new journal")
    (data_dir / "tmp").mkdir()
    footprint.undo()
    lock.release()
    assert sorted(p.name for p in data_dir.iterdir()) == ["blobs", "notes"]
    assert (data_dir / "blobs" / "old").read_bytes() == b"old body"


def test_keep_disarms_undo(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    footprint = datadir.Footprint(data_dir)
    lock = footprint.take_lock()
    _create_like_a_start(data_dir)
    footprint.keep()
    footprint.undo()
    lock.release()
    assert (data_dir / "journal.db").read_bytes() == b"new journal"


def test_a_locked_data_dir_is_never_undone(tmp_path: Path) -> None:
    """A second start on a data dir another gateway holds fails at the lock and removes
    nothing of the other's, even what it created after the second one looked."""
    data_dir = tmp_path / "data"
    first = datadir.Footprint(data_dir)
    held = first.take_lock()
    second = datadir.Footprint(data_dir)
    _create_like_a_start(data_dir)  # the first gateway's fresh journal
    with pytest.raises(datadir.DataDirLocked):
        second.take_lock()
    second.undo()
    assert (data_dir / "journal.db").read_bytes() == b"new journal"
    held.release()


def test_a_data_dir_filled_between_the_look_and_the_lock_is_not_ours(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    footprint = datadir.Footprint(data_dir)  # it does not exist yet ...
    other = datadir.lock(data_dir)  # ... another gateway makes it, writes, and exits
    _create_like_a_start(data_dir)
    other.release()
    lock = footprint.take_lock()
    footprint.undo()
    lock.release()
    assert (data_dir / "journal.db").read_bytes() == b"new journal"
