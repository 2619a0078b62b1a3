"""SigV4 verification against requests signed by botocore itself (header and presigned forms)."""

from __future__ import annotations

import asyncio
import base64
import calendar
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import botocore.session
import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest, AWSResponse
from botocore.config import Config
from botocore.credentials import Credentials
from multidict import CIMultiDict

from gateway.errors import (
    AccessDenied,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidRequest,
    RequestTimeTooSkewed,
    S3Error,
    SignatureDoesNotMatch,
)
from gateway.s3.auth import (
    STREAMING_PAYLOAD,
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    AuthContext,
    canonicalize_query,
    parse_query,
    verify_request,
)
from gateway.s3.chunked import AwsChunkedBody
from gateway.sigv4 import signing_key

ACCESS_KEY = "AKIDGATEWAYTEST00001"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
CREDENTIALS = {ACCESS_KEY: SECRET_KEY, "AKIDOTHER": "another secret"}
HOST = "gw.example:9000"
ENDPOINT = f"http://{HOST}"

# Keys that stress the canonical URI: spaces, unicode, '%', '+', '//', reserved characters.
TRICKY_KEYS = [
    "plain.txt",
    "with space/and more  spaces",
    "unicodé/日本語/ключ",
    "percent%25literal%/100%",
    "plus+sign/1+1=2",
    "double//slash/",
    "/leading-slash",
    "reserved!$&'()*,;:@=?#[]",
    "tilde~and-dot.._under_",
]


# --------------------------------------------------------------------------- helpers


def wire(request: AWSRequest | AWSPreparedRequest) -> dict[str, Any]:
    """What verify_request sees of a request botocore signed: the parts as sent on the wire."""
    parts = urlsplit(request.url)
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in request.headers.items():
        headers.add(name, value if isinstance(value, str) else value.decode())
    # The HTTP client adds Host unless the signer already set it (the CRT signer does).
    headers.setdefault("Host", parts.netloc)
    return {
        "method": request.method,
        "raw_path": parts.path,
        "raw_query": parts.query,
        "headers": headers,
    }


def verify(parts: dict[str, Any], *, now_s: float | None = None, **overrides: Any) -> AuthContext:
    args = {**parts, **overrides}
    return verify_request(
        args["method"],
        args["raw_path"],
        args["raw_query"],
        args["headers"],
        CREDENTIALS,
        time.time() if now_s is None else now_s,
    )


def header_signed(
    method: str,
    path: str,
    query: str = "",
    *,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    access_key: str = ACCESS_KEY,
    secret_key: str = SECRET_KEY,
    region: str = "us-east-1",
) -> AWSRequest:
    url = ENDPOINT + path + (f"?{query}" if query else "")
    request = AWSRequest(method=method, url=url, headers=dict(headers or {}), data=body)
    S3SigV4Auth(Credentials(access_key, secret_key), "s3", region).add_auth(request)
    return request


def presigned(
    method: str,
    path: str,
    query: str = "",
    *,
    expires_s: int = 300,
    headers: dict[str, str] | None = None,
    region: str = "us-east-1",
) -> AWSRequest:
    url = ENDPOINT + path + (f"?{query}" if query else "")
    request = AWSRequest(method=method, url=url, headers=dict(headers or {}))
    S3SigV4QueryAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", region, expires_s).add_auth(request)
    return request


def object_path(bucket: str, key: str) -> str:
    """The path botocore's S3 serializer puts on the wire for a key (path-style)."""
    return f"/{bucket}/{quote(key, safe='/~')}"


class _RawBody:
    def stream(self, **_: Any) -> Iterator[bytes]:
        yield b""


@pytest.fixture
def captured() -> Iterator[Callable[..., tuple[Any, list[AWSPreparedRequest]]]]:
    """Factory of real botocore S3 clients whose requests are captured instead of sent."""

    def make(endpoint: str = ENDPOINT, **config: Any) -> tuple[Any, list[AWSPreparedRequest]]:
        sent: list[AWSPreparedRequest] = []
        client = botocore.session.get_session().create_client(
            "s3",
            region_name="eu-west-3",
            endpoint_url=endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                signature_version="s3v4",
                **config,
            ),
        )

        def before_send(request: AWSPreparedRequest, **_: Any) -> AWSResponse:
            sent.append(request)
            return AWSResponse(request.url, 200, {}, _RawBody())

        client.meta.events.register("before-send.s3", before_send)
        return client, sent

    yield make


