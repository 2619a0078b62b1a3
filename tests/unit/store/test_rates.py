"""RateTable: the buckets' learnt rates load back across a reopen, newer records only."""

from __future__ import annotations

from pathlib import Path

from gateway.store.journal import Journal
from gateway.store.rates import RateTable


async def test_rates_load_back_after_a_reopen_and_old_ones_are_left_out(
    journal: Journal, tmp_path: Path
) -> None:
    table = RateTable(journal)
    assert await table.load(0.0) == {}
    await table.save({"a": 200.0, "b": 35.5}, now_wall_s=1000.0)
    await table.save({"a": 180.0}, now_wall_s=2000.0)  # a changed; b's record is kept
    await table.save({}, now_wall_s=3000.0)
    assert await table.load(0.0) == {"a": 180.0, "b": 35.5}
    journal.close()
    reopened = Journal(tmp_path / "j.db", fsync=False)
    reopened.open()
    try:
        assert await RateTable(reopened).load(1500.0) == {"a": 180.0}  # b too old
    finally:
        reopened.close()
