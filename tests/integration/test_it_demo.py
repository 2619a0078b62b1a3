"""The embedded demo upstream (`gateway serve` without --upstream-endpoint, what `make run`
starts) and a data dir's upstream: no start, demo or real, ever drops a write that was
acknowledged and is not in its upstream yet.

The demo upstream lives in memory: what was flushed there is gone with the process, so a
demo start forgets its cached copies; what was not flushed yet stays in the data dir and
flushes into the next demo start's upstream. A data dir holding unflushed writes for one
upstream is refused by a start with another (one line: what is there, how to flush it), and
the writes reach the upstream they were acknowledged for, bytes and ETags as acknowledged.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    REPO_ROOT,
    GatewayProcess,
    error_status,
    flush_state,
    payload,
    quoted_md5,
    read_body,
    s3_client,
    upstream_objects,
)
from test_it_startup import assert_one_line_failure, serve_once

sys.path.insert(0, str(REPO_ROOT / "loadtest"))

from emulator import EmulatorThread

DEMO_KEY, DEMO_SECRET = "demo", "demo-secret-key"
KiB = 1024


class DemoGateway(GatewayProcess):
    """The gateway as `make run` starts it: no upstream endpoint, no client keys."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(
            data_dir, "(embedded)", access_key=DEMO_KEY, secret_key=DEMO_SECRET, domain=None
        )

    def command(self) -> list[str]:
        full = super().command()
        drop = {"--upstream-endpoint", "--upstream-region", "--access-key", "--secret-key"}
        out: list[str] = []
        skip = False
        for arg in full:
            if skip:
                skip = False
            elif arg in drop:
                skip = True
            else:
                out.append(arg)
        return out

    def upstream(self) -> Any:
        """A client straight to this run's in-memory demo upstream (from its banner)."""
        start = f"===== start #{self.starts}"
        text = self.logged("in-memory S3 server at", after=start)
        found = re.search(r"in-memory S3 server at (http://[\d.]+:\d+)", text)
        assert found, text
        return s3_client(
            found.group(1),
            access_key="demo-upstream-key",
            secret_key="demo-upstream-secret",
            retries=3,
        )


