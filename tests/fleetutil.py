"""Several gateway processes forming one fleet on one upstream (docs/fleet.md)."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from harness import GatewayProcess, free_port, start_all, stop_all

FLEET_ARGS = ("--peer-lease", "1.5", "--peer-refresh", "1")


def fleet_of(
    base: Path,
    upstream_url: str,
    names: Sequence[str],
    extra_args: Sequence[str] = (),
) -> list[GatewayProcess]:
    """Gateways named ``names`` (not started), each given the same --peers list (every
    node, itself included: each leaves itself out, as on Slurm)."""
    ports = [free_port() for _ in names]
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    return [
        GatewayProcess(
            base / name,
            upstream_url,
            port=port,
            extra_args=["--node-id", name, "--peers", peers, *FLEET_ARGS, *extra_args],
        )
        for name, port in zip(names, ports, strict=True)
    ]


def until(check: Callable[[], Any], timeout_s: float = 20.0, what: str = "") -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.05)


def member(gateway: GatewayProcess, node: str) -> dict[str, Any]:
    for m in gateway.admin_get("/admin/v1/fleet")["members"]:
        if m["node"] == node:
            return dict(m)
    return {}


def wait_joined(gateways: Sequence[GatewayProcess], names: Sequence[str]) -> None:
    """Every gateway holds a trusted lease from every other one."""
    for gw, me in zip(gateways, names, strict=True):
        for other in names:
            if other != me:
                until(
                    lambda gw=gw, other=other: member(gw, other).get("lease_trusted"),
                    what=f"{me} to hold a lease from {other}",
                )


@contextlib.contextmanager
def running(
    gateways: Sequence[GatewayProcess], names: Sequence[str] = (), *, kill: bool = False
) -> Iterator[list[GatewayProcess]]:
    """The gateways started (and, given their ``names``, joined: ``wait_joined``); stopped
    after, or killed (``kill``: no drain to wait for)."""
    try:
        start_all(gateways)
        if names:
            wait_joined(gateways, names)
        yield list(gateways)
    finally:
        if kill:
            for gw in gateways:
                gw.kill()
        else:
            stop_all(gateways)


def held_by(head: dict[str, Any]) -> tuple[str | None, str | None]:
    """(x-gateway-flush-state, x-gateway-held-by) of a boto3 HEAD/GET answer."""
    headers = head["ResponseMetadata"]["HTTPHeaders"]
    return headers.get("x-gateway-flush-state"), headers.get("x-gateway-held-by")


def free_ports(n: int) -> list[int]:
    return [free_port() for _ in range(n)]


def stop_keeping_logs(gateways: Sequence[GatewayProcess], logs_dir: str) -> None:
    """Stop each gateway and, with ``logs_dir``, copy its log there (the loadtest scripts'
    ``--logs``: their gateways live in a temporary directory)."""
    for gw in gateways:
        gw.stop()
        if logs_dir:
            Path(logs_dir).mkdir(parents=True, exist_ok=True)
            shutil.copy(gw.log_path, Path(logs_dir) / gw.log_path.name)
