"""Signed hostile requests: every request is correctly signed (SigV4, so it reaches the
parsers behind authentication), its headers, query and body drawn from S3's own vocabulary
with malformed values. What it checks, request by request:

- the gateway answers (no reset, no hang) and keeps serving;
- nothing is answered 5xx but what S3 itself may answer so (503 SlowDown when it sheds
  load, 501 NotImplemented): a 500 is a request the gateway did not handle;
- every error has an S3 error body (XML with a ``Code``) unless it is a HEAD;
- in the end, the objects written before the storm still read back byte for byte, and
  what the storm acknowledged is upstream once drained.

    .venv/bin/python loadtest/fuzz.py --requests 3000 --seed 1 [--fleet 3]

``--fleet N`` runs N gateways as a fleet (``--replicas 1``), each request through one of
them at random (a multipart upload's requests through the node that created it: uploads
are node-local, docs/fleet.md).

Prints the count per status and each request answered 5xx (target: none).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fleetutil import fleet_of, stop_keeping_logs, wait_joined  # noqa: E402
from harness import (  # noqa: E402
    GatewayProcess,
    HttpResponse,
    http_request,
    sign_request,
    start_moto,
    upstream_client,
)

BUCKET = "fuzz"
KEEP = {f"keep/{i}": hashlib.sha256(str(i).encode()).digest() * 40 for i in range(8)}

WEIRD = (
    "",
    " ",
    "-1",
    "0",
    "1",
    "99999999999999999999999",
    "abc",
    "%",
    "%zz",
    "\u00e9t\u00e9",
    "a" * 3000,
    "bytes=",
    "bytes=5-2",
    "bytes=-0",
    "bytes=0-0,2-3",
    "bytes=999999-",
    '"etag"',
    "*",
    "Thu, 01 Jan 1970 00:00:00 GMT",
    "Mon, 32 Foo 2999 99:99:99 GMT",
    "true",
    "null",
    "../../etc/passwd",
    "fuzz/keep/0",
    "/fuzz/keep/0?versionId=x",
    "/nobucket/k",
    "STANDARD",
    "GLACIER",
    "AES256",
    "aws:kms",
    "CRC32",
    "SHA256",
    "AAAA",
    "====",
    "1B2M2Y8AsgTpgAmY7PhCfg==",
)
HEADERS = (
    "Range",
    "If-Match",
    "If-None-Match",
    "If-Modified-Since",
    "If-Unmodified-Since",
    "Content-MD5",
    "Content-Type",
    "Content-Encoding",
    "Cache-Control",
    "Expires",
    "x-amz-copy-source",
    "x-amz-copy-source-range",
    "x-amz-copy-source-if-match",
    "x-amz-copy-source-if-none-match",
    "x-amz-copy-source-if-modified-since",
    "x-amz-metadata-directive",
    "x-amz-tagging",
    "x-amz-tagging-directive",
    "x-amz-storage-class",
    "x-amz-server-side-encryption",
    "x-amz-checksum-crc32",
    "x-amz-checksum-crc32c",
    "x-amz-checksum-sha256",
    "x-amz-checksum-algorithm",
    "x-amz-sdk-checksum-algorithm",
    "x-amz-decoded-content-length",
    "x-amz-meta-a",
    "x-amz-acl",
    "x-amz-object-lock-mode",
    "x-amz-website-redirect-location",
    "x-amz-expected-bucket-owner",
    "x-amz-request-payer",
    "x-amz-mp-parts-count",
    "x-amz-write-offset-bytes",
)
QUERY = (
    "list-type",
    "max-keys",
    "prefix",
    "delimiter",
    "marker",
    "start-after",
    "continuation-token",
    "encoding-type",
    "fetch-owner",
    "uploadId",
    "partNumber",
    "max-parts",
    "part-number-marker",
    "max-uploads",
    "key-marker",
    "upload-id-marker",
    "versionId",
    "uploads",
    "delete",
    "tagging",
    "attributes",
    "response-content-type",
    "response-content-disposition",
    "versions",
    "acl",
    "x-id",
)


def xml_bodies(rng: random.Random) -> bytes:
    parts = "".join(
        f"<Part><PartNumber>{rng.choice(WEIRD[:8])}</PartNumber>"
        f"<ETag>{rng.choice(WEIRD)}</ETag></Part>"
        for _ in range(rng.randrange(0, 4))
    )
    keys = "".join(
        f"<Object><Key>{rng.choice(WEIRD)}</Key></Object>" for _ in range(rng.randrange(0, 4))
    )
    return rng.choice(
        (
            b"",
            b"<",
            b"<?xml version='1.0'?><!DOCTYPE a [<!ENTITY x SYSTEM 'file:///etc/passwd'>]><a>&x;</a>",
            b"<!DOCTYPE l [<!ENTITY a '1234567890'><!ENTITY b '&a;&a;&a;&a;&a;&a;&a;'>]><l>&b;</l>",
            f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode(),
            f"<Delete><Quiet>{rng.choice(WEIRD)}</Quiet>{keys}</Delete>".encode(),
            f"<Delete>{keys * 400}</Delete>".encode(),
            f"<Tagging><TagSet><Tag><Key>{rng.choice(WEIRD)}</Key><Value>v</Value></Tag>"
            f"</TagSet></Tagging>".encode(),
            b"\xff\xfe\x00<a/>",
            rng.randbytes(rng.randrange(1, 2000)),
        )
    )


# Real operations (method, path under the bucket, query, headers, body), each then given a
# malformed value or two: they reach the handlers behind the routing that random
# combinations mostly stop at (405, 501). ``{u}`` is a live multipart upload's id.
def _templates(rng: random.Random, upload: str, parts: list[tuple[int, str]]) -> list[tuple]:
    body = rng.randbytes(rng.choice((0, 1, 100, 5000)))
    done = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in parts)
    names = "".join(f"<Object><Key>f/d{i}</Key></Object>" for i in range(rng.randrange(1, 5)))
    deletes = f"<Delete><Quiet>false</Quiet>{names}</Delete>".encode()
    tags = b"<Tagging><TagSet><Tag><Key>a</Key><Value>b</Value></Tag></TagSet></Tagging>"
    copy = {"x-amz-copy-source": "/fuzz/keep/0"}
    return [
        ("PUT", "f/a", {}, {"Content-MD5": _md5_b64(body)}, body),
        ("PUT", "f/a", {}, {"If-None-Match": "*"}, body),
        ("PUT", "f/a", {}, {"x-amz-checksum-crc32": "AAAAAA=="}, body),
        ("GET", "keep/1", {}, {"Range": "bytes=10-99"}, b""),
        ("GET", "keep/1", {"partNumber": "1"}, {}, b""),
        ("HEAD", "keep/1", {}, {"If-Match": '"x"'}, b""),
        ("GET", "keep/1", {"attributes": ""}, {"x-amz-object-attributes": "ETag,ObjectSize"}, b""),
        ("PUT", "f/b", {}, {**copy, "x-amz-metadata-directive": "REPLACE"}, b""),
        ("PUT", "f/b", {}, {**copy, "x-amz-copy-source-if-match": '"x"'}, b""),
        ("POST", "f/m", {"uploads": ""}, {}, b""),
        ("PUT", "f/m", {"partNumber": "1", "uploadId": upload}, {}, body),
        (
            "PUT",
            "f/m",
            {"partNumber": "2", "uploadId": upload},
            {**copy, "x-amz-copy-source-range": "bytes=0-99"},
            b"",
        ),
        (
            "POST",
            "f/m",
            {"uploadId": upload},
            {},
            f"<CompleteMultipartUpload>{done}</CompleteMultipartUpload>".encode(),
        ),
        ("GET", "f/m", {"uploadId": upload, "max-parts": "1"}, {}, b""),
        ("DELETE", "f/m", {"uploadId": upload}, {}, b""),
        ("GET", "", {"list-type": "2", "prefix": "f/", "delimiter": "/", "max-keys": "2"}, {}, b""),
        ("GET", "", {"marker": "f/", "max-keys": "3"}, {}, b""),
        ("GET", "", {"uploads": "", "max-uploads": "2"}, {}, b""),
        ("POST", "", {"delete": ""}, {"Content-MD5": _md5_b64(deletes)}, deletes),
        ("PUT", "f/a", {"tagging": ""}, {"Content-MD5": _md5_b64(tags)}, tags),
        ("DELETE", "f/b", {}, {"If-Match": '"x"'}, b""),
    ]


class Fuzz:
    def __init__(self, endpoints: Sequence[str], seed: int) -> None:
        self.endpoints = list(endpoints)
        self.rng = random.Random(seed)
        self.upload_at = self.endpoints[0]  # the node the live upload was created through
        self.statuses: Counter[int] = Counter()
        self.bad: list[str] = []
        self.upload_id = "none"  # a live multipart upload (``_track``)
        self.parts: list[tuple[int, str]] = []

    def one(self) -> None:
        if self.rng.random() < 0.5:
            self.mutated()
        else:
            self.random()

    def mutated(self) -> None:
        """A real operation with one or two of its values (or headers) malformed."""
        rng = self.rng
        ops = _templates(rng, self.upload_id, self.parts)
        method, key, query, headers, body = rng.choice(ops)
        query, headers = dict(query), dict(headers)
        for _ in range(rng.randrange(1, 3)):
            roll = rng.random()
            if roll < 0.35 and query:
                query[rng.choice(sorted(query))] = rng.choice(WEIRD)
            elif roll < 0.6 and headers:
                name = rng.choice(sorted(headers))
                if rng.random() < 0.3:
                    del headers[name]
                else:
                    headers[name] = rng.choice(WEIRD)
            elif roll < 0.85:
                headers[rng.choice(HEADERS)] = rng.choice(WEIRD)
            elif body:
                cut = rng.randrange(len(body))
                body = body[:cut] + rng.randbytes(rng.randrange(0, 8)) + body[cut + 1 :]
        path = f"/{BUCKET}/{key}" if key else f"/{BUCKET}"
        endpoint = self.rng.choice(self.endpoints)
        if "uploadId" in query and "uploads" not in query:
            endpoint = self.upload_at
        resp = self.send(method, path, query, headers, body, endpoint)
        if resp is not None and resp.status == 200:
            if method == "POST" and "uploads" in query:
                self.upload_at = endpoint
            self._track(method, query, resp)

    def _track(self, method: str, query: dict[str, str], resp: HttpResponse) -> None:
        """Keep a live multipart upload (and its parts) for the templates to use."""
        if method == "POST" and "uploads" in query:
            self.upload_id = resp.body.split(b"<UploadId>")[1].split(b"</UploadId>")[0].decode()
            self.parts = []
        elif method == "PUT" and query.get("uploadId") == self.upload_id:
            etag = resp.headers.get("etag") or ""
            if not etag and b"<ETag>" in resp.body:
                etag = resp.body.split(b"<ETag>")[1].split(b"</ETag>")[0].decode()
            if query.get("partNumber", "").isdigit() and etag:
                self.parts.append((int(query["partNumber"]), etag.replace("&quot;", '"')))

    def random(self) -> None:
        """A random method, path, query and headers from S3's vocabulary."""
        rng = self.rng
        method = rng.choice(("GET", "HEAD", "PUT", "PUT", "POST", "DELETE"))
        keys = ["f/a", "f/b", "f/%E2%9C%93", "f/" + "x" * 1100, ""]
        key = rng.choice([*keys, "keep/0"] if method in ("GET", "HEAD") else keys)
        bucket = rng.choice((BUCKET, BUCKET, BUCKET, "nosuchbucket"))
        path = f"/{bucket}/{key}" if key else f"/{bucket}"
        query = {
            q: rng.choice(WEIRD) if rng.random() < 0.8 else ""
            for q in rng.sample(QUERY, rng.randrange(0, 4))
        }
        headers = {h: rng.choice(WEIRD) for h in rng.sample(HEADERS, rng.randrange(0, 6))}
        body = xml_bodies(rng) if method in ("PUT", "POST") else b""
        if method in ("PUT", "POST") and rng.random() < 0.3:
            headers["Content-MD5"] = _md5_b64(body)
        self.send(method, path, query, headers, body, rng.choice(self.endpoints))

    def send(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        headers: dict[str, str],
        body: bytes,
        endpoint: str,
    ) -> HttpResponse | None:
        url = endpoint + path
        if query:
            url += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        headers = {k: v for k, v in headers.items() if v.isascii()}  # http.client's rule
        try:
            req = sign_request(method, url, headers=headers, body=body)
            resp = http_request(req.method, req.url, body=req.body, headers=req.headers, timeout=30)
        except Exception as exc:  # a reset or a hang is what this looks for
            self.bad.append(f"{method} {url[:200]} {headers}: no answer ({exc!r})")
            return None
        self.statuses[resp.status] += 1
        self._judge(method, url, headers, resp)
        return resp

    def _judge(self, method: str, url: str, headers: dict[str, str], resp: HttpResponse) -> None:
        what = f"{method} {url[:200]} {dict(headers)} -> {resp.status}"
        if resp.status >= 500 and resp.status not in (501, 503):
            self.bad.append(f"{what}: {resp.body[:300]!r}")
        elif _wants_error_body(method, resp.status) and b"<Code>" not in resp.body:
            self.bad.append(f"{what}: no S3 error body: {resp.body[:200]!r}")


