"""gateway prefetch / latest: the progress line and the exit codes against a live admin
API double (aiohttp on loopback, real HTTP)."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from gateway import cli_restore


def test_progress_line_shows_share_sizes_objects_rate_and_eta() -> None:
    job = {"bytes_total": 4 << 30, "bytes_done": 1 << 30, "objects_done": 16, "objects_total": 64}
    line = cli_restore.progress_line(job, float(512 << 20))
    assert line.startswith("[" + "#" * 8 + "-" * 22 + "]  25% 1.0 GiB of 4.0 GiB")
    assert "16 of 64 objects, 512.0 MiB/s, ETA 6.0s" in line
    assert "failed" in cli_restore.progress_line({**job, "objects_failed": 2}, None)


class AdminDouble:
    """The admin API's prefetch and checkpoints answers, served over real HTTP."""

    def __init__(self) -> None:
        self.polls = 0
        self.refuse = False

    async def post(self, request: web.Request) -> web.Response:
        if self.refuse:
            body = {"error": "InsufficientStorage", "message": "too big"}
            return web.json_response(body, status=507)
        return web.json_response(self._job(done=False), status=202)

    async def get(self, request: web.Request) -> web.Response:
        self.polls += 1
        return web.json_response(self._job(done=self.polls >= 2))

    async def checkpoints(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"prefix": "run/", "latest_complete": "run/step_2/", "latest_durable": None}
        )

    def _job(self, *, done: bool) -> dict[str, Any]:
        return {
            "state": "done" if done else "running",
            "done": done,
            "objects_total": 2,
            "objects_done": 2 if done else 1,
            "objects_failed": 0,
            "bytes_total": 10,
            "bytes_done": 10 if done else 5,
            "failures": [],
        }


@pytest.fixture
def admin() -> Iterator[tuple[str, AdminDouble]]:
    import asyncio

    double = AdminDouble()
    app = web.Application()
    app.router.add_post("/admin/v1/prefetch", double.post)
    app.router.add_get("/admin/v1/prefetch", double.get)
    app.router.add_get("/admin/v1/checkpoints", double.checkpoints)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", double
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _args(url: str, command: str, **extra: Any) -> argparse.Namespace:
    base = {"command": command, "admin": url, "admin_token": None, "admin_token_file": None}
    base |= {"bucket": "b", "prefix": "run/", "json": False}
    return argparse.Namespace(**base, **extra)


def test_prefetch_wait_polls_until_done(
    admin: tuple[str, AdminDouble], capsys: pytest.CaptureFixture[str]
) -> None:
    url, double = admin
    args = _args(url, "prefetch", wait=True, timeout=30.0, progress="plain")
    assert cli_restore.run(args) == 0
    assert double.polls == 2
    assert '"state": "done"' in capsys.readouterr().out


def test_prefetch_refused_exits_4(
    admin: tuple[str, AdminDouble], capsys: pytest.CaptureFixture[str]
) -> None:
    url, double = admin
    double.refuse = True
    args = _args(url, "prefetch", wait=False, timeout=30.0, progress="none")
    assert cli_restore.run(args) == 4
    assert "refused: too big" in capsys.readouterr().err


def test_latest_prints_the_newest_or_exits_4(
    admin: tuple[str, AdminDouble], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = admin
    assert cli_restore.run(_args(url, "latest", durable=False)) == 0
    assert capsys.readouterr().out == "run/step_2/\n"
    assert cli_restore.run(_args(url, "latest", durable=True)) == 4
    assert "no durable checkpoint under s3://b/run/" in capsys.readouterr().err


def test_unreachable_admin_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("http://127.0.0.1:9", "latest", durable=False)
    assert cli_restore.run(args) == 1
    assert "cannot reach" in capsys.readouterr().err
