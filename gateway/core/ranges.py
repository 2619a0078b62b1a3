"""Byte ranges of GetObject / HeadObject as S3 serves them. Pure functions, no I/O.

S3's rules (which differ from a strict reading of RFC 9110 in places):

- One ``bytes=first-last``, ``bytes=first-`` or ``bytes=-suffix`` spec is honoured (206).
- A header S3 cannot use is ignored and the whole object is returned (200): another unit,
  a malformed spec, ``last < first``, or several ranges (S3 never serves multipart/byteranges).
- ``last`` past the end is clamped; a suffix longer than the object selects all of it (206).
- A range that starts at or past the end is unsatisfiable: 416 ``InvalidRange``. On an empty
  object every ``first-`` range is unsatisfiable, but a suffix range returns the (empty)
  object with 200.
- ``partNumber`` selects one part of a multipart object (or part 1 = all of a single-part
  object); a part the object does not have is 416 ``InvalidPartNumber``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.errors import InvalidPartNumber, InvalidRange

_SPEC = re.compile(r"\s*(\d*)\s*-\s*(\d*)\s*")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes ``start``..``end`` (inclusive) of an object of ``total_bytes``."""

    start: int
    end: int
    total_bytes: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    @property
    def content_range(self) -> str:
        return f"bytes {self.start}-{self.end}/{self.total_bytes}"


@dataclass(frozen=True, slots=True)
class RangeSpec:
    """One byte-range spec as the client wrote it, before the object's size is known.

    Either ``first`` is set (``last`` None means through the end), or ``suffix_bytes`` is.
    """

    first: int | None = None
    last: int | None = None
    suffix_bytes: int | None = None

    def header(self) -> str:
        """The canonical ``Range`` header value (what is sent upstream)."""
        if self.suffix_bytes is not None:
            return f"bytes=-{self.suffix_bytes}"
        return f"bytes={self.first}-{'' if self.last is None else self.last}"


def parse_range(value: str | None) -> RangeSpec | None:
    """The single range a ``Range`` header asks for, or None when S3 would ignore it."""
    if not value:
        return None
    unit, sep, specs = value.strip().partition("=")
    if not sep or unit.strip().lower() != "bytes" or "," in specs:
        return None
    match = _SPEC.fullmatch(specs)
    if match is None:
        return None
    first, last = match.group(1), match.group(2)
    if not first:
        return RangeSpec(suffix_bytes=int(last)) if last else None
    if last and int(last) < int(first):
        return None
    return RangeSpec(first=int(first), last=int(last) if last else None)


def resolve_range(spec: RangeSpec, size_bytes: int) -> ByteRange | None:
    """Apply ``spec`` to an object of ``size_bytes``: the bytes to serve (206), None for the
    whole object (200), or InvalidRange (416)."""
    if spec.suffix_bytes is not None:
        if size_bytes == 0:
            return None  # S3 answers a tail read of an empty object with 200 and no bytes
        if spec.suffix_bytes == 0:
            raise _unsatisfiable(spec, size_bytes)
        return ByteRange(max(0, size_bytes - spec.suffix_bytes), size_bytes - 1, size_bytes)
    assert spec.first is not None
    if spec.first >= size_bytes:
        raise _unsatisfiable(spec, size_bytes)
    last = size_bytes - 1 if spec.last is None else min(spec.last, size_bytes - 1)
    return ByteRange(spec.first, last, size_bytes)


def part_range(part_sizes: Sequence[int], part_number: int) -> ByteRange | None:
    """The bytes of part ``part_number`` (1-based) of an object made of ``part_sizes``.

    A single-part object is one part. None: the part is the whole, empty object (200).
    """
    if not 1 <= part_number <= len(part_sizes):
        raise InvalidPartNumber(PartNumberRequested=str(part_number))
    total = sum(part_sizes)
    if total == 0:
        return None
    start = sum(part_sizes[: part_number - 1])
    return ByteRange(start, start + part_sizes[part_number - 1] - 1, total)


def parse_content_range(value: str | None) -> ByteRange | None:
    """A ``Content-Range: bytes a-b/size`` response header (from the upstream)."""
    match = _CONTENT_RANGE.fullmatch((value or "").strip())
    if match is None:
        return None
    start, end, total = (int(g) for g in match.groups())
    return ByteRange(start, end, total)


def _unsatisfiable(spec: RangeSpec, size_bytes: int) -> InvalidRange:
    return InvalidRange(RangeRequested=spec.header(), ActualObjectSize=str(size_bytes))
