"""Start-up failures of `gateway serve`, as an operator meets them: one line on stderr naming
the cause, exit status 2, no traceback, nothing left half-started; and the data dir's lock
(one gateway per data dir)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import GatewayProcess, free_port

START_TIMEOUT_S = 60


def serve_once(
    gw: GatewayProcess, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the gateway's own command (plus ``extra`` flags; in ``env`` if given, else its
    own environment) expecting it to exit."""
    return subprocess.run(
        [*gw.command(), *extra],
        env=gw.environment() if env is None else env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )


def assert_one_line_failure(done: subprocess.CompletedProcess[str], *cause: str) -> str:
    """Exit 2; the last stderr line says why; nothing else but ordinary info lines."""
    out = done.stderr + done.stdout
    assert done.returncode == 2, out
    assert "Traceback" not in out, out
    lines = done.stderr.strip().splitlines()
    last = lines[-1]
    assert last.startswith("gateway: "), out
    for part in cause:
        assert part in last, out
    # Nothing before it but start-up info (no errors from tasks of a half-started gateway).
    assert not [line for line in lines[:-1] if " ERROR " in line or " WARNING " in line], out
    return last


@pytest.fixture
def listening() -> Iterator[int]:
    """A loopback port some other program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("which", ["s3", "admin"])
def test_port_in_use_is_one_line(
    moto_server: str, tmp_path: Path, listening: int, which: str
) -> None:
    port = {"port": listening} if which == "s3" else {"admin_port": listening}
    gw = GatewayProcess(tmp_path / "data", moto_server, **port)  # type: ignore[arg-type]
    done = serve_once(gw)
    assert_one_line_failure(done, f"listening on 127.0.0.1:{listening}", "address already in use")
    # Nothing was left behind (the lock included): the same data dir starts a gateway.
    other = GatewayProcess(tmp_path / "data", moto_server)
    other.start()
    other.stop()


@contextlib.contextmanager
def _read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory the gateway cannot write: a read-only tmpfs (root), else mode 0555."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if os.geteuid() != 0:
        (mount / "data").mkdir()
        mount.chmod(0o555)
        (mount / "data").chmod(0o555)
        yield mount / "data"
        return
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr!r}")
    try:
        (mount / "data").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        yield mount / "data"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_read_only_data_dir_is_one_line(moto_server: str, tmp_path: Path) -> None:
    with _read_only_dir(tmp_path) as data_dir:
        gw = GatewayProcess(data_dir, moto_server, log_path=tmp_path / "ro.log")
        done = serve_once(gw)
        last = assert_one_line_failure(done, f"data dir {data_dir}")
        assert "read-only file system" in last or "permission denied" in last, last
        # Neither listener was opened: both ports are free.
        for port in (gw.port, gw.admin_port):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    ("case", "args", "cause"),
    [
        ("tls-missing", ["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.pem"],
         ["configuration error", "tls-cert: /nonexistent.pem does not exist"]),
        ("tls-garbage", ["--tls-cert", "{garbage}", "--tls-key", "{garbage}"],
         ["cannot start: reading the TLS certificate and key", "not a PEM"]),
        ("endpoint-no-scheme", ["--upstream-endpoint", "s3.us-east-1.amazonaws.com"],
         ["configuration error", "upstream-endpoint", "http(s)://"]),
        ("endpoint-bad-port", ["--upstream-endpoint", "http://127.0.0.1:99999"],
         ["configuration error", "upstream-endpoint", "out of range"]),
        ("capacity", ["--capacity", "lots"], ["configuration error", "capacity: not a size"]),
        ("listen-port", ["--listen", "127.0.0.1:70000"], ["configuration error", "listen"]),
        ("address-not-here", ["--listen", "192.0.2.1:9000"],
         ["cannot start: listening on 192.0.2.1:9000", "cannot assign requested address"]),
        ("data-dir-is-a-file", ["--data-dir", "{garbage}"], ["not a directory"]),
        ("journal-not-sqlite", [], ["cannot start: opening the journal", "not a database"]),
    ],
)  # fmt: skip
def test_other_start_up_failures_are_one_line(
    moto_server: str, tmp_path: Path, case: str, args: list[str], cause: list[str]
) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN NOTHING-----\n")
    gw = GatewayProcess(tmp_path / "data", moto_server)
    if case == "journal-not-sqlite":
        gw.data_dir.mkdir()
        (gw.data_dir / "journal.db").write_text("these are not the pages of a database\n")
    done = serve_once(gw, *[a.replace("{garbage}", str(garbage)) for a in args])
    assert_one_line_failure(done, *cause)
    # Nothing was created on disk: no data dir, or the one there as it was.
    if case == "journal-not-sqlite":
        assert os.listdir(gw.data_dir) == ["journal.db"]
        assert (gw.data_dir / "journal.db").read_text() == "these are not the pages of a database\n"
    else:
        assert not gw.data_dir.exists()
    assert garbage.read_text() == "-----BEGIN NOTHING-----\n"


@pytest.mark.parametrize("case", ["new-nested-dir", "existing-dir", "blobs-is-a-file"])
def test_a_failed_start_leaves_the_disk_as_it_was(
    moto_server: str, tmp_path: Path, listening: int, case: str
) -> None:
    """A data dir the start made is gone again; one that existed holds what it held (no new
    journal or lock file in it), whichever step failed: the S3 address in use (before the
    data dir is touched), or the body store after the journal was created."""
    data_dir = (
        tmp_path / "new" / "nested" / "data" if case == "new-nested-dir" else tmp_path / "data"
    )
    if case != "new-nested-dir":
        data_dir.mkdir()
        (data_dir / "notes.txt").write_text("the operator's\n")
    extra: dict[str, int] = {}
    if case == "blobs-is-a-file":
        (data_dir / "blobs").write_text("not a directory\n")
    else:
        extra["port"] = listening
    gw = GatewayProcess(data_dir, moto_server, log_path=tmp_path / "gw.log", **extra)  # type: ignore[arg-type]
    done = serve_once(gw)
    if case == "blobs-is-a-file":
        assert_one_line_failure(done, f"cannot start: opening the data dir {data_dir}")
        assert sorted(os.listdir(data_dir)) == ["blobs", "notes.txt"]
    else:
        assert_one_line_failure(done, f"listening on 127.0.0.1:{listening}")
    if case == "new-nested-dir":
        assert not (tmp_path / "new").exists()
    else:
        assert (data_dir / "notes.txt").read_text() == "the operator's\n"
        assert not (data_dir / "journal.db").exists() and not (data_dir / "gateway.lock").exists()


@pytest.mark.parametrize("case", ["none", "partial"])
def test_no_upstream_credentials_is_one_line(moto_server: str, tmp_path: Path, case: str) -> None:
    """A real upstream and no upstream credentials in the AWS chain: the start fails before
    it creates anything (every PUT would otherwise be acknowledged and never flushed)."""
    gw = GatewayProcess(tmp_path / "data", moto_server)
    env = gw.environment()
    del env["AWS_SECRET_ACCESS_KEY"]
    if case == "none":
        del env["AWS_ACCESS_KEY_ID"]
    done = serve_once(gw, env=env)
    if case == "none":
        last = assert_one_line_failure(
            done,
            f"cannot start: setting up the upstream client for {moto_server}: no upstream "
            "credentials found",
        )
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ROLE_ARN"):
            assert name in last, last
    else:
        assert_one_line_failure(done, "missing: AWS_SECRET_ACCESS_KEY")
    assert not gw.data_dir.exists()


def test_an_unreachable_upstream_is_a_warning_not_a_refusal(tmp_path: Path) -> None:
    """An outage must not stop a node from acknowledging writes: the start says the
    upstream does not answer, and serves."""
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gw = GatewayProcess(tmp_path / "data", down)
    gw.start()
    try:
        log = gw.logged("flush once it answers")
        line = next(line for line in log.splitlines() if "flush once it answers" in line)
        assert f"WARNING gateway [-]: upstream {down}: Could not connect" in line, line
        assert gw.status()["pending_objects"] == 0
    finally:
        gw.stop()


def test_a_second_gateway_on_one_data_dir_refuses(
    gateway_factory: Any, moto_server: str, bucket: str
) -> None:
    first = gateway_factory()
    first.client().put_object(Bucket=bucket, Key="locked/k", Body=b"v")
    second = GatewayProcess(first.data_dir, moto_server, log_path=first.data_dir.parent / "2.log")
    done = serve_once(second)
    assert_one_line_failure(
        done, f"data dir {first.data_dir}", f"in use by another gateway (pid {first.pid})"
    )
    assert first.drained(bucket=bucket)["drained"] is True  # the first one never noticed
    # The lock goes with its process, however it ends (kill -9 included).
    first.kill()
    second.start()
    assert second.object_state(bucket, "locked/k")["state"] == "durable"
    second.stop()


def test_a_start_up_failure_leaves_nothing_in_process(tmp_path: Path, listening: int) -> None:
    """``serve`` in-process with the admin port taken: StartupError, and after it no thread,
    task, listener or lock of the gateway is left (the S3 port was bound, then released)."""
    import asyncio
    import threading

    from gateway.app import serve
    from gateway.config import Settings
    from gateway.startup import StartupError
    from gateway.store import datadir

    s3_port = free_port()
    settings = Settings(
        listen=f"127.0.0.1:{s3_port}",
        admin_listen=f"127.0.0.1:{listening}",
        data_dir=tmp_path / "data",
        upstream_endpoint="http://127.0.0.1:9",  # never contacted: nothing flushes
        access_key="k",
        secret_key="s",
        durability="none",
    )
    threads_before = set(threading.enumerate())

    async def attempt() -> None:
        with pytest.raises(StartupError, match=f"listening on 127.0.0.1:{listening}"):
            await serve(settings)
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(attempt())
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - threads_before and time.monotonic() < deadline:
        time.sleep(0.05)  # executor threads finish their last item
    assert not set(threading.enumerate()) - threads_before
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", s3_port))
    datadir.lock(tmp_path / "data").release()


def test_stop_and_restart_say_what_is_left_and_what_was_recovered(
    gateway_factory: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    gw.pause_flush()
    s3.put_object(Bucket=bucket, Key="left/a", Body=b"a" * 1000)
    s3.put_object(Bucket=bucket, Key="left/b", Body=b"b" * 2000)
    # Ctrl-C with the flusher paused: no drain is promised, and what is left is said.
    started = time.monotonic()
    gw.send_signal(signal.SIGINT)
    assert gw.wait_exit() == 0
    assert time.monotonic() - started < 15
    first_run = gw.log_path.read_text()
    assert "the flusher is paused, so nothing is drained" in first_run
    assert "draining" not in first_run
    assert "exiting with 2 objects (2.9 KiB) not yet flushed" in first_run

    gw.start()
    recovered = "recovered 2 pending objects (2.9 KiB) from the journal; flushing resumes"
    restarted = gw.logged(recovered, after="===== start #2")
    assert recovered in restarted
    gw.drained(bucket=bucket)
    gw.send_signal(signal.SIGTERM)
    assert gw.wait_exit() == 0
    last_run = gw.log_path.read_text().split("===== start #2")[1]
    assert "shutting down: refusing new writes; nothing is pending" in last_run
    assert "exiting: everything acknowledged is durable upstream" in last_run


def test_upstream_refusing_the_credentials_is_a_warning(gateway_factory: Any) -> None:
    """An upstream that answers but does not know the gateway's upstream key (here another
    gateway, which checks SigV4 against its own client keys): the start says so, and serves."""
    front = gateway_factory()
    gw = GatewayProcess(front.data_dir.parent / "behind", front.endpoint)
    gw.start()
    try:
        line = next(
            line
            for line in gw.logged("refused the gateway's credentials").splitlines()
            if "refused the gateway's credentials" in line
        )
        assert line.split(" gateway [-]: ", 1)[1].startswith(
            f"upstream {front.endpoint}: it refused the gateway's credentials (InvalidAccessKeyId: "
        ), line
        assert "none flushes until the upstream credentials are fixed" in line
    finally:
        gw.stop()
