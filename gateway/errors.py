"""S3 errors: one exception class per S3 error code.

Raise them anywhere below the protocol layer; ``gateway.s3.middleware`` is the only place
that renders them (as S3 XML with the class's ``status``). Nothing here imports aiohttp.
"""

from __future__ import annotations

from typing import ClassVar


class S3Error(Exception):
    """Base of every error a client may see. ``code`` and ``status`` are S3's."""

    code: ClassVar[str] = "InternalError"
    status: ClassVar[int] = 500
    default_message: ClassVar[str] = "We encountered an internal error. Please try again."

    def __init__(self, message: str | None = None, **fields: str) -> None:
        self.message = message or self.default_message
        # Extra elements of the error document (Key, BucketName, ...), as S3 returns them.
        self.fields = fields
        super().__init__(self.message)


def _error(code: str, status: int, message: str) -> type[S3Error]:
    return type(code, (S3Error,), {"code": code, "status": status, "default_message": message})


class InternalError(S3Error):
    pass


class NoSuchKey(S3Error):
    code = "NoSuchKey"
    status = 404
    default_message = "The specified key does not exist."


class NoSuchBucket(S3Error):
    code = "NoSuchBucket"
    status = 404
    default_message = "The specified bucket does not exist."


class NoSuchUpload(S3Error):
    code = "NoSuchUpload"
    status = 404
    default_message = "The specified multipart upload does not exist."


class BucketNotEmpty(S3Error):
    code = "BucketNotEmpty"
    status = 409
    default_message = "The bucket you tried to delete is not empty."


class BucketAlreadyOwnedByYou(S3Error):
    code = "BucketAlreadyOwnedByYou"
    status = 409
    default_message = (
        "Your previous request to create the named bucket succeeded and you already own it."
    )


class InvalidArgument(S3Error):
    code = "InvalidArgument"
    status = 400
    default_message = "Invalid Argument"


class InvalidRequest(S3Error):
    code = "InvalidRequest"
    status = 400
    default_message = "Invalid Request"


class InvalidBucketName(S3Error):
    code = "InvalidBucketName"
    status = 400
    default_message = "The specified bucket is not valid."


class KeyTooLongError(S3Error):
    code = "KeyTooLongError"
    status = 400
    default_message = "Your key is too long."


class InvalidDigest(S3Error):
    code = "InvalidDigest"
    status = 400
    default_message = "The Content-MD5 you specified is not valid."


class BadDigest(S3Error):
    code = "BadDigest"
    status = 400
    default_message = "The Content-MD5 you specified did not match what we received."


class XAmzContentSHA256Mismatch(S3Error):
    code = "XAmzContentSHA256Mismatch"
    status = 400
    default_message = "The provided 'x-amz-content-sha256' header does not match what was computed."


class IncompleteBody(S3Error):
    code = "IncompleteBody"
    status = 400
    default_message = (
        "You did not provide the number of bytes specified by the Content-Length HTTP header."
    )


class MissingContentLength(S3Error):
    code = "MissingContentLength"
    status = 411
    default_message = "You must provide the Content-Length HTTP header."


class EntityTooLarge(S3Error):
    code = "EntityTooLarge"
    status = 400
    default_message = "Your proposed upload exceeds the maximum allowed object size."


class MalformedXML(S3Error):
    code = "MalformedXML"
    status = 400
    default_message = (
        "The XML you provided was not well-formed or did not validate against our published schema."
    )


class InvalidRange(S3Error):
    code = "InvalidRange"
    status = 416
    default_message = "The requested range is not satisfiable"


class PreconditionFailed(S3Error):
    code = "PreconditionFailed"
    status = 412
    default_message = "At least one of the pre-conditions you specified did not hold"


class ConditionalRequestConflict(S3Error):
    code = "ConditionalRequestConflict"
    status = 409
    default_message = (
        "A conflicting conditional action is currently in progress against this resource. "
        "Try again."
    )


class AccessDenied(S3Error):
    code = "AccessDenied"
    status = 403
    default_message = "Access Denied"


class SignatureDoesNotMatch(S3Error):
    code = "SignatureDoesNotMatch"
    status = 403
    default_message = (
        "The request signature we calculated does not match the signature you provided. "
        "Check your key and signing method."
    )


class InvalidAccessKeyId(S3Error):
    code = "InvalidAccessKeyId"
    status = 403
    default_message = "The AWS Access Key Id you provided does not exist in our records."


