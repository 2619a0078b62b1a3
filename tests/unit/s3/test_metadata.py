"""Stored header values: what S3 keeps for each (ASCII as sent, else RFC 2047 of the
octets read as ISO-8859-1), Content-Encoding less aws-chunked, S3's 2 KB metadata limit."""

from __future__ import annotations

import base64

import pytest

from gateway.errors import InvalidArgument, InvalidTag, MetadataTooLarge
from gateway.s3.metadata import (
    content_type,
    header_text,
    names_aws_chunked,
    stored_headers,
    tag_count,
    upstream_headers,
    user_metadata,
    without_aws_chunked,
)


def _aiohttp(raw: bytes) -> str:
    """A header value as aiohttp hands it over."""
    return raw.decode("utf-8", "surrogateescape")


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        (b"plain", "plain"),
        (b"", ""),
        (b"=?UTF-8?B?Y2Fmw6k=?=", "=?UTF-8?B?Y2Fmw6k=?="),  # ASCII: kept as sent
        (b"caf\xe9", "=?UTF-8?B?Y2Fmw6k=?="),  # not UTF-8: read as ISO-8859-1
        ("café".encode(), "=?UTF-8?B?Y2Fmw4PCqQ==?="),  # UTF-8 octets, read the same way
        (b"\xff\xfe", "=?UTF-8?B?w7/Dvg==?="),
    ],
)
def test_metadata_header_text(raw: bytes, stored: str) -> None:
    assert header_text(_aiohttp(raw)) == stored
    assert stored.isascii()


def test_metadata_header_text_decodes_back_to_the_iso_8859_1_reading() -> None:
    raw = bytes(range(0x20, 0x100)).replace(b"\x7f", b"")
    encoded = header_text(_aiohttp(raw))
    inner = encoded.removeprefix("=?UTF-8?B?").removesuffix("?=")
    assert base64.b64decode(inner).decode("utf-8") == raw.decode("latin-1")


def test_metadata_user_metadata_lowercases_names_and_encodes_values() -> None:
    headers = {"X-Amz-Meta-Name": _aiohttp(b"caf\xe9"), "x-amz-meta-n2": "v", "Other": "x"}
    assert user_metadata(headers) == {"name": "=?UTF-8?B?Y2Fmw6k=?=", "n2": "v"}


def test_metadata_size_counts_the_utf8_s3_stores() -> None:
    # "x" (1) + 1023 * 2 + 1 bytes = 2048: allowed; one more stored byte is over.
    assert user_metadata({"x-amz-meta-x": _aiohttp(b"\xe9" * 1023 + b"a")})
    with pytest.raises(MetadataTooLarge):
        user_metadata({"x-amz-meta-x": _aiohttp(b"\xe9" * 1024)})


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        ("gzip", "gzip"),
        ("deflate, gzip", "deflate, gzip"),
        ("deflate,gzip", "deflate,gzip"),
        ("gzip, aws-chunked", "gzip"),
        ("aws-chunked, gzip", "gzip"),
        ("gzip,aws-chunked,br", "gzip,br"),
        ("aws-chunked", None),
        ("aws-chunked, aws-chunked", None),
        ("AWS-Chunked , deflate", "deflate"),
    ],
)
def test_metadata_content_encoding_stored_as_sent_less_aws_chunked(
    sent: str, stored: str | None
) -> None:
    assert stored_headers({"content-encoding": sent}).get("content-encoding") == stored
    assert names_aws_chunked(sent) == (stored != sent)
    assert without_aws_chunked(sent) == (stored or "")


def test_metadata_stored_headers_keep_expires_verbatim() -> None:
    headers = {"expires": "not a date", "cache-control": "no-cache", "x-other": "y"}
    assert stored_headers(headers) == {"expires": "not a date", "cache-control": "no-cache"}


def test_metadata_content_type_default_and_encoding() -> None:
    assert content_type({}) == "binary/octet-stream"
    assert content_type({"Content-Type": _aiohttp(b"text/\xe9")}) == "=?UTF-8?B?dGV4dC/DqQ==?="


def test_stored_headers_drop_an_empty_expires() -> None:
    assert stored_headers({"expires": "  ", "cache-control": ""}) == {"cache-control": ""}
    assert stored_headers({"expires": "garbage"}) == {"expires": "garbage"}


@pytest.mark.parametrize("value", ["a=\u00e9", "a=\x01", "a=b\udcff"])
def test_object_settings_that_are_not_printable_ascii_are_refused(value: str) -> None:
    with pytest.raises(InvalidArgument):
        upstream_headers({"x-amz-tagging": value})


def test_tags_are_checked_and_counted() -> None:
    kept = upstream_headers(
        {"x-amz-tagging": "a=1&b=", "x-amz-server-side-encryption-bucket-key-enabled": "TRUE"}
    )
    assert kept == {
        "x-amz-tagging": "a=1&b=",
        "x-amz-server-side-encryption-bucket-key-enabled": "true",
    }
    assert tag_count(kept["x-amz-tagging"]) == 2
    with pytest.raises(InvalidTag):
        upstream_headers({"x-amz-tagging": "=v"})
