"""The aws-chunked decoder: framing, trailers, chunk and trailer signatures, limits."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import io
import re
import zlib
from collections.abc import Callable, Sequence
from unittest import mock

import aiohttp
import pytest
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum

from gateway.errors import (
    IncompleteBody,
    InvalidRequest,
    MalformedTrailerError,
    S3Error,
    SignatureDoesNotMatch,
)
from gateway.s3.auth import (
    STREAMING_PAYLOAD,
    STREAMING_PAYLOAD_TRAILER,
    STREAMING_UNSIGNED_TRAILER,
    AuthContext,
)
from gateway.s3.chunked import AwsChunkedBody, ByteReader

MiB = 1 << 20
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


# --------------------------------------------------------------------------- helpers


def asyncio_reader(data: bytes) -> ByteReader:
    reader = asyncio.StreamReader(limit=1 << 16)
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def aiohttp_reader(data: bytes) -> ByteReader:
    """aiohttp's own request-body reader, as the gateway gets it from ``request.content``."""
    protocol = mock.Mock(_reading_paused=False)
    reader = aiohttp.StreamReader(protocol, 1 << 16, loop=asyncio.get_running_loop())
    # Fed in odd-sized slices so lines and chunks straddle buffer boundaries.
    for start in range(0, len(data), 7919):
        reader.feed_data(data[start : start + 7919])
    reader.feed_eof()
    return reader


ReaderFactory = Callable[[bytes], ByteReader]


@pytest.fixture(params=[asyncio_reader, aiohttp_reader], ids=["asyncio", "aiohttp"])
def make_reader(request: pytest.FixtureRequest) -> ReaderFactory:
    factory: ReaderFactory = request.param
    return factory


async def decode(body: AwsChunkedBody) -> tuple[bytes, list[bytes]]:
    pieces = [piece async for piece in body.chunks()]
    return b"".join(pieces), pieces


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def frame_unsigned(chunks: Sequence[bytes], trailer: bytes = b"\r\n") -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
    return out + b"0\r\n" + trailer


def _derive_key(secret: str, date: str, region: str) -> bytes:
    key = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def context(
    content_sha256: str = STREAMING_PAYLOAD,
    *,
    seed: str = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
) -> AuthContext:
    """The credentials and timestamp of the S3 documentation's chunked-upload examples."""
    return AuthContext(
        access_key="AKIAIOSFODNN7EXAMPLE",
        region="us-east-1",
        service="s3",
        scope="20130524/us-east-1/s3/aws4_request",
        amz_date="20130524T000000Z",
        signing_key=_derive_key(
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "20130524", "us-east-1"
        ),
        seed_signature=seed,
        content_sha256=content_sha256,
    )


