"""Incremental digests for ingest: MD5 (the ETag), SHA-256 (signed payloads) and S3's
``x-amz-checksum-*`` algorithms.

Hashers are fed from the blob-writer thread; hashlib releases the GIL on large buffers, so
hashing overlaps with the event loop.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

from awscrt import checksums as crt_checksums

# S3 checksum algorithm names as they appear in ``x-amz-checksum-<name>`` headers.
CHECKSUM_ALGORITHMS = ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")


class Hasher(Protocol):
    """An incremental digest: ``update`` with bytes, then ``digest`` once."""

    def update(self, data: bytes | memoryview, /) -> None: ...

    def digest(self) -> bytes: ...


class Crc32:
    """CRC-32 (ISO-HDLC, as zlib) with S3's big-endian 4-byte digest."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes | memoryview, /) -> None:
        self._value = zlib.crc32(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")


class _CrtCrc:
    """CRC-32C / CRC-64/NVME from awscrt (AWS's own implementation, as botocore uses)."""

    def __init__(self, fn: Callable[[bytes | memoryview, int], int], width_bytes: int) -> None:
        self._fn = fn
        self._width = width_bytes
        self._value = 0

    def update(self, data: bytes | memoryview, /) -> None:
        self._value = self._fn(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._width, "big")


_CRC_WIDTH = {"crc32": 4, "crc32c": 4, "crc64nvme": 8}
_COMBINE: dict[str, Callable[[int, int, int], int]] = {
    "crc32": crt_checksums.combine_crc32,
    "crc32c": crt_checksums.combine_crc32c,
    "crc64nvme": crt_checksums.combine_crc64nvme,
}


def new_hasher(algorithm: str) -> Hasher:
    """A fresh hasher for ``md5`` or one of CHECKSUM_ALGORITHMS.

    Raises ``ValueError`` for an unknown algorithm.
    """
    if algorithm == "crc32":
        return Crc32()
    if algorithm == "crc32c":
        return _CrtCrc(crt_checksums.crc32c, 4)
    if algorithm == "crc64nvme":
        return _CrtCrc(crt_checksums.crc64nvme, 8)
    if algorithm in ("md5", "sha1", "sha256"):
        return hashlib.new(algorithm)
    raise ValueError(f"unsupported checksum algorithm {algorithm!r}")


def composite(algorithm: str, part_values: Sequence[str]) -> str:
    """S3's COMPOSITE multipart checksum: the checksum of the concatenated binary part
    checksums, base64, then ``-N``."""
    hasher = new_hasher(algorithm)
    for value in part_values:
        hasher.update(base64.b64decode(value))
    return f"{b64(hasher.digest())}-{len(part_values)}"


def full_object(algorithm: str, parts: Sequence[tuple[str, int]]) -> str:
    """S3's FULL_OBJECT multipart checksum (CRCs only): the parts' CRCs combined into the
    CRC of the whole body, from (base64 value, part length) pairs."""
    combine = _COMBINE[algorithm]
    total = 0
    for i, (value, length) in enumerate(parts):
        crc = int.from_bytes(base64.b64decode(value), "big")
        total = crc if i == 0 else combine(total, crc, length)
    return b64(total.to_bytes(_CRC_WIDTH[algorithm], "big"))


def is_crc(algorithm: str) -> bool:
    return algorithm in _CRC_WIDTH


def b64(digest: bytes) -> str:
    """The base64 form S3 uses in Content-MD5 and x-amz-checksum-* values."""
    return base64.b64encode(digest).decode("ascii")


def checksum_type(value: str) -> str:
    """S3's x-amz-checksum-type of a stored value: composite values end in ``-N``."""
    return "COMPOSITE" if "-" in value else "FULL_OBJECT"
