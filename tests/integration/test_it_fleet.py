"""The fleet over real sockets: three gateway processes on one upstream (moto), shards
written through each, the commit marker through one (docs/fleet.md).

Node b's flusher is paused where a test needs "b has not flushed yet"; what the tests
assert is what a job on any node sees (bytes, ETags, states, drains) and what the bucket
shows, and when.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from fleetutil import fleet_of, held_by, member, running, start_all, stop_all, until, wait_joined
from harness import (
    GATEWAY_ACCESS_KEY,
    GATEWAY_SECRET_KEY,
    REPO_ROOT,
    UPSTREAM_SECRET_KEY,
    GatewayProcess,
    crc32_b64,
    error_code,
    error_status,
    flush_state,
    http_request,
    payload,
    quoted_md5,
    read_body,
    send_signed,
    sign_request,
    upstream_client,
    upstream_objects,
)
from test_it_object_attributes import ALL, PART
from test_it_object_attributes import multipart as multipart_with_sums

from gateway.fleet import auth

NAMES = ("a", "b", "c")


@pytest.fixture(scope="module")
def fleet(moto_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    with running(fleet_of(tmp_path_factory.mktemp("fleet"), moto_server, NAMES), NAMES) as gateways:
        yield gateways


def _peer_url(gw: GatewayProcess, op: str, query: str = "") -> str:
    return f"{gw.endpoint}/_gateway/peer/v1/{op}" + (f"?{query}" if query else "")


def test_fleet_members_see_each_other(fleet: list[Any]) -> None:
    a, _, _ = fleet
    status = a.admin_get("/admin/v1/fleet")
    assert status["node"] == "a"
    assert sorted(m["node"] for m in status["members"]) == ["b", "c"]
    assert all(m["state"] == "reachable" for m in status["members"])
    assert a.status()["fleet"]["node"] == "a"  # also in the status JSON


def test_peer_api_refuses_anything_but_the_fleet_secret(fleet: list[Any], bucket: str) -> None:
    _, b, _ = fleet
    with b.flush_paused():
        b.client().put_object(Bucket=bucket, Key="secret/x", Body=b"pending on b")
        query = f"bucket={bucket}&key=secret/x"
        # Nothing, S3 credentials (what every job holds), or a wrong secret: 403, no body.
        plain = http_request("GET", _peer_url(b, "object", query))
        s3_signed = send_signed(sign_request("GET", _peer_url(b, "object", query)))
        path = "/_gateway/peer/v1/object"
        wrong = auth.sign(b"not the fleet secret", "GET", path, query, "a", time.time(), b"")
        forged = http_request("GET", _peer_url(b, "object", query), headers=wrong)
        for resp in (plain, s3_signed, forged):
            assert resp.status == 403, resp
            assert b"pending on b" not in resp.body
        # ... nor make it do anything: a goodbye "from a", signed with S3 credentials.
        body = b'{"node": "a", "datadir_id": "x", "started_s": 0, "zone": null}'
        bye = sign_request(
            "POST",
            _peer_url(b, "bye"),
            body=body,
            access_key=GATEWAY_ACCESS_KEY,
            secret_key=GATEWAY_SECRET_KEY,
        )
        assert send_signed(bye).status == 403
        assert member(b, "a")["state"] == "reachable"
        # The fleet's secret (derived from the shared upstream credentials) opens it.
        secret = auth.derive_secret(UPSTREAM_SECRET_KEY)
        ok = auth.sign(secret, "GET", path, query, "a", time.time(), b"")
        resp = http_request("GET", _peer_url(b, "object", query), headers=ok)
        assert resp.status == 200 and resp.body == b"pending on b"
    b.drained(bucket=bucket)


def test_reads_on_any_node_see_what_another_node_holds(fleet: list[Any], bucket: str) -> None:
    a, b, c = fleet
    key, data = "ckpt/step_1/rank_1.pt", payload(300_000, "rank1")
    with b.flush_paused():
        b.client().put_object(
            Bucket=bucket, Key=key, Body=data, Metadata={"rank": "1"}, ChecksumAlgorithm="CRC32"
        )
        for gw in (a, c):
            s3 = gw.client()
            got = s3.get_object(Bucket=bucket, Key=key)
            assert read_body(got) == data and got["ETag"] == quoted_md5(data)
            assert got["Metadata"] == {"rank": "1"}
            assert flush_state(got) == "pending"
            assert got["ResponseMetadata"]["HTTPHeaders"]["x-gateway-node"] == "b"
            head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
            assert head["ContentLength"] == len(data)
            assert head["ChecksumCRC32"] == crc32_b64(data)
            part = s3.get_object(Bucket=bucket, Key=key, Range="bytes=1000-1999")
            assert read_body(part) == data[1000:2000]
            assert part["ContentRange"] == f"bytes 1000-1999/{len(data)}"
            with pytest.raises(ClientError) as not_modified:
                s3.get_object(Bucket=bucket, Key=key, IfNoneMatch=quoted_md5(data))
            assert not_modified.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
            with pytest.raises(ClientError) as failed:
                s3.get_object(Bucket=bucket, Key=key, IfMatch='"0000"')
            assert error_code(failed.value) == "PreconditionFailed"
            listed = s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/")["Contents"]
            assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [
                (key, len(data), quoted_md5(data))
            ]
            dirs = s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/", Delimiter="/")
            assert [p["Prefix"] for p in dirs["CommonPrefixes"]] == ["ckpt/step_1/"]
        assert key not in upstream_objects(fleet_upstream(a), bucket)
    a.drained(bucket=bucket)  # fleet-wide: b flushed it
    assert read_body(a.client().get_object(Bucket=bucket, Key=key)) == data


def test_a_large_cross_node_read_is_spliced_byte_for_byte(fleet: list[Any], bucket: str) -> None:
    """The rest of a peer's answer goes from its socket to the client's with splice (no
    copy through the reading gateway): the bytes, whole and ranged, and the counter."""
    a, b, _ = fleet
    data = payload(12 << 20, "spliced")
    with b.flush_paused():
        b.client().put_object(Bucket=bucket, Key="big/spliced", Body=data)
        before = a.metric("gateway_get_body_bytes", 'how="splice"')
        s3 = a.client()
        got = s3.get_object(Bucket=bucket, Key="big/spliced")
        assert read_body(got) == data and got["ETag"] == quoted_md5(data)
        part = s3.get_object(Bucket=bucket, Key="big/spliced", Range="bytes=3000000-9999999")
        assert read_body(part) == data[3_000_000:10_000_000]
        spliced = a.metric("gateway_get_body_bytes", 'how="splice"') - before
        # All but what arrived with the peer's answer head (at most aiohttp's read buffer).
        assert len(data) + 7_000_000 - 2 * (4 << 20) <= spliced <= len(data) + 7_000_000


def fleet_upstream(gw: GatewayProcess) -> Any:
    return upstream_client(gw.upstream_url)


def test_a_peer_delete_is_a_delete_everywhere(fleet: list[Any], bucket: str) -> None:
    a, b, c = fleet
    a.client().put_object(Bucket=bucket, Key="d/k", Body=b"v1")
    a.drained(bucket=bucket)
    with b.flush_paused():
        b.client().delete_object(Bucket=bucket, Key="d/k")
        for gw in (a, c):
            with pytest.raises(ClientError) as gone:
                gw.client().get_object(Bucket=bucket, Key="d/k")
            assert error_code(gone.value) == "NoSuchKey"
            assert "Contents" not in gw.client().list_objects_v2(Bucket=bucket, Prefix="d/")
        assert "d/k" in upstream_objects(fleet_upstream(a), bucket)  # b has not flushed
    a.drained(bucket=bucket)
    assert "d/k" not in upstream_objects(fleet_upstream(a), bucket)


def test_a_peer_delete_is_a_delete_for_head_too(fleet: list[Any], bucket: str) -> None:
    """A HEAD's answer has no body, so the peer's "this version is a delete" travels in a
    header. It used to be read from the body: the answer was taken for a peer that did not
    answer, the peer was marked unreachable, and a node holding an older unflushed version
    served it (found by loadtest/fleet_soak.py)."""
    a, b, c = fleet
    with a.flush_paused(), b.flush_paused():
        a.client().put_object(Bucket=bucket, Key="hd/k", Body=b"v1")
        b.client().delete_object(Bucket=bucket, Key="hd/k")
        for gw in (a, b, c):
            with pytest.raises(ClientError) as gone:
                gw.client().head_object(Bucket=bucket, Key="hd/k")
            assert gone.value.response["Error"]["Code"] == "404"
            with pytest.raises(ClientError) as gone:
                gw.client().get_object(Bucket=bucket, Key="hd/k")
            assert error_code(gone.value) == "NoSuchKey"
        assert member(a, "b")["state"] == "reachable"
        assert member(c, "b")["state"] == "reachable"
    a.drained(bucket=bucket)
    assert "hd/k" not in upstream_objects(fleet_upstream(a), bucket)


def _sees(gw: GatewayProcess, bucket: str, key: str) -> tuple[str | None, str | None, bytes]:
    """(HEAD's ETag, LIST's ETag, GET's body) of ``key`` through ``gw`` (None: absent)."""
    s3 = gw.client()
    try:
        head: str | None = s3.head_object(Bucket=bucket, Key=key)["ETag"]
        body = read_body(s3.get_object(Bucket=bucket, Key=key))
    except ClientError:
        head, body = None, b""
    listed = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    return head, listed.get(key), body


def test_a_flushed_copy_gives_way_to_a_version_another_node_flushed(
    fleet: list[Any], bucket: str
) -> None:
    """a keeps its flushed versions as copies of the bucket's objects; b overwrites one and
    deletes another, and flushes both. a's copies were served over them, for as long as a
    kept them (found by loadtest/fleet_soak.py); a now checks a copy against the bucket
    once another node wrote in its directory."""
    a, b, _ = fleet
    a.client().put_object(Bucket=bucket, Key="fc/over", Body=b"one")
    a.client().put_object(Bucket=bucket, Key="fc/gone", Body=b"one")
    a.drained(bucket=bucket)
    assert _sees(a, bucket, "fc/over") == (quoted_md5(b"one"), quoted_md5(b"one"), b"one")
    b.client().put_object(Bucket=bucket, Key="fc/over", Body=b"two")
    b.client().delete_object(Bucket=bucket, Key="fc/gone")
    b.drained(bucket=bucket)
    assert _sees(a, bucket, "fc/over") == (quoted_md5(b"two"), quoted_md5(b"two"), b"two")
    assert _sees(a, bucket, "fc/gone") == (None, None, b"")
    assert a.metric("gateway_stale_copies_dropped") >= 2


def test_a_node_back_from_a_restart_does_not_serve_copies_overwritten_meanwhile(
    fleet: list[Any], bucket: str
) -> None:
    """a is down while b overwrites a key a holds a flushed copy of: a hears of no
    announcement, so every copy is checked once a is back (its leases start again)."""
    a, b, c = fleet
    a.client().put_object(Bucket=bucket, Key="rb/k", Body=b"one")
    a.drained(bucket=bucket)
    a.kill()
    try:
        b.client().put_object(Bucket=bucket, Key="rb/k", Body=b"two")
        until(lambda: upstream_objects(fleet_upstream(b), bucket).get("rb/k"), 30)
        time.sleep(3.0)  # b withdraws its directory: nothing is left to announce
    finally:
        a.start()
        wait_joined(fleet, NAMES)
    assert _sees(a, bucket, "rb/k") == (quoted_md5(b"two"), quoted_md5(b"two"), b"two")
    assert _sees(c, bucket, "rb/k") == (quoted_md5(b"two"), quoted_md5(b"two"), b"two")


def test_a_copy_on_one_node_of_what_another_holds(fleet: list[Any], bucket: str) -> None:
    a, b, _ = fleet
    data = payload(100_000, "copy-src")
    with b.flush_paused():
        b.client().put_object(Bucket=bucket, Key="cp/src", Body=data)
        copied = a.client().copy_object(
            Bucket=bucket, Key="cp/dst", CopySource={"Bucket": bucket, "Key": "cp/src"}
        )
        assert copied["CopyObjectResult"]["ETag"] == quoted_md5(data)
        assert read_body(a.client().get_object(Bucket=bucket, Key="cp/dst")) == data
        with pytest.raises(ClientError) as failed:
            a.client().copy_object(
                Bucket=bucket,
                Key="cp/dst2",
                CopySource={"Bucket": bucket, "Key": "cp/src"},
                CopySourceIfMatch='"0000"',
            )
        assert error_code(failed.value) == "PreconditionFailed"
    a.drained(bucket=bucket)
    assert upstream_objects(fleet_upstream(a), bucket)["cp/dst"]["ETag"] == quoted_md5(data)


def test_a_part_copied_on_one_node_from_what_another_holds(fleet: list[Any], bucket: str) -> None:
    """UploadPartCopy through a of a source b holds unflushed (and has overwritten a
    flushed version of): the part is b's bytes, its range and conditions checked against
    b's version. a read its own copy or the bucket's older version before."""
    a, b, _ = fleet
    old, data = payload(70_000, "part-old"), payload(300_000, "part-src")
    b.client().put_object(Bucket=bucket, Key="pc/src", Body=old)
    b.drained(bucket=bucket)
    s3 = a.client()
    assert read_body(s3.get_object(Bucket=bucket, Key="pc/src")) == old  # a's copy of it
    with b.flush_paused():
        b.client().put_object(Bucket=bucket, Key="pc/src", Body=data)
        b.client().delete_object(Bucket=bucket, Key="pc/gone")
        upload = s3.create_multipart_upload(Bucket=bucket, Key="pc/dst")["UploadId"]
        source = {"Bucket": bucket, "Key": "pc/src"}
        first = s3.upload_part_copy(
            Bucket=bucket, Key="pc/dst", UploadId=upload, PartNumber=1, CopySource=source,
            CopySourceRange="bytes=100000-299999", CopySourceIfMatch=quoted_md5(data),
        )  # fmt: skip
        assert first["CopyPartResult"]["ETag"] == quoted_md5(data[100_000:])
        whole = s3.upload_part_copy(
            Bucket=bucket, Key="pc/dst", UploadId=upload, PartNumber=2, CopySource=source
        )
        assert whole["CopyPartResult"]["ETag"] == quoted_md5(data)
        with pytest.raises(ClientError) as beyond:  # b's size, not the older version's
            s3.upload_part_copy(
                Bucket=bucket, Key="pc/dst", UploadId=upload, PartNumber=3, CopySource=source,
                CopySourceRange="bytes=250000-300000",
            )  # fmt: skip
        assert error_code(beyond.value) == "InvalidArgument"
        with pytest.raises(ClientError) as failed:
            s3.upload_part_copy(
                Bucket=bucket, Key="pc/dst", UploadId=upload, PartNumber=3, CopySource=source,
                CopySourceIfMatch=quoted_md5(old),
            )  # fmt: skip
        assert error_code(failed.value) == "PreconditionFailed"
        with pytest.raises(ClientError) as gone:  # deleted through b, not flushed yet
            s3.upload_part_copy(
                Bucket=bucket, Key="pc/dst", UploadId=upload, PartNumber=3,
                CopySource={"Bucket": bucket, "Key": "pc/gone"},
            )  # fmt: skip
        assert error_code(gone.value) == "NoSuchKey"
        parts = [{"PartNumber": 1, "ETag": first["CopyPartResult"]["ETag"]}]
        s3.complete_multipart_upload(
            Bucket=bucket, Key="pc/dst", UploadId=upload, MultipartUpload={"Parts": parts}
        )
        assert read_body(s3.get_object(Bucket=bucket, Key="pc/dst")) == data[100_000:]


def test_object_attributes_on_one_node_of_what_another_holds(fleet: list[Any], bucket: str) -> None:
    """GetObjectAttributes through a and c of versions b holds unflushed (over an older
    one in the bucket): b's ETag, size, checksum and parts, paged as asked; b's delete is
    NoSuchKey. a and c answered from the bucket (or a 404) before."""
    a, b, c = fleet
    b.client().put_object(Bucket=bucket, Key="oa/single", Body=b"old")
    b.drained(bucket=bucket)
    with b.flush_paused():
        body = payload(4096, "oa")
        put = b.client().put_object(
            Bucket=bucket, Key="oa/single", Body=body, ChecksumAlgorithm="SHA256"
        )
        done, sums = multipart_with_sums(b.client(), bucket, "oa/mpu", [PART, PART, 10])
        b.client().delete_object(Bucket=bucket, Key="oa/gone")
        for gw in (a, c):
            s3 = gw.client()
            one = s3.get_object_attributes(Bucket=bucket, Key="oa/single", ObjectAttributes=ALL)
            assert (one["ETag"], one["ObjectSize"]) == (put["ETag"].strip('"'), len(body))
            assert one["Checksum"]["ChecksumSHA256"] == put["ChecksumSHA256"]
            paged = s3.get_object_attributes(
                Bucket=bucket, Key="oa/mpu", ObjectAttributes=ALL, MaxParts=1, PartNumberMarker=1
            )
            assert paged["ETag"] == done["ETag"].strip('"') and paged["ObjectSize"] == 2 * PART + 10
            parts = paged["ObjectParts"]
            assert parts["TotalPartsCount"] == 3 and parts["IsTruncated"] is True
            assert [(p["PartNumber"], p["Size"], p["ChecksumSHA256"]) for p in parts["Parts"]] == [
                (2, PART, sums[1])
            ]
            with pytest.raises(ClientError) as gone:
                s3.get_object_attributes(Bucket=bucket, Key="oa/gone", ObjectAttributes=ALL)
            assert error_code(gone.value) == "NoSuchKey"


def test_conditional_writes_see_what_peers_hold(fleet: list[Any], bucket: str) -> None:
    a, b, _ = fleet
    with b.flush_paused():
        b.client().put_object(Bucket=bucket, Key="cond/k", Body=b"from b")
        with pytest.raises(ClientError) as exists:
            a.client().put_object(Bucket=bucket, Key="cond/k", Body=b"x", IfNoneMatch="*")
        assert error_code(exists.value) == "PreconditionFailed"
        a.client().put_object(
            Bucket=bucket, Key="cond/k", Body=b"from a", IfMatch=quoted_md5(b"from b")
        )
        # a's version is the newer one now, wherever it is read.
        assert read_body(b.client().get_object(Bucket=bucket, Key="cond/k")) == b"from a"
    a.drained(bucket=bucket)
    b.drained(bucket=bucket)
    assert read_body(fleet_upstream(a).get_object(Bucket=bucket, Key="cond/k")) == b"from a"


@pytest.mark.parametrize("then", ["deleted", "overwritten"])
def test_a_writers_own_older_version_gives_way_to_a_peers_newer_one_in_a_condition(
    fleet: list[Any], bucket: str, then: str
) -> None:
    """A key written through a, then deleted (or overwritten) through b, both unflushed:
    a conditional write through a goes by b's version, as S3 would. a's own row used to
    decide inside its commit (``If-None-Match: *`` refused 412 after a delete, ``If-Match``
    the deleted ETag written: found by loadtest/fleet_soak.py)."""
    a, b, _ = fleet
    key = f"cond-own/{then}"
    with a.flush_paused(), b.flush_paused():
        a.client().put_object(Bucket=bucket, Key=key, Body=b"older, through a")
        if then == "deleted":
            b.client().delete_object(Bucket=bucket, Key=key)
        else:
            b.client().put_object(Bucket=bucket, Key=key, Body=b"newer, through b")
        with pytest.raises(ClientError) as stale:
            a.client().put_object(
                Bucket=bucket, Key=key, Body=b"x", IfMatch=quoted_md5(b"older, through a")
            )
        assert error_code(stale.value) == (
            "NoSuchKey" if then == "deleted" else "PreconditionFailed"
        )
        if then == "deleted":
            a.client().put_object(Bucket=bucket, Key=key, Body=b"newest", IfNoneMatch="*")
        else:
            with pytest.raises(ClientError) as exists:
                a.client().put_object(Bucket=bucket, Key=key, Body=b"x", IfNoneMatch="*")
            assert error_code(exists.value) == "PreconditionFailed"
            a.client().put_object(
                Bucket=bucket, Key=key, Body=b"newest", IfMatch=quoted_md5(b"newer, through b")
            )
        assert read_body(b.client().get_object(Bucket=bucket, Key=key)) == b"newest"
    a.drained(bucket=bucket)
    b.drained(bucket=bucket)
    assert read_body(fleet_upstream(a).get_object(Bucket=bucket, Key=key)) == b"newest"


def test_a_conditional_delete_goes_by_what_another_node_holds(
    fleet: list[Any], bucket: str
) -> None:
    """DeleteObject with ``If-Match`` through a, of a version b holds unflushed: refused
    412 on another ETag, carried out on b's, and then a delete everywhere."""
    a, b, _ = fleet
    key = "cond-del/k"
    with b.flush_paused():
        b.client().put_object(Bucket=bucket, Key=key, Body=b"from b")
        with pytest.raises(ClientError) as stale:
            a.client().delete_object(Bucket=bucket, Key=key, IfMatch=quoted_md5(b"other"))
        assert error_code(stale.value) == "PreconditionFailed"
        a.client().delete_object(Bucket=bucket, Key=key, IfMatch=quoted_md5(b"from b"))
        with pytest.raises(ClientError) as gone:
            b.client().head_object(Bucket=bucket, Key=key)
        assert error_code(gone.value) == "404"
    a.drained(bucket=bucket)
    b.drained(bucket=bucket)
    with pytest.raises(ClientError):
        fleet_upstream(a).head_object(Bucket=bucket, Key=key)


def test_a_conditional_copy_goes_by_what_another_node_holds(fleet: list[Any], bucket: str) -> None:
    """CopyObject with ``If-None-Match: *`` / ``If-Match`` through a, onto a key b holds
    unflushed: refused 412 while b's version is there, carried out on its ETag."""
    a, b, _ = fleet
    a.client().put_object(Bucket=bucket, Key="cond-copy/src", Body=b"source")
    source = {"Bucket": bucket, "Key": "cond-copy/src"}
    with b.flush_paused():
        b.client().put_object(Bucket=bucket, Key="cond-copy/dst", Body=b"from b")
        with pytest.raises(ClientError) as exists:
            a.client().copy_object(
                Bucket=bucket, Key="cond-copy/dst", CopySource=source, IfNoneMatch="*"
            )
        assert error_code(exists.value) == "PreconditionFailed"
        a.client().copy_object(
            Bucket=bucket, Key="cond-copy/dst", CopySource=source, IfMatch=quoted_md5(b"from b")
        )
        assert read_body(b.client().get_object(Bucket=bucket, Key="cond-copy/dst")) == b"source"
    a.drained(bucket=bucket)
    b.drained(bucket=bucket)
    got = fleet_upstream(a).get_object(Bucket=bucket, Key="cond-copy/dst")
    assert read_body(got) == b"source"


def test_a_bucket_is_not_deleted_under_another_nodes_unflushed_writes(fleet: list[Any]) -> None:
    """DeleteBucket through a while b holds an acknowledged write in it is BucketNotEmpty,
    as S3 answers for a bucket holding an object: a checked only its own rows, deleted the
    bucket upstream, and b's write failed for ever (NoSuchBucket; found by
    loadtest/fuzz.py --fleet 3)."""
    a, b, _ = fleet
    name = "fleet-delete-bucket"
    a.client().create_bucket(Bucket=name)
    with b.flush_paused():
        b.client().put_object(Bucket=name, Key="k", Body=b"acked on b")
        with pytest.raises(ClientError) as refused:
            a.client().delete_bucket(Bucket=name)
        assert error_code(refused.value) == "BucketNotEmpty"
    b.drained(bucket=name)
    assert read_body(fleet_upstream(a).get_object(Bucket=name, Key="k")) == b"acked on b"
    b.client().delete_object(Bucket=name, Key="k")
    b.drained(bucket=name)
    a.client().delete_bucket(Bucket=name)  # empty everywhere now
    assert name not in [x["Name"] for x in fleet_upstream(a).list_buckets()["Buckets"]]


def test_concurrent_conditional_writes_through_three_nodes_have_one_winner(
    fleet: list[Any], bucket: str
) -> None:
    """The same key written at the same moment through each node, ``If-None-Match: *``,
    then ``If-Match`` the winner's ETag: exactly one write wins each round, as in S3 (a
    commit file of Delta Lake or Iceberg). Each node used to check its peers, see nothing
    and acknowledge: every key had two or three winners."""
    clients = [gw.client() for gw in fleet]

    def race(key: str, **cond: str) -> list[tuple[int, bytes]]:
        barrier = threading.Barrier(len(clients))
        results: list[tuple[int, bytes]] = []

        def write(n: int) -> None:  # (bodies unique: a write of the same bytes keeps the ETag)
            body = f"{key} {cond} through {NAMES[n]}".encode()
            barrier.wait()
            try:
                clients[n].put_object(Bucket=bucket, Key=key, Body=body, **cond)
                results.append((200, body))
            except ClientError as exc:
                results.append((error_status(exc), body))

        threads = [threading.Thread(target=write, args=(n,)) for n in range(len(clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    winners: dict[str, bytes] = {}
    for i in range(6):
        key = f"commit/{i:04d}.json"
        first = race(key, IfNoneMatch="*")
        assert sorted(s for s, _ in first) == [200, 412, 412], first
        (won,) = [body for s, body in first if s == 200]
        second = race(key, IfMatch=quoted_md5(won))
        assert sorted(s for s, _ in second) == [200, 412, 412], second
        (winners[key],) = [body for s, body in second if s == 200]
    for gw in fleet:
        gw.drained(bucket=bucket)
    upstream = fleet_upstream(fleet[0])
    for key, body in winners.items():
        assert read_body(upstream.get_object(Bucket=bucket, Key=key)) == body
        for gw in fleet:
            assert read_body(gw.client().get_object(Bucket=bucket, Key=key)) == body
    listed = upstream.list_objects_v2(Bucket=bucket, Prefix=".gateway/locks/")
    assert listed.get("KeyCount", 0) == len(winners)  # one lock object per key, released
    for gw in fleet:
        assert not any(
            o["Key"].startswith(".gateway/")
            for o in gw.client().list_objects_v2(Bucket=bucket).get("Contents", [])
        )


@pytest.mark.parametrize("older_on", ["a", "b"])
def test_an_older_version_on_a_slower_node_never_lands_over_a_newer_one(
    fleet: list[Any], bucket: str, older_on: str
) -> None:
    """One key through two nodes, the older version's node not flushing: the newer one's
    upload first has the slow node drop its older version (it would otherwise land later,
    over the newer one, and be served there meanwhile)."""
    a, b, _ = fleet
    slow, fast = (a, b) if older_on == "a" else (b, a)
    key = f"latest/{older_on}"
    with slow.flush_paused():
        slow.client().put_object(Bucket=bucket, Key=key, Body=b"step 100")
        fast.client().put_object(Bucket=bucket, Key=key, Body=b"step 200")
        until(lambda: fast.object_state(bucket, key)["state"] == "durable")
        for gw in (slow, fast):
            assert read_body(gw.client().get_object(Bucket=bucket, Key=key)) == b"step 200"
    slow.drained(bucket=bucket)
    fast.drained(bucket=bucket)
    assert read_body(fleet_upstream(a).get_object(Bucket=bucket, Key=key)) == b"step 200"
    for gw in (slow, fast):
        assert read_body(gw.client().get_object(Bucket=bucket, Key=key)) == b"step 200"


def test_marker_reaches_the_bucket_after_every_nodes_shards(fleet: list[Any], bucket: str) -> None:
    a, b, c = fleet
    upstream = fleet_upstream(a)
    shards = {f"ckpt/7/shard_{n}": payload(70_000, f"s7{n}") for n in NAMES}
    marker = "ckpt/7/.metadata"
    with b.flush_paused():
        for gw, (key, data) in zip(fleet, shards.items(), strict=True):
            gw.client().put_object(Bucket=bucket, Key=key, Body=data)
        a.client().put_object(Bucket=bucket, Key=marker, Body=b"meta")  # after the barrier
        until(lambda: a.object_state(bucket, "ckpt/7/shard_a")["state"] == "durable")
        until(lambda: c.object_state(bucket, "ckpt/7/shard_c")["state"] == "durable")
        until(lambda: "not yet durable" in str(_marker_state(a, bucket, marker)[1]))
        state, why = _marker_state(a, bucket, marker)
        assert state == "held" and str(why).startswith("b: 1 objects"), why
        drain = c.drain(bucket=bucket, prefix="ckpt/7/", wait=False)
        assert drain["drained"] is False
        by_node = {n["node"]: n for n in drain["nodes"]}
        assert by_node["b"]["pending_objects"] == 1 and by_node["a"]["pending_objects"] == 1
        assert marker not in upstream_objects(upstream, bucket)
        fleet_status = a.admin_get("/admin/v1/fleet")
        assert [h["key"] for h in fleet_status["held_markers"]] == [marker]
    # From here on the bucket must never show the marker without all three shards.
    deadline = time.monotonic() + 30
    while True:
        seen = upstream_objects(upstream, bucket, "ckpt/7/")
        if marker in seen:
            assert set(shards) <= set(seen), f"marker before its shards: {sorted(seen)}"
            break
        assert time.monotonic() < deadline, "the marker never reached the bucket"
    assert c.drained(bucket=bucket, prefix="ckpt/7/")["drained"]
    for key, data in shards.items():
        assert upstream_objects(upstream, bucket)[key]["ETag"] == quoted_md5(data)


def test_fleet_drain_waits_for_every_node(fleet: list[Any], bucket: str) -> None:
    a, b, _ = fleet
    with b.flush_paused():
        b.client().put_object(Bucket=bucket, Key="w/k", Body=b"b's")
        started = time.monotonic()
        drain = a.drain(bucket=bucket, prefix="w/", timeout=1)
        assert drain["drained"] is False and time.monotonic() - started >= 0.9
        assert drain["pending_objects"] == 1 and drain["unanswered_nodes"] == []
    assert a.drain(bucket=bucket, prefix="w/", timeout=30)["drained"] is True


# -------------------------------------------------------------- a node lost, or gone for good


@pytest.fixture
def pair(moto_server: str, tmp_path: Any) -> Iterator[list[Any]]:
    gateways = fleet_of(tmp_path, moto_server, ("a", "b"))
    try:
        start_all(gateways)
        wait_joined(gateways, ("a", "b"))
        yield gateways
    finally:
        stop_all(gateways)


def test_a_node_that_is_down_holds_the_marker_until_an_operator_releases_it(
    pair: list[Any], bucket: str
) -> None:
    a, b = pair
    upstream = fleet_upstream(a)
    b.pause_flush()
    b.client().put_object(Bucket=bucket, Key="lost/shard_b", Body=b"only on b")
    b.kill()
    a.client().put_object(Bucket=bucket, Key="lost/.metadata", Body=b"meta")
    until(lambda: "unreachable" in str(_marker_state(a, bucket, "lost/.metadata")[1]))
    state, why = _marker_state(a, bucket, "lost/.metadata")
    assert state == "held" and str(why).startswith("b: unreachable for"), why
    (held,) = a.admin_get(f"/admin/v1/checkpoints?bucket={bucket}&prefix=")["checkpoints"]
    assert held["state"] == "held" and held["state_text"].startswith("held: waiting on b:")
    # The list of peers changes (b dropped out of discovery): b is still waited on.
    a.stop()
    a.extra_args[a.extra_args.index("--peers") + 1] = f"127.0.0.1:{a.port}"  # itself alone
    a.start()
    assert member(a, "b") != {}  # remembered across the restart
    until(lambda: "unreachable" in str(_marker_state(a, bucket, "lost/.metadata")[1]))
    assert "lost/.metadata" not in upstream_objects(upstream, bucket)
    # An operator decides: publish it anyway (logged).
    out = subprocess.run(
        [
            *(sys.executable, "-m", "gateway", "release", "--admin", a.admin),
            *("--bucket", bucket, "--key", "lost/.metadata"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    until(lambda: "lost/.metadata" in upstream_objects(upstream, bucket))
    assert "released by an operator" in a.logged("released by an operator")


def test_a_node_back_with_an_empty_disk_keeps_the_marker_held(pair: list[Any], bucket: str) -> None:
    a, b = pair
    b.pause_flush()
    b.client().put_object(Bucket=bucket, Key="wiped/shard_b", Body=b"only on b")
    a.client().put_object(Bucket=bucket, Key="wiped/.metadata", Body=b"meta")
    until(lambda: "b:" in str(_marker_state(a, bucket, "wiped/.metadata")[1]))
    b.kill()
    shutil.rmtree(b.data_dir)
    b.start()  # empty: it answers "drained", but what it held is gone
    until(lambda: "new data dir" in str(_marker_state(a, bucket, "wiped/.metadata")[1]))
    assert "wiped/.metadata" not in upstream_objects(fleet_upstream(a), bucket)
    assert a.object_state(bucket, "wiped/.metadata")["state"] == "pending"


def test_a_node_back_with_its_disk_is_read_through_the_others_before_it_flushes(
    moto_server: str, tmp_path: Any, bucket: str
) -> None:
    """b restarts (kill -9) holding unflushed versions (a long write-back delay keeps them
    so): a reads them through b at once, not the bucket's older version or its 404."""
    upstream = upstream_client(moto_server)
    upstream.put_object(Bucket=bucket, Key="rs/k", Body=b"old")
    upstream.put_object(Bucket=bucket, Key="rs/gone", Body=b"deleted through b")
    gateways = fleet_of(tmp_path, moto_server, ("a", "b"), ("--write-back-delay", "120"))
    with running(gateways) as (a, b):
        wait_joined(gateways, ("a", "b"))
        b.client().put_object(Bucket=bucket, Key="rs/k", Body=b"new")
        b.client().put_object(Bucket=bucket, Key="rs/sub/only", Body=b"only on b")
        b.client().delete_object(Bucket=bucket, Key="rs/gone")
        b.restart(hard=True)
        wait_joined(gateways, ("a", "b"))
        s3 = a.client()
        got = s3.get_object(Bucket=bucket, Key="rs/k")
        assert read_body(got) == b"new" and got["ETag"] == quoted_md5(b"new")
        assert got["ResponseMetadata"]["HTTPHeaders"]["x-gateway-node"] == "b"
        assert read_body(s3.get_object(Bucket=bucket, Key="rs/sub/only")) == b"only on b"
        with pytest.raises(ClientError) as gone:
            s3.head_object(Bucket=bucket, Key="rs/gone")
        assert error_code(gone.value) in ("404", "NoSuchKey")
        listed = s3.list_objects_v2(Bucket=bucket, Prefix="rs/")["Contents"]
        assert [(o["Key"], o["ETag"]) for o in listed] == [
            ("rs/k", quoted_md5(b"new")),
            ("rs/sub/only", quoted_md5(b"only on b")),
        ]
        assert upstream_objects(upstream, bucket)["rs/k"]["ETag"] == quoted_md5(b"old")
        for gw in gateways:
            gw.kill()  # a graceful stop would drain, and wait out the write-back delay


def test_a_node_back_with_its_disk_never_uploads_over_a_newer_version(
    pair: list[Any], bucket: str
) -> None:
    """b holds an unflushed version when it is killed; the key is written through a and
    flushed while b is down (b is nobody's candidate then: a asks it nothing). Back with
    its disk, b compares its older version with the bucket's and drops it: it went up over
    a's newer one before (found in the fleet simulator)."""
    a, b = pair
    b.pause_flush()
    b.client().put_object(Bucket=bucket, Key="rn/k", Body=b"older, through b")
    b.kill()
    until(lambda: member(a, "b").get("state") == "unreachable", 20)
    time.sleep(2.5)  # later than the rule's margin for the two clocks (2 s)
    a.client().put_object(Bucket=bucket, Key="rn/k", Body=b"newer, through a")
    newer = quoted_md5(b"newer, through a")
    upstream = fleet_upstream(a)
    until(lambda: upstream_objects(upstream, bucket).get("rn/k", {}).get("ETag") == newer, 30)
    # a withdraws its directory: b's flusher then has nobody to ask about the key
    until(lambda: a.admin_get("/admin/v1/fleet")["announced_directories"] == 0, 20)
    b.start()  # its flusher runs again (a pause is not kept across a restart)
    wait_joined([a, b], ("a", "b"))
    until(lambda: b.status()["pending_objects"] == 0, 30)
    assert upstream_objects(upstream, bucket)["rn/k"]["ETag"] == newer
    for gw in (a, b):
        assert read_body(gw.client().get_object(Bucket=bucket, Key="rn/k")) == b"newer, through a"
    assert "goes instead" in b.logged("goes instead")


def test_a_node_back_with_its_disk_never_uploads_over_a_delete_made_meanwhile(
    pair: list[Any], bucket: str
) -> None:
    """As above with a delete: b holds an unflushed PUT when it is killed, and the key is
    deleted through a and flushed while b is down. The bucket keeps nothing of a delete:
    b, back with its disk, found no object and uploaded its older version over the delete
    (without replicas). a noted the delete in the key's claims (b could not be asked);
    b finds it there, serves nothing of its version and drops it."""
    a, b = pair
    upstream = fleet_upstream(a)
    upstream.put_object(Bucket=bucket, Key="rd/k", Body=b"v1")
    b.pause_flush()
    b.client().put_object(Bucket=bucket, Key="rd/k", Body=b"v2, through b")
    b.kill()
    until(lambda: member(a, "b").get("state") == "unreachable", 20)
    a.client().delete_object(Bucket=bucket, Key="rd/k")
    until(lambda: "rd/k" not in upstream_objects(upstream, bucket), 30)
    until(lambda: a.admin_get("/admin/v1/fleet")["announced_directories"] == 0, 20)
    b.start()  # its flusher runs again (a pause is not kept across a restart)
    wait_joined([a, b], ("a", "b"))
    for gw in (b, a):
        with pytest.raises(ClientError) as gone:
            gw.client().head_object(Bucket=bucket, Key="rd/k")
        assert error_code(gone.value) in ("404", "NoSuchKey")
    until(lambda: b.status()["pending_objects"] == 0, 30)
    assert "rd/k" not in upstream_objects(upstream, bucket)
    assert "goes instead" in b.logged("goes instead")


def _marker_state(gw: GatewayProcess, bucket: str, key: str) -> tuple[str | None, str | None]:
    return held_by(gw.client().head_object(Bucket=bucket, Key=key))


def test_checkpoints_answer_for_the_whole_fleet(fleet: list[Any], bucket: str) -> None:
    a, b, c = fleet
    with b.flush_paused():
        a.client().put_object(Bucket=bucket, Key="run/5/shard_a", Body=b"a" * 1000)
        b.client().put_object(Bucket=bucket, Key="run/5/shard_b", Body=b"b" * 2000)
        a.client().put_object(Bucket=bucket, Key="run/5/.metadata", Body=b"meta")
        until(lambda: a.object_state(bucket, "run/5/shard_a")["state"] == "durable")

        def step() -> dict[str, Any]:
            doc = c.admin_get(f"/admin/v1/checkpoints?bucket={bucket}&prefix=run/")
            (checkpoint,) = doc["checkpoints"]
            return dict(checkpoint)

        # b is paused, not lost: complete, not durable yet (waiting will see it durable).
        pending = until(lambda: (s := step())["unflushed_objects"] == 2 and s)
        assert pending["complete"] is True and pending["durable"] is False
        assert pending["state"] == "complete", pending
        assert pending["state_text"] == "complete in the fleet"
        # Asked on c, which holds nothing: a's marker and b's shard, summed.
        assert pending["unflushed_bytes"] == 2004 and pending["unanswered_nodes"] == []
        waiting = subprocess.run(
            [
                *(sys.executable, "-m", "gateway", "checkpoints", "--admin", c.admin),
                *("--bucket", bucket, "--prefix", "run/", "--wait", "--timeout", "1"),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert waiting.returncode == 3, waiting.stdout + waiting.stderr
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gateway", "checkpoints", "--admin", c.admin),
            *("--bucket", bucket, "--prefix", "run/", "--wait", "--timeout", "60"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "durable in the bucket" in done.stdout


def test_a_peer_dying_mid_read_cuts_the_body_never_completes_it_short(
    pair: list[Any], bucket: str
) -> None:
    a, b = pair
    data = payload(48 << 20, "big")
    b.pause_flush()
    b.client().put_object(Bucket=bucket, Key="big/obj", Body=data)
    got = a.client().get_object(Bucket=bucket, Key="big/obj")
    assert got["ContentLength"] == len(data)
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-gateway-node"] == "b"
    body = got["Body"]
    first = body.read(1 << 20)
    assert first == data[: 1 << 20]
    b.kill()
    with pytest.raises(Exception) as cut:  # botocore: IncompleteRead / ResponseStreamingError
        rest = body.read()
        assert len(first) + len(rest) == len(data)  # only if the whole body had been buffered
        raise AssertionError("the body was already complete when b died")
    assert "AssertionError" not in type(cut.value).__name__, cut.value
    # a keeps serving; b's data is not in the bucket, so a read now falls back to it: 404.
    started = time.monotonic()
    with pytest.raises(ClientError) as gone:
        a.client().get_object(Bucket=bucket, Key="big/obj")
    assert error_code(gone.value) == "NoSuchKey"
    assert time.monotonic() - started < 5.0  # within the peer read deadline (2 s) and then some
