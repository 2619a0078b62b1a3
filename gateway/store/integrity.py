"""Is a local body still what was acknowledged? One check for every reader of bodies (the
flusher before an upload, a local GET, ``gateway verify``).

At ingest every body is hashed with CRC32C beside MD5 (and any checksum the client asked
for), all from the same in-memory pieces that are written to the file, and the CRC32C is
stored with the row. The client's MD5 (Content-MD5 / the ETag) was verified against those
bytes, and the CRC32C records them. So a file whose CRC32C still matches holds the bytes the
client's digests were checked against: a torn or lost write, a flipped bit, a truncated or
swapped file changes it (CRC32C catches every burst of up to 32 bits and misses a random
corruption with probability 2^-32). It is not a defence against someone who rewrites the
data directory on purpose (they could rewrite the journal too), and it does not replace the
end-to-end checks: uploads still carry Content-MD5, and S3 verifies it.

CRC32C (awscrt) runs at many GB/s, where MD5 runs at ~0.6 GB/s per core, so checking costs
about the read. Rows written before the CRC32C was stored are checked by MD5, as before.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from awscrt import checksums as crt_checksums

from gateway.models import LocalObject

_PIECE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class BodyDigest:
    """What one body file (a single body or one part) must hash to."""

    size_bytes: int
    crc32c: int | None  # stored at ingest; None for rows written before it was
    md5_hex: str | None  # the file's MD5 when it is known (not for a multipart ETag)

    @property
    def is_checkable(self) -> bool:
        return self.crc32c is not None or self.md5_hex is not None


def body_digests(obj: LocalObject) -> list[BodyDigest]:
    """One digest per body file of ``obj``, in order ([] for a tombstone)."""
    if obj.parts:
        return [BodyDigest(p.size_bytes, p.crc32c, _md5_hex(p.etag)) for p in obj.parts]
    if obj.blob_id is None and obj.body is None:
        return []
    return [BodyDigest(obj.meta.size_bytes, obj.crc32c, _md5_hex(obj.meta.etag))]


def _md5_hex(etag: str) -> str | None:
    value = etag.strip('"').lower()
    return value if len(value) == 32 and "-" not in value else None


class BodyCheck:
    """Incremental check of one body file: ``update`` with all of its bytes in order, then
    ``problem()``. Uses the stored CRC32C, else the MD5; a body with neither is not checked
    (``problem()`` is then always None)."""

    def __init__(self, digest: BodyDigest) -> None:
        self.digest = digest
        self._size = 0
        self._crc = 0
        self._md5 = hashlib.md5() if digest.crc32c is None and digest.md5_hex else None

    def update(self, data: bytes | memoryview) -> None:
        self._size += len(data)
        if self.digest.crc32c is not None:
            self._crc = crt_checksums.crc32c(data, self._crc)
        elif self._md5 is not None:
            self._md5.update(data)

    def problem(self) -> str | None:
        """None when the bytes seen are the acknowledged ones, else what differs."""
        digest = self.digest
        if self._size != digest.size_bytes:
            return f"size {self._size}, recorded {digest.size_bytes}"
        if digest.crc32c is not None:
            if self._crc != digest.crc32c:
                return f"CRC32C {self._crc:08x}, recorded {digest.crc32c:08x}"
        elif self._md5 is not None and self._md5.hexdigest() != digest.md5_hex:
            return f"MD5 {self._md5.hexdigest()}, recorded {digest.md5_hex}"
        return None


def check_fd(fd: int, digest: BodyDigest) -> str | None:
    """Check a whole open body file (``pread`` from offset 0: the file position is not
    used, so a descriptor shared with an upload is safe). None when it matches, else the
    problem. Blocking: run it in a thread."""
    check = BodyCheck(digest)
    offset = 0
    while piece := os.pread(fd, _PIECE_BYTES, offset):
        check.update(piece)
        offset += len(piece)
    return check.problem()


def check_bytes(data: bytes, digest: BodyDigest) -> str | None:
    """Check a body held in memory (a body stored inline in the journal)."""
    check = BodyCheck(digest)
    check.update(data)
    return check.problem()