class AuthorizationHeaderMalformed(S3Error):
    code = "AuthorizationHeaderMalformed"
    status = 400
    default_message = "The authorization header you provided is invalid."


class RequestTimeTooSkewed(S3Error):
    code = "RequestTimeTooSkewed"
    status = 403
    default_message = "The difference between the request time and the server's time is too large."


class MissingSecurityHeader(S3Error):
    code = "MissingSecurityHeader"
    status = 400
    default_message = "Your request was missing a required header."


class MethodNotAllowed(S3Error):
    code = "MethodNotAllowed"
    status = 405
    default_message = "The specified method is not allowed against this resource."


class S3NotImplemented(S3Error):
    """501 NotImplemented: a feature S3 has and this gateway does not (DESIGN.md: "anything
    else answers 501 NotImplemented"). Named apart from Python's builtin NotImplementedError."""

    code = "NotImplemented"
    status = 501
    default_message = (
        "A header or query you provided implies functionality that is not implemented."
    )


class SlowDown(S3Error):
    code = "SlowDown"
    status = 503
    default_message = "Please reduce your request rate."


class ServiceUnavailable(S3Error):
    code = "ServiceUnavailable"
    status = 503
    default_message = "Service is unable to handle request."


class InvalidTag(S3Error):
    code = "InvalidTag"
    status = 400
    default_message = "The tag provided was not a valid tag."


class InvalidStorageClass(S3Error):
    code = "InvalidStorageClass"
    status = 400
    default_message = "The storage class you specified is not valid."


class AuthorizationQueryParametersError(S3Error):
    """A presigned URL whose X-Amz-* authentication parameters are missing or invalid."""

    code = "AuthorizationQueryParametersError"
    status = 400
    default_message = (
        "Query-string authentication version 4 requires the X-Amz-Algorithm, X-Amz-Credential, "
        "X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters."
    )


class MalformedTrailerError(S3Error):
    """The trailer section of an aws-chunked body is not well-formed."""

    code = "MalformedTrailerError"
    status = 400
    default_message = (
        "The request contained trailing data that was not well-formed or did not conform "
        "to our published schema."
    )


def upstream_error(code: str, status: int, message: str) -> S3Error:
    """An error the upstream returned on a read-through or pass-through call, kept verbatim.

    Read-through GET/HEAD/LIST and the bucket calls pass the upstream's S3 code through.
    """
    known = {cls.code: cls for cls in _all_subclasses(S3Error)}
    cls = known.get(code)
    if cls is not None and cls.status == status:
        return cls(message or None)
    return _error(code or "InternalError", status, message or code)(message or None)


def _all_subclasses(cls: type[S3Error]) -> list[type[S3Error]]:
    out: list[type[S3Error]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


class InvalidPart(S3Error):
    code = "InvalidPart"
    status = 400
    default_message = (
        "One or more of the specified parts could not be found. The part may not have been "
        "uploaded, or the specified entity tag may not match the part's entity tag."
    )


class InvalidPartOrder(S3Error):
    code = "InvalidPartOrder"
    status = 400
    default_message = (
        "The list of parts was not in ascending order. Parts must be ordered by part number."
    )


class EntityTooSmall(S3Error):
    code = "EntityTooSmall"
    status = 400
    default_message = "Your proposed upload is smaller than the minimum allowed object size."


class NotModified(S3Error):
    """304: rendered without a body (as S3 does)."""

    code = "NotModified"
    status = 304
    default_message = "Not Modified"


class InvalidPartNumber(S3Error):
    """GET/HEAD ``?partNumber=N`` for a part the object does not have."""

    code = "InvalidPartNumber"
    status = 416
    default_message = "The requested partnumber is not satisfiable"


# --- Hostile-input limits (request size, URI and metadata checks) ---------------------------


class InvalidURI(S3Error):
    code = "InvalidURI"
    status = 400
    default_message = "Couldn't parse the specified URI."


class MetadataTooLarge(S3Error):
    code = "MetadataTooLarge"
    status = 400
    default_message = "Your metadata headers exceed the maximum allowed metadata size."


class RequestHeaderSectionTooLarge(S3Error):
    code = "RequestHeaderSectionTooLarge"
    status = 400
    default_message = "Your request header section exceeds the maximum allowed size."


class BadRequest(S3Error):
    """An HTTP message that cannot be parsed at all (S3 answers such requests with a bare 400)."""

    code = "BadRequest"
    status = 400
    default_message = "An error occurred when parsing the HTTP request."
