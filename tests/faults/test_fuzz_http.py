"""Property-based fuzzing of the HTTP surface against the sandbox gateway (a real process):
keys of arbitrary bytes, Range values, mutated aws-chunked bodies and XML documents. Sizes
are CI-sized (``GATEWAY_FUZZ_EXAMPLES``, default 40 per property); loadtest/fuzz_http.py runs
the same checks with many more examples."""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest
from conftest import Sandbox, signed
from fuzzcases import (
    BUCKET,
    OBJECT,
    check_chunked,
    check_key,
    check_range,
    check_region,
    check_transfer_coding,
    check_xml,
    key_bytes,
    mutations,
    payloads,
    range_values,
    regions,
    transfer_codings,
    xml_fragments,
)
from hypothesis import HealthCheck, example, given, settings

EXAMPLES = int(os.environ.get("GATEWAY_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_names = itertools.count()


@pytest.fixture(scope="module")
def fuzz_target(sandbox: Sandbox, upstream: Any) -> tuple[Sandbox, str]:
    upstream.create_bucket(Bucket=BUCKET)
    gw = sandbox.gw
    assert signed(gw, "PUT", f"/{BUCKET}/ranged", OBJECT).status == 200
    created = signed(gw, "POST", f"/{BUCKET}/fuzz-mpu?uploads").body
    upload_id = created.split(b"<UploadId>")[1].split(b"</UploadId>")[0].decode()
    return sandbox, upload_id


def _after(sandbox: Sandbox) -> None:
    resp = signed(sandbox.gw, "GET", f"/{BUCKET}/ranged")
    assert resp.status == 200 and resp.body == OBJECT
    sandbox.assert_contained()


@FUZZ
@given(raw_key=key_bytes)
@example(raw_key=b"\n")  # "." in the catch-all route did not match it: aiohttp's plain 404
@example(raw_key=b"a\xff")
def test_fuzz_keys(fuzz_target: tuple[Sandbox, str], raw_key: bytes) -> None:
    check_key(fuzz_target[0].gw, raw_key)
    _after(fuzz_target[0])


@FUZZ
@given(value=range_values)
@example(value="bytes=\xfe-")  # a surrogate in SignatureDoesNotMatch's document: plain 500
def test_fuzz_ranges(fuzz_target: tuple[Sandbox, str], value: str) -> None:
    check_range(fuzz_target[0].gw, value)
    _after(fuzz_target[0])


@FUZZ
@given(data=payloads, edits=mutations)
@example(data=b"", edits=[("truncate", 0, 0)])  # empty aws-chunked body: 500 (aiohttp)
def test_fuzz_aws_chunked_framing(
    fuzz_target: tuple[Sandbox, str], data: bytes, edits: list[tuple[str, int, int]]
) -> None:
    check_chunked(fuzz_target[0].gw, data, edits, f"chunked/{next(_names)}")
    _after(fuzz_target[0])


@FUZZ
@given(doc=xml_fragments)
def test_fuzz_xml_documents(fuzz_target: tuple[Sandbox, str], doc: str) -> None:
    sandbox, upload_id = fuzz_target
    check_xml(sandbox.gw, doc, upload_id)
    _after(sandbox)


@FUZZ
@given(value=transfer_codings)
@example(value="gzip, chunked")  # decoded as chunked, stored still gzip-coded: a 200
def test_fuzz_transfer_codings(fuzz_target: tuple[Sandbox, str], value: str) -> None:
    check_transfer_coding(fuzz_target[0].gw, value, f"te/{next(_names)}")
    _after(fuzz_target[0])


@FUZZ
@given(region=regions)
@example(region="eu-west-1")  # a signature scoped to another region was accepted
def test_fuzz_signature_regions(fuzz_target: tuple[Sandbox, str], region: str) -> None:
    check_region(fuzz_target[0].gw, region, f"region/{next(_names)}")
    _after(fuzz_target[0])