# --------------------------------------------------------------------------- header auth


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_verify_header_auth_accepts_botocore_signed_keys(key: str) -> None:
    request = header_signed("PUT", object_path("bucket", key), body=b"data")
    context = verify(wire(request))
    assert context.access_key == ACCESS_KEY
    assert context.content_sha256 == request.headers["X-Amz-Content-SHA256"]


@pytest.mark.parametrize(
    "query",
    [
        "list-type=2&prefix=a%2Fb&continuation-token=1%2Fab%2B%3D%3D&delimiter=%2F",
        "uploads",
        "uploads=",
        "partNumber=3&uploadId=2~abc.def_x-y",
        "prefix=%E6%97%A5%E6%9C%AC&max-keys=10&encoding-type=url",
        "b=2&a=1&a=0&A=3",
        "acl&versionId=",
    ],
)
def test_verify_header_auth_accepts_botocore_signed_queries(query: str) -> None:
    request = header_signed("GET", "/bucket", query)
    verify(wire(request))


def test_verify_header_auth_with_real_client(
    captured: Callable[..., tuple[Any, list[AWSPreparedRequest]]],
) -> None:
    client, sent = captured()
    client.list_objects_v2(
        Bucket="bucket", Prefix="a/b c+d", ContinuationToken="tok/+=", Delimiter="/"
    )
    client.create_multipart_upload(Bucket="bucket", Key="big file+1")
    client.put_object(Bucket="bucket", Key="dir//unicodé 100%", Body=b"hello", Metadata={"a": "b"})
    client.delete_objects(Bucket="bucket", Delete={"Objects": [{"Key": "x"}]})
    assert len(sent) == 4
    for request in sent:
        context = verify(wire(request))
        assert context.region == "eu-west-3"
        assert context.scope.endswith("/eu-west-3/s3/aws4_request")


