"""Merged listing: the journal's local view over the upstream listing, in S3 order.

Every expectation is checked against a brute-force model: the union of upstream keys and
local writes, minus local deletes, filtered by prefix, sorted by UTF-8 bytes and rolled up
at the delimiter.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from fakes import FakeUpstream, utf8_order
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.listing import ListingService, list_objects, resume_after
from gateway.models import ObjectMeta
from gateway.store.journal import Journal

BUCKET = "ckpt"
ACKED_S = 1_700_000_100.0
# (name, is_prefix, size_bytes, etag): what a listing row promises a client.
Row = tuple[str, bool, int, str]


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.db", fsync=False)
    j.open()
    yield j
    j.close()


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream([BUCKET])


def _etag(body: bytes) -> str:
    return hashlib.md5(body).hexdigest()


async def _put(journal: Journal, key: str, body: bytes, bucket: str = BUCKET) -> ObjectMeta:
    meta = ObjectMeta(
        bucket=bucket, key=key, size_bytes=len(body), etag=_etag(body), last_modified_s=ACKED_S
    )
    await journal.commit_put(meta, blob_id="x" * 32, acked_s=ACKED_S)
    return meta


async def _delete(journal: Journal, key: str, bucket: str = BUCKET) -> None:
    await journal.commit_delete(bucket, key, ACKED_S)


def _model(
    upstream: Mapping[str, bytes],
    local: Mapping[str, bytes | None],
    prefix: str = "",
    delimiter: str = "",
) -> list[Row]:
    """The expected full listing. ``local`` maps a key to its body, or None for a delete."""
    live = {k: v for k, v in upstream.items() if k not in local}
    live.update({k: v for k, v in local.items() if v is not None})
    rows: list[Row] = []
    for name in sorted((k for k in live if k.startswith(prefix)), key=utf8_order):
        cut = name.find(delimiter, len(prefix)) if delimiter else -1
        if cut >= 0:
            rolled = name[: cut + len(delimiter)]
            if not rows or rows[-1][0] != rolled:
                rows.append((rolled, True, 0, ""))
        else:
            rows.append((name, False, len(live[name]), _etag(live[name])))
    return rows


async def _walk(
    journal: Journal,
    upstream: FakeUpstream,
    *,
    prefix: str = "",
    delimiter: str = "",
    max_keys: int = 1000,
    bucket: str = BUCKET,
) -> list[Row]:
    """Every page, continued the way the S3 handlers do it, concatenated."""
    rows: list[Row] = []
    after = ""
    for _ in range(200):
        page = await list_objects(
            journal,
            upstream,
            bucket=bucket,
            prefix=prefix,
            delimiter=delimiter,
            after=after,
            max_keys=max_keys,
        )
        assert len(page.entries) <= max_keys
        rows += [(e.name, e.is_prefix, e.size_bytes, e.etag) for e in page.entries]
        if not page.is_truncated:
            return rows
        assert page.entries, "a truncated page must make progress"
        assert page.last_name == page.entries[-1].name
        after = resume_after(page.last_name, prefix, delimiter)
    raise AssertionError("pagination did not terminate")


async def _seed(
    journal: Journal,
    upstream: FakeUpstream,
    remote: Mapping[str, bytes],
    local: Mapping[str, bytes | None],
    bucket: str = BUCKET,
) -> None:
    for key, body in remote.items():
        upstream.add_object(bucket, key, body)
    for key, maybe_body in local.items():
        if maybe_body is None:
            await _delete(journal, key, bucket)
        else:
            await _put(journal, key, maybe_body, bucket)


# -- merge ----------------------------------------------------------------------------------


async def test_listing_merges_local_and_upstream_in_order(
    journal: Journal, upstream: FakeUpstream
) -> None:
    remote = {"b": b"1", "d": b"22", "f": b"333"}
    local: dict[str, bytes | None] = {"a": b"L", "c": b"LL", "e": b"LLL", "g": b""}
    await _seed(journal, upstream, remote, local)

    rows = await _walk(journal, upstream)

    assert [r[0] for r in rows] == ["a", "b", "c", "d", "e", "f", "g"]
    assert rows == _model(remote, local)


async def test_listing_local_version_replaces_upstream_figures(
    journal: Journal, upstream: FakeUpstream
) -> None:
    upstream.add_object(BUCKET, "model.pt", b"old")
    await _put(journal, "model.pt", b"newer and longer")

    page = await ListingService(journal, upstream).list_objects(
        BUCKET, prefix="", delimiter="", after="", max_keys=10
    )

    assert len(page.entries) == 1
    entry = page.entries[0]
    assert (entry.name, entry.size_bytes, entry.etag) == (
        "model.pt",
        len(b"newer and longer"),
        _etag(b"newer and longer"),
    )
    assert entry.last_modified_s == ACKED_S
    assert not page.is_truncated


async def test_listing_local_tombstone_hides_upstream_key(
    journal: Journal, upstream: FakeUpstream
) -> None:
    remote = {"a": b"1", "b": b"2", "c": b"3"}
    await _seed(journal, upstream, remote, {"b": None})

    assert [r[0] for r in await _walk(journal, upstream)] == ["a", "c"]


async def test_listing_tombstone_without_upstream_key_is_not_listed(
    journal: Journal, upstream: FakeUpstream
) -> None:
    await _seed(journal, upstream, {"a": b"1"}, {"ghost": None, "z": b"2"})

    rows = await _walk(journal, upstream)

    assert [r[0] for r in rows] == ["a", "z"]


async def test_listing_only_tombstones_is_empty_and_complete(
    journal: Journal, upstream: FakeUpstream
) -> None:
    await _seed(journal, upstream, {}, {"a": None, "b/c": None})

    page = await list_objects(
        journal, upstream, bucket=BUCKET, prefix="", delimiter="/", after="", max_keys=1
    )

    assert page.entries == ()
    assert not page.is_truncated
    assert page.last_name is None


# -- delimiter roll-up ------------------------------------------------------------------------


async def test_listing_rolls_up_local_and_upstream_keys_into_one_prefix(
    journal: Journal, upstream: FakeUpstream
) -> None:
    remote = {"step1/a": b"1", "step1/b": b"2", "step3/x": b"3", "top": b"4"}
    local: dict[str, bytes | None] = {"step1/c": b"5", "step2/a": b"6", "step2/b/deep": b"7"}
    await _seed(journal, upstream, remote, local)

    rows = await _walk(journal, upstream, delimiter="/")

    assert rows == [
        ("step1/", True, 0, ""),
        ("step2/", True, 0, ""),
        ("step3/", True, 0, ""),
        ("top", False, 1, _etag(b"4")),
    ]
    assert rows == _model(remote, local, delimiter="/")


async def test_listing_rolls_up_below_a_prefix(journal: Journal, upstream: FakeUpstream) -> None:
    remote = {"run/1/a": b"1", "run/2/a": b"2", "run/x": b"3", "other/1": b"4"}
    local: dict[str, bytes | None] = {"run/1/b": b"5", "run/3/a": b"6", "run/y": b"7"}
    await _seed(journal, upstream, remote, local)

    rows = await _walk(journal, upstream, prefix="run/", delimiter="/")

    assert [r[0] for r in rows] == ["run/1/", "run/2/", "run/3/", "run/x", "run/y"]
    assert rows == _model(remote, local, prefix="run/", delimiter="/")


async def test_listing_hides_upstream_prefix_whose_keys_are_all_deleted_locally(
    journal: Journal, upstream: FakeUpstream
) -> None:
    remote = {"gone/a": b"1", "gone/b/c": b"2", "kept": b"3"}
    await _seed(journal, upstream, remote, {"gone/a": None, "gone/b/c": None})

    rows = await _walk(journal, upstream, delimiter="/")

    assert [r[0] for r in rows] == ["kept"]


async def test_listing_shows_upstream_prefix_if_one_key_survives(
    journal: Journal, upstream: FakeUpstream
) -> None:
    remote = {"part/a": b"1", "part/b": b"2", "part/c": b"3"}
    await _seed(journal, upstream, remote, {"part/a": None, "part/c": None})

    rows = await _walk(journal, upstream, delimiter="/")

    assert rows == [("part/", True, 0, "")]


async def test_listing_local_tombstone_alone_does_not_make_a_prefix(
    journal: Journal, upstream: FakeUpstream
) -> None:
    await _seed(journal, upstream, {"z": b"1"}, {"dir/a": None, "dir/b": None})

    assert await _walk(journal, upstream, delimiter="/") == [("z", False, 1, _etag(b"1"))]


async def test_listing_prefix_kept_by_a_local_put_among_deletes(
    journal: Journal, upstream: FakeUpstream
) -> None:
    remote = {"d/a": b"1", "d/b": b"2"}
    local: dict[str, bytes | None] = {"d/a": None, "d/b": None, "d/c": b"3"}
    await _seed(journal, upstream, remote, local)

    assert await _walk(journal, upstream, delimiter="/") == [("d/", True, 0, "")]


# -- pagination -----------------------------------------------------------------------------

_PAGINATION_REMOTE = {
    "a": b"1",
    "b/1": b"2",
    "b/2": b"3",
    "c": b"4",
    "d/x/1": b"5",
    "e": b"6",
    "g/1": b"7",
    "h": b"8",
}
_PAGINATION_LOCAL: dict[str, bytes | None] = {
    "a0": b"9",
    "b/3": b"10",
    "c": b"changed",
    "d/x/1": None,
    "d/y": b"11",
    "e": None,
    "f/1": b"12",
    "g/1": None,
    "i": b"13",
}


@pytest.mark.parametrize("max_keys", [1, 2, 3])
@pytest.mark.parametrize(("prefix", "delimiter"), [("", ""), ("", "/"), ("d/", "/"), ("b", "/")])
async def test_listing_pages_walk_the_complete_sequence(
    journal: Journal, upstream: FakeUpstream, max_keys: int, prefix: str, delimiter: str
) -> None:
    await _seed(journal, upstream, _PAGINATION_REMOTE, _PAGINATION_LOCAL)
    expected = _model(_PAGINATION_REMOTE, _PAGINATION_LOCAL, prefix, delimiter)
    assert expected  # the table is meant to list something for every case

    rows = await _walk(journal, upstream, prefix=prefix, delimiter=delimiter, max_keys=max_keys)

    assert rows == expected


async def test_listing_page_is_not_truncated_when_only_hidden_items_follow(
    journal: Journal, upstream: FakeUpstream
) -> None:
    await _seed(journal, upstream, {"a": b"1", "b": b"2", "c/d": b"3"}, {"b": None, "c/d": None})

    page = await list_objects(
        journal, upstream, bucket=BUCKET, prefix="", delimiter="/", after="", max_keys=1
    )

    assert [e.name for e in page.entries] == ["a"]
    assert not page.is_truncated


# -- ordering -------------------------------------------------------------------------------


async def test_listing_sorts_unicode_keys_by_utf8_bytes(
    journal: Journal, upstream: FakeUpstream
) -> None:
    # UTF-8 byte order: ASCII < é (C3 A9) < 中 (E4 B8 AD) < U+FFFD (EF BF BD) < 😀 (F0 9F 98 80).
    # UTF-16 order would put 😀 (a surrogate pair, D83D) before U+FFFD.
    remote = {"z": b"1", "\U0001f600": b"2", "é": b"3"}
    local: dict[str, bytes | None] = {"\ufffd": b"4", "中": b"5", "A": b"6"}
    await _seed(journal, upstream, remote, local)

    rows = await _walk(journal, upstream, max_keys=2)

    assert [r[0] for r in rows] == ["A", "z", "é", "中", "\ufffd", "\U0001f600"]
    assert rows == _model(remote, local)


async def test_listing_unicode_prefixes_roll_up_in_utf8_order(
    journal: Journal, upstream: FakeUpstream
) -> None:
    remote = {"\U0001f600/a": b"1", "é/a": b"2"}
    local: dict[str, bytes | None] = {"\ufffd/a": b"3", "é/b": b"4", "e/a": b"5"}
    await _seed(journal, upstream, remote, local)

    rows = await _walk(journal, upstream, delimiter="/", max_keys=1)

    assert [r[0] for r in rows] == ["e/", "é/", "\ufffd/", "\U0001f600/"]


# -- max_keys=0 -----------------------------------------------------------------------------


async def test_listing_max_keys_zero_returns_no_entries(
    journal: Journal, upstream: FakeUpstream
) -> None:
    await _seed(journal, upstream, {"a": b"1"}, {"b": b"2"})

    page = await list_objects(
        journal, upstream, bucket=BUCKET, prefix="", delimiter="", after="", max_keys=0
    )

    assert page.entries == ()
    assert page.last_name is None


async def test_listing_max_keys_zero_is_not_truncated(
    journal: Journal, upstream: FakeUpstream
) -> None:
    await _seed(journal, upstream, {"a": b"1"}, {"b": b"2"})

    page = await list_objects(
        journal, upstream, bucket=BUCKET, prefix="", delimiter="", after="", max_keys=0
    )

    assert not page.is_truncated


# -- edge cases of the seek past a prefix ---------------------------------------------------


@pytest.mark.parametrize("where", ["local", "upstream"])
async def test_listing_prefix_listed_once_with_max_code_point_key(
    journal: Journal, upstream: FakeUpstream, where: str
) -> None:
    keys = {"p/a": b"1", "p/\U0010ffffz": b"2", "q": b"3"}
    if where == "local":
        await _seed(journal, upstream, {}, dict(keys))
    else:
        await _seed(journal, upstream, keys, {})

    page = await list_objects(
        journal, upstream, bucket=BUCKET, prefix="", delimiter="/", after="", max_keys=10
    )
    assert [e.name for e in page.entries] == ["p/", "q"]
    rows = await _walk(journal, upstream, delimiter="/", max_keys=1)
    assert [r[0] for r in rows] == ["p/", "q"]


async def test_listing_start_after_inside_prefix_same_for_local_and_upstream(
    tmp_path: Path,
) -> None:
    answers = []
    for where in ("local", "upstream"):
        j = Journal(tmp_path / f"{where}.db", fsync=False)
        j.open()
        try:
            fake = FakeUpstream([BUCKET])
            keys: dict[str, bytes | None] = {"p/a": b"1", "p/c": b"2", "q": b"3"}
            if where == "local":
                await _seed(j, fake, {}, keys)
            else:
                await _seed(j, fake, {k: v for k, v in keys.items() if v is not None}, {})
            page = await list_objects(
                j, fake, bucket=BUCKET, prefix="", delimiter="/", after="p/b", max_keys=10
            )
            answers.append([e.name for e in page.entries])
        finally:
            j.close()

    assert answers[0] == answers[1]


# -- property: paginated merge == model -------------------------------------------------------

_KEYS = st.text(alphabet="ab/", min_size=1, max_size=4)
_bucket_numbers = itertools.count()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    remote=st.dictionaries(_KEYS, st.binary(max_size=3), max_size=8),
    local=st.dictionaries(_KEYS, st.none() | st.binary(max_size=3), max_size=8),
    prefix=st.sampled_from(["", "a", "a/", "b/"]),
    delimiter=st.sampled_from(["", "/"]),
    max_keys=st.integers(min_value=1, max_value=4),
)
async def test_listing_paginated_merge_matches_model(
    journal: Journal,
    remote: dict[str, bytes],
    local: dict[str, bytes | None],
    prefix: str,
    delimiter: str,
    max_keys: int,
) -> None:
    # One journal for every example; a fresh bucket keeps the examples apart.
    bucket = f"prop-{next(_bucket_numbers)}"
    fake = FakeUpstream([bucket])
    await _seed(journal, fake, remote, local, bucket)

    rows = await _walk(
        journal, fake, prefix=prefix, delimiter=delimiter, max_keys=max_keys, bucket=bucket
    )

    assert rows == _model(remote, local, prefix, delimiter)
