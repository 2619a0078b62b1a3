"""boto3 / s3transfer against the gateway, over plain http and over https (TLS listener).

Every test checks bytes (by hash) and ETags, and the ones that write also drain the gateway
and compare what reached the upstream bucket (moto) with what the client was told.
"""

from __future__ import annotations

import http.client
import io
import ssl
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError, SSLError
from clientutil import (
    MiB,
    file_sha256,
    multipart_etag,
    random_bytes,
    sha256,
    split,
    upstream_body,
)
from harness import (
    GatewayProcess,
    error_code,
    error_status,
    quoted_md5,
    read_body,
    s3_client,
)


@dataclass
class Target:
    """One way of reaching the gateway: its process, S3 endpoint and a matching client."""

    scheme: str
    gw: GatewayProcess
    endpoint: str
    ca_path: str | None
    client: Any

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.ca_path is None:
            return None
        return ssl.create_default_context(cafile=self.ca_path)

    def connection(self) -> http.client.HTTPConnection:
        parts = urllib.parse.urlsplit(self.endpoint)
        assert parts.hostname and parts.port
        if self.scheme == "https":
            return http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=60, context=self.ssl_context()
            )
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)


@pytest.fixture(params=["http", "https"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "http":
        gw: GatewayProcess = request.getfixturevalue("gateway")
        return Target("http", gw, gw.endpoint, None, gw.client())
    gw = request.getfixturevalue("tls_gateway")
    ca_path = request.getfixturevalue("tls_ca").ca_path
    endpoint = f"https://127.0.0.1:{gw.port}"
    client = s3_client(endpoint, access_key=gw.access_key, secret_key=gw.secret_key, verify=ca_path)
    return Target("https", gw, endpoint, ca_path, client)


TRANSFER = TransferConfig(
    multipart_threshold=8 * MiB,
    multipart_chunksize=8 * MiB,
    max_concurrency=8,
    use_threads=True,
)


def _assert_upstream(target: Target, upstream: Any, bucket: str, key: str, data: bytes, etag: str):
    target.gw.drained(bucket=bucket)
    up_etag, up_body = upstream_body(upstream, bucket, key)
    assert up_etag == etag
    assert sha256(up_body) == sha256(data)


def test_upload_file_download_file_multipart(
    target: Target, upstream: Any, bucket: str, tmp_path: Path
) -> None:
    data = random_bytes(40 * MiB, "boto3-40mib")
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    s3 = target.client

    s3.upload_file(str(src), bucket, "big/model.bin", Config=TRANSFER)

    expected_etag = multipart_etag(split(data, 8 * MiB))
    head = s3.head_object(Bucket=bucket, Key="big/model.bin")
    assert head["ContentLength"] == len(data)
    assert head["ETag"] == expected_etag  # "...-5"

    dst = tmp_path / "dst.bin"
    s3.download_file(bucket, "big/model.bin", str(dst), Config=TRANSFER)
    assert file_sha256(dst) == sha256(data)

    _assert_upstream(target, upstream, bucket, "big/model.bin", data, expected_etag)


def test_upload_fileobj(target: Target, upstream: Any, bucket: str) -> None:
    s3 = target.client
    small = random_bytes(3 * MiB + 5, "fileobj-small")
    large = random_bytes(9 * MiB + 123, "fileobj-large")
    s3.upload_fileobj(io.BytesIO(small), bucket, "fo/small.bin", Config=TRANSFER)
    s3.upload_fileobj(io.BytesIO(large), bucket, "fo/large.bin", Config=TRANSFER)

    small_etag = quoted_md5(small)
    large_etag = multipart_etag(split(large, 8 * MiB))
    for key, data, etag in (
        ("fo/small.bin", small, small_etag),
        ("fo/large.bin", large, large_etag),
    ):
        got = s3.get_object(Bucket=bucket, Key=key)
        assert got["ETag"] == etag
        assert sha256(read_body(got)) == sha256(data)
        out = io.BytesIO()
        s3.download_fileobj(bucket, key, out, Config=TRANSFER)
        assert sha256(out.getvalue()) == sha256(data)

    _assert_upstream(target, upstream, bucket, "fo/small.bin", small, small_etag)
    _assert_upstream(target, upstream, bucket, "fo/large.bin", large, large_etag)


def test_ranged_get_object(target: Target, bucket: str) -> None:
    s3 = target.client
    data = random_bytes(1 * MiB + 999, "ranged")
    s3.put_object(Bucket=bucket, Key="r/obj", Body=data)
    size = len(data)

    cases = {
        "bytes=0-0": (0, 0),
        "bytes=100-199": (100, 199),
        f"bytes={size - 10}-": (size - 10, size - 1),
        "bytes=-50": (size - 50, size - 1),
        f"bytes=1000-{size + 5000}": (1000, size - 1),  # end past EOF is clamped
    }
    for header, (first, last) in cases.items():
        resp = s3.get_object(Bucket=bucket, Key="r/obj", Range=header)
        assert resp["ResponseMetadata"]["HTTPStatusCode"] == 206, header
        assert resp["ContentRange"] == f"bytes {first}-{last}/{size}", header
        assert resp["ContentLength"] == last - first + 1, header
        assert read_body(resp) == data[first : last + 1], header
        assert resp["ETag"] == quoted_md5(data)

    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="r/obj", Range=f"bytes={size}-")
    assert error_code(exc.value) == "InvalidRange"
    assert error_status(exc.value) == 416


def test_presigned_put_and_get(target: Target, upstream: Any, bucket: str) -> None:
    s3 = target.client
    data = random_bytes(256 * 1024 + 3, "presigned")

    put_url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "pre/signed obj.bin"}, ExpiresIn=300
    )
    parts = urllib.parse.urlsplit(put_url)
    assert parts.scheme == target.scheme
    assert "X-Amz-Signature=" in parts.query
    conn = target.connection()
    try:
        conn.request(
            "PUT",
            f"{parts.path}?{parts.query}",
            body=data,
            headers={"Content-Length": str(len(data))},
        )
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, body
        assert resp.getheader("ETag") == quoted_md5(data)
    finally:
        conn.close()

    get_url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "pre/signed obj.bin"}, ExpiresIn=300
    )
    with urllib.request.urlopen(get_url, timeout=60, context=target.ssl_context()) as got:
        assert got.status == 200
        assert got.headers["ETag"] == quoted_md5(data)
        assert sha256(got.read()) == sha256(data)

    # A presigned URL is bound to its method and key: reusing the GET URL to PUT fails.
    conn = target.connection()
    try:
        gparts = urllib.parse.urlsplit(get_url)
        conn.request("PUT", f"{gparts.path}?{gparts.query}", body=b"evil")
        resp = conn.getresponse()
        assert resp.status == 403
        assert b"SignatureDoesNotMatch" in resp.read()
    finally:
        conn.close()

    _assert_upstream(target, upstream, bucket, "pre/signed obj.bin", data, quoted_md5(data))


