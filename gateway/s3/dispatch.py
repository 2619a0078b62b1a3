"""The single catch-all route: authenticate, parse into an Operation, call its handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from gateway.clock import Clock
from gateway.core.attributes import ObjectAttributesService
from gateway.core.buckets import BucketService
from gateway.core.copy import CopyService
from gateway.core.deletes import DeleteService
from gateway.core.listing import ListingService
from gateway.core.multipart import MultipartService
from gateway.core.objects import ObjectService
from gateway.errors import AccessDenied, RequestHeaderSectionTooLarge, S3NotImplemented, SlowDown
from gateway.s3 import operations as ops
from gateway.s3.auth import AuthContext, verify_request
from gateway.s3.routing import parse_operation, split_host


@dataclass(slots=True)
class S3Services:
    """Everything the S3 handlers call; built by app.py."""

    objects: ObjectService
    buckets: BucketService
    listing: ListingService
    multipart: MultipartService
    copy: CopyService
    deletes: DeleteService
    attributes: ObjectAttributesService
    credentials: Mapping[str, str]
    region: str
    domain: str | None
    clock: Clock
    is_accepting_writes: bool = True
    # The fleet's own objects in every bucket (--control-prefix): never served to clients.
    hidden_prefix: str | None = None
    # Hostile-input limits: the whole header section (names and values, bytes), and XML
    # request documents (CompleteMultipartUpload, DeleteObjects, CreateBucket).
    max_header_bytes: int = 16 << 10
    max_xml_body_bytes: int = 4 << 20

    def check_writable(self) -> None:
        """New writes get 503 SlowDown (retried by every SDK) while shutting down."""
        if not self.is_accepting_writes:
            raise SlowDown("The gateway is shutting down; retry against another endpoint.")


SERVICES = web.AppKey("s3_services", S3Services)
# The request's parsed operation, for the middlewares (metrics) once routing has run.
OPERATION = web.RequestKey("s3_operation", ops.Operation)
Handler = Callable[[web.Request, Any, S3Services, AuthContext], Awaitable[web.StreamResponse]]
HANDLERS: dict[type[ops.Operation], Handler] = {}


def handles(op_type: type[ops.Operation]) -> Callable[[Handler], Handler]:
    """Register a handler for one operation type (used by the handlers modules)."""

    def register(fn: Handler) -> Handler:
        HANDLERS[op_type] = fn
        return fn

    return register


def check_header_section(raw_headers: Iterable[tuple[bytes, bytes]], max_bytes: int) -> None:
    """``RequestHeaderSectionTooLarge`` when the headers' names and values exceed ``max_bytes``
    (aiohttp's parser bounds each line and their number, not their sum)."""
    if sum(len(name) + len(value) for name, value in raw_headers) > max_bytes:
        raise RequestHeaderSectionTooLarge()


def check_transfer_coding(values: Iterable[str]) -> None:
    """501 NotImplemented (naming the header, as S3 does) for a transfer coding other than
    ``chunked``: the body would be stored still coded (aiohttp undoes only ``chunked``).
    aiohttp's parser already refuses a list that does not end in ``chunked``."""
    codings = [c.strip().lower() for value in values for c in value.split(",")]
    if any(c != "chunked" for c in codings):
        raise S3NotImplemented(
            "A header you provided implies functionality that is not implemented",
            Header="Transfer-Encoding",
        )


def refuse_hidden(op: ops.Operation, hidden_prefix: str) -> None:
    """AccessDenied for any object operation on a key under the fleet's control prefix
    (its claims, docs/fleet.md): clients never read, write or delete them."""
    for name in ("key", "source_key"):
        key = getattr(op, name, None)
        if isinstance(key, str) and key.startswith(hidden_prefix):
            raise AccessDenied("The key is reserved for the gateways of this fleet.")


async def dispatch(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICES]
    check_header_section(request.raw_headers, svc.max_header_bytes)
    check_transfer_coding(request.headers.getall("Transfer-Encoding", ()))
    raw_path, _, raw_query = request.raw_path.partition("?")
    auth = verify_request(
        request.method,
        raw_path,
        raw_query,
        request.headers,
        svc.credentials,
        svc.clock.wall(),
        region=svc.region,
        virtual_bucket=split_host(request.host, svc.domain),
    )
    query = dict(parse_qsl(raw_query, keep_blank_values=True))
    op = parse_operation(
        request.method, request.host, raw_path, query, request.headers, domain=svc.domain
    )
    request[OPERATION] = op
    if svc.hidden_prefix is not None:
        refuse_hidden(op, svc.hidden_prefix)
    handler = HANDLERS.get(type(op))
    if handler is None:
        name = op.name if isinstance(op, ops.Unsupported) else type(op).__name__
        raise S3NotImplemented(f"{name} is not implemented by this gateway.")
    return await handler(request, op, svc, auth)
