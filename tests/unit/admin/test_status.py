"""The lanes' failed figures of the status document: each lane's own, when directory counts
include the lanes nested in them (gateway/admin/status.py)."""

from __future__ import annotations

from gateway.admin.status import own_failed


def test_each_lane_gets_only_its_own_failed_objects() -> None:
    # Failed objects and bytes under each directory prefix (what the journal's figures keep):
    # 1 directly in a/ (lane a/), 2 in a/b/c/ (lane a/b/c/), 4 in a/b/d/ (lane a/b/d/).
    under = {
        ("bk", ""): (7, 70),
        ("bk", "a/"): (7, 70),
        ("bk", "a/b/"): (6, 60),
        ("bk", "a/b/c/"): (2, 20),
        ("bk", "a/b/d/"): (4, 40),
        ("other", "a/"): (0, 0),
    }
    lanes = [("bk", "a/"), ("bk", "a/b/c/"), ("bk", "a/b/d/"), ("other", "a/")]
    assert own_failed(lanes, lambda b, p: under[(b, p)]) == {
        ("bk", "a/"): (1, 10),
        ("bk", "a/b/c/"): (2, 20),
        ("bk", "a/b/d/"): (4, 40),
        ("other", "a/"): (0, 0),
    }


def test_the_root_lane_gives_back_what_every_other_lane_holds() -> None:
    under = {("bk", ""): (5, 5), ("bk", "x/"): (3, 3), ("bk", "x/y/z/"): (1, 1)}
    lanes = [("bk", ""), ("bk", "x/"), ("bk", "x/y/z/")]
    assert own_failed(lanes, lambda b, p: under[(b, p)]) == {
        ("bk", ""): (2, 2),
        ("bk", "x/"): (2, 2),
        ("bk", "x/y/z/"): (1, 1),
    }