def test_multipart_out_of_order_parts(target: Target, upstream: Any, bucket: str) -> None:
    s3 = target.client
    key = "mpu/out-of-order.bin"
    parts = [
        random_bytes(5 * MiB, "p1"),
        random_bytes(5 * MiB + 7, "p2"),
        random_bytes(1234, "p3"),
    ]
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

    etags: dict[int, str] = {}
    for number in (3, 1, 2):  # deliberately out of order
        resp = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=parts[number - 1]
        )
        assert resp["ETag"] == quoted_md5(parts[number - 1])
        etags[number] = resp["ETag"]
    # Re-uploading a part replaces it.
    resp = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=2, Body=parts[1])
    assert resp["ETag"] == etags[2]

    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id)
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed["Parts"]] == [
        (n, etags[n], len(parts[n - 1])) for n in (1, 2, 3)
    ]
    uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix="mpu/").get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [(key, upload_id)]

    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in (1, 2, 3)]},
    )
    expected = multipart_etag(parts)
    assert done["ETag"] == expected
    data = b"".join(parts)
    got = s3.get_object(Bucket=bucket, Key=key)
    assert got["ETag"] == expected
    assert sha256(read_body(got)) == sha256(data)
    assert s3.list_multipart_uploads(Bucket=bucket, Prefix="mpu/").get("Uploads", []) == []

    _assert_upstream(target, upstream, bucket, key, data, expected)


