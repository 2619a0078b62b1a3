"""S3 XML out (and, later, in). xmltodict does the serialising; this module only shapes
documents. Element names and order follow the S3 API reference."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import xmltodict

from gateway.models import BucketInfo, ListEntry

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
OWNER = {"ID": "gateway", "DisplayName": "gateway"}


def document(root: str, body: Mapping[str, Any], *, namespace: bool = True) -> bytes:
    content: dict[str, Any] = {"@xmlns": S3_NS} if namespace else {}
    content.update(body)
    out: str = xmltodict.unparse({root: content}, full_document=True, encoding="utf-8")
    return out.encode("utf-8")


def iso8601(ts_s: float) -> str:
    """S3's timestamp form in XML: ``2026-11-22T10:00:00.000Z``."""
    millis = int(ts_s * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(ts_s))) + f".{millis:03d}Z"


# Characters XML 1.0 cannot carry at all, not even as references.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """``text`` with characters XML cannot carry percent-encoded (keys may contain them).

    Lone surrogates (undecodable request bytes that aiohttp kept with surrogateescape) are
    encoded back to their bytes, or to their UTF-8 form outside that range; neither may raise:
    this renders error documents."""
    return _NOT_XML.sub(lambda m: quote(_raw(m.group(0)), safe=""), text)


def _raw(char: str) -> bytes:
    try:
        return char.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return char.encode("utf-8", "surrogatepass")


def error_document(code: str, message: str, request_id: str, fields: Mapping[str, str]) -> bytes:
    body: dict[str, Any] = {
        "Code": code,
        "Message": xml_safe(message),
        **{name: xml_safe(value) for name, value in fields.items()},
        "RequestId": request_id,
    }
    return document("Error", body, namespace=False)


def list_buckets(buckets: Iterable[BucketInfo]) -> bytes:
    items = [{"Name": b.name, "CreationDate": iso8601(b.created_s)} for b in buckets]
    return document("ListAllMyBucketsResult", {"Owner": OWNER, "Buckets": {"Bucket": items}})


def location(region: str) -> bytes:
    # us-east-1 is reported as an empty LocationConstraint, as S3 does.
    return document("LocationConstraint", {"#text": "" if region == "us-east-1" else region})


def encoder(encoding_type: str | None) -> Any:
    """With ``encoding-type=url`` names in listings are percent-encoded (botocore asks)."""
    if encoding_type == "url":
        return lambda s: quote(s, safe="/")
    return xml_safe


def contents(
    entries: Iterable[ListEntry], enc: Any, *, with_owner: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``Contents`` and ``CommonPrefixes`` of a listing; ``with_owner`` adds each key's
    ``Owner`` (always in ListObjects v1, with ``fetch-owner=true`` in v2): the gateway's one
    identity, which owns every object it serves."""
    keys: list[dict[str, Any]] = []
    prefixes: list[dict[str, Any]] = []
    for e in entries:
        if e.is_prefix:
            prefixes.append({"Prefix": enc(e.name)})
        else:
            keys.append(
                {
                    "Key": enc(e.name),
                    "LastModified": iso8601(e.last_modified_s),
                    "ETag": f'"{e.etag}"',
                    "Size": str(e.size_bytes),
                    "StorageClass": e.storage_class,
                    **({"Owner": OWNER} if with_owner else {}),
                }
            )
    return keys, prefixes
