"""LIST parameters validated as S3 validates them, and never a 500 for a marker S3 accepts.

S3 keys may hold control characters (S3's key guide lists 0x01-0x1F and 0x7F as characters
that need special handling, not as refused), so a marker or start-after holding them is a
position in the listing like any other: the gateway answers it correctly even though the
moto upstream cannot echo such a StartAfter in its XML. A continuation token the gateway
did not issue is S3's InvalidArgument.
"""

from __future__ import annotations

import base64
import urllib.parse
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import error_code, error_status, parse_s3_error
from s3raw import signed_raw

KEYS = ["a", "a\x01b", "a\x01c", "a\x02", "b\x7f", "z"]


@pytest.fixture
def listed_bucket(gateway: Any, s3: Any, upstream: Any, bucket: str) -> str:
    # Half the keys only upstream, half only local: the merge is exercised on both sides.
    for i, key in enumerate(KEYS):
        target = upstream if i % 2 else s3
        target.put_object(Bucket=bucket, Key=key, Body=key.encode())
    return bucket


def _v2_keys(s3: Any, bucket: str, **kwargs: Any) -> list[str]:
    page = s3.list_objects_v2(Bucket=bucket, EncodingType="url", **kwargs)
    return [urllib.parse.unquote(o["Key"]) for o in page.get("Contents", [])]


@pytest.mark.parametrize("start_after", ["\x00", "\x01\x02", "a\x01", "a\x01b", "b\x7f", "\x1f"])
def test_list_start_after_with_control_characters(
    gateway: Any, s3: Any, listed_bucket: str, start_after: str
) -> None:
    expected = [k for k in KEYS if k > start_after]
    assert _v2_keys(s3, listed_bucket, StartAfter=start_after) == expected


def test_list_v1_marker_with_control_characters(gateway: Any, s3: Any, listed_bucket: str) -> None:
    page = s3.list_objects(Bucket=listed_bucket, Marker="\x01\x02", EncodingType="url")
    assert [urllib.parse.unquote(o["Key"]) for o in page["Contents"]] == KEYS
    page = s3.list_objects(Bucket=listed_bucket, Marker="a\x01b", EncodingType="url")
    assert [urllib.parse.unquote(o["Key"]) for o in page["Contents"]] == KEYS[2:]


def test_list_pages_through_control_character_keys(
    gateway: Any, s3: Any, listed_bucket: str
) -> None:
    """v1 pagination hands the last key back as the marker: every page must work."""
    seen: list[str] = []
    marker = ""
    while True:
        page = s3.list_objects(
            Bucket=listed_bucket, Marker=marker, MaxKeys=1, Delimiter="/", EncodingType="url"
        )
        keys = [urllib.parse.unquote(o["Key"]) for o in page.get("Contents", [])]
        seen += keys
        if not page["IsTruncated"]:
            break
        marker = urllib.parse.unquote(page["NextMarker"])
    assert seen == KEYS


@pytest.mark.parametrize(
    "token",
    [
        "x" * 10_000,
        base64.urlsafe_b64encode(b"k" * 1025).decode(),  # longer than any key
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),  # not UTF-8
        "not base64 at all!",
    ],
)
def test_list_foreign_continuation_token_is_invalid_argument(
    gateway: Any, s3: Any, bucket: str, token: str
) -> None:
    with pytest.raises(ClientError) as exc:
        s3.list_objects_v2(Bucket=bucket, ContinuationToken=token)
    assert error_status(exc.value) == 400
    assert error_code(exc.value) == "InvalidArgument"
    assert exc.value.response["Error"]["Message"] == "The continuation token provided is incorrect"


def test_list_v1_refuses_start_after(gateway: Any, bucket: str) -> None:
    resp = signed_raw(gateway, "GET", f"/{bucket}?start-after=a")
    assert resp.status == 400
    err = parse_s3_error(resp.body)
    assert err["Code"] == "InvalidArgument"
    assert err["Message"] == "startAfter only supported in REST.GET.BUCKET with list-type=2"
    assert err["ArgumentName"] == "start-after"


def test_list_upstream_failure_is_explained_not_a_bare_500(
    gateway: Any, s3: Any, listed_bucket: str
) -> None:
    """moto cannot answer a delimiter it cannot put in XML: the client gets an error that
    says the upstream failed (never the gateway's bare InternalError), and the gateway logs it
    once."""
    with pytest.raises(ClientError) as exc:
        s3.list_objects_v2(Bucket=listed_bucket, Delimiter="\x01")
    message = exc.value.response["Error"]["Message"]
    assert "upstream" in message
    rid = exc.value.response["ResponseMetadata"]["RequestId"]
    text = gateway.logged(f"[{rid}]")
    lines = [line for line in text.splitlines() if f"[{rid}]" in line]
    assert sum("upstream" in line for line in lines) == 1, lines
    # The gateway keeps serving.
    assert _v2_keys(s3, listed_bucket) == KEYS
