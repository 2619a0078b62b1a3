"""Conditional requests as S3 evaluates them (RFC 7232 precedence). Pure functions.

- If-Match fails -> 412; when it holds, If-Unmodified-Since is not consulted.
- If-None-Match matches -> 304 on GET/HEAD, 412 on writes; when present, If-Modified-Since
  is not consulted.
- If-Unmodified-Since: modified after the date -> 412.
- If-Modified-Since (GET/HEAD only): not modified since the date -> 304.
Unparseable dates are ignored, as S3 ignores them. Times compare at whole seconds (the
precision of HTTP dates).
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass

from gateway.errors import NotModified, PreconditionFailed


@dataclass(frozen=True, slots=True)
class Preconditions:
    if_match: str | None = None
    if_none_match: str | None = None
    if_modified_since: str | None = None
    if_unmodified_since: str | None = None

    @property
    def is_empty(self) -> bool:
        return not (
            self.if_match
            or self.if_none_match
            or self.if_modified_since
            or self.if_unmodified_since
        )


def etag_matches(header: str, etag: str | None) -> bool:
    """Does an If-Match / If-None-Match list name ``etag`` (``*`` names any existing object)?"""
    if etag is None:
        return False
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate.startswith("W/"):
            candidate = candidate[2:]
        if candidate == "*" or candidate.strip('"') == etag:
            return True
    return False


def _seconds(value: str | None) -> int | None:
    if not value:
        return None
    try:
        return int(email.utils.parsedate_to_datetime(value).timestamp())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def evaluate(
    cond: Preconditions, etag: str | None, last_modified_s: float | None, *, is_read: bool
) -> None:
    """Raise PreconditionFailed / NotModified unless the conditions hold for this version.

    ``etag`` None means the key does not exist (If-Match then fails; If-None-Match: * holds).
    """
    mtime = None if last_modified_s is None else int(last_modified_s)
    if cond.if_match is not None:
        if not etag_matches(cond.if_match, etag):
            raise PreconditionFailed(Condition="If-Match")
    elif (
        (since := _seconds(cond.if_unmodified_since)) is not None
        and mtime is not None
        and mtime > since
    ):
        raise PreconditionFailed(Condition="If-Unmodified-Since")
    if cond.if_none_match is not None:
        if etag_matches(cond.if_none_match, etag):
            if is_read:
                raise NotModified()
            raise PreconditionFailed(Condition="If-None-Match")
    elif (
        is_read
        and (since := _seconds(cond.if_modified_since)) is not None
        and mtime is not None
        and mtime <= since
    ):
        raise NotModified()
