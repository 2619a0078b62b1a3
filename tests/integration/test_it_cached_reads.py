"""Cached reads: a local body is sent with sendfile (zero-copy) on plain http and with large
reads under TLS, whole or ranged; each body file is hashed once and trusted until it
changes, and a corrupt body never reaches a client complete, ranged reads included."""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from botocore.exceptions import IncompleteReadError, ResponseStreamingError
from harness import GatewayProcess, corrupt_file, payload, quoted_md5, read_body, s3_client
from urllib3.exceptions import HTTPError as Urllib3Error

KiB = 1024
MiB = 1024 * KiB
_TRUNCATED = (IncompleteReadError, ResponseStreamingError, Urllib3Error)
_VERIFIED = "gateway_read_verified_bytes"
_SENDFILE = 'how="sendfile"'
_COPY = 'how="copy"'


def test_cached_get_is_zero_copy_and_verified_once(gateway_factory: Any, bucket: str) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    body = payload(3 * MiB + 5, seed="once")
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="c/obj", Body=body)
        hashed = gw.metric(_VERIFIED)
        sent = gw.metric("gateway_get_body_bytes", _SENDFILE)

        got = s3.get_object(Bucket=bucket, Key="c/obj")
        assert read_body(got) == body and got["ETag"] == quoted_md5(body)
        assert gw.metric(_VERIFIED) == hashed + len(body)  # the first read hashes the file

        for rng, want in [
            ("bytes=0-0", body[:1]),
            ("bytes=1048570-2097160", body[1048570:2097161]),
            ("bytes=-7", body[-7:]),
            ("bytes=3145000-", body[3145000:]),
        ]:
            part = s3.get_object(Bucket=bucket, Key="c/obj", Range=rng)
            assert read_body(part) == want, rng
            assert part["ContentLength"] == len(want)
        assert read_body(s3.get_object(Bucket=bucket, Key="c/obj")) == body
        # Known good since: no second hash; every byte went out with sendfile.
        assert gw.metric(_VERIFIED) == hashed + len(body)
        total = 2 * len(body) + sum(len(w) for w in (body[:1], body[-7:]))
        total += 2097161 - 1048570 + len(body) - 3145000
        assert gw.metric("gateway_get_body_bytes", _SENDFILE) == sent + total


def test_changed_body_file_is_verified_again_and_never_served_complete(
    gateway_factory: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    body = payload(2 * MiB + 100, seed="rot")
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="c/rot", Body=body)
        assert read_body(s3.get_object(Bucket=bucket, Key="c/rot")) == body  # now known good
        hashed = gw.metric(_VERIFIED)
        (path,) = gw.blob_files(bucket, "c/rot")
        corrupt_file(path)  # a write in place: mtime and ctime change

        # A small range far from the damage: held back whole until the file is checked.
        resp = s3.get_object(Bucket=bucket, Key="c/rot", Range="bytes=0-99")
        with pytest.raises(_TRUNCATED):
            resp["Body"].read()
        assert gw.metric(_VERIFIED) == hashed + len(body)
        state = gw.object_state(bucket, "c/rot")
        assert state["state"] == "failed" and "local corruption" in state["last_error"]
        assert gw.metric("gateway_corrupt_blobs") >= 1
    assert gw.status()["failed_objects"] == 1  # never flushed as good


def test_corrupt_part_of_a_range_across_parts_is_cut(gateway_factory: Any, bucket: str) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    parts = [payload(5 * MiB, seed="p1"), payload(5 * MiB, seed="p2"), payload(300, seed="p3")]
    whole = b"".join(parts)
    with gw.flush_paused():
        upload = s3.create_multipart_upload(Bucket=bucket, Key="c/mp")
        etags = [
            s3.upload_part(
                Bucket=bucket, Key="c/mp", UploadId=upload["UploadId"], PartNumber=n, Body=p
            )["ETag"]
            for n, p in enumerate(parts, 1)
        ]
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="c/mp",
            UploadId=upload["UploadId"],
            MultipartUpload={
                "Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]
            },
        )
        rng = f"bytes={5 * MiB - 10}-{10 * MiB + 9}"
        got = s3.get_object(Bucket=bucket, Key="c/mp", Range=rng)
        assert read_body(got) == whole[5 * MiB - 10 : 10 * MiB + 10]
        assert read_body(s3.get_object(Bucket=bucket, Key="c/mp", PartNumber=3)) == parts[2]
        assert read_body(s3.get_object(Bucket=bucket, Key="c/mp")) == whole

        corrupt_file(gw.blob_files(bucket, "c/mp")[1])
        # Part 1 alone is untouched and still served; any read touching part 2 is cut.
        first = s3.get_object(Bucket=bucket, Key="c/mp", Range="bytes=0-1023")
        assert read_body(first) == whole[:1024]
        resp = s3.get_object(Bucket=bucket, Key="c/mp", Range=rng)
        with pytest.raises(_TRUNCATED):
            resp["Body"].read()
        assert gw.object_state(bucket, "c/mp")["state"] == "failed"


