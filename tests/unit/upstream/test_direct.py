"""The direct PutObject's request is botocore's: the same URL for a key, the same SigV4
signature (checked against botocore's own ``S3SigV4Auth`` over tricky keys, metadata and a
session token), and a bucket's target learnt from the URL botocore signs."""

from __future__ import annotations

import hashlib
import io
import socket
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from aiohttp import web
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.utils import percent_encode
from fakes import path_style_upstream

from gateway.models import ObjectMeta
from gateway.upstream.classify import ConditionFailed, Fatal, Retryable, Throttled
from gateway.upstream.client import AiobotocoreUpstream, unchanged_since
from gateway.upstream.direct import sign_put, target_of

AMZ_DATE = "20261127T041500Z"
KEYS = [
    "ckpt/step_100/rank_0/shard.distcp",
    "ckpt/rank 0/shard+1=a&b.pt",
    "ünïcödé/ø/日本",
    "a//b/./c/../d",
    "~tilde%25percent%",
    "question?mark#hash;semi:colon",
]


def _botocore_signature(url: str, headers: dict[str, str], creds: Credentials, region: str) -> str:
    request = AWSRequest(method="PUT", url=url, headers=dict(headers), data=b"x")
    request.context["timestamp"] = AMZ_DATE
    auth = S3SigV4Auth(creds, "s3", region)
    canonical = auth.canonical_request(request)
    return str(auth.signature(auth.string_to_sign(request, canonical), request))


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzE//session+token="])
@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9000/bkt/KEY", "https://bkt.s3.eu-west-3.amazonaws.com/KEY"]
)
def test_the_signature_is_the_one_botocore_computes(key: str, token: str | None, url: str) -> None:
    target = target_of(url.replace("KEY", "probe"), "probe", "eu-west-3")
    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    headers = {
        "content-md5": "1B2M2Y8AsgTpgAmY7PhCfg==",
        "content-type": "text/plain; charset=utf-8",
        "x-amz-meta-note": "two  spaces\tand a tab ",
        "X-Amz-Meta-Rank": "3",  # names are signed in lower case, as sent
        "x-amz-checksum-crc32c": "yZRlqg==",
        "if-none-match": "*",
    }
    path, signed = sign_put(target, key, 1, headers, creds, AMZ_DATE)

    assert target.origin + path == url.replace("KEY", percent_encode(key, safe="/~"))
    wire = {name: value for name, value in signed.items() if name != "authorization"}
    expected = _botocore_signature(target.origin + path, wire, creds, "eu-west-3")
    authorization = signed["authorization"]
    assert authorization.endswith(f"Signature={expected}")
    assert "Credential=AKIDEXAMPLE/20261127/eu-west-3/s3/aws4_request," in authorization
    assert signed["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert signed["host"] == target.host
    assert ("x-amz-security-token" in signed) == (token is not None)


def test_a_target_is_the_url_without_the_key_and_the_host_botocore_signs() -> None:
    path_style = target_of("http://127.0.0.1:9000/bkt/a/b%20c", "a/b c", "us-east-1")
    assert (path_style.origin, path_style.host, path_style.path_prefix) == (
        "http://127.0.0.1:9000",
        "127.0.0.1:9000",
        "/bkt/",
    )
    vhost = target_of("https://Bkt.s3.amazonaws.com:443/k", "k", "us-east-1")
    assert (vhost.host, vhost.path_prefix) == ("bkt.s3.amazonaws.com", "/")
    ipv6 = target_of("http://[::1]:8080/b/k", "k", "us-east-1")
    assert ipv6.host == "[::1]:8080"
    with pytest.raises(ValueError):
        target_of("http://127.0.0.1:9000/bkt/k?versionId=1", "k", "us-east-1")
    with pytest.raises(ValueError):
        target_of("http://127.0.0.1:9000/bkt/other", "k", "us-east-1")


# -- answers, over a loopback socket -------------------------------------------------------

_ERROR = "<Error><Code>{code}</Code><Message>{message}</Message></Error>"


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[str, list[web.Response]]]:
    """A loopback HTTP server answering each PUT with the next scripted response (200
    with an ETag once the script is out)."""
    script: list[web.Response] = []

    async def put(request: web.Request) -> web.Response:
        await request.read()
        if script:
            return script.pop(0)
        return web.Response(headers={"ETag": '"0123456789abcdef0123456789abcdef"'})

    app = web.Application()
    app.router.add_route("PUT", "/{tail:.*}", put)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", script
    await runner.cleanup()


