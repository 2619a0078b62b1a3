"""Pure parts of a read-through fill: how an upstream object is laid out in body files, how
its bytes are checked, and which of them have arrived. No I/O.

Layout: an object with a plain MD5 ETag is one body file. A multipart object
(``<md5 of part md5s>-N``) is kept part by part, one body file per part, so each file can
later be verified against its own MD5 and the set against the ETag; the part boundaries
are derived from part 1's size (one ``HEAD ?partNumber=1``), assuming equal parts but the
last, as every SDK uploads them. When that cannot be the layout (sizes inconsistent) or the
ETag is neither form, the copy is one file that cannot be checked: it still serves the
readers sharing the fill, and is not kept.

Coverage: the object is fetched in fixed-size chunks (ranged GETs), several at once, each
written front to back; a reader may read any byte range that has fully arrived.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

_MD5_HEX = re.compile(r"[0-9a-f]{32}")
_MULTIPART = re.compile(r"([0-9a-f]{32})-(\d+)")


@dataclass(frozen=True, slots=True)
class Layout:
    """Body file sizes in object order, and whether the copy can be checked (and kept)."""

    sizes: tuple[int, ...]
    is_checkable: bool


def parts_count(etag: str) -> int | None:
    """N of a multipart ETag ``<hex>-N``; None for any other ETag."""
    match = _MULTIPART.fullmatch(etag)
    return int(match.group(2)) if match else None


def layout(etag: str, size_bytes: int, part_one_bytes: int | None) -> Layout:
    """The body files of a copy of an object with ``etag`` and ``size_bytes``.
    ``part_one_bytes`` is part 1's size for a multipart ETag (None when unknown)."""
    if _MD5_HEX.fullmatch(etag):
        return Layout((size_bytes,), True)
    count = parts_count(etag)
    if count is None or part_one_bytes is None or part_one_bytes <= 0:
        return Layout((size_bytes,), False)
    if count == 1:
        return Layout((size_bytes,), part_one_bytes == size_bytes)
    last = size_bytes - part_one_bytes * (count - 1)
    if not 0 < last <= part_one_bytes:
        return Layout((size_bytes,), False)
    return Layout((part_one_bytes,) * (count - 1) + (last,), True)


def digest_matches(etag: str, md5s: Sequence[bytes]) -> bool:
    """Whether body files with these MD5s (raw, in order) make up an object with ``etag``."""
    if parts_count(etag) is not None:
        combined = hashlib.md5(b"".join(md5s)).hexdigest()
        return f"{combined}-{len(md5s)}" == etag
    return len(md5s) == 1 and md5s[0].hex() == etag


class Coverage:
    """Which bytes of a ``size_bytes`` object have arrived, fetched in chunks of
    ``chunk_bytes`` each filled front to back (chunk ``i`` holds bytes ``i * chunk_bytes``
    up to the next chunk's start)."""

    def __init__(self, size_bytes: int, chunk_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.chunk_bytes = max(1, chunk_bytes)
        count = max(1, -(-size_bytes // self.chunk_bytes))
        self._filled = [0] * count
        self._prefix_end = 0  # every byte before it has arrived

    @property
    def chunks(self) -> int:
        return len(self._filled)

    def chunk(self, index: int) -> tuple[int, int]:
        """Bytes ``[start, end)`` of chunk ``index``."""
        start = index * self.chunk_bytes
        return start, min(self.size_bytes, start + self.chunk_bytes)

    def filled(self, index: int) -> int:
        return self._filled[index]

    def add(self, index: int, count: int) -> None:
        """``count`` more bytes of chunk ``index`` arrived (after those already there)."""
        start, end = self.chunk(index)
        self._filled[index] = min(end - start, self._filled[index] + count)
        self._prefix_end = self.available_end(self._prefix_end)

    @property
    def is_complete(self) -> bool:
        return self._prefix_end >= self.size_bytes

    @property
    def arrived_bytes(self) -> int:
        return sum(self._filled)

    def available_end(self, pos: int) -> int:
        """The end of the run of arrived bytes starting at ``pos`` (``pos`` itself when
        byte ``pos`` has not arrived)."""
        if pos < self._prefix_end:
            pos = self._prefix_end
        index = pos // self.chunk_bytes
        while index < len(self._filled):
            start, end = self.chunk(index)
            reached = start + self._filled[index]
            if reached <= pos:
                return pos
            pos = reached
            if reached < end:
                return pos
            index += 1
        return pos
