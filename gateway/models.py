"""Value objects shared by every layer. No I/O, no framework imports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class FlushState(StrEnum):
    """Where an acknowledged write stands on its way to the upstream bucket."""

    PENDING = "pending"  # durable locally, waiting to be uploaded
    FLUSHING = "flushing"  # an upload is in flight
    DURABLE = "durable"  # the upstream has this exact version
    FAILED = "failed"  # a permanent upstream error; kept until an operator retries


# Headers of a write that S3 applies to the object in the bucket, not to its bytes: its
# encryption at rest (SSE-S3; SSE-KMS is refused at ingest), storage class and tags. Stored with the
# version (``ObjectMeta.headers``) and sent with its upload; a copy takes the request's
# (the source's tags unless ``x-amz-tagging-directive: REPLACE``), as S3's CopyObject does.
UPSTREAM_HEADERS = (
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-bucket-key-enabled",
    "x-amz-storage-class",
    "x-amz-tagging",
)


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What S3 returns about an object version. ``etag`` is unquoted hex (``-N`` for multipart)."""

    bucket: str
    key: str
    size_bytes: int
    etag: str
    last_modified_s: float
    content_type: str = "binary/octet-stream"
    user_metadata: Mapping[str, str] = field(default_factory=dict)
    # System metadata stored and returned verbatim (content-encoding, cache-control, ...).
    headers: Mapping[str, str] = field(default_factory=dict)
    # x-amz-checksum-<algorithm> values (base64) verified on ingest.
    checksums: Mapping[str, str] = field(default_factory=dict)

    @property
    def storage_class(self) -> str:
        """The storage class the version was written with (``x-amz-storage-class``)."""
        return self.headers.get("x-amz-storage-class", "STANDARD")


@dataclass(frozen=True, slots=True)
class PartRef:
    """One part of a multipart object: its body file, size and MD5 (unquoted hex)."""

    blob_id: str
    size_bytes: int
    etag: str
    # The part's checksum (base64) in the object's multipart checksum algorithm, if any.
    checksum: str | None = None
    # CRC32C of the part's file, taken at ingest (local integrity checks); None if older.
    crc32c: int | None = None


@dataclass(frozen=True, slots=True)
class LocalObject:
    """A journal row: the newest local version of a key, or a delete of it (a tombstone)."""

    meta: ObjectMeta
    seq: int  # global acknowledgement order; also the version's generation
    state: FlushState
    blob_id: str | None  # single-part body; None for tombstones and multipart objects
    is_delete: bool = False
    attempts: int = 0
    last_error: str | None = None
    parts: tuple[PartRef, ...] = ()  # multipart body, in part order
    acked_s: float = 0.0  # wall clock of the acknowledgement
    # An older version of this key was sent (or is being sent) upstream by this gateway.
    flushed_before: bool = False
    # CRC32C of the single body, taken at ingest (local integrity checks); None if older.
    crc32c: int | None = None
    # The body itself when it is small enough to live in the journal (no blob file then).
    body: bytes | None = None

    @property
    def blob_ids(self) -> list[str]:
        """Every body file this version references."""
        return (
            [p.blob_id for p in self.parts]
            if self.parts
            else ([self.blob_id] if self.blob_id else [])
        )


class RequestBody(Protocol):
    """A streamed request body (plain or aws-chunked-decoded).

    ``trailers`` is valid only once ``chunks()`` is exhausted (aws-chunked trailing headers,
    lower-cased names); it is empty for plain bodies.
    """

    def chunks(self) -> AsyncIterator[bytes]: ...

    @property
    def trailers(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class PutRequest:
    """A PutObject after protocol parsing: what to store and what to verify."""

    bucket: str
    key: str
    content_type: str
    user_metadata: Mapping[str, str]
    headers: Mapping[str, str]
    content_length: int | None  # decoded length when known up front
    content_md5: str | None = None  # base64, from Content-MD5
    payload_sha256: str | None = None  # hex, from x-amz-content-sha256 when it is a digest
    checksums: Mapping[str, str] = field(default_factory=dict)  # algorithm -> base64 expected
    # Algorithm whose value arrives in the aws-chunked trailer (x-amz-trailer), if any.
    trailer_checksum: str | None = None


@dataclass(frozen=True, slots=True)
class ListEntry:
    """One row of a listing: a key with its figures, or a common prefix."""

    name: str
    is_prefix: bool = False
    size_bytes: int = 0
    etag: str = ""
    last_modified_s: float = 0.0
    storage_class: str = "STANDARD"


@dataclass(frozen=True, slots=True)
class ListPage:
    """A page of a merged listing, in S3 order (keys and prefixes interleaved by name)."""

    entries: tuple[ListEntry, ...]
    is_truncated: bool
    # The last name returned: the marker for the next page when truncated.
    last_name: str | None


@dataclass(frozen=True, slots=True)
class BucketInfo:
    name: str
    created_s: float


@dataclass(frozen=True, slots=True)
class PartAttributes:
    """One part of a multipart object as GetObjectAttributes lists it."""

    part_number: int
    size_bytes: int
    # The part's checksum in the object's checksum algorithm (base64), if it has one.
    checksum: str | None = None


@dataclass(frozen=True, slots=True)
class ObjectAttributes:
    """What GetObjectAttributes reports about an object version (every attribute; the
    protocol layer renders those asked for). ``etag`` is unquoted. For a multipart object,
    ``parts_count`` is its number of parts and ``parts`` one page of them: after
    ``part_number_marker``, at most ``max_parts``, ``is_truncated`` when more follow."""

    etag: str
    size_bytes: int
    last_modified_s: float
    checksums: Mapping[str, str] = field(default_factory=dict)  # algorithm -> base64
    storage_class: str = "STANDARD"
    parts_count: int | None = None
    parts: tuple[PartAttributes, ...] = ()
    part_number_marker: int = 0
    max_parts: int = 1000
    is_truncated: bool = False


def parent_prefix(key: str) -> str:
    """The key's directory: ``ckpt/step_1/rank_0`` -> ``ckpt/step_1/`` (``""`` for a
    top-level key). What a checkpoint's marker commits, and what the fleet announces."""
    head, sep, _ = key.rpartition("/")
    return head + sep


def meta_to_json(meta: ObjectMeta) -> dict[str, Any]:
    return {
        "bucket": meta.bucket,
        "key": meta.key,
        "size": meta.size_bytes,
        "etag": meta.etag,
        "last_modified_s": meta.last_modified_s,
        "content_type": meta.content_type,
        "user_metadata": dict(meta.user_metadata),
        "headers": dict(meta.headers),
        "checksums": dict(meta.checksums),
    }


def meta_from_json(doc: Mapping[str, Any]) -> ObjectMeta:
    """Raises KeyError, TypeError or ValueError when malformed."""
    return ObjectMeta(
        bucket=str(doc["bucket"]),
        key=str(doc["key"]),
        size_bytes=int(doc["size"]),
        etag=str(doc["etag"]),
        last_modified_s=float(doc["last_modified_s"]),
        content_type=str(doc["content_type"]),
        user_metadata={str(k): str(v) for k, v in dict(doc["user_metadata"]).items()},
        headers={str(k): str(v) for k, v in dict(doc["headers"]).items()},
        checksums={str(k): str(v) for k, v in dict(doc["checksums"]).items()},
    )
