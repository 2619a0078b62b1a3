"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.store.journal import Journal


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[Journal]:
    """An open journal at ``tmp_path / "j.db"`` (no fsync), closed after the test."""
    j = Journal(tmp_path / "j.db", fsync=False)
    j.open()
    yield j
    j.close()
