"""Fixtures for third-party client tests (``tls_ca`` and ``tls_gateway`` are in the root
conftest, shared with the upstream client's tests):

- ``aws_env`` (function): an environment for subprocess clients (AWS CLI) carrying the
  gateway's *client* credentials, no proxies, no shared config files.
"""

from __future__ import annotations

import os

import pytest
from harness import GATEWAY_ACCESS_KEY, GATEWAY_SECRET_KEY, REGION


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
