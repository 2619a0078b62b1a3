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
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl

from gateway.errors import (
    InvalidArgument,
    InvalidStorageClass,
    InvalidTag,
    MetadataTooLarge,
    S3NotImplemented,
)
from gateway.models import UPSTREAM_HEADERS

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
    refuse_unsupported(headers)
    stored = {name: header_text(headers[name]) for name in STORED_HEADERS if name in headers}
    if not stored.get("expires", "x").strip():
        # An empty Expires is no date at all: kept, it would be answered as ``Expires:``,
        # which botocore cannot parse (every GET/HEAD of the object raises in boto3).
        del stored["expires"]
    if "content-encoding" in stored:
        kept = without_aws_chunked(stored.pop("content-encoding"))
        if kept:
            stored["content-encoding"] = kept
    stored.update(upstream_headers(headers))
    return stored


_SSE = ("AES256", "aws:kms", "aws:kms:dsse")
_SSE_KMS = ("aws:kms", "aws:kms:dsse")
_KMS_HEADERS = (
    "x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-server-side-encryption-context",
)
_STORAGE_CLASSES = frozenset(
    (
        "STANDARD",
        "REDUCED_REDUNDANCY",
        "STANDARD_IA",
        "ONEZONE_IA",
        "INTELLIGENT_TIERING",
        "GLACIER",
        "DEEP_ARCHIVE",
        "GLACIER_IR",
    )
)
# Asked of S3 and not carried by this gateway: refused (501) rather than dropped. SSE-C
# needs the client's key on every read, object lock a retention the bucket enforces, and an
# append (directory buckets only) is not an overwrite.
_REFUSED_HEADERS = (
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-server-side-encryption-customer-key",
    "x-amz-server-side-encryption-customer-key-md5",
    "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date",
    "x-amz-object-lock-legal-hold",
    "x-amz-write-offset-bytes",
)
_MAX_TAGS = 10


def refuse_unsupported(
    headers: Mapping[str, object], names: Sequence[str] = _REFUSED_HEADERS
) -> None:
    """501 NotImplemented, naming it, for a header (or element) of ``names`` whose meaning
    this gateway would drop."""
    for name in names:
        if name in headers:
            raise S3NotImplemented(
                "A header you provided implies functionality that is not implemented",
                Header=name,
            )


def upstream_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The request's ``UPSTREAM_HEADERS``, checked as S3 checks them (400 otherwise, before
    anything is stored: an upload S3 would refuse must never be acknowledged)."""
    sent = {name: headers[name].strip() for name in UPSTREAM_HEADERS if name in headers}
    for name, value in sent.items():
        if not value.isascii() or not value.isprintable():  # tags come URL-encoded
            raise InvalidArgument(
                f"The {name} header holds characters S3 does not take there",
                ArgumentName=name,
            )
    sse = sent.get("x-amz-server-side-encryption")
    if sse is not None and sse not in _SSE:
        raise InvalidArgument(
            "The encryption method specified is not supported",
            ArgumentName="x-amz-server-side-encryption",
            ArgumentValue=sse,
        )
    if sse in _SSE_KMS or any(name in headers for name in _KMS_HEADERS):
        # S3 answers an SSE-KMS object with an ETag that is not its body's MD5, and the
        # gateway acknowledges (and later matches uploads, copies and versions by) the MD5.
        raise S3NotImplemented(
            "SSE-KMS is not implemented by this gateway: use SSE-S3 (AES256)",
            Header="x-amz-server-side-encryption",
        )
    bucket_key = sent.get("x-amz-server-side-encryption-bucket-key-enabled")
    if bucket_key is not None:
        if bucket_key.lower() not in ("true", "false"):
            raise InvalidArgument(
                "Bucket key must be true or false",
                ArgumentName="x-amz-server-side-encryption-bucket-key-enabled",
                ArgumentValue=bucket_key,
            )
        sent["x-amz-server-side-encryption-bucket-key-enabled"] = bucket_key.lower()
    storage = sent.get("x-amz-storage-class")
    if storage is not None and storage not in _STORAGE_CLASSES:
        raise InvalidStorageClass(StorageClassRequested=storage)
    if "x-amz-tagging" in sent:
        check_tagging(sent["x-amz-tagging"])
    return sent


def check_tagging(value: str) -> None:
    """``x-amz-tagging`` (URL query form): at most 10 tags, keys of 1-128 characters and
    values of at most 256, each key once (S3's limits; 400 InvalidTag otherwise)."""
    try:
        tags = parse_qsl(value, keep_blank_values=True, strict_parsing=bool(value))
    except ValueError as exc:
        raise InvalidArgument(
            "The header 'x-amz-tagging' shall be encoded as UTF-8 then URLEncoded URL query "
            "parameters without tag name duplicates.",
            ArgumentName="x-amz-tagging",
        ) from exc
    keys = [k for k, _ in tags]
    if len(tags) > _MAX_TAGS:
        raise InvalidTag("Object tags cannot be greater than 10")
    if len(set(keys)) != len(keys):
        raise InvalidTag("Cannot provide multiple Tags with the same key")
    for key, tag_value in tags:
        if not 1 <= len(key) <= 128:
            raise InvalidTag("The TagKey you have provided is invalid")
        if len(tag_value) > 256:
            raise InvalidTag("The TagValue you have provided is invalid")


def tag_count(value: str) -> int:
    """How many tags a stored ``x-amz-tagging`` holds."""
    return len(parse_qsl(value, keep_blank_values=True))


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
