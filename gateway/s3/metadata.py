"""Header values an object stores (user metadata, Content-Type and the other system
headers), turned into what S3 keeps, so every stored value can later be sent upstream.

HTTP hands a header value over as octets. S3 reads them as ISO-8859-1 (each byte one
character: the string-to-sign S3 reports for ``x-amz-meta-a: á`` sent as UTF-8 reads
``Ã¡``), and a value holding any non-ASCII character is kept as Unicode and returned RFC 2047
encoded, ``=?UTF-8?B?<base64 of its UTF-8>?=`` (AWS S3 user guide, "User-defined object
metadata"; observed: ``ö`` sent as UTF-8 comes back as ``=?UTF-8?B?w4PCtg==?=``). A value
that is pure ASCII is kept and returned as sent. The gateway stores the returned form, which
is ASCII: it is what a GET answers, and it is what the upstream client sends on flush (S3
decodes the encoded word back to the same Unicode string), so botocore, which refuses
non-ASCII metadata, never sees a value it cannot send. Bytes that are not UTF-8
(``caf\\xe9``) need no special case: as ISO-8859-1 they are ``café``.

aiohttp decodes header octets as UTF-8 with ``surrogateescape``; encoding them back the same
way recovers the exact bytes.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from gateway.errors import MetadataTooLarge

# System metadata S3 stores with an object and returns on GET/HEAD (as sent, see above).
STORED_HEADERS = (
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
)
# S3 stores at most 2 KB of user metadata (x-amz-meta-* names and values, UTF-8 bytes).
MAX_USER_METADATA_BYTES = 2048
DEFAULT_CONTENT_TYPE = "binary/octet-stream"
_AWS_CHUNKED = "aws-chunked"


def _octets(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def header_text(value: str) -> str:
    """The value S3 keeps for a header that arrived as ``value`` (see the module docstring):
    unchanged when its octets are ASCII, else the RFC 2047 encoded word of their
    ISO-8859-1 reading. The result is always ASCII."""
    raw = _octets(value)
    if raw.isascii():
        return value
    text = raw.decode("latin-1").encode("utf-8")
    return f"=?UTF-8?B?{base64.b64encode(text).decode('ascii')}?="


def _stored_size(value: str) -> int:
    """Bytes S3 counts for a value: the UTF-8 form of the characters it keeps."""
    return len(_octets(value).decode("latin-1").encode("utf-8"))


def user_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    """``x-amz-meta-*`` headers, names lower-cased and values as S3 keeps them.

    Raises ``MetadataTooLarge`` over S3's limit: 2 KB of names and values (UTF-8 bytes)."""
    sent = {k[11:].lower(): v for k, v in headers.items() if k.lower().startswith("x-amz-meta-")}
    size = sum(_stored_size(k) + _stored_size(v) for k, v in sent.items())
    if size > MAX_USER_METADATA_BYTES:
        raise MetadataTooLarge(
            f"Your metadata headers are {size} bytes; the maximum is {MAX_USER_METADATA_BYTES}."
        )
    return {k: header_text(v) for k, v in sent.items()}


def content_type(headers: Mapping[str, str]) -> str:
    """The Content-Type S3 stores (its default when none was sent)."""
    value = headers.get("Content-Type")
    return DEFAULT_CONTENT_TYPE if value is None else header_text(value)


def stored_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """System metadata kept with the object, as S3 keeps it. Content-Encoding is stored
    exactly as sent, less its ``aws-chunked`` tokens (a framing of this request, not part of
    the object): ``deflate, gzip`` stays ``deflate, gzip``, ``gzip, aws-chunked`` is
    ``gzip``, and ``aws-chunked`` alone stores no Content-Encoding."""
    stored = {name: header_text(headers[name]) for name in STORED_HEADERS if name in headers}
    if not stored.get("expires", "x").strip():
        # An empty Expires is no date at all: kept, it would be answered as ``Expires:``,
        # which botocore cannot parse (every GET/HEAD of the object raises in boto3).
        del stored["expires"]
    if "content-encoding" in stored:
        kept = without_aws_chunked(stored.pop("content-encoding"))
        if kept:
            stored["content-encoding"] = kept
    return stored


def without_aws_chunked(value: str) -> str:
    """``value`` less every ``aws-chunked`` coding, the other codings and their spacing kept."""
    parts = value.split(",")
    kept = [p for p in parts if p.strip().lower() != _AWS_CHUNKED]
    if len(kept) == len(parts):
        return value
    return ",".join(kept).strip()


def names_aws_chunked(value: str) -> bool:
    """Whether a Content-Encoding value lists the ``aws-chunked`` coding."""
    return any(p.strip().lower() == _AWS_CHUNKED for p in value.split(","))
