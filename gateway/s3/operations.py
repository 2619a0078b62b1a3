"""Typed S3 operations: what a request asks for, named as in the AWS API."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Operation:
    """Base of every parsed request."""


@dataclass(frozen=True, slots=True)
class ListBuckets(Operation):
    pass


@dataclass(frozen=True, slots=True)
class BucketOperation(Operation):
    bucket: str


@dataclass(frozen=True, slots=True)
class ObjectOperation(Operation):
    bucket: str
    key: str


@dataclass(frozen=True, slots=True)
class CreateBucket(BucketOperation):
    pass


@dataclass(frozen=True, slots=True)
class DeleteBucket(BucketOperation):
    pass


@dataclass(frozen=True, slots=True)
class HeadBucket(BucketOperation):
    pass


@dataclass(frozen=True, slots=True)
class GetBucketLocation(BucketOperation):
    pass


@dataclass(frozen=True, slots=True)
class ListObjects(BucketOperation):
    pass


@dataclass(frozen=True, slots=True)
class ListObjectsV2(BucketOperation):
    pass


@dataclass(frozen=True, slots=True)
class PutObject(ObjectOperation):
    pass


@dataclass(frozen=True, slots=True)
class GetObject(ObjectOperation):
    pass


@dataclass(frozen=True, slots=True)
class HeadObject(ObjectOperation):
    pass


@dataclass(frozen=True, slots=True)
class DeleteObject(ObjectOperation):
    pass


@dataclass(frozen=True, slots=True)
class Unsupported(Operation):
    """A valid S3 request for an operation the gateway does not implement (501)."""

    name: str


@dataclass(frozen=True, slots=True)
class CreateMultipartUpload(ObjectOperation):
    pass


@dataclass(frozen=True, slots=True)
class UploadPart(ObjectOperation):
    upload_id: str
    part_number: str  # validated by the service (S3 answers InvalidArgument)


@dataclass(frozen=True, slots=True)
class CompleteMultipartUpload(ObjectOperation):
    upload_id: str


@dataclass(frozen=True, slots=True)
class AbortMultipartUpload(ObjectOperation):
    upload_id: str


@dataclass(frozen=True, slots=True)
class ListParts(ObjectOperation):
    upload_id: str


@dataclass(frozen=True, slots=True)
class ListMultipartUploads(BucketOperation):
    pass


@dataclass(frozen=True, slots=True)
class CopyObject(ObjectOperation):
    copy_source: str  # the raw x-amz-copy-source header (parsed by the handler)


@dataclass(frozen=True, slots=True)
class UploadPartCopy(ObjectOperation):
    upload_id: str
    part_number: str
    copy_source: str


@dataclass(frozen=True, slots=True)
class DeleteObjects(BucketOperation):
    pass


@dataclass(frozen=True, slots=True)
class GetObjectAttributes(ObjectOperation):
    pass