def _sign(auth: AuthContext, algorithm: str, previous: str, *hashes: str) -> str:
    string_to_sign = "\n".join((algorithm, auth.amz_date, auth.scope, previous, *hashes))
    return hmac.new(auth.signing_key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def frame_signed(
    auth: AuthContext,
    chunks: Sequence[bytes],
    trailers: dict[str, str] | None = None,
    *,
    tamper: int | None = None,
) -> tuple[bytes, list[str]]:
    """A STREAMING-AWS4-HMAC-SHA256-PAYLOAD(-TRAILER) body, signed from the spec's formulas.

    Returns the body and the signatures in order (chunks, final chunk, then trailer if any).
    """
    previous = auth.seed_signature
    signatures: list[str] = []
    out = bytearray()
    for index, chunk in enumerate([*chunks, b""]):
        chunk_hash = hashlib.sha256(chunk).hexdigest()
        previous = _sign(auth, "AWS4-HMAC-SHA256-PAYLOAD", previous, EMPTY_SHA256, chunk_hash)
        signatures.append(previous)
        sent = previous if index != tamper else previous[::-1]
        out += b"%x;chunk-signature=%s\r\n" % (len(chunk), sent.encode())
        if chunk:
            out += chunk + b"\r\n"
    if trailers is None:
        return bytes(out + b"\r\n"), signatures
    canonical = "".join(f"{name}:{value}\n" for name, value in sorted(trailers.items()))
    trailer_hash = hashlib.sha256(canonical.encode()).hexdigest()
    previous = _sign(auth, "AWS4-HMAC-SHA256-TRAILER", previous, trailer_hash)
    signatures.append(previous)
    out += canonical.replace("\n", "\r\n").encode()
    out += f"x-amz-trailer-signature:{previous}\r\n\r\n".encode()
    return bytes(out), signatures


async def expect(error: type[S3Error], body: AwsChunkedBody) -> S3Error:
    with pytest.raises(error) as caught:
        await decode(body)
    return caught.value


# --------------------------------------------------------------------------- unsigned


async def test_decode_botocore_unsigned_trailer(make_reader: ReaderFactory) -> None:
    payload = b"0123456789abcdef" * 40_000 + b"end"
    wrapper = AwsChunkedWrapper(
        io.BytesIO(payload),
        checksum_cls=Crc32Checksum,
        checksum_name="x-amz-checksum-crc32",
        chunk_size=64 * 1024,
    )
    encoded = wrapper.read()
    body = AwsChunkedBody(
        make_reader(encoded), decoded_length=len(payload), auth=context(STREAMING_UNSIGNED_TRAILER)
    )
    data, _ = await decode(body)
    assert data == payload
    assert dict(body.trailers) == {"x-amz-checksum-crc32": crc32_b64(payload)}


async def test_decode_botocore_without_checksum(make_reader: ReaderFactory) -> None:
    payload = b"x" * 100_000
    encoded = AwsChunkedWrapper(io.BytesIO(payload), chunk_size=30_000).read()
    assert encoded.endswith(b"\r\n0\r\n\r\n")
    body = AwsChunkedBody(make_reader(encoded), decoded_length=len(payload))
    data, pieces = await decode(body)
    assert data == payload
    assert [len(piece) for piece in pieces] == [30_000, 30_000, 30_000, 10_000]
    assert dict(body.trailers) == {}


@pytest.mark.parametrize(
    ("encoded", "trailers"),
    [
        (b"0\r\n\r\n", {}),
        (b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n", {"x-amz-checksum-crc32": "AAAAAA=="}),
        (b"0\r\nX-Amz-Checksum-CRC32 : AAAAAA== \r\n\r\n", {"x-amz-checksum-crc32": "AAAAAA=="}),
    ],
)
async def test_decode_empty_body(
    make_reader: ReaderFactory, encoded: bytes, trailers: dict[str, str]
) -> None:
    body = AwsChunkedBody(make_reader(encoded), decoded_length=0)
    data, pieces = await decode(body)
    assert data == b"" and pieces == []
    assert dict(body.trailers) == trailers


async def test_decode_ignores_signatures_when_unsigned(make_reader: ReaderFactory) -> None:
    auth = context(STREAMING_UNSIGNED_TRAILER)
    encoded, _ = frame_signed(context(), [b"abc"], {"x-amz-checksum-crc32": crc32_b64(b"abc")})
    garbled = re.sub(rb"(signature[=:])[0-9a-f]{64}", rb"\g<1>" + b"0" * 64, encoded)
    assert garbled.count(b"0" * 64) == 3
    body = AwsChunkedBody(make_reader(garbled), decoded_length=3, auth=auth)
    assert (await decode(body))[0] == b"abc"
    assert dict(body.trailers) == {"x-amz-checksum-crc32": crc32_b64(b"abc")}


async def test_decode_splits_large_chunk_into_pieces(make_reader: ReaderFactory) -> None:
    payload = bytes(range(256)) * (5 * MiB // 256)
    encoded = frame_unsigned([payload])
    body = AwsChunkedBody(make_reader(encoded), decoded_length=len(payload))
    data, pieces = await decode(body)
    assert data == payload
    assert len(pieces) == 5
    assert all(len(piece) <= MiB for piece in pieces)


async def test_decode_respects_small_piece_size(make_reader: ReaderFactory) -> None:
    encoded = frame_unsigned([b"a" * 1000, b"b" * 10])
    body = AwsChunkedBody(make_reader(encoded), decoded_length=1010, max_piece_bytes=300)
    _, pieces = await decode(body)
    assert [len(piece) for piece in pieces] == [300, 300, 300, 100, 10]


async def test_decode_accepts_unknown_length_and_uppercase_hex(make_reader: ReaderFactory) -> None:
    encoded = b"1A\r\n" + b"z" * 26 + b"\r\n0\r\n\r\n"
    body = AwsChunkedBody(make_reader(encoded), decoded_length=None)
    assert (await decode(body))[0] == b"z" * 26


async def test_decode_tolerates_missing_final_crlf_after_trailers(
    make_reader: ReaderFactory,
) -> None:
    # The AWS SDK for .NET 3.7 ends its trailer section without the last CRLF.
    encoded = frame_unsigned(
        [b"abc"], b"x-amz-checksum-crc32:" + crc32_b64(b"abc").encode() + b"\r\n"
    )
    body = AwsChunkedBody(make_reader(encoded), decoded_length=3)
    assert (await decode(body))[0] == b"abc"
    assert body.trailers["x-amz-checksum-crc32"] == crc32_b64(b"abc")


async def test_trailers_empty_until_exhausted(make_reader: ReaderFactory) -> None:
    encoded = frame_unsigned([b"abc"], b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n")
    body = AwsChunkedBody(make_reader(encoded), decoded_length=3)
    chunks = body.chunks()
    assert await anext(chunks) == b"abc"
    assert dict(body.trailers) == {}
    with pytest.raises(StopAsyncIteration):
        await anext(chunks)
    assert dict(body.trailers) == {"x-amz-checksum-crc32": "AAAAAA=="}
    with pytest.raises(RuntimeError):
        body.chunks()


# --------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(
    ("encoded", "error"),
    [
        pytest.param(b"", IncompleteBody, id="empty-stream"),
        pytest.param(b"5\r\nabc", IncompleteBody, id="eof-mid-chunk"),
        pytest.param(b"5\r\nabcde", IncompleteBody, id="eof-before-crlf"),
        pytest.param(b"5\r\nabcde\r\n", IncompleteBody, id="eof-before-last-chunk"),
        pytest.param(b"5\r\nabcde\r\n0\r\n", IncompleteBody, id="eof-before-final-crlf"),
        pytest.param(b"5\r\nabcde\r\n0", IncompleteBody, id="eof-mid-header"),
        pytest.param(
            b"5\r\nabcde\r\n0\r\nx-amz-checksum-crc32:AA", IncompleteBody, id="eof-trailer"
        ),
        pytest.param(b"zz\r\nabcde\r\n0\r\n\r\n", InvalidRequest, id="bad-hex"),
        pytest.param(b"0x5\r\nabcde\r\n0\r\n\r\n", InvalidRequest, id="hex-prefix"),
        pytest.param(b"-5\r\nabcde\r\n0\r\n\r\n", InvalidRequest, id="negative"),
        pytest.param(b";chunk-signature=ab\r\n0\r\n\r\n", InvalidRequest, id="no-size"),
        pytest.param(b"1" * 17 + b"\r\n", InvalidRequest, id="size-too-long"),
        pytest.param(b"5\nabcde\r\n0\r\n\r\n", InvalidRequest, id="bare-lf"),
        pytest.param(b"5\r\nabcdeXX0\r\n\r\n", InvalidRequest, id="no-crlf-after-data"),
        pytest.param(b"5;" + b"x" * 5000 + b"\r\nabcde", InvalidRequest, id="header-too-long"),
        pytest.param(b"5;" + b"x" * 200_000 + b"\r\n", InvalidRequest, id="header-huge"),
        pytest.param(b"0\r\nno-colon\r\n\r\n", MalformedTrailerError, id="trailer-no-colon"),
        pytest.param(b"0\r\n:value\r\n\r\n", MalformedTrailerError, id="trailer-no-name"),
        pytest.param(b"0\r\na b:c\r\n\r\n", MalformedTrailerError, id="trailer-bad-name"),
        pytest.param(b"0\r\na:1\r\nA:2\r\n\r\n", MalformedTrailerError, id="trailer-twice"),
        pytest.param(b"0\r\n" + b"a:1\r\n" * 40 + b"\r\n", MalformedTrailerError, id="too-many"),
        pytest.param(b"0\r\n\r\n0\r\nx:y\r\n\r\n", MalformedTrailerError, id="data-after-end"),
    ],
)
async def test_decode_rejects_malformed(
    make_reader: ReaderFactory, encoded: bytes, error: type[S3Error]
) -> None:
    await expect(error, AwsChunkedBody(make_reader(encoded), decoded_length=None))


@pytest.mark.parametrize("declared", [0, 4, 6, 100])
async def test_decode_rejects_length_mismatch(make_reader: ReaderFactory, declared: int) -> None:
    encoded = frame_unsigned([b"abc", b"de"])
    await expect(IncompleteBody, AwsChunkedBody(make_reader(encoded), decoded_length=declared))


async def test_decode_rejects_overlong_chunk_before_reading_it(make_reader: ReaderFactory) -> None:
    # The header alone announces more than x-amz-decoded-content-length: no data is yielded.
    body = AwsChunkedBody(make_reader(b"400000\r\n" + b"a" * 10), decoded_length=5)
    chunks = body.chunks()
    with pytest.raises(IncompleteBody):
        await anext(chunks)


# --------------------------------------------------------------------------- signed


async def test_decode_aws_documentation_example(make_reader: ReaderFactory) -> None:
    """The S3 docs' STREAMING-AWS4-HMAC-SHA256-PAYLOAD example: 64 KiB + 1 KiB of 'a'."""
    auth = context()
    chunks = [b"a" * 65536, b"a" * 1024]
    encoded, signatures = frame_signed(auth, chunks)
    assert signatures == [
        "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
        "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
        "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
    ]
    assert len(encoded) == 66824  # the example's Content-Length
    body = AwsChunkedBody(make_reader(encoded), decoded_length=66560, auth=auth)
    assert (await decode(body))[0] == b"".join(chunks)


async def test_decode_aws_documentation_trailer_example(make_reader: ReaderFactory) -> None:
    """The S3 docs' STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER example (CRC32C trailer)."""
    auth = context(
        STREAMING_PAYLOAD_TRAILER,
        seed="106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e",
    )
    trailers = {"x-amz-checksum-crc32c": "sOO8/Q=="}
    encoded, signatures = frame_signed(auth, [b"a" * 65536, b"a" * 1024], trailers)
    assert signatures[-1] == "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435"
    body = AwsChunkedBody(make_reader(encoded), decoded_length=66560, auth=auth)
    assert len((await decode(body))[0]) == 66560
    assert dict(body.trailers) == trailers


async def test_decode_signed_large_chunk_in_pieces(make_reader: ReaderFactory) -> None:
    auth = context()
    payload = b"q" * (3 * MiB + 17)
    encoded, _ = frame_signed(auth, [payload, b"tail"])
    body = AwsChunkedBody(make_reader(encoded), decoded_length=len(payload) + 4, auth=auth)
    data, pieces = await decode(body)
    assert data == payload + b"tail"
    assert max(len(piece) for piece in pieces) == MiB


async def test_decode_signed_trailer_sorted_canonical_form(make_reader: ReaderFactory) -> None:
    auth = context(STREAMING_PAYLOAD_TRAILER)
    trailers = {"x-amz-checksum-sha256": "abc=", "x-amz-checksum-crc32": crc32_b64(b"xyz")}
    encoded, _ = frame_signed(auth, [b"xyz"], trailers)
    body = AwsChunkedBody(make_reader(encoded), decoded_length=3, auth=auth)
    await decode(body)
    assert dict(body.trailers) == trailers


@pytest.mark.parametrize("tamper", [0, 1, 2])
async def test_decode_rejects_bad_chunk_signature(make_reader: ReaderFactory, tamper: int) -> None:
    auth = context()
    encoded, _ = frame_signed(auth, [b"a" * 100, b"b" * 50], tamper=tamper)
    await expect(
        SignatureDoesNotMatch, AwsChunkedBody(make_reader(encoded), decoded_length=150, auth=auth)
    )


async def test_decode_rejects_tampered_signed_data(make_reader: ReaderFactory) -> None:
    auth = context()
    encoded, _ = frame_signed(auth, [b"a" * 100])
    tampered = encoded.replace(b"a" * 100, b"a" * 99 + b"b")
    await expect(
        SignatureDoesNotMatch, AwsChunkedBody(make_reader(tampered), decoded_length=100, auth=auth)
    )


async def test_decode_rejects_tampered_large_chunk_hashed_off_the_loop(
    make_reader: ReaderFactory,
) -> None:
    # Pieces of large chunks are hashed in a worker thread: a change is caught all the same.
    auth = context()
    payload = bytes(range(256)) * 800  # 200 KiB, several pieces at a 64 KiB piece size
    encoded, _ = frame_signed(auth, [payload, b"tail"])
    tampered = encoded.replace(payload[150_000:150_010], b"X" * 10, 1)
    assert tampered != encoded
    for data, ok in ((encoded, True), (tampered, False)):
        body = AwsChunkedBody(
            make_reader(data), decoded_length=len(payload) + 4, auth=auth, max_piece_bytes=65536
        )
        if ok:
            assert (await decode(body))[0] == payload + b"tail"
        else:
            await expect(SignatureDoesNotMatch, body)


async def test_decode_rejects_wrong_seed(make_reader: ReaderFactory) -> None:
    encoded, _ = frame_signed(context(), [b"abc"])
    auth = context(seed="0" * 64)
    await expect(
        SignatureDoesNotMatch, AwsChunkedBody(make_reader(encoded), decoded_length=3, auth=auth)
    )


async def test_decode_rejects_missing_chunk_signature(make_reader: ReaderFactory) -> None:
    auth = context()
    await expect(
        SignatureDoesNotMatch,
        AwsChunkedBody(make_reader(frame_unsigned([b"abc"])), decoded_length=3, auth=auth),
    )
    # Only the final chunk unsigned.
    encoded, _ = frame_signed(auth, [b"abc"])
    unsigned_final = encoded[: encoded.index(b"0;chunk-signature")] + b"0\r\n\r\n"
    await expect(
        SignatureDoesNotMatch,
        AwsChunkedBody(make_reader(unsigned_final), decoded_length=3, auth=auth),
    )


async def test_decode_rejects_bad_trailer_signature(make_reader: ReaderFactory) -> None:
    auth = context(STREAMING_PAYLOAD_TRAILER)
    encoded, _ = frame_signed(auth, [b"abc"], {"x-amz-checksum-crc32": crc32_b64(b"abc")})
    changed = encoded.replace(crc32_b64(b"abc").encode(), b"AAAAAA==")
    await expect(
        SignatureDoesNotMatch, AwsChunkedBody(make_reader(changed), decoded_length=3, auth=auth)
    )
    no_signature = encoded[: encoded.index(b"x-amz-trailer-signature")] + b"\r\n"
    await expect(
        SignatureDoesNotMatch,
        AwsChunkedBody(make_reader(no_signature), decoded_length=3, auth=auth),
    )


async def test_decode_rejects_trailers_without_trailer_mode(make_reader: ReaderFactory) -> None:
    auth = context(STREAMING_PAYLOAD)
    encoded, _ = frame_signed(auth, [b"abc"], {"x-amz-checksum-crc32": crc32_b64(b"abc")})
    await expect(
        MalformedTrailerError, AwsChunkedBody(make_reader(encoded), decoded_length=3, auth=auth)
    )


async def test_decode_yields_nothing_past_a_bad_signature(make_reader: ReaderFactory) -> None:
    auth = context()
    encoded, _ = frame_signed(auth, [b"a" * 10, b"b" * 10, b"c" * 10], tamper=0)
    body = AwsChunkedBody(make_reader(encoded), decoded_length=30, auth=auth)
    seen: list[bytes] = []
    with pytest.raises(SignatureDoesNotMatch):
        async for piece in body.chunks():
            seen.append(piece)
    assert seen == [b"a" * 10]
