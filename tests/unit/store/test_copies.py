"""ShortCopies (gateway/store/copies.py): versions acknowledged with fewer replicas than
wanted, per key, in memory and in the journal."""

from __future__ import annotations

from gateway.store.copies import ShortCopies
from gateway.store.journal import Journal


async def test_a_short_version_is_said_until_cleared_and_survives_a_restart(
    journal: Journal,
) -> None:
    short = ShortCopies(journal)
    await short.load()
    assert short.of("b", "k", 3) is None
    await short.note("b", "k", 3, 0, 1)
    assert short.of("b", "k", 3) == (0, 1)
    assert short.of("b", "k", 2) is None  # another version of the key: not this one
    await short.note("b", "k", 2, 0, 1)  # an older version's record arriving late
    assert short.of("b", "k", 3) == (0, 1) and short.versions() == [("b", "k", 3)]
    again = ShortCopies(journal)
    await again.load()  # what a restart reads
    assert again.of("b", "k", 3) == (0, 1)
    await again.clear("b", "k", 2)  # not the recorded version: nothing changes
    assert again.versions() == [("b", "k", 3)]
    await again.clear("b", "k", 3)
    assert again.of("b", "k", 3) is None
    third = ShortCopies(journal)
    await third.load()
    assert third.versions() == []