def test_abort_multipart_upload(target: Target, upstream: Any, bucket: str) -> None:
    s3 = target.client
    key = "mpu/aborted.bin"
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    part = random_bytes(5 * MiB, "aborted")
    etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=part)[
        "ETag"
    ]

    resp = s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []

    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
        )
    assert error_code(exc.value) == "NoSuchUpload"
    assert error_status(exc.value) == 404
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key=key)
    assert error_status(exc.value) == 404

    target.gw.drained(bucket=bucket)
    assert upstream.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_multipart_errors(target: Target, bucket: str) -> None:
    s3 = target.client
    key = "mpu/errors.bin"
    bogus = "this-upload-id-does-not-exist"

    with pytest.raises(ClientError) as exc:
        s3.upload_part(Bucket=bucket, Key=key, UploadId=bogus, PartNumber=1, Body=b"x")
    assert (error_code(exc.value), error_status(exc.value)) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError) as exc:
        s3.list_parts(Bucket=bucket, Key=key, UploadId=bogus)
    assert (error_code(exc.value), error_status(exc.value)) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError) as exc:
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=bogus)
    assert (error_code(exc.value), error_status(exc.value)) == ("NoSuchUpload", 404)

    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    p1 = random_bytes(5 * MiB, "err-p1")
    p2 = random_bytes(10, "err-p2")
    e1 = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=p1)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=2, Body=p2)["ETag"]

    def complete(parts: list[dict[str, Any]]) -> ClientError:
        with pytest.raises(ClientError) as exc:
            s3.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        return exc.value

    # A part that was never uploaded, and a wrong ETag for an uploaded part.
    err = complete([{"PartNumber": 1, "ETag": e1}, {"PartNumber": 3, "ETag": e2}])
    assert (error_code(err), error_status(err)) == ("InvalidPart", 400)
    err = complete([{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": quoted_md5(b"no")}])
    assert (error_code(err), error_status(err)) == ("InvalidPart", 400)
    # Parts listed out of order.
    err = complete([{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}])
    assert (error_code(err), error_status(err)) == ("InvalidPartOrder", 400)
    # A part under 5 MiB that is not the last one.
    e3 = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=3, Body=p2)["ETag"]
    err = complete([{"PartNumber": 2, "ETag": e2}, {"PartNumber": 3, "ETag": e3}])
    assert (error_code(err), error_status(err)) == ("EntityTooSmall", 400)

    # The failed completions left the upload intact; completing with a subset of the
    # uploaded parts is allowed (part 3 is discarded).
    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]},
    )
    assert done["ETag"] == multipart_etag([p1, p2])
    assert sha256(read_body(s3.get_object(Bucket=bucket, Key=key))) == sha256(p1 + p2)


def test_https_is_really_tls(tls_gateway: GatewayProcess, tls_ca: Any, bucket: str) -> None:
    """The https target is a verified TLS listener: an untrusting client refuses it, and
    plain http on the same port gets no S3 answer."""
    endpoint = f"https://127.0.0.1:{tls_gateway.port}"
    untrusting = s3_client(
        endpoint, access_key=tls_gateway.access_key, secret_key=tls_gateway.secret_key, verify=True
    )
    with pytest.raises(SSLError):
        untrusting.list_objects_v2(Bucket=bucket)

    trusting = s3_client(
        endpoint,
        access_key=tls_gateway.access_key,
        secret_key=tls_gateway.secret_key,
        verify=tls_ca.ca_path,
    )
    assert trusting.list_objects_v2(Bucket=bucket)["KeyCount"] == 0

    conn = http.client.HTTPConnection("127.0.0.1", tls_gateway.port, timeout=10)
    try:
        conn.request("GET", f"/{bucket}")
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException):
        status = None
    finally:
        conn.close()
    assert status in (None, 400)  # a TLS server cannot answer a cleartext request with data


def test_access_log_counts_a_tls_upload_without_content_length(
    tls_gateway: GatewayProcess, tls_ca: Any, bucket: str
) -> None:
    """boto3 over https streams aws-chunked with a checksum trailer and no Content-Length:
    the access log's ``in=`` is the bytes received (it said 0)."""
    s3 = s3_client(
        f"https://127.0.0.1:{tls_gateway.port}",
        access_key=tls_gateway.access_key,
        secret_key=tls_gateway.secret_key,
        verify=tls_ca.ca_path,
    )
    body = b"t" * 200_000
    response = s3.put_object(Bucket=bucket, Key="tls/in-bytes", Body=io.BytesIO(body))
    sent = response["ResponseMetadata"]["RequestId"]
    deadline = time.monotonic() + 20
    line = ""
    while not line and time.monotonic() < deadline:
        line = next((x for x in tls_gateway.log_path.read_text().splitlines() if sent in x), "")
    assert " op=PutObject " in line, tls_gateway.log_tail()
    received = int(line.split(" in=")[1].split()[0])
    assert received >= len(body)  # the aws-chunked framing and trailer on top of the body