def disk_state(data_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``data_dir`` with its size and mtime (the lock file aside: a start
    that takes the lock writes its pid there), and every directory."""
    out: dict[str, tuple[int, int]] = {}
    for path in sorted(data_dir.rglob("*")):
        if path.name == "gateway.lock":
            continue
        st = path.stat()
        out[str(path.relative_to(data_dir))] = (
            (0, 0)
            if path.is_dir()
            else (
                st.st_size,
                st.st_mtime_ns,
            )
        )
    return out


def stop_with_pending(gw: GatewayProcess) -> str:
    """SIGTERM (the flusher is paused: nothing drains); returns this run's log."""
    gw.send_signal(signal.SIGTERM)
    assert gw.wait_exit() == 0
    text = gw.log_path.read_text()
    return text[text.rfind(f"===== start #{gw.starts}") :]


def assert_in_upstream(upstream: Any, bucket: str, bodies: dict[str, bytes]) -> None:
    """Exactly these keys in ``bucket``, with their bytes and single-PUT ETags."""
    assert sorted(upstream_objects(upstream, bucket)) == sorted(bodies)
    for key, body in bodies.items():
        got = upstream.get_object(Bucket=bucket, Key=key)
        assert got["ETag"] == quoted_md5(body), key
        assert read_body(got) == body, key


@pytest.fixture
def demo(tmp_path: Path) -> Any:
    gw = DemoGateway(tmp_path / "demo-data")
    yield gw
    gw.stop()


def test_a_demo_restart_keeps_and_flushes_what_was_not_flushed(
    demo: DemoGateway, moto_server: str
) -> None:
    demo.start()
    s3 = demo.client()
    weights = payload(100 * KiB, seed="weights")  # over the inline threshold: a body file
    s3.put_object(Bucket="demo", Key="ckpt/step_1/rank_0.pt", Body=weights)
    demo.drained(bucket="demo")
    assert flush_state(s3.head_object(Bucket="demo", Key="ckpt/step_1/rank_0.pt")) == "durable"
    [flushed_body] = demo.blob_files("demo", "ckpt/step_1/rank_0.pt")
    s3.create_bucket(Bucket="other")  # passed to the demo upstream
    demo.pause_flush()
    pending = {
        ("demo", "ckpt/step_2/rank_0.pt"): payload(64 * KiB, seed="step2"),
        ("other", "logs/run.txt"): payload(5000, seed="other"),
    }
    for (bucket, key), body in pending.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    size = "68.9 KiB"  # 64 KiB + 5000 B
    first = stop_with_pending(demo)
    assert (
        f"exiting with 2 objects ({size}) not yet flushed; they are safe on disk in "
        f"{demo.data_dir}, and the next demo start on it flushes them into its new in-memory "
        "upstream" in first
    )
    assert "what was flushed to the demo upstream is lost now" in first

    # A real upstream never gets the demo's writes.
    real = GatewayProcess(demo.data_dir, moto_server, log_path=demo.data_dir.parent / "r.log")
    before = disk_state(demo.data_dir)
    last = assert_one_line_failure(serve_once(real), f"cannot start: data dir {demo.data_dir}")
    assert last.endswith(
        f"it holds 2 objects ({size}) acknowledged for the embedded demo upstream and not "
        f"flushed yet; they never go to {moto_server}: start the demo on it (no "
        "--upstream-endpoint) to flush them into its new in-memory upstream, or give this "
        "gateway another --data-dir"
    ), last
    assert disk_state(demo.data_dir) == before

    demo.start()
    s3 = demo.client()
    log = demo.logged("flushing resumes", after="===== start #2")
    assert "dropped 1 cached copies (100.0 KiB) of objects flushed to the previous demo " in log
    assert f"recovered 2 pending objects ({size}) from the journal; flushing resumes into " in log
    banner = demo.logged("the next demo start", after="===== start #2")
    assert "DEMO MODE" in banner and "flushes them into its own new upstream" in banner
    demo.drained()
    upstream = demo.upstream()
    for name in ("demo", "other"):
        in_bucket = {key: body for (b, key), body in pending.items() if b == name}
        assert_in_upstream(upstream, name, in_bucket)
    # What the old demo upstream held is gone with it, and the gateway says so too.
    with pytest.raises(ClientError) as missing:
        s3.head_object(Bucket="demo", Key="ckpt/step_1/rank_0.pt")
    assert error_status(missing.value) == 404
    listed = s3.list_objects_v2(Bucket="demo")["Contents"]
    assert [o["Key"] for o in listed] == ["ckpt/step_2/rank_0.pt"]
    deadline = time.monotonic() + 20
    while flushed_body.exists():  # its body file goes with the background sweep
        assert time.monotonic() < deadline, f"{flushed_body} is still there"
        time.sleep(0.05)
    assert demo.stop() == 0
    assert (
        "exiting: everything acknowledged was flushed to the demo upstream, which lived in "
        "this process's memory and is lost now" in demo.log_path.read_text()
    )


def test_demo_then_real_then_demo_loses_nothing(
    tmp_path: Path, moto_server: str, upstream: Any, bucket: str
) -> None:
    """The path of issue 19: a demo's data dir used with a real upstream, stopped with
    writes pending, then started as the demo again."""
    data_dir = tmp_path / "gateway-data"
    demo = DemoGateway(data_dir)
    demo.start()
    demo.client().put_object(Bucket="demo", Key="tried", Body=b"first steps")
    demo.drained()
    demo.stop()

    real = GatewayProcess(data_dir, moto_server, log_path=tmp_path / "real.log")
    real.start()
    assert "dropped 1 cached copies (11 B) of objects flushed to the previous demo upstream" in (
        real.logged("dropped")
    )
    real.pause_flush()
    bodies = {f"ckpt/step_9/rank_{i}.pt": payload(3 * KiB + i, seed=f"r{i}") for i in range(4)}
    for key, body in bodies.items():
        real.client().put_object(Bucket=bucket, Key=key, Body=body)
    size = "12.0 KiB"  # 4 x 3 KiB + 6 B
    left = stop_with_pending(real)
    assert (
        f"exiting with 4 objects ({size}) not yet flushed; they are safe on disk in {data_dir} "
        f"and flush at the next start on it with --upstream-endpoint {moto_server}" in left
    )

    before = disk_state(data_dir)
    last = assert_one_line_failure(serve_once(demo), f"cannot start: data dir {data_dir}")
    assert last.endswith(
        f"it holds 4 objects ({size}) acknowledged for {moto_server} and not flushed there "
        f"yet: start it with --upstream-endpoint {moto_server} and that upstream's "
        "credentials to flush them, or give the demo another --data-dir"
    ), last
    assert disk_state(data_dir) == before

    real.start()
    real.drained()
    assert_in_upstream(upstream, bucket, bodies)
    real.stop()

    # Nothing is left to flush: the demo may have the data dir, and forgets the copies.
    demo.start()
    assert f"dropped 4 cached copies ({size}) of objects in {moto_server}" in demo.logged(
        "dropped", after="===== start #2"
    )
    with pytest.raises(ClientError) as missing:
        demo.client().head_object(Bucket=bucket, Key="ckpt/step_9/rank_0.pt")
    assert error_status(missing.value) == 404
    demo.stop()
    assert_in_upstream(upstream, bucket, bodies)


def test_real_writes_never_go_to_another_upstream(
    tmp_path: Path, moto_server: str, upstream: Any, bucket: str
) -> None:
    emu = EmulatorThread(latency_ms=0, buckets=[bucket]).start()  # another S3, empty
    try:
        data_dir = tmp_path / "data"
        first = GatewayProcess(data_dir, moto_server, log_path=tmp_path / "first.log")
        first.start()
        first.pause_flush()
        bodies = {f"run/{i}": payload(2 * KiB, seed=f"u{i}") for i in range(2)}
        for key, body in bodies.items():
            first.client().put_object(Bucket=bucket, Key=key, Body=body)
        stop_with_pending(first)

        second = GatewayProcess(data_dir, emu.url, log_path=tmp_path / "second.log")
        last = assert_one_line_failure(serve_once(second), f"cannot start: data dir {data_dir}")
        assert last.endswith(
            f"it holds 2 objects (4.0 KiB) acknowledged for {moto_server} and not flushed "
            f"there yet: start it with --upstream-endpoint {moto_server} and that upstream's "
            "credentials to flush them, or give this gateway another --data-dir (or "
            f"--adopt-data-dir true to send them to {emu.url})"
        ), last

        # The same upstream under another spelling is another upstream to the gateway: the
        # operator adopts the writes for it.
        port = moto_server.rsplit(":", 1)[1]
        adopting = GatewayProcess(
            data_dir,
            f"http://localhost:{port}/",
            extra_args=["--adopt-data-dir", "true"],
            log_path=tmp_path / "adopt.log",
        )
        adopting.start()
        assert (
            f"--adopt-data-dir true: 2 objects (4.0 KiB), acknowledged for {moto_server}, "
            f"flush to http://localhost:{port} instead"
            in adopting.logged("--adopt-data-dir true: ")
        )
        adopting.drained()
        adopting.stop()
        assert_in_upstream(upstream, bucket, bodies)

        # Nothing unflushed: another upstream may take the data dir, and never serves the
        # first one's bytes as its own.
        second.start()
        assert "dropped 2 cached copies (4.0 KiB)" in second.logged("dropped")
        with pytest.raises(ClientError) as missing:
            second.client().get_object(Bucket=bucket, Key="run/0")
        assert error_status(missing.value) == 404
        second.stop()
        assert emu.call(lambda: emu.emulator.objects(bucket)) == {}
    finally:
        emu.stop()


def test_an_older_versions_data_dir_is_never_emptied(
    tmp_path: Path, moto_server: str, upstream: Any, bucket: str
) -> None:
    """A data dir an older version wrote has no record of its upstream. With that version's
    demo mark, the upstream of its unflushed writes is unknown: refused by every start, until
    an operator adopts them; without the mark (written with a real upstream) a real start
    takes them as its own, as that version did (the upgrade path)."""
    data_dir = tmp_path / "data"
    gw = GatewayProcess(data_dir, moto_server)
    gw.start()
    gw.pause_flush()
    gw.client().put_object(Bucket=bucket, Key="old/1", Body=b"older")
    stop_with_pending(gw)
    _as_an_older_version_left_it(data_dir, demo_mark=True)

    demo = DemoGateway(data_dir)
    last = assert_one_line_failure(serve_once(demo), f"cannot start: data dir {data_dir}")
    assert last.endswith(
        "it holds 1 objects (5 B) not flushed yet, written by an older version that did not "
        "record for which upstream (a demo data dir then): start it with --upstream-endpoint "
        "of the upstream they were written for and --adopt-data-dir true to flush them "
        "there, or give the demo another --data-dir"
    ), last
    last = assert_one_line_failure(serve_once(gw), f"cannot start: data dir {data_dir}")
    assert "written by an older version" in last and "give this gateway another" in last

    adopting = GatewayProcess(
        data_dir, moto_server, extra_args=["--adopt-data-dir", "true"], log_path=gw.log_path
    )
    adopting.start()
    adopting.drained()
    assert not (data_dir / "DEMO-DATA-DIR").exists()
    adopting.pause_flush()
    adopting.client().put_object(Bucket=bucket, Key="old/2", Body=b"upgrade")
    stop_with_pending(adopting)
    _as_an_older_version_left_it(data_dir, demo_mark=False)

    gw.start()
    assert (
        "the data dir has no record of its upstream (an older version wrote it): its 1 "
        f"objects (7 B) not flushed yet are taken as acknowledged for {moto_server}"
        in gw.logged("no record of its upstream", after=f"===== start #{gw.starts}")
    )
    gw.drained()
    gw.stop()
    assert_in_upstream(upstream, bucket, {"old/1": b"older", "old/2": b"upgrade"})


def _as_an_older_version_left_it(data_dir: Path, *, demo_mark: bool) -> None:
    """The journal without the upstream record (as versions before it wrote it) and, for a
    data dir an older demo made, its mark."""
    conn = sqlite3.connect(data_dir / "journal.db")
    try:
        conn.execute("DROP TABLE upstream")
    finally:
        conn.close()
    if demo_mark:
        (data_dir / "DEMO-DATA-DIR").write_text("A demo data dir (an older version's mark)\n")


def test_the_demo_without_its_extra_says_how_to_get_it(tmp_path: Path) -> None:
    """A production install has no moto (the demo extra): `gateway serve` without
    --upstream-endpoint then says in one line what to do, and creates no data dir. (A
    package named moto that fails to import stands in for its absence.)"""
    shim = tmp_path / "shim" / "moto"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'moto'\", name='moto')\n"
    )
    gw = DemoGateway(tmp_path / "data")
    env = {**gw.environment(), "PYTHONPATH": str(shim.parent)}
    done = serve_once(gw, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "gateway: cannot start: no --upstream-endpoint given, and the embedded demo upstream "
        "is not installed (moto is missing): give --upstream-endpoint, or install the demo "
        "extra (make run does; pip install -r requirements/demo.txt)"
    ]
    assert not gw.data_dir.exists()