class _FixedPayloadAuth(S3SigV4Auth):
    """botocore's S3 signer with a chosen x-amz-content-sha256 (as SDKs that stream do)."""

    def __init__(self, payload: str) -> None:
        super().__init__(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1")
        self._payload = payload

    def payload(self, request: AWSRequest) -> str:
        return self._payload


def test_verify_header_auth_returns_context_for_streaming() -> None:
    request = AWSRequest(
        method="PUT",
        url=ENDPOINT + "/bucket/key",
        headers={"Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": "5"},
    )
    _FixedPayloadAuth(STREAMING_PAYLOAD).add_auth(request)
    context = verify(wire(request))
    date = request.context["timestamp"]
    assert context.content_sha256 == STREAMING_PAYLOAD
    assert context.amz_date == date
    assert context.scope == f"{date[:8]}/us-east-1/s3/aws4_request"
    assert context.signing_key == signing_key(SECRET_KEY, date[:8], "us-east-1", "s3")
    assert context.seed_signature == request.headers["Authorization"].rsplit("=", 1)[1]


def test_verify_accepts_any_region() -> None:
    for region in ("us-east-1", "eu-central-1", "garage", "local"):
        context = verify(wire(header_signed("GET", "/bucket", region=region)))
        assert context.region == region


def test_verify_accepts_date_header_instead_of_x_amz_date() -> None:
    request = AWSRequest(method="GET", url=ENDPOINT + "/bucket/key", headers={"Date": "x"})
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
    assert "X-Amz-Date" not in request.headers
    context = verify(wire(request))
    assert context.amz_date == request.context["timestamp"]


def test_verify_accepts_plain_dict_headers() -> None:
    parts = wire(header_signed("GET", "/bucket/key"))
    parts["headers"] = {name.upper(): value for name, value in parts["headers"].items()}
    verify(parts)


def test_verify_joins_repeated_headers_and_collapses_whitespace() -> None:
    request = header_signed("PUT", "/bucket/key", headers={"X-Amz-Meta-Note": "  a   b  c "})
    verify(wire(request))
    parts = wire(request)
    headers = CIMultiDict(parts["headers"])
    headers["X-Amz-Meta-Note"] = "a b  c"
    verify({**parts, "headers": headers})


def test_verify_plus_in_query_means_space() -> None:
    request = header_signed("GET", "/bucket", "prefix=a%20b")
    parts = wire(request)
    verify(parts, raw_query="prefix=a+b")
    with pytest.raises(SignatureDoesNotMatch):
        verify(parts, raw_query="prefix=a%2Bb")


def test_verify_accepts_non_canonical_path_escaping() -> None:
    # Signed in canonical form, sent with '~' escaped and '=' raw: S3 re-encodes and accepts.
    request = header_signed("GET", "/bucket/~key%3D1")
    verify(wire(request), raw_path="/bucket/%7ekey=1")
    # But an encoded slash is not a slash.
    request = header_signed("GET", "/bucket/a/b")
    with pytest.raises(SignatureDoesNotMatch):
        verify(wire(request), raw_path="/bucket/a%2Fb")


def test_canonical_query_rules() -> None:
    params = parse_query("b=2&a=%7e&a=1&c&d=x+y&&e=%2B&f=%zz")
    assert canonicalize_query(params) == "a=1&a=~&b=2&c=&d=x%20y&e=%2B&f=%25zz"
    assert canonicalize_query(params, exclude=b"a") == "b=2&c=&d=x%20y&e=%2B&f=%25zz"


# --------------------------------------------------------------------------- presigned URLs


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_verify_presigned_get(key: str) -> None:
    request = presigned("GET", object_path("bucket", key))
    context = verify(wire(request))
    assert context.content_sha256 == UNSIGNED_PAYLOAD
    assert context.seed_signature == urlsplit(request.url).query.rsplit("=", 1)[1]


def test_verify_presigned_with_real_client(
    captured: Callable[..., tuple[Any, list[AWSPreparedRequest]]],
) -> None:
    client, _ = captured()
    get_url = client.generate_presigned_url(
        "get_object",
        Params={
            "Bucket": "bucket",
            "Key": "a b/ü+%",
            "ResponseContentDisposition": 'attachment; filename="x y.txt"',
        },
        ExpiresIn=600,
    )
    put_url = client.generate_presigned_url(
        "put_object",
        Params={"Bucket": "bucket", "Key": "up/load", "ContentType": "text/plain"},
        ExpiresIn=600,
    )
    parts = urlsplit(get_url)
    host_only = CIMultiDict({"Host": parts.netloc})
    verify(
        {"method": "GET", "raw_path": parts.path, "raw_query": parts.query, "headers": host_only}
    )
    parts = urlsplit(put_url)
    assert "content-type" in parts.query.lower()
    headers = CIMultiDict({"Host": parts.netloc, "Content-Type": "text/plain"})
    put = {"method": "PUT", "raw_path": parts.path, "raw_query": parts.query, "headers": headers}
    verify(put)
    with pytest.raises(SignatureDoesNotMatch):
        verify(put, headers=CIMultiDict({"Host": parts.netloc, "Content-Type": "text/html"}))
    with pytest.raises(SignatureDoesNotMatch):
        verify(put, method="GET")


def test_verify_presigned_with_operation_query() -> None:
    request = presigned("PUT", "/bucket/key", "partNumber=2&uploadId=abc%2Fdef")
    verify(wire(request))


def test_verify_presigned_uses_content_sha256_header_when_sent() -> None:
    request = presigned("PUT", "/bucket/key", headers={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    assert verify(wire(request)).content_sha256 == UNSIGNED_PAYLOAD


# --------------------------------------------------------------------------- failures


def _expect(error: type[S3Error], parts: dict[str, Any], **kwargs: Any) -> S3Error:
    with pytest.raises(error) as caught:
        verify(parts, **kwargs)
    return caught.value


def test_verify_rejects_wrong_secret() -> None:
    error = _expect(
        SignatureDoesNotMatch, wire(header_signed("GET", "/bucket", secret_key="wrong"))
    )
    assert error.fields["AWSAccessKeyId"] == ACCESS_KEY
    assert error.fields["CanonicalRequest"].startswith("GET\n/bucket\n")


def test_verify_rejects_unknown_key() -> None:
    error = _expect(InvalidAccessKeyId, wire(header_signed("GET", "/bucket", access_key="NOPE")))
    assert error.fields["AWSAccessKeyId"] == "NOPE"


@pytest.mark.parametrize("offset_s", [-901.0, 901.0, 86400.0])
def test_verify_rejects_skew(offset_s: float) -> None:
    parts = wire(header_signed("GET", "/bucket"))
    _expect(RequestTimeTooSkewed, parts, now_s=time.time() + offset_s)


def test_verify_tolerates_skew_within_limit() -> None:
    parts = wire(header_signed("GET", "/bucket"))
    verify(parts, now_s=time.time() + 600)


def test_verify_rejects_expired_presign() -> None:
    parts = wire(presigned("GET", "/bucket/key", expires_s=60))
    verify(parts, now_s=time.time() + 30)
    error = _expect(AccessDenied, parts, now_s=time.time() + 120)
    assert error.message == "Request has expired"


def test_verify_rejects_presign_not_yet_valid() -> None:
    parts = wire(presigned("GET", "/bucket/key"))
    error = _expect(AccessDenied, parts, now_s=time.time() - 3600)
    assert error.message == "Request is not valid yet"


def test_verify_rejects_presign_longer_than_a_week() -> None:
    verify(wire(presigned("GET", "/bucket/key", expires_s=604800)))
    _expect(AuthorizationQueryParametersError, wire(presigned("GET", "/k", expires_s=604801)))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("X-Amz-Algorithm=AWS4-HMAC-SHA256", "X-Amz-Algorithm=AWS4-ECDSA-P256-SHA256"),
        ("X-Amz-Expires=300", "X-Amz-Expires=-5"),
        ("X-Amz-Expires=300", "X-Amz-Expires=5m"),
        ("X-Amz-Expires=300&", ""),
        ("X-Amz-Date=", "X-Amz-Date=2026"),
        ("%2Fs3%2Faws4_request", "%2Fec2%2Faws4_request"),
        ("%2Fs3%2Faws4_request", "%2Fs3%2Faws5_request"),
        ("X-Amz-SignedHeaders=host", "X-Amz-SignedHeaders=x-amz-date"),
    ],
)
def test_verify_rejects_bad_presign_parameters(old: str, new: str) -> None:
    parts = wire(presigned("GET", "/bucket/key"))
    assert old in parts["raw_query"]
    _expect(
        AuthorizationQueryParametersError, parts, raw_query=parts["raw_query"].replace(old, new)
    )


def test_verify_rejects_tampered_header() -> None:
    request = header_signed("PUT", "/bucket/key", headers={"X-Amz-Meta-Owner": "alice"})
    parts = wire(request)
    parts["headers"]["X-Amz-Meta-Owner"] = "mallory"
    _expect(SignatureDoesNotMatch, parts)


def test_verify_rejects_tampered_query() -> None:
    parts = wire(header_signed("GET", "/bucket", "list-type=2&prefix=a%2Fb"))
    _expect(SignatureDoesNotMatch, parts, raw_query="list-type=2&prefix=a%2Fc")
    _expect(SignatureDoesNotMatch, parts, raw_query="list-type=2&prefix=a%2Fb&delimiter=%2F")
    _expect(SignatureDoesNotMatch, parts, raw_path="/other")
    _expect(SignatureDoesNotMatch, parts, method="DELETE")


def test_verify_rejects_tampered_presign() -> None:
    parts = wire(presigned("GET", "/bucket/key", "versionId=1"))
    _expect(
        SignatureDoesNotMatch,
        parts,
        raw_query=parts["raw_query"].replace("versionId=1", "versionId=2"),
    )
    _expect(SignatureDoesNotMatch, parts, raw_path="/bucket/other")
    signature = parts["raw_query"].rsplit("=", 1)[1]
    forged = ("0" if signature[0] != "0" else "1") + signature[1:]
    _expect(SignatureDoesNotMatch, parts, raw_query=parts["raw_query"].replace(signature, forged))
    _expect(SignatureDoesNotMatch, parts, raw_query=parts["raw_query"].replace(signature, "zz"))


def test_verify_rejects_missing_content_sha256() -> None:
    parts = wire(header_signed("GET", "/bucket"))
    del parts["headers"]["X-Amz-Content-SHA256"]
    error = _expect(InvalidRequest, parts)
    assert error.message == "Missing required header for this request: x-amz-content-sha256"


def test_verify_rejects_invalid_content_sha256() -> None:
    parts = wire(header_signed("GET", "/bucket"))
    parts["headers"]["X-Amz-Content-SHA256"] = "NOT-A-HASH"
    _expect(InvalidArgument, parts)


def test_verify_rejects_anonymous() -> None:
    headers = CIMultiDict({"Host": HOST})
    parts = {"method": "GET", "raw_path": "/bucket/key", "raw_query": "", "headers": headers}
    _expect(AccessDenied, parts)


def test_verify_rejects_missing_date() -> None:
    parts = wire(header_signed("GET", "/bucket"))
    del parts["headers"]["X-Amz-Date"]
    _expect(AccessDenied, parts)
    parts["headers"]["X-Amz-Date"] = "yesterday"
    _expect(AccessDenied, parts)


def test_verify_rejects_two_auth_mechanisms() -> None:
    parts = wire(header_signed("GET", "/bucket"))
    presign = wire(presigned("GET", "/bucket"))
    _expect(InvalidArgument, parts, raw_query=presign["raw_query"])


def _authorization(parts: dict[str, Any]) -> str:
    value: str = parts["headers"]["Authorization"]
    return value


@pytest.mark.parametrize(
    "mangle",
    [
        lambda a: "garbage",
        # ("AWS AKID:signature" is SigV2, verified by gateway.s3.auth_v2: test_auth_v2.py)
        lambda a: a.replace("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA512"),
        lambda a: a.split(",")[0],
        lambda a: a.replace("/s3/", "/sqs/"),
        lambda a: a.replace("aws4_request", "aws4_reqest"),
        lambda a: a.replace("/aws4_request", ""),
        lambda a: a.replace("SignedHeaders=host;", "SignedHeaders="),
        lambda a: a.replace("SignedHeaders=host;", "SignedHeaders=;"),
        lambda a: a.replace("/us-east-1/", "//"),
    ],
)
def test_verify_rejects_malformed_authorization(mangle: Callable[[str], str]) -> None:
    parts = wire(header_signed("GET", "/bucket"))
    parts["headers"]["Authorization"] = mangle(_authorization(parts))
    _expect(AuthorizationHeaderMalformed, parts)


def test_verify_rejects_credential_date_not_request_date() -> None:
    parts = wire(header_signed("GET", "/bucket"))
    authorization = _authorization(parts)
    date = parts["headers"]["X-Amz-Date"][:8]
    parts["headers"]["Authorization"] = authorization.replace(f"/{date}/", "/20000101/")
    _expect(AuthorizationHeaderMalformed, parts)


# --------------------------------------------------------------------------- known answers


def test_verify_aws_documentation_seed_signature() -> None:
    """The chunked-upload example of the S3 docs (sigv4-streaming): its seed signature."""
    headers = CIMultiDict(
        {
            "Host": "s3.amazonaws.com",
            "x-amz-date": "20130524T000000Z",
            "x-amz-storage-class": "REDUCED_REDUNDANCY",
            "Authorization": "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/"
            "us-east-1/s3/aws4_request,SignedHeaders=content-encoding;content-length;host;"
            "x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;x-amz-storage-class,"
            "Signature=4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
            "x-amz-content-sha256": STREAMING_PAYLOAD,
            "Content-Encoding": "aws-chunked",
            "x-amz-decoded-content-length": "66560",
            "Content-Length": "66824",
        }
    )
    context = verify_request(
        "PUT",
        "/examplebucket/chunkObject.txt",
        "",
        headers,
        {"AKIAIOSFODNN7EXAMPLE": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
        calendar.timegm((2013, 5, 24, 0, 5, 0)),
    )
    assert context.seed_signature.startswith("4f232c43")
    assert context.scope == "20130524/us-east-1/s3/aws4_request"


# --------------------------------------------------------------------------- real aws-chunked


async def test_botocore_aws_chunked_upload_round_trip(
    captured: Callable[..., tuple[Any, list[AWSPreparedRequest]]],
) -> None:
    """botocore over https sends STREAMING-UNSIGNED-PAYLOAD-TRAILER with a CRC32 trailer."""
    client, sent = captured(endpoint="https://gw.example")
    payload = bytes(range(256)) * (10 * 1024) + b"tail"  # 2.5 MiB: three chunks
    client.put_object(Bucket="bucket", Key="big object+1", Body=payload)
    (request,) = sent
    parts = wire(request)
    context = verify(parts)
    assert context.content_sha256 == STREAMING_UNSIGNED_TRAILER
    headers = parts["headers"]
    assert headers["Content-Encoding"] == "aws-chunked"
    assert headers["X-Amz-Trailer"] == "x-amz-checksum-crc32"
    encoded = request.body.read()
    assert encoded.endswith(b"\r\n0\r\nx-amz-checksum-crc32:" + _crc32_b64(payload) + b"\r\n\r\n")

    reader = asyncio.StreamReader()
    reader.feed_data(encoded)
    reader.feed_eof()
    body = AwsChunkedBody(
        reader, decoded_length=int(headers["X-Amz-Decoded-Content-Length"]), auth=context
    )
    pieces = [piece async for piece in body.chunks()]
    assert b"".join(pieces) == payload
    assert dict(body.trailers) == {"x-amz-checksum-crc32": _crc32_b64(payload).decode()}


def _crc32_b64(data: bytes) -> bytes:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big"))
