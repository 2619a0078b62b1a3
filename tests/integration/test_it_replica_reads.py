"""Reads while a writer is lost and after its takeover, over real sockets (docs/fleet.md,
"Takeover", on reads): three gateway processes with ``--replicas 1`` on one moto
upstream. A replica is the newest version only until the bucket holds a newer one; a copy
checked during the loss is checked again after the takeover lands.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from fleetutil import fleet_of, member, running, until, wait_joined
from harness import GatewayProcess, error_code, quoted_md5, read_body, upstream_client
from test_it_replicas import data_objects, replicas_held

NAMES = ("a", "b", "c")


def _trio(tmp_path: Path, moto_server: str, peer_timeout_s: float) -> list[GatewayProcess]:
    args = ("--replicas", "1", "--peer-timeout", str(peer_timeout_s))
    return fleet_of(tmp_path, moto_server, NAMES, args)


@pytest.fixture
def slow_takeover(moto_server: str, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    """A takeover 60 s after a loss: reads during the loss have time to go wrong."""
    with running(_trio(tmp_path, moto_server, 60.0), NAMES, kill=True) as gateways:
        yield gateways


def _etag(gw: GatewayProcess, bucket: str, key: str) -> tuple[str, str, bytes]:
    s3 = gw.client()
    got = s3.get_object(Bucket=bucket, Key=key)
    return s3.head_object(Bucket=bucket, Key=key)["ETag"], got["ETag"], read_body(got)


def test_a_lost_writers_replica_gives_way_to_a_newer_version_in_the_bucket(
    slow_takeover: list[GatewayProcess], bucket: str
) -> None:
    """b is lost holding v2 (only its replica is left, on h); h writes v3 after it and
    flushes it. Reads anywhere get v3: the replica of v2, older than what the bucket holds,
    was served over it until the takeover (which does not upload it)."""
    a, b, c = slow_takeover
    b.pause_flush()
    b.client().put_object(Bucket=bucket, Key="rg/k", Body=b"v2 on b")
    [holder] = [gw for gw in (a, c) if ("b", "rg/k") in replicas_held(gw)]
    b.kill()
    until(lambda: member(a, "b").get("state") == "unreachable", 20)
    until(lambda: member(c, "b").get("state") == "unreachable", 20)
    holder.client().put_object(Bucket=bucket, Key="rg/k", Body=b"v3")
    new = quoted_md5(b"v3")
    upstream = upstream_client(a.upstream_url)
    until(lambda: data_objects(upstream, bucket, "rg/").get("rg/k", {}).get("ETag") == new, 30)
    assert ("b", "rg/k") in replicas_held(holder)  # not taken over yet
    for gw in (a, c, a, c):
        assert _etag(gw, bucket, "rg/k") == (new, new, b"v3")


def test_copies_checked_during_a_loss_are_checked_again_after_its_takeover(
    moto_server: str, tmp_path: Path, bucket: str
) -> None:
    """a and c hold flushed copies of v1; b writes v2 and is lost; reads during the loss
    get v2 from its replica (and check the copies: still v1 in the bucket). Once the
    takeover has put v2 in the bucket and the replica is gone, a and c read v2 (they served
    their v1 copies while the holder that uploaded it announced nothing)."""
    with running(_trio(tmp_path, moto_server, 4.5), NAMES, kill=True) as (a, b, c):
        a.client().put_object(Bucket=bucket, Key="tc/k", Body=b"v1")
        a.drained(bucket=bucket)
        v1, v2 = quoted_md5(b"v1"), quoted_md5(b"v2 on b")
        assert _etag(c, bucket, "tc/k") == (v1, v1, b"v1")  # c's read-through copy
        b.pause_flush()
        b.client().put_object(Bucket=bucket, Key="tc/k", Body=b"v2 on b")
        b.kill()
        until(lambda: member(a, "b").get("state") == "unreachable", 20)
        until(lambda: member(c, "b").get("state") == "unreachable", 20)
        for gw in (a, c):
            assert _etag(gw, bucket, "tc/k") == (v2, v2, b"v2 on b")
        upstream = upstream_client(a.upstream_url)
        until(lambda: data_objects(upstream, bucket, "tc/").get("tc/k", {}).get("ETag") == v2, 60)
        until(lambda: not any(("b", "tc/k") in replicas_held(gw) for gw in (a, c)), 30)
        for gw in (a, c, a, c):
            assert _etag(gw, bucket, "tc/k") == (v2, v2, b"v2 on b")


def test_a_writer_back_with_its_disk_never_serves_a_version_deleted_meanwhile(
    moto_server: str, tmp_path: Path, bucket: str
) -> None:
    """b holds an unflushed PUT (a long write-back delay) and is killed; the key is
    deleted through a, which flushes the delete once b's lease runs out (b can no longer
    be asked). b comes back with its disk before any takeover: every node answers 404 at
    once. b's older version was served through every node until b's flusher got to it
    (found by loadtest/fleet_soak.py: a read of a deleted key through a node with every
    member up)."""
    gateways = _trio(tmp_path, moto_server, 60.0)
    a, b, c = gateways
    b.extra_args += ["--write-back-delay", "60"]
    upstream = upstream_client(a.upstream_url)
    upstream.put_object(Bucket=bucket, Key="rd/k", Body=b"v1 in the bucket")
    with running(gateways, NAMES, kill=True):
        b.client().put_object(Bucket=bucket, Key="rd/k", Body=b"v2 on b")
        assert _etag(c, bucket, "rd/k")[2] == b"v2 on b"
        b.kill()
        until(lambda: member(a, "b").get("state") == "unreachable", 20)
        a.client().delete_object(Bucket=bucket, Key="rd/k")
        until(lambda: "rd/k" not in data_objects(upstream, bucket, "rd/"), 30)
        b.start()
        wait_joined(gateways, NAMES)
        for gw in (a, b, c):
            with pytest.raises(ClientError) as gone:
                gw.client().head_object(Bucket=bucket, Key="rd/k")
            assert error_code(gone.value) in ("404", "NoSuchKey")
            with pytest.raises(ClientError) as gone:
                gw.client().get_object(Bucket=bucket, Key="rd/k")
            assert error_code(gone.value) == "NoSuchKey"
        assert b.status()["pending_objects"] == 1  # not flushed yet: the delay holds it


def test_a_writer_back_with_an_empty_disk_reads_what_it_wrote_before_from_its_replicas(
    moto_server: str, tmp_path: Path, bucket: str
) -> None:
    """b writes v2 over the bucket's v1 and is killed before flushing it; its disk is
    wiped and it comes back empty (a pod on an emptyDir). Reads and copies through b get
    v2 from its replica at once, as reads through the others do: b read the bucket's v1
    (found by loadtest/fleet_soak.py: a copy through a node just back with a new disk
    copied an older source). The others told b, in its first leases, of the data dir it
    had before."""
    gateways = _trio(tmp_path, moto_server, 60.0)
    a, b, _ = gateways
    upstream = upstream_client(a.upstream_url)
    upstream.put_object(Bucket=bucket, Key="rw/k", Body=b"v1")
    with running(gateways, NAMES, kill=True):
        b.pause_flush()
        b.client().put_object(Bucket=bucket, Key="rw/k", Body=b"v2 on b")
        b.kill()
        shutil.rmtree(b.data_dir)
        b.start()
        v2 = quoted_md5(b"v2 on b")
        assert _etag(b, bucket, "rw/k") == (v2, v2, b"v2 on b")
        s3 = b.client()
        copied = s3.copy_object(
            Bucket=bucket, Key="rw/copy", CopySource={"Bucket": bucket, "Key": "rw/k"}
        )
        assert copied["CopyObjectResult"]["ETag"] == v2
        assert "data dir" in b.logged("data dir it had before")
