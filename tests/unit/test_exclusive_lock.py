"""The lock that runs ``exclusive`` tests alone under pytest-xdist (tests/conftest.py): an
exclusive holder waits for the shared ones, and a shared one that comes after it waits for
it (no starvation by a stream of shared holders)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from harness import held_test_lock


def test_an_exclusive_holder_is_alone_and_not_starved(tmp_path: Path) -> None:
    lock, turnstile = tmp_path / "tests.lock", tmp_path / "turnstile.lock"
    events: list[str] = []
    release_first = threading.Event()

    def hold(name: str, exclusive: bool, until: threading.Event | None = None) -> None:
        with held_test_lock(lock, turnstile, exclusive):
            events.append(f"{name} in")
            if until is not None:
                until.wait(10)
            else:
                time.sleep(0.1)
            events.append(f"{name} out")

    first = threading.Thread(target=hold, args=("shared-1", False, release_first))
    first.start()
    while "shared-1 in" not in events:
        time.sleep(0.01)
    alone = threading.Thread(target=hold, args=("exclusive", True))
    alone.start()
    time.sleep(0.2)  # the exclusive one now waits for shared-1, holding the turnstile
    later = threading.Thread(target=hold, args=("shared-2", False))
    later.start()
    time.sleep(0.2)
    assert events == ["shared-1 in"]
    release_first.set()
    for t in (first, alone, later):
        t.join(10)
    assert events == [
        "shared-1 in",
        "shared-1 out",
        "exclusive in",
        "exclusive out",
        "shared-2 in",
        "shared-2 out",
    ]
