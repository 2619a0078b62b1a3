"""ListObjectsV2 through the gateway: local pending state merged with the upstream listing."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import ClientError
from harness import (
    error_code,
    error_status,
    flush_state,
    list_all_keys,
    list_pages,
    payload,
    quoted_md5,
    read_body,
    unique_bucket_name,
    upstream_objects,
)


def _utf8_sorted(keys: Any) -> list[str]:
    return sorted(keys, key=lambda k: k.encode())


def _check_pages(pages: list[dict[str, Any]], max_keys: int) -> None:
    for i, page in enumerate(pages):
        contents = page.get("Contents", [])
        prefixes = page.get("CommonPrefixes", [])
        assert page["KeyCount"] == len(contents) + len(prefixes), page
        assert page["MaxKeys"] == max_keys
        assert len(contents) + len(prefixes) <= max_keys
        if i < len(pages) - 1:
            assert page["IsTruncated"] is True
            assert len(contents) + len(prefixes) == max_keys, "short page before the end"
        else:
            assert page["IsTruncated"] is False
            assert "NextContinuationToken" not in page


def test_pagination_mixes_pending_and_flushed(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    bodies: dict[str, bytes] = {}
    # Phase 1: even-numbered keys, flushed upstream.
    for i in range(0, 30, 2):
        key = f"ckpt/shard-{i:03d}"
        bodies[key] = payload(100 + i, seed=key)
        s3.put_object(Bucket=bucket, Key=key, Body=bodies[key])
    bodies["aaa-first"] = b"first"
    s3.put_object(Bucket=bucket, Key="aaa-first", Body=b"first")
    gateway.drained(bucket=bucket)
    assert set(upstream_objects(upstream, bucket)) == set(bodies)

    with gateway.flush_paused():
        # Phase 2: odd-numbered keys interleaved, pending only; plus overwrites of flushed keys.
        for i in range(1, 30, 2):
            key = f"ckpt/shard-{i:03d}"
            bodies[key] = payload(200 + i, seed=key)
            s3.put_object(Bucket=bucket, Key=key, Body=bodies[key])
        for i in (0, 10, 28):
            key = f"ckpt/shard-{i:03d}"
            bodies[key] = payload(5000 + i, seed=f"overwrite-{key}")
            s3.put_object(Bucket=bucket, Key=key, Body=bodies[key])
        bodies["zzz-last"] = b"last"
        s3.put_object(Bucket=bucket, Key="zzz-last", Body=b"last")

        # The mix is real: the upstream does not have phase 2 yet.
        up = upstream_objects(upstream, bucket)
        assert "ckpt/shard-001" not in up
        assert "zzz-last" not in up
        assert up["ckpt/shard-000"]["Size"] == 100

        expected = _utf8_sorted(bodies)
        for max_keys in (1, 3, 7, 16, 1000):
            pages = list_pages(s3, bucket, MaxKeys=max_keys)
            _check_pages(pages, max_keys)
            listed = [obj for p in pages for obj in p.get("Contents", [])]
            assert [o["Key"] for o in listed] == expected, f"MaxKeys={max_keys}"
            for obj in listed:
                assert obj["Size"] == len(bodies[obj["Key"]]), obj["Key"]
                assert obj["ETag"] == quoted_md5(bodies[obj["Key"]]), obj["Key"]

        # Prefix + pagination.
        pages = list_pages(s3, bucket, Prefix="ckpt/", MaxKeys=4)
        _check_pages(pages, 4)
        assert [o["Key"] for p in pages for o in p.get("Contents", [])] == [
            k for k in expected if k.startswith("ckpt/")
        ]

    gateway.drained(bucket=bucket)
    assert list_all_keys(s3, bucket) == expected
    up = upstream_objects(upstream, bucket)
    assert _utf8_sorted(up) == expected
    for key, obj in up.items():
        assert obj["ETag"] == quoted_md5(bodies[key])


def test_delimiter_common_prefixes(gateway: Any, s3: Any, bucket: str) -> None:
    flushed = ["a/1", "b/x/1", "c", "e/deep/er/1"]
    pending = ["a/2", "b/y", "d/", "d/inner", "f", "b/x/2"]
    for key in flushed:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    gateway.drained(bucket=bucket)
    with gateway.flush_paused():
        for key in pending:
            s3.put_object(Bucket=bucket, Key=key, Body=key.encode())

        resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
        assert [o["Key"] for o in resp["Contents"]] == ["c", "f"]
        assert [p["Prefix"] for p in resp["CommonPrefixes"]] == ["a/", "b/", "d/", "e/"]
        assert resp["KeyCount"] == 6
        assert resp["Delimiter"] == "/"
        assert resp["IsTruncated"] is False

        resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/", Prefix="b/")
        assert [o["Key"] for o in resp["Contents"]] == ["b/y"]
        assert [p["Prefix"] for p in resp["CommonPrefixes"]] == ["b/x/"]
        assert resp["Prefix"] == "b/"

        resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/", Prefix="d/")
        assert [o["Key"] for o in resp["Contents"]] == ["d/", "d/inner"]
        assert "CommonPrefixes" not in resp

        resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/", Prefix="e/")
        assert "Contents" not in resp
        assert [p["Prefix"] for p in resp["CommonPrefixes"]] == ["e/deep/"]

        # Paginated with a delimiter: common prefixes count towards MaxKeys, once each.
        entries: list[str] = []
        pages = list_pages(s3, bucket, Delimiter="/", MaxKeys=1)
        _check_pages(pages, 1)
        for page in pages:
            entries += [o["Key"] for o in page.get("Contents", [])]
            entries += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        assert entries == ["a/", "b/", "c", "d/", "e/", "f"]

        pages = list_pages(s3, bucket, Delimiter="/", MaxKeys=2)
        _check_pages(pages, 2)
        assert len(pages) == 3


def test_other_delimiter(s3: Any, bucket: str) -> None:
    for key in ["x-1-a", "x-1-b", "x-2", "y"]:
        s3.put_object(Bucket=bucket, Key=key, Body=b".")
    resp = s3.list_objects_v2(Bucket=bucket, Delimiter="-", Prefix="x-")
    assert [p["Prefix"] for p in resp["CommonPrefixes"]] == ["x-1-"]
    assert [o["Key"] for o in resp["Contents"]] == ["x-2"]


def test_start_after(gateway: Any, s3: Any, bucket: str) -> None:
    keys = [f"k{i:02d}" for i in range(12)]
    for key in keys[:6]:
        s3.put_object(Bucket=bucket, Key=key, Body=b"f")
    gateway.drained(bucket=bucket)
    with gateway.flush_paused():
        for key in keys[6:]:
            s3.put_object(Bucket=bucket, Key=key, Body=b"p")
        assert list_all_keys(s3, bucket, StartAfter="k03") == keys[4:]
        assert list_all_keys(s3, bucket, StartAfter="k07") == keys[8:]
        assert list_all_keys(s3, bucket, StartAfter="k05x") == keys[6:]
        assert list_all_keys(s3, bucket, StartAfter="k11") == []
        assert list_all_keys(s3, bucket, StartAfter="") == keys
        assert list_all_keys(s3, bucket, StartAfter="a") == keys
        pages = list_pages(s3, bucket, StartAfter="k02", MaxKeys=4)
        _check_pages(pages, 4)
        assert [o["Key"] for p in pages for o in p["Contents"]] == keys[3:]
        assert pages[0]["StartAfter"] == "k02"


def test_deleted_while_paused_is_hidden(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    for key in ["d/keep-1", "d/gone", "d/keep-2"]:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    gateway.drained(bucket=bucket)
    with gateway.flush_paused():
        s3.delete_object(Bucket=bucket, Key="d/gone")
        # The delete is local only: the upstream still has the object.
        assert "d/gone" in upstream_objects(upstream, bucket)
        assert list_all_keys(s3, bucket) == ["d/keep-1", "d/keep-2"]
        assert list_all_keys(s3, bucket, MaxKeys=1) == ["d/keep-1", "d/keep-2"]
        assert list_all_keys(s3, bucket, StartAfter="d/gone") == ["d/keep-1", "d/keep-2"]
        resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
        assert [p["Prefix"] for p in resp["CommonPrefixes"]] == ["d/"]
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=bucket, Key="d/gone")
        assert error_code(exc.value) == "NoSuchKey"
        with pytest.raises(ClientError) as exc:
            s3.head_object(Bucket=bucket, Key="d/gone")
        assert error_code(exc.value) == "404"
    gateway.drained(bucket=bucket)
    assert set(upstream_objects(upstream, bucket)) == {"d/keep-1", "d/keep-2"}
    assert list_all_keys(s3, bucket) == ["d/keep-1", "d/keep-2"]


def test_deleted_prefix_with_only_tombstones_disappears(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    for key in ["only/a", "only/b", "other"]:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    gateway.drained(bucket=bucket)
    with gateway.flush_paused():
        s3.delete_object(Bucket=bucket, Key="only/a")
        s3.delete_object(Bucket=bucket, Key="only/b")
        resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
        assert "CommonPrefixes" not in resp, resp.get("CommonPrefixes")
        assert [o["Key"] for o in resp["Contents"]] == ["other"]
        assert resp["KeyCount"] == 1


def test_upstream_only_objects_are_visible(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    direct = payload(12_345, seed="direct")
    upstream.put_object(
        Bucket=bucket, Key="up/direct.bin", Body=direct, Metadata={"origin": "upstream"}
    )
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="up/local.bin", Body=b"local")
        resp = s3.list_objects_v2(Bucket=bucket)
        assert [o["Key"] for o in resp["Contents"]] == ["up/direct.bin", "up/local.bin"]
        assert resp["KeyCount"] == 2
        by_key = {o["Key"]: o for o in resp["Contents"]}
        assert by_key["up/direct.bin"]["Size"] == len(direct)
        assert by_key["up/direct.bin"]["ETag"] == quoted_md5(direct)

        got = s3.get_object(Bucket=bucket, Key="up/direct.bin")
        assert read_body(got) == direct
        assert got["ETag"] == quoted_md5(direct)
        assert got["Metadata"] == {"origin": "upstream"}
        assert flush_state(got) == "durable"
        head = s3.head_object(Bucket=bucket, Key="up/direct.bin")
        assert head["ContentLength"] == len(direct)
        assert head["ETag"] == quoted_md5(direct)


def test_local_overwrite_shadows_upstream(
    gateway: Any, s3: Any, upstream: Any, bucket: str
) -> None:
    upstream.put_object(Bucket=bucket, Key="shadow", Body=b"old upstream body")
    with gateway.flush_paused():
        s3.put_object(Bucket=bucket, Key="shadow", Body=b"new")
        resp = s3.list_objects_v2(Bucket=bucket)
        assert [(o["Key"], o["Size"], o["ETag"]) for o in resp["Contents"]] == [
            ("shadow", 3, quoted_md5(b"new"))
        ]
        assert read_body(s3.get_object(Bucket=bucket, Key="shadow")) == b"new"


def test_unicode_and_space_keys_listed(gateway: Any, s3: Any, bucket: str) -> None:
    keys = [
        "sp ace/ä ö ü",
        "日本/語.txt",
        "plus+key",
        "pct%25key%",
        "amp&<lt>\"quot'",
        "emoji/🚀",
        "dir//x",
        "  spaces around  ",
    ]
    half = len(keys) // 2
    for key in keys[:half]:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    gateway.drained(bucket=bucket)
    with gateway.flush_paused():
        for key in keys[half:]:
            s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
        expected = _utf8_sorted(keys)
        assert list_all_keys(s3, bucket) == expected
        assert list_all_keys(s3, bucket, MaxKeys=3) == expected
        resp = s3.list_objects_v2(Bucket=bucket, Prefix="sp ace/")
        assert [o["Key"] for o in resp["Contents"]] == ["sp ace/ä ö ü"]
        resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
        assert [p["Prefix"] for p in resp["CommonPrefixes"]] == _utf8_sorted(
            ["sp ace/", "日本/", "emoji/", "dir/"]
        )
    gateway.drained(bucket=bucket)
    assert list_all_keys(s3, bucket) == expected


def test_empty_bucket_and_no_match(s3: Any, bucket: str) -> None:
    resp = s3.list_objects_v2(Bucket=bucket)
    assert resp["KeyCount"] == 0
    assert "Contents" not in resp
    assert resp["IsTruncated"] is False
    s3.put_object(Bucket=bucket, Key="present", Body=b"1")
    resp = s3.list_objects_v2(Bucket=bucket, Prefix="absent/")
    assert resp["KeyCount"] == 0
    assert "Contents" not in resp


def test_fetch_owner_is_accepted(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="o", Body=b"1")
    resp = s3.list_objects_v2(Bucket=bucket, FetchOwner=True)
    assert [o["Key"] for o in resp["Contents"]] == ["o"]


def test_list_missing_bucket(s3: Any) -> None:
    with pytest.raises(ClientError) as exc:
        s3.list_objects_v2(Bucket=unique_bucket_name("nolist"))
    assert error_code(exc.value) == "NoSuchBucket"


def test_list_after_many_writes_and_deletes(gateway: Any, s3: Any, bucket: str) -> None:
    """Deletes and re-puts of the same keys, some flushed, some not: the listing is exact."""
    live: dict[str, bytes] = {}
    for i in range(20):
        key = f"m/{i:02d}"
        live[key] = payload(i + 1, seed=key)
        s3.put_object(Bucket=bucket, Key=key, Body=live[key])
    gateway.drained(bucket=bucket)
    with gateway.flush_paused():
        for i in range(0, 20, 3):
            key = f"m/{i:02d}"
            s3.delete_object(Bucket=bucket, Key=key)
            del live[key]
        for i in range(0, 20, 6):
            key = f"m/{i:02d}"
            live[key] = payload(99, seed=f"again-{key}")
            s3.put_object(Bucket=bucket, Key=key, Body=live[key])
        pages = list_pages(s3, bucket, MaxKeys=5)
        _check_pages(pages, 5)
        listed = [o for p in pages for o in p.get("Contents", [])]
        assert [o["Key"] for o in listed] == sorted(live)
        for o in listed:
            assert o["ETag"] == quoted_md5(live[o["Key"]])


@pytest.mark.slow  # ~15 s: moto takes that long to accept 1100 objects
def test_merge_across_upstream_pages(gateway: Any, s3: Any, upstream: Any, bucket: str) -> None:
    """More upstream objects than one upstream page (1000), with local writes and deletes
    interleaved around the page boundaries: every key exactly once, in order."""
    upstream_keys = [f"u/{i:05d}" for i in range(0, 2200, 2)]  # 1100 objects upstream
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(lambda k: upstream.put_object(Bucket=bucket, Key=k, Body=b"u"), upstream_keys)
        )
    expected = set(upstream_keys)
    with gateway.flush_paused():
        for i in (1, 997, 999, 1001, 1999, 2001, 2003, 2199):
            key = f"u/{i:05d}"
            s3.put_object(Bucket=bucket, Key=key, Body=b"local")
            expected.add(key)
        for i in (0, 998, 1000, 1998, 2000, 2198):
            key = f"u/{i:05d}"
            s3.delete_object(Bucket=bucket, Key=key)
            expected.discard(key)
        s3.put_object(Bucket=bucket, Key="u/00500", Body=b"overwritten")
        want = sorted(expected)
        assert list_all_keys(s3, bucket) == want
        assert list_all_keys(s3, bucket, MaxKeys=333) == want
        pages = list_pages(s3, bucket)
        _check_pages(pages, 1000)
        assert len(pages) == 2
        assert list_all_keys(s3, bucket, StartAfter="u/00999") == [k for k in want if k > "u/00999"]
        sizes = {o["Key"]: o["Size"] for p in pages for o in p.get("Contents", [])}
        assert sizes["u/00500"] == len(b"overwritten")
        assert sizes["u/00001"] == len(b"local")
        assert sizes["u/00002"] == 1
    gateway.drained(bucket=bucket, timeout=60)
    assert list_all_keys(upstream, bucket) == want


def test_invalid_continuation_token(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="a", Body=b"1")
    with pytest.raises(ClientError) as exc:
        s3.list_objects_v2(Bucket=bucket, ContinuationToken="definitely-not-a-token")
    assert error_code(exc.value) == "InvalidArgument"
    assert error_status(exc.value) == 400


def test_list_objects_v1(gateway: Any, s3: Any, bucket: str) -> None:
    flushed = ["v1/a", "v1/c", "v1/e", "top"]
    pending = ["v1/b", "v1/d", "v1/sub/x", "v1/sub/y"]
    for key in flushed:
        s3.put_object(Bucket=bucket, Key=key, Body=b"f")
    gateway.drained(bucket=bucket)
    with gateway.flush_paused():
        for key in pending:
            s3.put_object(Bucket=bucket, Key=key, Body=b"p")
        s3.delete_object(Bucket=bucket, Key="v1/c")
        expected = sorted(set(flushed + pending) - {"v1/c"})

        keys: list[str] = []
        marker = ""
        for _ in range(20):
            page = s3.list_objects(Bucket=bucket, MaxKeys=2, Marker=marker)
            keys += [o["Key"] for o in page.get("Contents", [])]
            if not page["IsTruncated"]:
                break
            marker = page.get("NextMarker") or page["Contents"][-1]["Key"]
        assert keys == expected

        page = s3.list_objects(Bucket=bucket, Prefix="v1/", Delimiter="/")
        assert [o["Key"] for o in page["Contents"]] == ["v1/a", "v1/b", "v1/d", "v1/e"]
        assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["v1/sub/"]

        page = s3.list_objects(Bucket=bucket, Delimiter="/", MaxKeys=1)
        assert page["IsTruncated"] is True
        assert page["NextMarker"] == "top" or page.get("CommonPrefixes")
