"""Shared fixtures: moto as the upstream, the gateway as a subprocess, boto3 clients.

Fixtures:
- ``moto_server`` (session): URL of a ThreadedMotoServer on a free loopback port.
- ``upstream`` (session): boto3 client straight to moto (the "real" bucket).
- ``gateway`` (module): one running GatewayProcess shared by a test module.
- ``s3`` (module): boto3 client to ``gateway`` (path-style, no retries).
- ``bucket`` (function): a unique bucket created directly in moto.
- ``fresh_gateway`` (function): a GatewayProcess with its own data dir (crash tests).
- ``gateway_factory`` (function): ``gateway_factory(extra_args=[...], ...)`` starts a
  GatewayProcess with its own data dir and options; all are stopped after the test.
- ``tls_ca`` (session): a trustme CA plus a server certificate for 127.0.0.1 / localhost,
  written as PEM files; ``tls_ca.ca_path`` is the bundle clients verify against.
- ``tls_gateway`` (module): a GatewayProcess serving S3 over https with that certificate
  (the admin API stays plain http, so the harness's drain/status helpers work unchanged).

Tests marked ``exclusive`` (they measure rates or timing that a second worker's load would
skew) are left out of ``make test``'s parallel pass and run after it, alone (Makefile).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (
    GatewayProcess,
    start_moto,
    unique_bucket_name,
    upstream_client,
)

from gateway.store.journal import Journal


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[Journal]:
    """An open journal at ``tmp_path / "j.db"`` (no fsync), closed after the test (unit
    tests of the store and the flush order; files with their own ``journal`` keep it)."""
    j = Journal(tmp_path / "j.db", fsync=False)
    j.open()
    yield j
    j.close()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    server, url = start_moto()
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def upstream(moto_server: str) -> Any:
    return upstream_client(moto_server)


def _teardown_gateway(gw: GatewayProcess) -> None:
    crashed = gw.crashed
    rc = gw.proc.returncode if gw.proc is not None else None
    gw.stop()
    if crashed:
        pytest.fail(
            f"gateway process died during the tests (exit status {rc}):\n{gw.log_tail()}",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def gateway(moto_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("gateway")
    gw = GatewayProcess(base / "data", moto_server)
    gw.start()
    try:
        yield gw
    finally:
        _teardown_gateway(gw)


@pytest.fixture(scope="module")
def s3(gateway: GatewayProcess) -> Any:
    return gateway.client()


@pytest.fixture
def bucket(upstream: Any) -> str:
    name = unique_bucket_name()
    upstream.create_bucket(Bucket=name)
    return name


@pytest.fixture
def fresh_gateway(moto_server: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(tmp_path / "data", moto_server)
    gw.start()
    try:
        yield gw
    finally:
        _teardown_gateway(gw)


@pytest.fixture
def gateway_factory(moto_server: str, tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def make(start: bool = True, **kwargs: Any) -> GatewayProcess:
        gw = GatewayProcess(tmp_path / f"data{len(started)}", moto_server, **kwargs)
        started.append(gw)
        if start:
            gw.start()
        return gw

    try:
        yield make
    finally:
        for gw in started:
            _teardown_gateway(gw)


@dataclass(frozen=True)
class TlsFiles:
    ca_path: str
    cert_path: str
    key_path: str


@pytest.fixture(scope="session")
def tls_ca(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    base = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca_path = base / "ca.pem"
    cert_path = base / "server-chain.pem"
    key_path = base / "server-key.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    server.private_key_pem.write_to_path(str(key_path))
    # Leaf first, then the chain (trustme's CA has no intermediates by default).
    with open(cert_path, "wb") as fh:
        for blob in server.cert_chain_pems:
            fh.write(blob.bytes())
    return TlsFiles(str(ca_path), str(cert_path), str(key_path))


@pytest.fixture(scope="module")
def tls_gateway(
    moto_server: str, tmp_path_factory: pytest.TempPathFactory, tls_ca: TlsFiles
) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("tls-gateway")
    gw = GatewayProcess(
        base / "data",
        moto_server,
        extra_args=["--tls-cert", tls_ca.cert_path, "--tls-key", tls_ca.key_path],
    )
    gw.start()
    try:
        yield gw
    finally:
        crashed = gw.proc is not None and not gw.running
        gw.stop()
        if crashed:
            pytest.fail(f"TLS gateway died during the tests:\n{gw.log_tail()}", pytrace=False)


# The files that take longest (worker-seconds, measured with --durations=0 on 2026-11-28),
# longest first. `make test` hands files to its workers in collection order
# (--no-loadscope-reorder; xdist's default puts the files with the most tests first, and
# left a 100-second file of two tests to start last): these go first, the rest after.
_LONGEST_FIRST = (
    "sim/test_sim_replicas.py",
    "integration/test_it_replicas.py",
    "faults/test_crash_kill.py",
    "integration/test_it_fleet.py",
    "sim/test_sim_scale.py",
    "integration/test_it_fills.py",
    "integration/test_it_demo.py",
    "integration/test_it_crash.py",
    "integration/test_it_fleet_shares.py",
    "integration/test_it_startup.py",
    "integration/test_it_lifecycle.py",
    "integration/test_it_readme.py",
    "integration/test_it_checkpoints.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        path = Path(str(item.path)).as_posix()
        return next((r for name, r in rank.items() if path.endswith(name)), len(rank))

    items.sort(key=key)  # stable: the rest keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for gw in list(GatewayProcess.live):
            report.sections.append(
                (f"gateway log (port {gw.port}, {gw.log_path})", gw.log_tail(60))
            )
    # A pytest-xdist worker sends its reports as UTF-8: a lone surrogate in captured output
    # (tests of keys and errors that are not valid UTF-8 log them) would crash the worker.
    report.sections = [(title, _utf8(text)) for title, text in report.sections]


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
