"""GetObjectAttributes of a local version: figures from the row, parts paged, part
entries only when the object carries a checksum (as S3 does for general purpose buckets)."""

from __future__ import annotations

import pytest

from gateway.core.attributes import local_attributes
from gateway.errors import InvalidArgument
from gateway.models import FlushState, LocalObject, ObjectMeta, PartRef
from gateway.s3.handlers.attributes import attributes_document, requested_attributes


def _row(checksums: dict[str, str], parts: int) -> LocalObject:
    refs = tuple(
        PartRef(f"b{n}", 10 * n, f"e{n}", f"c{n}" if checksums else None)
        for n in range(1, parts + 1)
    )
    meta = ObjectMeta(
        "b", "k", sum(p.size_bytes for p in refs) or 5, "etag-3", 7.0, checksums=checksums
    )
    return LocalObject(meta, 1, FlushState.PENDING, None if refs else "blob", parts=refs)


def test_attributes_single_part() -> None:
    attrs = local_attributes(_row({"crc32": "AAAAAA=="}, 0), max_parts=1000, part_number_marker=0)
    assert attrs.parts_count is None and attrs.parts == ()
    assert attrs.checksums == {"crc32": "AAAAAA=="} and attrs.size_bytes == 5


def test_attributes_multipart_pages_parts() -> None:
    row = _row({"sha256": "x-3"}, 3)
    attrs = local_attributes(row, max_parts=1, part_number_marker=1)
    assert attrs.parts_count == 3 and attrs.is_truncated
    assert [(p.part_number, p.size_bytes, p.checksum) for p in attrs.parts] == [(2, 20, "c2")]
    doc = attributes_document(attrs, {"ObjectParts", "Checksum"})
    assert b"<NextPartNumberMarker>2</NextPartNumberMarker>" in doc
    assert b"<ChecksumSHA256>c2</ChecksumSHA256>" in doc
    assert b"<ChecksumType>COMPOSITE</ChecksumType>" in doc


def test_attributes_multipart_without_checksum_lists_no_parts() -> None:
    attrs = local_attributes(_row({}, 3), max_parts=1, part_number_marker=0)
    assert attrs.parts_count == 3 and attrs.parts == () and not attrs.is_truncated
    doc = attributes_document(attrs, {"ObjectParts", "Checksum", "ETag"})
    assert b"<PartsCount>3</PartsCount>" in doc and b"<Part>" not in doc
    assert b"<Checksum>" not in doc and b"<ETag>etag-3</ETag>" in doc


def test_attributes_requested_names() -> None:
    assert requested_attributes(["ETag, ObjectSize", "Checksum"]) == {
        "ETag",
        "ObjectSize",
        "Checksum",
    }
    for bad in ([], [""], ["ETag,Colour"], ["etag"]):
        with pytest.raises(InvalidArgument):
            requested_attributes(bad)
