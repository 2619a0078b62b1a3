"""Decoder for S3's ``aws-chunked`` request bodies, checking chunk and trailer signatures.

Wire format (https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html and
https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming-trailers.html)::

    <hex size>[;chunk-signature=<64 hex>]\\r\\n<data>\\r\\n        (repeated)
    0[;chunk-signature=<64 hex>]\\r\\n                             (the last chunk)
    <name>:<value>\\r\\n ...                                       (optional trailers)
    x-amz-trailer-signature:<64 hex>\\r\\n                         (signed trailers only)
    \\r\\n

botocore's ``AwsChunkedWrapper`` (STREAMING-UNSIGNED-PAYLOAD-TRAILER) sends 1 MiB chunks without
extensions and ends with ``0\\r\\nx-amz-checksum-crc32:<base64>\\r\\n\\r\\n``, or ``0\\r\\n\\r\\n``
when it has no checksum to send.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Protocol

from aiohttp.http_exceptions import LineTooLong

from gateway.errors import (
    IncompleteBody,
    InvalidRequest,
    MalformedTrailerError,
    SignatureDoesNotMatch,
)
from gateway.s3.auth import (
    EMPTY_SHA256,
    SIGNED_STREAMING,
    STREAMING_PAYLOAD_TRAILER,
    AuthContext,
)
from gateway.sigv4 import hmac_hex

TRAILER_SIGNATURE = "x-amz-trailer-signature"
# More trailer lines than any client sends (a checksum and a signature) means a broken body.
_MAX_TRAILER_LINES = 32
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_TRAILER_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TRUNCATED = "The request body terminated unexpectedly."
# Signed chunks: a piece this large is hashed in a worker thread, off the event loop.
_THREAD_HASH_MIN_BYTES = 32 << 10


class ByteReader(Protocol):
    """The two reads the decoder needs; ``aiohttp.StreamReader`` and ``asyncio.StreamReader``
    both provide them.

    At end of stream ``readexactly`` MUST raise ``asyncio.IncompleteReadError``; ``readuntil`` may
    either raise it (asyncio) or return the bytes read so far without the separator (aiohttp).
    """

    async def readexactly(self, n: int) -> bytes: ...

    async def readuntil(self, separator: bytes = b"\n") -> bytes: ...


class AwsChunkedBody:
    """An aws-chunked body, decoded: implements ``gateway.models.RequestBody``.

    ``chunks()`` yields the payload in pieces of at most ``max_piece_bytes`` and never buffers a
    whole chunk. When ``auth`` says the payload is signed (``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``
    or its ``-TRAILER`` form), every chunk signature and the trailer signature are checked,
    chained from ``auth.seed_signature``; otherwise signatures are ignored.

    A chunk's signature can only be checked after its last byte, so pieces are yielded before
    they are authenticated: the payload is valid only if iteration ends without raising, and
    callers MUST discard whatever they stored when it raises. It raises ``IncompleteBody`` when
    the stream ends early or the payload length differs from ``decoded_length``,
    ``InvalidRequest`` for broken chunk framing, ``MalformedTrailerError`` for a broken trailer
    section or data after it, and ``SignatureDoesNotMatch`` for a missing or wrong signature.

    ``trailers`` (lower-cased names, without the trailer signature) is filled in only once
    ``chunks()`` is exhausted. Checksums are not verified here; the caller hashes the payload
    and compares with ``trailers``. ``chunks()`` may be called once; the body is bound to the
    event loop of its reader.
    """

    def __init__(
        self,
        reader: ByteReader,
        *,
        decoded_length: int | None,
        auth: AuthContext | None = None,
        max_piece_bytes: int = 1 << 20,
        max_chunk_header_bytes: int = 4096,
    ) -> None:
        if max_piece_bytes <= 0:
            raise ValueError("max_piece_bytes must be positive")
        self._reader = reader
        self._decoded_length = decoded_length
        self._max_piece_bytes = max_piece_bytes
        self._max_line_bytes = max_chunk_header_bytes
        is_signed = auth is not None and auth.content_sha256 in SIGNED_STREAMING
        self._signer = _ChunkSigner(auth) if auth is not None and is_signed else None
        self._has_signed_trailer = auth is not None and auth.content_sha256 == (
            STREAMING_PAYLOAD_TRAILER
        )
        self._trailers: dict[str, str] = {}
        self._is_started = False

    def chunks(self) -> AsyncIterator[bytes]:
        """The decoded payload, in pieces of at most ``max_piece_bytes``."""
        if self._is_started:
            raise RuntimeError("an aws-chunked body can be read only once")
        self._is_started = True
        return self._decode()

    @property
    def trailers(self) -> Mapping[str, str]:
        """Trailing headers (lower-cased names); empty until ``chunks()`` is exhausted."""
        return MappingProxyType(self._trailers)

    async def _decode(self) -> AsyncIterator[bytes]:
        total_bytes = 0
        while True:
            size, signature = await self._read_chunk_header()
            if size == 0:
                break
            total_bytes += size
            self._check_not_over(total_bytes)
            hasher = hashlib.sha256() if self._signer is not None else None
            hashing: asyncio.Future[None] | None = None
            remaining = size
            while remaining > 0:
                piece = await self._read_exactly(min(remaining, self._max_piece_bytes))
                remaining -= len(piece)
                if hasher is not None:
                    if hashing is not None:
                        await hashing
                    hashing = _hash_piece(hasher, piece)
                yield piece
            if hashing is not None:
                await hashing
            if await self._read_exactly(2) != b"\r\n":
                raise InvalidRequest("aws-chunked: chunk data is not followed by CRLF.")
            if self._signer is not None and hasher is not None:
                self._signer.verify_chunk(signature, hasher.hexdigest())
        if self._signer is not None:
            self._signer.verify_chunk(signature, EMPTY_SHA256)
        if self._decoded_length is not None and total_bytes != self._decoded_length:
            raise IncompleteBody(
                f"The aws-chunked body decodes to {total_bytes} bytes, but "
                f"x-amz-decoded-content-length is {self._decoded_length}."
            )
        await self._read_trailers()
        await self._expect_end()

    def _check_not_over(self, total_bytes: int) -> None:
        if self._decoded_length is not None and total_bytes > self._decoded_length:
            raise IncompleteBody(
                "The aws-chunked body is longer than x-amz-decoded-content-length "
                f"({self._decoded_length})."
            )

    async def _read_chunk_header(self) -> tuple[int, bytes | None]:
        line = await self._read_line()
        if line is None:
            raise IncompleteBody(_TRUNCATED)
        size_text, _, extensions = line.partition(b";")
        size_text = size_text.strip(b" \t")
        if not _CHUNK_SIZE.fullmatch(size_text):
            raise InvalidRequest("aws-chunked: a chunk size is not a hexadecimal number.")
        return int(size_text, 16), _chunk_signature(extensions)

    async def _read_trailers(self) -> None:
        lines, signature = await self._read_trailer_lines()
        if self._signer is not None and (lines or signature is not None):
            if not self._has_signed_trailer:
                raise MalformedTrailerError(
                    "Trailers are not allowed with STREAMING-AWS4-HMAC-SHA256-PAYLOAD."
                )
            canonical = "".join(f"{name}:{value}\n" for name, value in sorted(lines.items()))
            self._signer.verify_trailer(signature, canonical.encode("utf-8"))
        self._trailers = lines

    async def _read_trailer_lines(self) -> tuple[dict[str, str], bytes | None]:
        """Trailer lines up to the empty line, and the trailer signature if one was sent."""
        lines: dict[str, str] = {}
        signature: bytes | None = None
        for _ in range(_MAX_TRAILER_LINES):
            line = await self._read_line()
            if line is None:
                if lines or signature is not None:
                    # The AWS SDK for .NET (3.7) ends the body without the final CRLF after
                    # its trailers (minio/minio#17662); S3 accepts that, and so do we.
                    return lines, signature
                raise IncompleteBody(_TRUNCATED)
            if not line:
                return lines, signature
            name, value = _parse_trailer(line)
            if name == TRAILER_SIGNATURE:
                signature = value.encode("ascii", "replace")
            elif name in lines:
                raise MalformedTrailerError(f"The trailer {name} appears twice.")
            else:
                lines[name] = value
        raise MalformedTrailerError("The aws-chunked trailer section is too long.")

    async def _expect_end(self) -> None:
        try:
            await self._reader.readexactly(1)
        except asyncio.IncompleteReadError:
            return
        raise MalformedTrailerError("Data follows the end of the aws-chunked body.")

    async def _read_exactly(self, n: int) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise IncompleteBody(_TRUNCATED) from None

    async def _read_line(self) -> bytes | None:
        """One CRLF-terminated line without its CRLF; ``None`` at end of stream."""
        try:
            line = await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            line = exc.partial
        except (asyncio.LimitOverrunError, LineTooLong):
            raise InvalidRequest("aws-chunked: a chunk header line is too long.") from None
        if not line:
            return None
        if not line.endswith(b"\n"):
            raise IncompleteBody(_TRUNCATED)
        if len(line) > self._max_line_bytes:
            raise InvalidRequest("aws-chunked: a chunk header line is too long.")
        if not line.endswith(b"\r\n"):
            raise InvalidRequest("aws-chunked: a chunk header line does not end with CRLF.")
        return line[:-2]


def _hash_piece(hasher: hashlib._Hash, piece: bytes) -> asyncio.Future[None] | None:
    """Feed a chunk's SHA-256 (signed chunks): a large piece in a worker thread (hashlib
    releases the GIL), running while the piece is written; a small one at once."""
    if len(piece) < _THREAD_HASH_MIN_BYTES:
        hasher.update(piece)
        return None
    return asyncio.get_running_loop().run_in_executor(None, hasher.update, piece)


class _ChunkSigner:
    """Checks the chain of chunk signatures that starts at the request's seed signature."""

    def __init__(self, auth: AuthContext) -> None:
        self._auth = auth
        self._previous = auth.seed_signature

    def verify_chunk(self, provided: bytes | None, data_sha256: str) -> None:
        """One chunk's signature, given the hex SHA-256 of its data."""
        self._verify(provided, "AWS4-HMAC-SHA256-PAYLOAD", EMPTY_SHA256, data_sha256)

    def verify_trailer(self, provided: bytes | None, canonical: bytes) -> None:
        """The trailer signature over the canonical trailers (``name:value\\n`` each, sorted)."""
        self._verify(provided, "AWS4-HMAC-SHA256-TRAILER", hashlib.sha256(canonical).hexdigest())

    def _verify(self, provided: bytes | None, algorithm: str, *hashes: str) -> None:
        auth = self._auth
        string_to_sign = "\n".join((algorithm, auth.amz_date, auth.scope, self._previous, *hashes))
        expected = hmac_hex(auth.signing_key, string_to_sign)
        if provided is None:
            raise SignatureDoesNotMatch("A signed aws-chunked body is missing a signature.")
        if not hmac.compare_digest(expected.encode("ascii"), provided.lower()):
            raise SignatureDoesNotMatch(StringToSign=string_to_sign)
        self._previous = expected


def _chunk_signature(extensions: bytes) -> bytes | None:
    for extension in extensions.split(b";"):
        name, _, value = extension.partition(b"=")
        if name.strip(b" \t") == b"chunk-signature":
            return value.strip(b" \t")
    return None


def _parse_trailer(line: bytes) -> tuple[str, str]:
    name, separator, value = line.partition(b":")
    name = name.strip(b" \t")
    if not separator or not _TRAILER_NAME.fullmatch(name):
        raise MalformedTrailerError()
    try:
        text = value.strip(b" \t").decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedTrailerError() from None
    return name.decode("ascii").lower(), text
