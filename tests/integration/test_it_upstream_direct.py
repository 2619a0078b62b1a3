"""Small PutObjects past botocore's pipeline (``gateway/upstream/direct.py``), over real
sockets, against an upstream that checks every signature: a gateway process (SigV4 as S3
verifies it) in front of moto. The first PutObject of a bucket goes through botocore and
teaches the direct path the bucket's URL; the rest go direct and land byte for byte with
their metadata, system headers and checksum; a conditional PUT fails as botocore's does;
an answer only botocore handles sends that bucket back to botocore, and the write still
lands."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from fakes import path_style_upstream
from harness import GatewayProcess

from gateway.checksums import b64, new_hasher
from gateway.models import ObjectMeta
from gateway.upstream.classify import ConditionFailed
from gateway.upstream.client import AiobotocoreUpstream

KEYS = [
    "ckpt/step_1/rank_0/shard.distcp",
    "ckpt/step_1/rank 1/shard+1=a&b.pt",
    "ckpt/step_1/ünïcödé/日本",
    "ckpt/step_1/a//b/~tilde%25",
]


@pytest.fixture
async def client(gateway: GatewayProcess) -> AsyncIterator[AiobotocoreUpstream]:
    """The upstream client, pointed at the verifying gateway; counts its direct PUTs."""
    up = path_style_upstream(
        gateway.endpoint, gateway.region, gateway.access_key, gateway.secret_key
    )
    await up.start()
    yield up
    await up.close()


def _meta(bucket: str, key: str, body: bytes, **kwargs: Any) -> ObjectMeta:
    return ObjectMeta(bucket, key, len(body), hashlib.md5(body).hexdigest(), time.time(), **kwargs)


def _count_direct(up: AiobotocoreUpstream) -> list[str]:
    direct = up._direct
    assert direct is not None
    sent: list[str] = []
    put = direct.put_object

    async def counting(bucket: str, key: str, body: Any, size_bytes: int, headers: Any) -> str:
        sent.append(key)
        return await put(bucket, key, body, size_bytes, headers)

    direct.put_object = counting  # type: ignore[method-assign]
    return sent


async def test_small_puts_go_direct_after_the_first_and_land_as_botocore_sends_them(
    client: AiobotocoreUpstream, gateway: GatewayProcess, bucket: str, upstream: Any
) -> None:
    sent = _count_direct(client)
    first = b"first"
    assert await client.put_object(_meta(bucket, "ckpt/first", first), _io(first))
    assert sent == []  # botocore's: it taught the direct path the bucket's URL

    bodies = {key: f"{key}\n".encode() * 50 for key in KEYS}
    for key, body in bodies.items():
        crc = new_hasher("crc32c")
        crc.update(body)
        meta = _meta(
            bucket,
            key,
            body,
            content_type="text/plain; charset=utf-8",
            user_metadata={"rank": "1", "note": "two  spaces"},
            headers={
                "cache-control": "no-cache",
                "content-disposition": 'attachment; filename="shard.pt"',
                "expires": "not a date",  # S3 keeps any Expires string verbatim
            },
            checksums={"crc32c": b64(crc.digest())},
        )
        etag = await client.put_object(meta, _io(body))
        assert etag == hashlib.md5(body).hexdigest()
    assert sent == KEYS

    gateway.drained(bucket=bucket, timeout=60)
    s3 = upstream
    for key, body in bodies.items():
        got = s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert got["Body"].read() == body
        crc = new_hasher("crc32c")
        crc.update(body)
        # Verified against the body and kept by the verifying upstream (moto drops it).
        head = gateway.client().head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert head["ChecksumCRC32C"] == b64(crc.digest())
        assert got["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
        assert got["ContentType"] == "text/plain; charset=utf-8"
        assert got["Metadata"] == {"rank": "1", "note": "two  spaces"}
        assert got["CacheControl"] == "no-cache"
        assert got["ContentDisposition"] == 'attachment; filename="shard.pt"'
        assert got["ExpiresString"] == "not a date"


async def test_a_failed_condition_is_a_failed_condition(
    client: AiobotocoreUpstream, bucket: str
) -> None:
    from gateway.upstream.client import unchanged_since

    sent = _count_direct(client)
    body = b"v1"
    await client.put_object(_meta(bucket, "ckpt/c", body), _io(body))
    with pytest.raises(ConditionFailed):
        await client.put_object(_meta(bucket, "ckpt/c", b"v2"), _io(b"v2"), unchanged_since(None))
    with pytest.raises(ConditionFailed):
        await client.put_object(
            _meta(bucket, "ckpt/c", b"v3"), _io(b"v3"), unchanged_since("0" * 32)
        )
    etag = await client.put_object(
        _meta(bucket, "ckpt/c", b"v4"), _io(b"v4"), unchanged_since(hashlib.md5(body).hexdigest())
    )
    assert etag == hashlib.md5(b"v4").hexdigest()
    assert sent == ["ckpt/c"] * 3


async def test_an_answer_only_botocore_handles_sends_the_bucket_back_to_botocore(
    client: AiobotocoreUpstream, gateway: GatewayProcess, bucket: str, upstream: Any
) -> None:
    """A signature scoped to the wrong region (as after a bucket moved, or a learnt URL
    gone stale): the verifying upstream refuses it with 400, the write goes through
    botocore and lands, and the bucket's later writes stay with botocore."""
    sent = _count_direct(client)
    await client.put_object(_meta(bucket, "ckpt/a", b"a"), _io(b"a"))
    direct = client._direct
    assert direct is not None and direct.takes(bucket)
    direct._targets[bucket] = replace(direct._targets[bucket], region="eu-west-3")

    etag = await client.put_object(_meta(bucket, "ckpt/b", b"b"), _io(b"b"))
    assert etag == hashlib.md5(b"b").hexdigest()
    assert sent == ["ckpt/b"] and not direct.takes(bucket)
    await client.put_object(_meta(bucket, "ckpt/c", b"c"), _io(b"c"))
    assert sent == ["ckpt/b"]

    gateway.drained(bucket=bucket, timeout=60)
    s3 = upstream
    for key in ("a", "b", "c"):
        assert s3.get_object(Bucket=bucket, Key=f"ckpt/{key}")["Body"].read() == key.encode()


def _io(body: bytes) -> Any:
    import io

    return io.BytesIO(body)


async def test_over_https_the_direct_path_trusts_what_botocore_trusts(
    tls_gateway: GatewayProcess, tls_ca: Any, bucket: str, upstream: Any, monkeypatch: Any
) -> None:
    """An https upstream whose certificate only ``AWS_CA_BUNDLE`` vouches for (as with a
    private S3 endpoint): the direct PUTs verify it as botocore does, and land."""
    monkeypatch.setenv("AWS_CA_BUNDLE", tls_ca.ca_path)
    client = path_style_upstream(
        f"https://127.0.0.1:{tls_gateway.port}",
        tls_gateway.region,
        tls_gateway.access_key,
        tls_gateway.secret_key,
    )
    await client.start()
    try:
        sent = _count_direct(client)
        bodies = {f"ckpt/tls/{i}": f"tls {i}".encode() for i in range(3)}
        for key, body in bodies.items():
            assert await client.put_object(_meta(bucket, key, body), _io(body)) == (
                hashlib.md5(body).hexdigest()
            )
        assert sent == list(bodies)[1:]
    finally:
        await client.close()
    tls_gateway.drained(bucket=bucket, timeout=60)
    for key, body in bodies.items():
        assert upstream.get_object(Bucket=bucket, Key=key)["Body"].read() == body
