"""Conditional request evaluation (gateway.core.conditions): RFC 9110 precedence as S3
applies it, for reads (304) and writes (412)."""

from __future__ import annotations

import email.utils

import pytest

from gateway.core.conditions import Preconditions, etag_matches, evaluate
from gateway.core.objects import check_write
from gateway.errors import NoSuchKey, NotModified, PreconditionFailed

ETAG = "5d41402abc4b2a76b9719d911017c592"
MP_ETAG = "0d0c7f5a9e2b8d64a3b1c2d3e4f5a6b7-3"
MTIME = 1_700_000_000.0  # the object's Last-Modified


def http_date(seconds: float) -> str:
    return email.utils.formatdate(seconds, usegmt=True)


BEFORE = http_date(MTIME - 60)
AT = http_date(MTIME)
AFTER = http_date(MTIME + 60)
OK, NOT_MODIFIED, FAILED = "200", "304", "412"


def outcome(cond: Preconditions, etag: str | None = ETAG, *, is_read: bool = True) -> str:
    try:
        evaluate(cond, etag, None if etag is None else MTIME, is_read=is_read)
    except NotModified:
        return NOT_MODIFIED
    except PreconditionFailed:
        return FAILED
    return OK


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        (Preconditions(), OK),
        # If-Match
        (Preconditions(if_match=f'"{ETAG}"'), OK),
        (Preconditions(if_match=ETAG), OK),  # unquoted, as some clients send it
        (Preconditions(if_match='"other"'), FAILED),
        (Preconditions(if_match="*"), OK),
        (Preconditions(if_match=f'"a", "{ETAG}"'), OK),  # a list
        (Preconditions(if_match='"a", "b"'), FAILED),
        (Preconditions(if_match=f'W/"{ETAG}"'), OK),  # weak tags compare by value
        # If-None-Match
        (Preconditions(if_none_match=f'"{ETAG}"'), NOT_MODIFIED),
        (Preconditions(if_none_match='"other"'), OK),
        (Preconditions(if_none_match="*"), NOT_MODIFIED),
        (Preconditions(if_none_match=f'"x", W/"{ETAG}"'), NOT_MODIFIED),
        # If-Modified-Since
        (Preconditions(if_modified_since=BEFORE), OK),
        (Preconditions(if_modified_since=AT), NOT_MODIFIED),
        (Preconditions(if_modified_since=AFTER), NOT_MODIFIED),
        # If-Unmodified-Since
        (Preconditions(if_unmodified_since=BEFORE), FAILED),
        (Preconditions(if_unmodified_since=AT), OK),
        (Preconditions(if_unmodified_since=AFTER), OK),
        # invalid dates are ignored
        (Preconditions(if_modified_since="yesterday"), OK),
        (Preconditions(if_unmodified_since="not a date"), OK),
        (Preconditions(if_unmodified_since=""), OK),
        # If-Match true wins over a failing If-Unmodified-Since (S3 returns the object)
        (Preconditions(if_match=f'"{ETAG}"', if_unmodified_since=BEFORE), OK),
        (Preconditions(if_match='"other"', if_unmodified_since=AFTER), FAILED),
        # If-None-Match present: If-Modified-Since is not consulted
        (Preconditions(if_none_match='"other"', if_modified_since=AFTER), OK),
        (Preconditions(if_none_match=f'"{ETAG}"', if_modified_since=BEFORE), NOT_MODIFIED),
        # 412 beats 304
        (Preconditions(if_match='"other"', if_none_match=f'"{ETAG}"'), FAILED),
        (Preconditions(if_unmodified_since=BEFORE, if_modified_since=AFTER), FAILED),
        # all four: If-Match holds, If-None-Match matches -> 304
        (
            Preconditions(
                if_match=f'"{ETAG}"',
                if_none_match=f'"{ETAG}"',
                if_modified_since=BEFORE,
                if_unmodified_since=BEFORE,
            ),
            NOT_MODIFIED,
        ),
        (
            Preconditions(
                if_match=f'"{ETAG}"',
                if_none_match='"other"',
                if_modified_since=AFTER,
                if_unmodified_since=BEFORE,
            ),
            OK,
        ),
    ],
)
def test_conditions_read(cond: Preconditions, expected: str) -> None:
    assert outcome(cond) == expected


def test_conditions_multipart_etag() -> None:
    assert outcome(Preconditions(if_match=f'"{MP_ETAG}"'), MP_ETAG) == OK
    assert outcome(Preconditions(if_match=f'"{ETAG}"'), MP_ETAG) == FAILED


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        (Preconditions(if_match="*"), FAILED),
        (Preconditions(if_match=f'"{ETAG}"'), FAILED),
        (Preconditions(if_none_match="*"), OK),
        (Preconditions(if_none_match=f'"{ETAG}"'), OK),
        (Preconditions(if_modified_since=BEFORE), OK),  # no date to compare with
        (Preconditions(if_unmodified_since=BEFORE), OK),
    ],
)
def test_conditions_missing_object(cond: Preconditions, expected: str) -> None:
    assert outcome(cond, etag=None) == expected


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        (Preconditions(if_none_match="*"), FAILED),  # writes get 412, never 304
        (Preconditions(if_none_match=f'"{ETAG}"'), FAILED),
        (Preconditions(if_match=f'"{ETAG}"'), OK),
        (Preconditions(if_match='"other"'), FAILED),
        (Preconditions(if_modified_since=AFTER), OK),  # not consulted for writes
    ],
)
def test_conditions_write(cond: Preconditions, expected: str) -> None:
    assert outcome(cond, is_read=False) == expected


def test_conditions_check_write_missing_key() -> None:
    check_write(Preconditions(if_none_match="*"), None, "k")  # creates
    with pytest.raises(NoSuchKey):
        check_write(Preconditions(if_match=f'"{ETAG}"'), None, "k")  # S3: 404 NoSuchKey
    with pytest.raises(PreconditionFailed):
        check_write(Preconditions(if_none_match="*"), ETAG, "k")
    with pytest.raises(PreconditionFailed):
        check_write(Preconditions(if_match='"other"'), ETAG, "k")
    check_write(Preconditions(if_match=f'"{ETAG}"'), ETAG, "k")
    check_write(Preconditions(), None, "k")


@pytest.mark.parametrize(
    ("header", "etag", "expected"),
    [
        ("*", ETAG, True),
        ("*", None, False),
        (f'"{ETAG}"', ETAG, True),
        (f" {ETAG} ", ETAG, True),
        ('"a","b"', "b", True),
        ('"a","b"', "c", False),
        ("", ETAG, False),
    ],
)
def test_conditions_etag_matches(header: str, etag: str | None, expected: bool) -> None:
    assert etag_matches(header, etag) is expected


def test_conditions_is_empty() -> None:
    assert Preconditions().is_empty
    assert not Preconditions(if_none_match="*").is_empty
