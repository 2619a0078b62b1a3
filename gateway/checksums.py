"""Incremental digests for ingest: MD5 (the ETag), SHA-256 (signed payloads) and S3's
``x-amz-checksum-*`` algorithms.

Hashers are fed from the blob-writer thread; hashlib releases the GIL on large buffers, so
hashing overlaps with the event loop.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from typing import Protocol

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


def new_hasher(algorithm: str) -> Hasher:
    """A fresh hasher for ``md5``, ``sha256``, ``sha1`` or ``crc32``.

    Raises ``ValueError`` for an algorithm this build cannot compute.
    """
    if algorithm == "crc32":
        return Crc32()
    if algorithm in ("md5", "sha1", "sha256"):
        return hashlib.new(algorithm)
    raise ValueError(f"unsupported checksum algorithm {algorithm!r}")


def b64(digest: bytes) -> str:
    """The base64 form S3 uses in Content-MD5 and x-amz-checksum-* values."""
    return base64.b64encode(digest).decode("ascii")