_META = ObjectMeta("b", "ckpt/x", 1, hashlib.md5(b"x").hexdigest(), 0.0)


@pytest.fixture
async def learnt(
    scripted: tuple[str, list[web.Response]],
) -> AsyncIterator[tuple[AiobotocoreUpstream, list[web.Response]]]:
    """An upstream client of the scripted server whose first PutObject (botocore's) has
    taught the direct path bucket ``b``'s URL."""
    url, script = scripted
    up = path_style_upstream(url)
    await up.start()
    try:
        await up.put_object(_META, io.BytesIO(b"x"))
        assert up._direct is not None and up._direct.takes("b")
        yield up, script
    finally:
        await up.close()


async def test_throttles_failed_conditions_and_refusals_are_told_apart(
    learnt: tuple[AiobotocoreUpstream, list[web.Response]],
) -> None:
    up, script = learnt
    assert up._direct is not None
    script += [
        web.Response(
            status=503,
            text=_ERROR.format(code="SlowDown", message="Please reduce your request rate."),
            headers={"Retry-After": "2"},
        ),
        web.Response(status=412, text=_ERROR.format(code="PreconditionFailed", message="")),
        web.Response(status=500, text="<html>proxy error</html>"),
    ]
    with pytest.raises(Throttled) as throttled:
        await up.put_object(_META, io.BytesIO(b"x"))
    assert throttled.value.retry_after_s == 2.0
    assert "SlowDown" in str(throttled.value)
    with pytest.raises(ConditionFailed):
        await up.put_object(_META, io.BytesIO(b"x"), unchanged_since(None))
    with pytest.raises(Retryable):
        await up.put_object(_META, io.BytesIO(b"x"))
    assert up._direct.takes("b")  # all of these are the direct path's to classify

    script.append(
        web.Response(status=301, text=_ERROR.format(code="PermanentRedirect", message=""))
    )
    assert await up.put_object(_META, io.BytesIO(b"x")) == "0123456789abcdef0123456789abcdef"
    assert not up._direct.takes("b")  # sent again through botocore, and from now on


async def test_a_refused_connection_is_retryable(
    learnt: tuple[AiobotocoreUpstream, list[web.Response]],
) -> None:
    up, _ = learnt
    assert up._direct is not None
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    up._direct._targets["b"] = replace(up._direct._targets["b"], origin=dead)
    body = _ReadLog(b"x")
    with pytest.raises(Retryable):
        await up.put_object(_META, body)
    assert up._direct.takes("b")
    # Never read: the flusher counts what is read of a body as bytes moving upstream.
    assert body.reads == 0


class _ReadLog(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads = 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        return super().read(size)


def test_the_proxy_is_the_environments_unless_no_proxy_exempts_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert target_of("https://b.s3.amazonaws.com/k", "k", "us-east-1").proxy is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,.svc.cluster.local")
    assert target_of("https://b.s3.amazonaws.com/k", "k", "us-east-1").proxy == (
        "http://proxy.internal:3128"
    )
    assert target_of("http://b.s3.amazonaws.com/k", "k", "us-east-1").proxy is None
    assert target_of("https://127.0.0.1:9000/b/k", "k", "us-east-1").proxy is None
    assert target_of("https://minio.svc.cluster.local/b/k", "k", "us-east-1").proxy is None


async def test_metadata_botocore_refuses_is_refused_as_botocore_refuses_it(
    learnt: tuple[AiobotocoreUpstream, list[web.Response]],
) -> None:
    """Non-ASCII user metadata (a row from before ingest encoded it): botocore's own
    refusal, a permanent failure, not a direct PUT the bucket would store differently."""
    up, _ = learnt
    meta = replace(_META, user_metadata={"a": "café"})
    with pytest.raises(Fatal, match="Non ascii"):
        await up.put_object(meta, io.BytesIO(b"x"))
    assert up._direct is not None and up._direct.takes("b")
