"""Listing cases of ceph/s3-tests (test_s3.py: test_bucket_list*, test_bucket_listv2*),
rewritten against the gateway with the moto upstream: the same requests through boto3 and
the same codes and values asserted. Each test names the s3-tests case it mirrors."""

from __future__ import annotations

from typing import Any

import botocore
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from harness import error_code, error_status

KEYS = ["bar", "baz", "foo", "quxx"]


@pytest.fixture
def listed(s3: Any, bucket: str) -> str:
    for key in KEYS:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    return bucket


def _keys(resp: dict[str, Any]) -> list[str]:
    return [o["Key"] for o in resp.get("Contents", [])]


def test_bucket_listv2_fetchowner_notempty(s3: Any, bucket: str) -> None:
    for key in ("foo/bar", "foo/baz", "quux"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    contents = s3.list_objects_v2(Bucket=bucket, FetchOwner=True)["Contents"]
    owner = contents[0]["Owner"]
    assert owner["ID"] and owner["DisplayName"]
    # The one identity the gateway serves: the owner ListBuckets reports too.
    assert owner == s3.list_buckets()["Owner"]


@pytest.mark.parametrize("fetch", [None, False])
def test_bucket_listv2_fetchowner_defaultempty_and_empty(
    s3: Any, listed: str, fetch: bool | None
) -> None:
    kwargs = {} if fetch is None else {"FetchOwner": fetch}
    assert "Owner" not in s3.list_objects_v2(Bucket=listed, **kwargs)["Contents"][0]


def test_bucket_list_return_data(s3: Any, listed: str) -> None:
    """v1 always carries each key's Owner, with the figures HEAD gives."""
    owner = s3.list_buckets()["Owner"]
    for obj in s3.list_objects(Bucket=listed)["Contents"]:
        head = s3.head_object(Bucket=listed, Key=obj["Key"])
        assert obj["ETag"] == head["ETag"]
        assert obj["Size"] == head["ContentLength"]
        assert obj["Owner"] == owner
        assert obj["LastModified"].replace(microsecond=0) == head["LastModified"]


def test_bucket_list_maxkeys_invalid(s3: Any, listed: str) -> None:
    def add_invalid_maxkeys(**kwargs: Any) -> None:
        kwargs["params"]["url"] += "&max-keys=blah"

    s3.meta.events.register("before-call.s3.ListObjects", add_invalid_maxkeys)
    try:
        with pytest.raises(ClientError) as exc:
            s3.list_objects(Bucket=listed)
    finally:
        s3.meta.events.unregister("before-call.s3.ListObjects", add_invalid_maxkeys)
    assert error_status(exc.value) == 400
    assert error_code(exc.value) == "InvalidArgument"


def test_bucket_list_marker_none_and_empty(s3: Any, listed: str) -> None:
    assert s3.list_objects(Bucket=listed)["Marker"] == ""
    resp = s3.list_objects(Bucket=listed, Marker="")
    assert resp["Marker"] == "" and resp["IsTruncated"] is False
    assert _keys(resp) == KEYS


def test_bucket_listv2_continuationtoken_empty(s3: Any, listed: str) -> None:
    resp = s3.list_objects_v2(Bucket=listed, ContinuationToken="")
    assert resp["ContinuationToken"] == ""
    assert resp["IsTruncated"] is False
    assert _keys(resp) == KEYS


def test_bucket_listv2_continuationtoken(s3: Any, listed: str) -> None:
    token = s3.list_objects_v2(Bucket=listed, MaxKeys=1)["NextContinuationToken"]
    resp = s3.list_objects_v2(Bucket=listed, ContinuationToken=token)
    assert resp["ContinuationToken"] == token
    assert resp["IsTruncated"] is False
    assert _keys(resp) == ["baz", "foo", "quxx"]


def test_bucket_listv2_both_continuationtoken_startafter(s3: Any, listed: str) -> None:
    token = s3.list_objects_v2(Bucket=listed, StartAfter="bar", MaxKeys=1)["NextContinuationToken"]
    resp = s3.list_objects_v2(Bucket=listed, StartAfter="bar", ContinuationToken=token)
    assert resp["ContinuationToken"] == token
    assert resp["StartAfter"] == "bar"
    assert resp["IsTruncated"] is False
    assert _keys(resp) == ["foo", "quxx"]


def test_bucket_list_marker_unreadable(s3: Any, listed: str) -> None:
    resp = s3.list_objects(Bucket=listed, Marker="\x0a")
    assert resp["Marker"] == "\x0a"
    assert resp["IsTruncated"] is False
    assert _keys(resp) == KEYS


def test_bucket_listv2_startafter_unreadable(s3: Any, listed: str) -> None:
    resp = s3.list_objects_v2(Bucket=listed, StartAfter="\x0a")
    assert resp["StartAfter"] == "\x0a"
    assert resp["IsTruncated"] is False
    assert _keys(resp) == KEYS


@pytest.mark.parametrize(("marker", "expected"), [("blah", ["foo", "quxx"]), ("zzz", [])])
def test_bucket_list_marker_not_in_list_and_after_list(
    s3: Any, listed: str, marker: str, expected: list[str]
) -> None:
    resp = s3.list_objects(Bucket=listed, Marker=marker)
    assert resp["Marker"] == marker
    assert _keys(resp) == expected
    v2 = s3.list_objects_v2(Bucket=listed, StartAfter=marker)
    assert v2["StartAfter"] == marker
    assert _keys(v2) == expected
    assert v2["IsTruncated"] is False


@pytest.mark.parametrize("delimiter", ["\x0a"])
def test_bucket_list_delimiter_unreadable(s3: Any, bucket: str, delimiter: str) -> None:
    keys = ["bar", "baz", "cab", "foo"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    for resp in (
        s3.list_objects(Bucket=bucket, Delimiter=delimiter),
        s3.list_objects_v2(Bucket=bucket, Delimiter=delimiter),
    ):
        assert resp["Delimiter"] == delimiter
        assert _keys(resp) == keys
        assert resp.get("CommonPrefixes", []) == []


def test_bucket_list_delimiter_basic(s3: Any, bucket: str) -> None:
    for key in ("foo/bar", "foo/bar/xyzzy", "quux/thud", "asdf"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    for resp in (
        s3.list_objects(Bucket=bucket, Delimiter="/"),
        s3.list_objects_v2(Bucket=bucket, Delimiter="/"),
    ):
        assert resp["Delimiter"] == "/"
        assert _keys(resp) == ["asdf"]
        assert [p["Prefix"] for p in resp["CommonPrefixes"]] == ["foo/", "quux/"]


def test_bucket_list_maxkeys_zero(s3: Any, listed: str) -> None:
    resp = s3.list_objects(Bucket=listed, MaxKeys=0)
    assert resp["IsTruncated"] is False
    assert _keys(resp) == []


def test_bucket_listv2_maxkeys_one(s3: Any, listed: str) -> None:
    resp = s3.list_objects_v2(Bucket=listed, MaxKeys=1)
    assert resp["IsTruncated"] is True
    assert _keys(resp) == KEYS[:1]
    resp = s3.list_objects_v2(Bucket=listed, StartAfter=KEYS[0])
    assert resp["IsTruncated"] is False
    assert _keys(resp) == KEYS[1:]


def test_bucket_list_objects_anonymous_fail(gateway: Any, listed: str) -> None:
    anon = gateway.client(config=Config(signature_version=botocore.UNSIGNED))
    with pytest.raises(ClientError) as exc:
        anon.list_objects(Bucket=listed)
    assert error_status(exc.value) == 403
    assert error_code(exc.value) == "AccessDenied"
