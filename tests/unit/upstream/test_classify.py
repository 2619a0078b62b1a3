"""How upstream write failures are classified for the flusher (gateway/upstream/classify.py)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from gateway.upstream.classify import Corrupt, Fatal, Retryable, Throttled, for_flush


def _client_error(code: str, status: int) -> ClientError:
    response = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}},
    }
    return ClientError(response, "PutObject")  # type: ignore[arg-type]


@pytest.mark.parametrize("code", ["BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"])
def test_digest_refusals_are_local_corruption(code: str) -> None:
    got = for_flush(_client_error(code, 400))
    assert isinstance(got, Corrupt) and isinstance(got, Fatal)
    assert str(got).startswith(f"local corruption: {code}:")


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("AccessDenied", 403, Fatal),
        ("SlowDown", 503, Throttled),
        ("InternalError", 500, Retryable),
    ],
)
def test_other_refusals_keep_their_class(code: str, status: int, kind: type) -> None:
    got = for_flush(_client_error(code, status))
    assert type(got) is kind
