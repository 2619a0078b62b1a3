"""EarlyCommit (gateway/core/writes.py): a PutObject's commit on its replica holders goes
beside its own journal commit when the seq is under the durable ceiling, after it
otherwise, and is withdrawn from the holders when the local commit fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from gateway.core.writes import EarlyCommit
from gateway.fleet.view import Holder
from gateway.models import ObjectMeta
from gateway.store.journal import Journal


class Holders:
    """A ReplicaWriter that records what it is asked, and when."""

    stage_id = "s1"
    key = "k"
    holders: Sequence[Holder] = ()

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.calls: list[tuple[str, int, bool, int]] = []  # (what, seq, early, committed)

    def tee(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return chunks

    async def staged(self, md5_hex: str, size_bytes: int) -> Sequence[Holder]:
        return ()

    def abort(self) -> None:
        pass

    async def commit(
        self,
        holders: Sequence[Holder],
        seq: int,
        meta: ObjectMeta,
        acked_s: float,
        *,
        is_delete: bool = False,
        stage_ids: Sequence[str] = (),
        parts: Sequence[tuple[int, str]] = (),
        resend: Callable[[str], AsyncIterator[bytes]] | None = None,
        is_early: bool = False,
    ) -> int:
        committed_here = int(self.journal.figures.last_seq >= seq)
        self.calls.append(("commit", seq, is_early, committed_here))
        await asyncio.sleep(0.01)
        return 1

    async def withdraw(self, seq: int) -> bool:
        self.calls.append(("withdraw", seq, True, 0))
        return self.reachable

    reachable = True


META = ObjectMeta("b", "k", 1, "e", 1.0)


async def test_the_holders_commit_starts_before_the_local_commit_lands(journal: Journal) -> None:
    holders = Holders(journal)
    early = EarlyCommit(holders, (), journal.is_reserved, META, 1.0)
    row, _ = await journal.commit_put(META, "blob", 1.0, on_seq=early.on_seq)
    await early.committed(row)
    assert holders.calls == [("commit", row.seq, True, 0)]  # sent before the row existed


async def test_above_the_ceiling_the_holders_commit_goes_after(journal: Journal) -> None:
    holders = Holders(journal)
    early = EarlyCommit(holders, (), lambda seq: False, META, 1.0)
    row, _ = await journal.commit_put(META, "blob", 1.0, on_seq=early.on_seq)
    await early.committed(row)
    assert holders.calls == [("commit", row.seq, False, 1)]


async def test_a_failed_local_commit_withdraws_the_early_version(journal: Journal) -> None:
    holders = Holders(journal)
    early = EarlyCommit(holders, (), journal.is_reserved, META, 1.0)

    def refuse(current: Any) -> None:
        raise RuntimeError("the local commit fails")

    with pytest.raises(RuntimeError):
        await journal.commit_put(META, "blob", 1.0, refuse, on_seq=early.on_seq)
    holders.reachable = False  # a holder cannot be told: the caller marks the key doubtful
    assert await early.failed() is False
    [(_, seq, _, _), withdrawn] = holders.calls
    assert withdrawn == ("withdraw", seq, True, 0)
    assert await journal.get("b", "k") is None
