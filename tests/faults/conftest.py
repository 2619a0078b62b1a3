"""Fixtures and checks shared by the hostile-input and crash tests (tests/faults).

The gateway runs as a real subprocess (tests/harness.py); moto is the upstream. The checks
here are the promises every hostile request must keep: the server answers (a follow-up
request works), nothing is written outside the data directory, and no temp file survives
the request.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import GatewayProcess, HttpResponse, send_signed, sign_request


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (relative), files and directories."""
    out: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def tmp_files(gw: GatewayProcess) -> list[str]:
    tmp = gw.data_dir / "tmp"
    return sorted(os.listdir(tmp)) if tmp.exists() else []


def signed(
    gw: GatewayProcess, method: str, path: str, body: bytes = b"", **kw: Any
) -> HttpResponse:
    """A request signed with the gateway's client credentials (header SigV4)."""
    return send_signed(sign_request(method, gw.endpoint + path, body=body, **kw))


class Sandbox:
    """A gateway whose data dir sits alone in a directory we watch for stray files."""

    def __init__(self, gw: GatewayProcess, root: Path) -> None:
        self.gw = gw
        self.root = root
        self.outside_before = self.outside()

    def outside(self) -> set[str]:
        """Paths under the sandbox root that are not in the data dir (the log is allowed)."""
        data = self.gw.data_dir.name
        return {p for p in tree(self.root) if p != data and not p.startswith(data + os.sep)} - {
            self.gw.log_path.name
        }

    def assert_contained(self) -> None:
        assert self.outside() == self.outside_before, "a file appeared outside the data dir"
        assert tmp_files(self.gw) == [], "temp files left behind"
        assert self.gw.running, self.gw.log_tail()


@pytest.fixture(scope="module")
def sandbox(
    moto_server: str, upstream: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sandbox]:
    root = tmp_path_factory.mktemp("sandbox")
    # Decoys a path-traversal would hit: siblings of the data dir and of its subdirs.
    (root / "decoy").mkdir()
    gw = GatewayProcess(
        root / "data",
        moto_server,
        extra_args=["--max-xml-body", "64KiB", "--max-header-size", "8KiB"],
    )
    gw.start()
    try:
        yield Sandbox(gw, root)
    finally:
        gw.stop()
