"""Request size limits are configurable and each answers S3's error (tests/faults/conftest.py's
sandbox runs with --max-xml-body 64KiB --max-header-size 8KiB; here the limits are raised)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import signed
from harness import content_md5, parse_s3_error
from test_hostile_http import raw_exchange

RAISED = [
    "--max-header-size",
    "32KiB",
    "--max-line-size",
    "32KiB",
    "--max-headers",
    "300",
    "--max-xml-body",
    "8MiB",
    "--max-object",
    "4KiB",
]


@pytest.fixture
def raised(gateway_factory: Any, upstream: Any) -> Any:
    upstream.create_bucket(Bucket="limits-bucket")
    return gateway_factory(extra_args=RAISED)


def test_raised_limits_let_bigger_requests_through(raised: Any) -> None:
    gw = raised
    padded = {f"x-pad-{i}": "p" * 900 for i in range(20)}  # 18 KB: over 16KiB, under 32KiB
    assert signed(gw, "PUT", "/limits-bucket/hdr", b"x", headers=padded).status == 200
    many = {f"x-h-{i}": "1" for i in range(250)}
    assert signed(gw, "PUT", "/limits-bucket/many", b"x", headers=many).status == 200
    # A 20 KB request line passes the parser and reaches S3's own key-length rule.
    status, body = raw_exchange(
        gw, b"GET /limits-bucket/" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert (status, parse_s3_error(body)["Code"]) == (403, "AccessDenied"), body  # anonymous


def test_raised_xml_limit_parses_big_documents(raised: Any) -> None:
    gw = raised
    upload = signed(gw, "POST", "/limits-bucket/big?uploads").body
    upload_id = upload.split(b"<UploadId>")[1].split(b"</UploadId>")[0].decode()
    one = b'<Part><PartNumber>1</PartNumber><ETag>"0"</ETag></Part>'
    doc = b"<CompleteMultipartUpload>" + one * 2000 + b"</CompleteMultipartUpload>"  # 110 KB
    resp = signed(
        gw,
        "POST",
        f"/limits-bucket/big?uploadId={upload_id}",
        doc,
        headers={"Content-MD5": content_md5(doc)},
    )
    # Parsed (not MalformedXML as under the 64KiB sandbox): the parts simply do not exist.
    assert resp.status == 400 and parse_s3_error(resp.body)["Code"] == "InvalidPart"


def test_max_object_answers_entity_too_large(raised: Any) -> None:
    gw = raised
    resp = signed(gw, "PUT", "/limits-bucket/large", b"l" * 5000)
    assert resp.status == 400 and parse_s3_error(resp.body)["Code"] == "EntityTooLarge"
    assert signed(gw, "HEAD", "/limits-bucket/large").status == 404
    assert signed(gw, "PUT", "/limits-bucket/small", b"s" * 4096).status == 200


@pytest.mark.parametrize("declared", [5000, 10**15], ids=["past --max-object", "past any disk"])
def test_a_declared_length_past_the_limit_is_entity_too_large_up_front(
    raised: Any, declared: int
) -> None:
    """A length declared past the limit (here an aws-chunked body's decoded length) is
    refused before anything is reserved or read: it was 503 SlowDown when it did not fit
    the cache, which a client retries for ever (found by loadtest/fuzz.py)."""
    gw = raised
    streaming = {
        "x-amz-decoded-content-length": str(declared),
        "Content-Encoding": "aws-chunked",
    }
    chunk = b"0;chunk-signature=" + b"0" * 64 + b"\r\n\r\n"
    sha = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    resp = signed(
        gw, "PUT", "/limits-bucket/declared", chunk, headers=streaming, content_sha256=sha
    )
    assert (resp.status, parse_s3_error(resp.body)["Code"]) == (400, "EntityTooLarge"), resp.body
    assert signed(gw, "HEAD", "/limits-bucket/declared").status == 404
    upload = signed(gw, "POST", "/limits-bucket/parted?uploads").body
    upload_id = upload.split(b"<UploadId>")[1].split(b"</UploadId>")[0].decode()
    part = f"/limits-bucket/parted?partNumber=1&uploadId={upload_id}"
    resp = signed(gw, "PUT", part, chunk, headers=streaming, content_sha256=sha)
    assert (resp.status, parse_s3_error(resp.body)["Code"]) == (400, "EntityTooLarge"), resp.body
    assert signed(gw, "PUT", "/limits-bucket/small", b"s" * 4096).status == 200
