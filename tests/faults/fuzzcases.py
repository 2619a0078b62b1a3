"""Hypothesis strategies and checks over the gateway's HTTP surface, shared by
tests/faults/test_fuzz_http.py (CI size) and loadtest/fuzz_http.py (long runs).

Every check sends one hostile-ish request to a running gateway and asserts the contract:
the answer is a success that stored exactly what a client wrote in full, or an S3 XML error
with a 4xx status from an expected set; never a 5xx, never a traceback. The caller then
checks that the server still serves and that nothing leaked out of the data dir.
"""

from __future__ import annotations

import urllib.parse
import zlib
from typing import Any

from conftest import signed
from harness import (
    HttpResponse,
    aws_chunked_unsigned,
    content_md5,
    crc32_b64,
    parse_s3_error,
    send_signed,
    sign_request,
)
from hypothesis import strategies as st
from s3raw import raw_exchange, signed_head

BUCKET = "fuzz-bucket"
OBJECT = bytes(range(256)) * 4  # the 1 KiB object range requests read

key_bytes = st.binary(min_size=1, max_size=1100)
range_values = st.one_of(
    st.text(alphabet="bytes=0123456789-, ", max_size=30),
    st.builds(
        lambda a, b: f"bytes={a}-{b}",
        st.one_of(st.none(), st.integers(-5, 3000)).map(lambda v: "" if v is None else str(v)),
        st.one_of(st.none(), st.integers(-5, 3000)).map(lambda v: "" if v is None else str(v)),
    ),
    # Any latin-1 text (what an HTTP header can carry): non-ASCII bytes reach aiohttp as
    # surrogate escapes, which the signature then does not match.
    st.text(alphabet=st.characters(max_codepoint=255, exclude_categories=("Cc",)), max_size=40),
)
payloads = st.binary(min_size=0, max_size=300)
mutations = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "delete", "truncate"]),
        st.integers(0, 10**6),
        st.integers(0, 255),
    ),
    min_size=1,
    max_size=4,
)
xml_fragments = st.lists(
    st.sampled_from(
        [
            "<Delete>",
            "</Delete>",
            "<Object>",
            "</Object>",
            "<Key>",
            "</Key>",
            "k",
            "&amp;",
            "&lol;",
            "<Quiet>true</Quiet>",
            "<CompleteMultipartUpload>",
            "</CompleteMultipartUpload>",
            "<Part>",
            "</Part>",
            "<PartNumber>",
            "</PartNumber>",
            "1",
            "-1",
            "99999",
            "<ETag>",
            "</ETag>",
            '"x"',
            '<!DOCTYPE d [<!ENTITY lol "lol">]>',
            '<?xml version="1.0"?>',
            "\x00",
            "\udcff",
            "<![CDATA[",
            "]]>",
            "<!--",
            "-->",
            "<",
            ">",
            "/",
        ]
    ),
    max_size=40,
).map("".join)