def _wants_error_body(method: str, status: int) -> bool:
    """An error answer carries S3's XML error (a HEAD's has no body; 304 is no error)."""
    return status >= 300 and status != 304 and method != "HEAD"


def _md5_b64(body: bytes) -> str:
    import base64

    return base64.b64encode(hashlib.md5(body).digest()).decode()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--logs", default="", help="copy the gateways' logs here")
    p.add_argument("--fleet", type=int, default=0, help="N gateways as a fleet (0: one alone)")
    args = p.parse_args(argv)
    moto, url = start_moto()
    upstream = upstream_client(url)
    upstream.create_bucket(Bucket=BUCKET)
    with TemporaryDirectory(prefix="gw-fuzz-") as tmp:
        if args.fleet:
            names = "abcdefgh"[: args.fleet]
            extra = ("--write-back-delay", "0.2", "--replicas", "1")
            gateways = fleet_of(Path(tmp), url, names, extra)
        else:
            gateways = [
                GatewayProcess(Path(tmp) / "gw", url, extra_args=["--write-back-delay", "0.2"])
            ]
        for gw in gateways:
            gw.start(timeout=60)
        if args.fleet:
            wait_joined(gateways, names)
        try:
            s3 = gateways[0].client()
            for key, body in KEEP.items():
                s3.put_object(Bucket=BUCKET, Key=key, Body=body)
            fuzz = Fuzz([gw.endpoint for gw in gateways], args.seed)
            started = time.monotonic()
            for _ in range(args.requests):
                fuzz.one()
            took_s = time.monotonic() - started
            lost = []
            for gw in gateways:
                lost += _check_kept(partial(_read, gw.client()))
            drain = "/admin/v1/drain?wait=true&timeout=60"
            drained = all(gw.admin_get(drain)["drained"] for gw in gateways)
            lost += _check_kept(partial(_read, upstream))
        finally:
            stop_keeping_logs(gateways, args.logs)
            moto.stop()
    for line in fuzz.bad:
        print(f"  BAD {line}")
    for line in lost:
        print(f"  LOST {line}")
    print(
        f"fuzz: {args.requests} signed requests in {took_s:.0f} s, statuses "
        f"{dict(sorted(fuzz.statuses.items()))}, {len(fuzz.bad)} bad answers, "
        f"{len(lost)} kept objects wrong, drained {drained}"
    )
    return 1 if fuzz.bad or lost or not drained else 0


def _read(client: Any, key: str) -> bytes:
    body: bytes = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    return body


def _check_kept(read: Callable[[str], bytes]) -> list[str]:
    wrong = []
    for key, body in KEEP.items():
        try:
            got = read(key)
        except Exception as exc:
            wrong.append(f"{key}: {exc!r}")
            continue
        if got != body:
            wrong.append(f"{key}: {len(got)} bytes, not the {len(body)} written")
    return wrong


if __name__ == "__main__":
    sys.exit(main())