def test_client_leaving_mid_body_does_not_disturb_the_gateway(
    gateway_factory: Any, bucket: str
) -> None:
    gw = gateway_factory()
    s3 = gw.client()
    body = payload(24 * MiB, seed="leave")
    s3.put_object(Bucket=bucket, Key="c/big", Body=body)
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "c/big"})
    for _ in range(3):
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        conn.request("GET", f"{parts.path}?{parts.query}")
        resp = conn.getresponse()
        assert resp.status == 200
        assert len(resp.read(64 * KiB)) == 64 * KiB
        conn.sock.close()  # gone, with megabytes still to come
        conn.close()
    got = s3.get_object(Bucket=bucket, Key="c/big")
    assert read_body(got) == body
    assert "Traceback" not in gw.log_tail(200)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    base = tmp_path_factory.mktemp("tls-reads")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    ca_path, cert_path, key_path = base / "ca.pem", base / "cert.pem", base / "key.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    server.private_key_pem.write_to_path(str(key_path))
    with open(cert_path, "wb") as fh:
        for blob in server.cert_chain_pems:
            fh.write(blob.bytes())
    return str(ca_path), str(cert_path), str(key_path)


@pytest.fixture
def tls_gateway(
    moto_server: str, tmp_path: Path, tls_files: tuple[str, str, str]
) -> Iterator[GatewayProcess]:
    _, cert, key = tls_files
    gw = GatewayProcess(
        tmp_path / "data", moto_server, extra_args=["--tls-cert", cert, "--tls-key", key]
    )
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


def test_cached_get_over_tls_uses_large_reads(
    tls_gateway: GatewayProcess, tls_files: tuple[str, str, str], bucket: str
) -> None:
    gw = tls_gateway
    s3 = s3_client(
        f"https://127.0.0.1:{gw.port}",
        access_key=gw.access_key,
        secret_key=gw.secret_key,
        verify=tls_files[0],
    )
    body = payload(5 * MiB + 3, seed="tls")
    s3.put_object(Bucket=bucket, Key="t/obj", Body=body)
    copied = gw.metric("gateway_get_body_bytes", _COPY)
    assert read_body(s3.get_object(Bucket=bucket, Key="t/obj")) == body
    ranged = s3.get_object(Bucket=bucket, Key="t/obj", Range="bytes=1000-3000999")
    assert read_body(ranged) == body[1000:3001000]
    assert gw.metric("gateway_get_body_bytes", _COPY) == copied + len(body) + 3000000
    assert gw.metric("gateway_get_body_bytes", _SENDFILE) == 0


def test_stored_crc32c_is_what_a_read_checks(gateway_factory: Any, bucket: str) -> None:
    """A body sent with x-amz-checksum-crc32c is verified with it (CRC-32C: tens of GB/s,
    against MD5's ~0.7), and a damaged one is still never served complete."""
    gw = gateway_factory()
    s3 = gw.client()
    body = payload(3 * MiB, seed="crc")
    with gw.flush_paused():
        s3.put_object(Bucket=bucket, Key="c/crc", Body=body, ChecksumAlgorithm="CRC32C")
        assert read_body(s3.get_object(Bucket=bucket, Key="c/crc")) == body
        corrupt_file(gw.blob_files(bucket, "c/crc")[0])
        resp = s3.get_object(Bucket=bucket, Key="c/crc")
        with pytest.raises(_TRUNCATED):
            resp["Body"].read()
        state = gw.object_state(bucket, "c/crc")
        assert state["state"] == "failed" and "recorded crc32c" in state["last_error"]


def test_verified_files_stay_known_good_across_a_restart(gateway_factory: Any, bucket: str) -> None:
    """A resuming job after a gateway restart reads its checkpoint without a second hash of
    each file; a file changed while the gateway was down is hashed again and caught."""
    # Nothing flushes (the rows stay local), and the stop does not wait for them.
    gw = gateway_factory(
        extra_args=["--write-back-delay", "3600", "--shutdown-drain-timeout", "0.5"]
    )
    s3 = gw.client()
    kept, changed = payload(2 * MiB + 3, seed="kept"), payload(MiB + 7, seed="changed")
    s3.put_object(Bucket=bucket, Key="r/kept", Body=kept)
    s3.put_object(Bucket=bucket, Key="r/changed", Body=changed)
    for key, body in (("r/kept", kept), ("r/changed", changed)):
        assert read_body(s3.get_object(Bucket=bucket, Key=key)) == body  # verified now
    gw.restart(hard=False)
    (path,) = gw.blob_files(bucket, "r/changed")
    corrupt_file(path)  # after the memo was loaded: mtime and ctime move
    s3 = gw.client()
    assert gw.metric(_VERIFIED) == 0
    got = s3.get_object(Bucket=bucket, Key="r/kept")
    assert read_body(got) == kept and got["ETag"] == quoted_md5(kept)
    assert gw.metric(_VERIFIED) == 0  # remembered from before the restart
    resp = s3.get_object(Bucket=bucket, Key="r/changed")
    with pytest.raises(_TRUNCATED):
        resp["Body"].read()
    assert gw.metric(_VERIFIED) == len(changed)
    state = gw.object_state(bucket, "r/changed")
    assert state["state"] == "failed" and "local corruption" in state["last_error"]