# Transfer-Encoding values: lists of codings, ``chunked`` the only one the gateway decodes.
transfer_codings = st.lists(
    st.sampled_from(
        ["chunked", "CHUNKED", "gzip", "deflate", "identity", "br", "compress", "x-own", ""]
    ),
    min_size=1,
    max_size=3,
).map(", ".join)
# Regions a credential scope may name: only the gateway's own (REGION) is accepted.
regions = st.one_of(
    st.sampled_from(["us-east-1", "eu-west-1", "US-EAST-1", "us-east-1 ", "us_east_1", "s3"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20),
)

KEY_ERRORS = {"KeyTooLongError", "InvalidURI"}
RANGE_ERRORS = {"InvalidRange"}
BODY_ERRORS = {
    "IncompleteBody",
    "InvalidRequest",
    "MalformedTrailerError",
    "BadDigest",
    "InvalidArgument",
    "XAmzContentSHA256Mismatch",
    "BadRequest",
    "InvalidDigest",
}
XML_ERRORS = {
    "MalformedXML",
    "InvalidPart",
    "InvalidPartOrder",
    "NoSuchUpload",
    "InvalidArgument",
    "EntityTooSmall",
    "InvalidRequest",
    "BadRequest",
}


def expect_error(resp: HttpResponse, allowed: set[str]) -> str:
    assert 400 <= resp.status < 500 or resp.status == 416, (resp.status, resp.body[:300])
    code = parse_s3_error(resp.body)["Code"]
    assert code in allowed, (code, resp.body[:300])
    return code


def check_key(gw: Any, raw_key: bytes) -> None:
    """PUT under any byte string as the key: stored and read back under it, or refused."""
    path = f"/{BUCKET}/" + urllib.parse.quote(raw_key, safe="")
    body = raw_key[:64] or b"-"
    resp = signed(gw, "PUT", path, body)
    if resp.status == 200:
        assert len(raw_key) <= 1024
        got = signed(gw, "GET", path)
        assert got.status == 200 and got.body == body
        assert signed(gw, "DELETE", path).status == 204
        assert signed(gw, "HEAD", path).status == 404
    else:
        code = expect_error(resp, KEY_ERRORS)
        try:
            raw_key.decode("utf-8")
            assert code == "KeyTooLongError" and len(raw_key) > 1024
        except UnicodeDecodeError:
            assert code == "InvalidURI"


def check_range(gw: Any, value: str) -> None:
    """GET with any Range value: 200 whole, 206 the exact slice it names, or 416."""
    resp = signed(gw, "GET", f"/{BUCKET}/ranged", headers={"Range": value})
    if not value.isascii():
        expect_error(resp, {"SignatureDoesNotMatch", *RANGE_ERRORS})
        return
    if resp.status == 200:
        assert resp.body == OBJECT
    elif resp.status == 206:
        unit, _, spec = resp.header("content-range").partition(" ")
        first, _, last = spec.partition("/")[0].partition("-")
        assert unit == "bytes"
        assert resp.body == OBJECT[int(first) : int(last) + 1]
    else:
        expect_error(resp, RANGE_ERRORS)


def check_chunked(gw: Any, data: bytes, edits: list[tuple[str, int, int]], key: str) -> None:
    """A mutated aws-chunked body with a CRC32 trailer: stored only if it decodes to exactly
    ``data`` (the trailer protects the payload), else refused and invisible."""
    body = bytearray(aws_chunked_unsigned(data, 64, {"x-amz-checksum-crc32": crc32_b64(data)}))
    for kind, at, value in edits:
        pos = at % (len(body) + 1)
        if kind == "flip" and pos < len(body):
            body[pos] ^= value or 1
        elif kind == "insert":
            body[pos:pos] = bytes([value])
        elif kind == "delete":
            del body[pos : pos + 1]
        elif kind == "truncate":
            del body[pos:]
    headers = {
        "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(data)),
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    req = sign_request(
        "PUT",
        f"{gw.endpoint}/{BUCKET}/{key}",
        headers=headers,
        content_sha256="STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    )
    resp = send_signed(req, body=bytes(body))
    got = signed(gw, "GET", f"/{BUCKET}/{key}")
    if resp.status == 200:
        assert got.status == 200 and got.body == data
        assert zlib.crc32(got.body) == zlib.crc32(data)
    else:
        expect_error(resp, BODY_ERRORS)
        assert got.status == 404, "a refused write is visible"


def check_xml(gw: Any, doc: str, upload_id: str) -> None:
    """Any XML-ish document to DeleteObjects and CompleteMultipartUpload: a 4xx S3 error, or
    (DeleteObjects only, for well-formed documents) a 200 result."""
    raw = doc.encode("utf-8", "surrogateescape")
    headers = {"Content-MD5": content_md5(raw)}
    deleted = signed(gw, "POST", f"/{BUCKET}?delete", raw, headers=headers)
    if deleted.status != 200:
        expect_error(deleted, XML_ERRORS)
    done = signed(gw, "POST", f"/{BUCKET}/fuzz-mpu?uploadId={upload_id}", raw, headers=headers)
    expect_error(done, XML_ERRORS)


def check_transfer_coding(gw: Any, value: str, key: str) -> None:
    """A PUT whose body is framed chunked under ``Transfer-Encoding: value``: stored only when
    every coding is ``chunked`` (one of them, as HTTP allows), else refused with S3's error
    (501 NotImplemented for a coding the gateway does not decode, 400 for a malformed list)
    and invisible; never any other 5xx."""
    data = b"abc"
    head = signed_head(gw, "PUT", f"/{BUCKET}/{key}", data)
    request = head + f"Transfer-Encoding: {value}\r\n\r\n".encode() + b"3\r\nabc\r\n0\r\n\r\n"
    status, _, body = raw_exchange(gw.port, request)
    got = signed(gw, "GET", f"/{BUCKET}/{key}")
    if status == 200:
        assert [c.strip().lower() for c in value.split(",")] == ["chunked"], value
        assert got.status == 200 and got.body == data
        return
    assert status in (400, 501), (status, body[:300])
    code = parse_s3_error(body)["Code"]
    assert code == ("NotImplemented" if status == 501 else "BadRequest"), (value, code)
    assert got.status == 404, "a refused write is visible"


def check_region(gw: Any, region: str, key: str) -> None:
    """A PUT signed for ``region``: stored only for the gateway's own region, else S3's
    AuthorizationHeaderMalformed naming the expected one, and nothing stored."""
    req = sign_request("PUT", f"{gw.endpoint}/{BUCKET}/{key}", body=b"r", region=region)
    resp = send_signed(req)
    got = signed(gw, "GET", f"/{BUCKET}/{key}")
    if region == gw.region:
        assert resp.status == 200 and got.body == b"r"
        return
    assert resp.status == 400, (region, resp.status, resp.body[:300])
    err = parse_s3_error(resp.body)
    # A scope that does not even parse (a '/' in the region) is malformed either way.
    assert err["Code"] == "AuthorizationHeaderMalformed", err
    assert got.status == 404, "a refused write is visible"
