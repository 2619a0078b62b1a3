"""Fixtures for third-party client tests: a TLS-serving gateway and client environments.

- ``tls_ca`` (session): a trustme CA plus a server certificate for 127.0.0.1 / localhost,
  written as PEM files; ``tls_ca.ca_path`` is the bundle clients verify against.
- ``tls_gateway`` (module): a GatewayProcess serving S3 over https with that certificate
  (the admin API stays plain http, so the harness's drain/status helpers work unchanged).
- ``aws_env`` (function): an environment for subprocess clients (AWS CLI) carrying the
  gateway's *client* credentials, no proxies, no shared config files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import trustme
from harness import GATEWAY_ACCESS_KEY, GATEWAY_SECRET_KEY, REGION, GatewayProcess


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


@pytest.fixture
def aws_env() -> dict[str, str]:
    """A clean environment for a client subprocess, signing with the gateway's credentials."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AWS_") and k.upper() not in ("HTTP_PROXY", "HTTPS_PROXY")
    }
    env.update(
        {
            "AWS_ACCESS_KEY_ID": GATEWAY_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": GATEWAY_SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_CONFIG_FILE": os.devnull,
            "NO_PROXY": "*",
        }
    )
    return env
