"""Ingest: take a request body and check it against what the client promised.

Shared by PutObject and UploadPart so both verify exactly the same way. A body that is
declared no longer than ``inline_max_bytes`` is held in memory, to be stored inside the
journal row (a small PUT is then durable with one grouped journal commit); any other body
streams to a new blob file. On any failure the blob is removed before the error
propagates: nothing half-written is ever referenced. A body with no declared length grows
its capacity reservation as it is written.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator

from gateway.checksums import b64
from gateway.errors import (
    BadDigest,
    IncompleteBody,
    InvalidDigest,
    InvalidRequest,
    KeyTooLongError,
    XAmzContentSHA256Mismatch,
)
from gateway.models import PutRequest, RequestBody
from gateway.store.blobs import BlobStore, Ingested, WrittenBlob
from gateway.store.space import Grant, current_grant

MAX_KEY_BYTES = 1024


async def ingest(
    blobs: BlobStore,
    req: PutRequest,
    body: RequestBody,
    *,
    max_bytes: int,
    inline_max_bytes: int = 0,
) -> tuple[Ingested, dict[str, str]]:
    """Take ``body`` (a durable blob file, or bytes for the journal when the client declared
    at most ``inline_max_bytes``) and verify it; returns it and its verified checksums."""
    algorithms = {"md5", *req.checksums}
    if req.trailer_checksum:
        algorithms.add(req.trailer_checksum)
    if req.payload_sha256:
        algorithms.add("sha256")
    length = req.content_length
    taken: Ingested
    # (0: never inline; an empty part went here and was not a file: 500 for UploadPart)
    if inline_max_bytes > 0 and length is not None and length <= min(inline_max_bytes, max_bytes):
        taken = await blobs.hold(body.chunks(), algorithms, max_bytes=length)
    else:
        chunks = body.chunks()
        grant = current_grant()
        if length is None and grant is not None:
            chunks = _reserved_as_written(chunks, grant)
        taken = await blobs.write(chunks, algorithms, max_bytes=max_bytes)
    try:
        _verify(req, body, taken)
    except BaseException:
        await asyncio.shield(blobs.discard(taken.blob_ids))
        raise
    return taken, _checksums(req, taken)


async def ingest_file(
    blobs: BlobStore, req: PutRequest, body: RequestBody, *, max_bytes: int
) -> tuple[WrittenBlob, dict[str, str]]:
    """``ingest`` into a blob file always (parts of multipart uploads)."""
    taken, checksums = await ingest(blobs, req, body, max_bytes=max_bytes)
    assert isinstance(taken, WrittenBlob)
    return taken, checksums


async def _reserved_as_written(chunks: AsyncIterator[bytes], grant: Grant) -> AsyncIterator[bytes]:
    """A body with no declared length (HTTP chunked): each piece's capacity is reserved
    before it is written, so such writes are held to ``--capacity`` like any other; a piece
    that does not fit ends the write with SlowDown (the partial blob is removed)."""
    async for piece in chunks:
        await grant.grow(len(piece))
        yield piece


def validate_key(key: str) -> None:
    if not key:
        raise InvalidRequest("A key must be at least one character long.")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise KeyTooLongError(Key=key[:64] + "...")


def _verify(req: PutRequest, body: RequestBody, blob: Ingested) -> None:
    """Check what the client promised against what arrived; raise the S3 error S3 raises."""
    if req.content_length is not None and blob.size_bytes != req.content_length:
        raise IncompleteBody()
    if req.content_md5 is not None:
        try:
            expected = bytes.fromhex(_b64_to_hex(req.content_md5))
        except ValueError as exc:
            raise InvalidDigest() from exc
        if expected != blob.digests["md5"]:
            raise BadDigest()
    if (
        req.payload_sha256 is not None
        and req.payload_sha256.lower() != blob.digests["sha256"].hex()
    ):
        raise XAmzContentSHA256Mismatch()
    for algorithm, value in req.checksums.items():
        if value != b64(blob.digests[algorithm]):
            raise _mismatch(algorithm)
    if req.trailer_checksum:
        sent = body.trailers.get(f"x-amz-checksum-{req.trailer_checksum}")
        if sent is None:
            raise InvalidRequest(f"x-amz-checksum-{req.trailer_checksum} trailer is missing.")
        if sent != b64(blob.digests[req.trailer_checksum]):
            raise _mismatch(req.trailer_checksum)


def _mismatch(algorithm: str) -> BadDigest:
    return BadDigest(
        f"The {algorithm.upper()} you specified did not match the calculated checksum."
    )


def _checksums(req: PutRequest, blob: Ingested) -> dict[str, str]:
    names = set(req.checksums) | ({req.trailer_checksum} if req.trailer_checksum else set())
    return {name: b64(blob.digests[name]) for name in sorted(names)}


def _b64_to_hex(value: str) -> str:
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ValueError("bad base64") from exc
    if len(raw) != 16:
        raise ValueError("not an MD5")
    return raw.hex()
