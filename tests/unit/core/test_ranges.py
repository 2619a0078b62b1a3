"""Range parsing and resolution as S3 does it (gateway.core.ranges)."""

from __future__ import annotations

import pytest

from gateway.core.ranges import (
    ByteRange,
    RangeSpec,
    parse_content_range,
    parse_range,
    part_range,
    resolve_range,
)
from gateway.errors import InvalidPartNumber, InvalidRange

IGNORED = None  # S3 serves the whole object (200)


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        # first-last
        ("bytes=0-0", 10, (0, 0)),
        ("bytes=0-9", 10, (0, 9)),
        ("bytes=2-5", 10, (2, 5)),
        ("bytes=9-9", 10, (9, 9)),
        ("bytes=5-100", 10, (5, 9)),  # last clamped to the end
        # open-ended
        ("bytes=0-", 10, (0, 9)),
        ("bytes=7-", 10, (7, 9)),
        ("bytes=9-", 10, (9, 9)),
        # suffix
        ("bytes=-1", 10, (9, 9)),
        ("bytes=-4", 10, (6, 9)),
        ("bytes=-10", 10, (0, 9)),
        ("bytes=-11", 10, (0, 9)),  # longer than the object: all of it, still 206
        ("bytes=-99999999999999999999", 10, (0, 9)),
        # spelling tolerated
        ("Bytes=1-2", 10, (1, 2)),
        ("bytes= 1 - 2 ", 10, (1, 2)),
        # ignored: whole object, 200
        ("", 10, IGNORED),
        ("bytes=", 10, IGNORED),
        ("bytes=-", 10, IGNORED),
        ("bytes=5-2", 10, IGNORED),  # last < first
        ("bytes=0-1,4-5", 10, IGNORED),  # several ranges
        ("bytes=0-1,", 10, IGNORED),
        ("items=0-1", 10, IGNORED),
        ("0-1", 10, IGNORED),
        ("bytes=a-b", 10, IGNORED),
        ("bytes=1-2-3", 10, IGNORED),
        ("bytes=-1-4", 10, IGNORED),
        ("bytes=0x1-2", 10, IGNORED),
        # empty object: a suffix range is the (empty) object, 200
        ("bytes=-1", 0, IGNORED),
        ("bytes=-0", 0, IGNORED),
    ],
)
def test_ranges_resolve(header: str, size: int, expected: tuple[int, int] | None) -> None:
    spec = parse_range(header)
    got = None if spec is None else resolve_range(spec, size)
    if expected is None:
        assert got is None
    else:
        assert got == ByteRange(expected[0], expected[1], size)
        assert got.length == expected[1] - expected[0] + 1
        assert got.content_range == f"bytes {expected[0]}-{expected[1]}/{size}"


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=10-", 10),  # starts at the end
        ("bytes=10-20", 10),
        ("bytes=11-11", 10),
        ("bytes=-0", 10),  # a zero-length suffix selects nothing
        ("bytes=0-", 0),  # nothing to start at in an empty object
        ("bytes=0-0", 0),
        ("bytes=0-10", 0),
    ],
)
def test_ranges_unsatisfiable(header: str, size: int) -> None:
    spec = parse_range(header)
    assert spec is not None
    with pytest.raises(InvalidRange) as caught:
        resolve_range(spec, size)
    assert caught.value.status == 416
    assert caught.value.fields["ActualObjectSize"] == str(size)
    assert caught.value.fields["RangeRequested"] == spec.header()


@pytest.mark.parametrize(
    ("header", "canonical"),
    [
        ("bytes=1-2", "bytes=1-2"),
        ("bytes=3-", "bytes=3-"),
        ("bytes=-7", "bytes=-7"),
        ("BYTES = 01-002", "bytes=1-2"),
    ],
)
def test_ranges_header_round_trip(header: str, canonical: str) -> None:
    spec = parse_range(header)
    assert spec is not None
    assert spec.header() == canonical
    assert parse_range(spec.header()) == spec


def test_ranges_spec_shapes() -> None:
    assert parse_range("bytes=3-") == RangeSpec(first=3)
    assert parse_range("bytes=-3") == RangeSpec(suffix_bytes=3)
    assert parse_range("bytes=3-4") == RangeSpec(first=3, last=4)
    assert parse_range(None) is None


MIB5 = 5 << 20


@pytest.mark.parametrize(
    ("sizes", "number", "expected"),
    [
        ([MIB5, MIB5, 7], 1, (0, MIB5 - 1)),
        ([MIB5, MIB5, 7], 2, (MIB5, 2 * MIB5 - 1)),
        ([MIB5, MIB5, 7], 3, (2 * MIB5, 2 * MIB5 + 6)),
        ([10], 1, (0, 9)),  # single-part object: part 1 is all of it
    ],
)
def test_ranges_part(sizes: list[int], number: int, expected: tuple[int, int]) -> None:
    got = part_range(sizes, number)
    assert got == ByteRange(expected[0], expected[1], sum(sizes))


@pytest.mark.parametrize(("sizes", "number"), [([10], 2), ([MIB5, 7], 3), ([MIB5, 7], 0)])
def test_ranges_part_out_of_range(sizes: list[int], number: int) -> None:
    with pytest.raises(InvalidPartNumber) as caught:
        part_range(sizes, number)
    assert (caught.value.status, caught.value.code) == (416, "InvalidPartNumber")


def test_ranges_part_of_empty_object_is_whole() -> None:
    assert part_range([0], 1) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("bytes 0-9/10", ByteRange(0, 9, 10)),
        ("bytes 5-5/6", ByteRange(5, 5, 6)),
        ("bytes */10", None),
        ("", None),
        (None, None),
    ],
)
def test_ranges_content_range(value: str | None, expected: ByteRange | None) -> None:
    assert parse_content_range(value) == expected
