"""Replicas before the ack and takeover (docs/fleet.md, "Node loss") over real sockets:
three gateway processes with ``--replicas 1`` on one moto upstream; a writer killed (and
its disk wiped) mid-burst; every acknowledged object ends upstream with its ETag, exactly
once, the commit marker after its shards. And with ``--replicas 2``, two writers lost at
once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from awscrt import checksums as crt_checksums
from botocore.exceptions import ClientError
from fleetutil import fleet_of, start_all, stop_all, until, wait_joined
from harness import (
    REPO_ROOT,
    UPSTREAM_SECRET_KEY,
    GatewayProcess,
    error_code,
    error_status,
    http_request,
    payload,
    quoted_md5,
    read_body,
    upstream_client,
)

from gateway.fleet import auth
from gateway.fleet.replication import rank
from gateway.fleet.wire import ReplicaCommit
from gateway.models import ObjectMeta

REPLICAS = ("--replicas", "1", "--peer-timeout", "4.5")
CONTROL = ".gateway/"


def data_objects(upstream: Any, bucket: str, prefix: str = "") -> dict[str, dict[str, Any]]:
    """The bucket's objects, the fleet's own claims left out."""
    out: dict[str, dict[str, Any]] = {}
    for page in upstream.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            if not obj["Key"].startswith(CONTROL):
                out[obj["Key"]] = obj
    return out


def landed_marker_last(upstream: Any, bucket: str, step: str, shards: dict[str, bytes]) -> None:
    """Wait (60 s at most) for ``step``'s marker in the bucket, which must never show
    before every shard; then each shard holds its bytes under its ETag."""
    deadline = time.monotonic() + 60
    while True:
        seen = data_objects(upstream, bucket, step)
        if f"{step}.metadata" in seen:
            assert set(shards) <= set(seen), sorted(set(shards) - set(seen))
            break
        assert time.monotonic() < deadline, f"not taken over: {sorted(seen)}"
    for key, data in shards.items():
        assert seen[key]["ETag"] == quoted_md5(data), key
        assert read_body(upstream.get_object(Bucket=bucket, Key=key)) == data


def replicas_held(gw: GatewayProcess) -> list[tuple[str, str]]:
    """(writer, key) of every replica ``gw`` holds (its journal, read-only)."""
    conn = sqlite3.connect(f"file:{gw.data_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        return [(str(o), str(k)) for o, k in conn.execute("SELECT owner, key FROM replicas")]
    finally:
        conn.close()


def staged_sums(gw: GatewayProcess, key: str) -> list[tuple[str, int]]:
    """(md5, crc32c) of each body ``gw`` staged for ``key`` (its journal, read-only)."""
    conn = sqlite3.connect(f"file:{gw.data_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT md5, crc32c FROM replica_bodies WHERE key = ?", (key,))
        return [(str(m), int(c)) for m, c in rows]
    finally:
        conn.close()


def multipart_put(s3: Any, bucket: str, key: str, parts: list[bytes]) -> str:
    """A multipart upload of ``parts``, completed: its ETag."""
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    done = [
        {"PartNumber": n, "ETag": s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=n, Body=body
        )["ETag"]}
        for n, body in enumerate(parts, 1)
    ]  # fmt: skip
    return str(
        s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": done}
        )["ETag"]
    )


@pytest.fixture
def trio(moto_server: str, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    gateways = fleet_of(tmp_path, moto_server, ("a", "b", "c"), REPLICAS)
    try:
        start_all(gateways)
        wait_joined(gateways, ("a", "b", "c"))
        yield gateways
    finally:
        stop_all(gateways)


def test_an_ack_means_a_replica_is_durable_on_a_member(
    trio: list[GatewayProcess], bucket: str
) -> None:
    a, b, c = trio
    b.pause_flush()
    keys = [f"rep/{i}" for i in range(6)]
    for key in keys:
        b.client().put_object(Bucket=bucket, Key=key, Body=payload(5000, key))
    held = {k for gw in (a, c) for owner, k in replicas_held(gw) if owner == "b"}
    assert held == set(keys)  # each on exactly the member rendezvous hashing chose
    assert not replicas_held(b)

    def held_for_b(gw: GatewayProcess) -> int:
        rep = gw.admin_get("/admin/v1/fleet")["replicas"]
        return sum(int(h["objects"]) for h in rep["held_for"] if h["writer"] == "b")

    # The status says it too (refreshed by the holders' loop every 5 s).
    until(lambda: held_for_b(a) + held_for_b(c) == len(keys), 20)
    shown = subprocess.run(
        [sys.executable, "-m", "gateway", "fleet", "--admin", a.admin],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert "replicas: 1 per write (strict)" in shown.stdout, shown.stdout
    b.resume_flush()
    b.drained(bucket=bucket)
    # Once durable upstream the holders drop them (they ask the writer every 30 s; a
    # restart of the holders' loop is not waited for here): the writer no longer needs them.
    upstream = upstream_client(b.upstream_url)
    assert {k: o["ETag"] for k, o in data_objects(upstream, bucket).items()} == {
        k: quoted_md5(payload(5000, k)) for k in keys
    }


def write_shards(
    gateways: list[GatewayProcess], bucket: str, prefix: str, per_node: int
) -> dict[str, bytes]:
    """``per_node`` shards through each gateway (``<prefix><node>_<i>``): the last one
    streamed (over the inline size), the rest inline. Key -> body."""
    shards = {}
    for gw in gateways:
        for i in range(per_node):
            key = f"{prefix}{gw.data_dir.name}_{i}"
            shards[key] = payload(200_000 + i if i == per_node - 1 else 3000 + i, key)
            gw.client().put_object(Bucket=bucket, Key=key, Body=shards[key])
    return shards


def test_the_writer_lost_with_its_disk_mid_burst_loses_nothing(
    trio: list[GatewayProcess], bucket: str
) -> None:
    a, b, c = trio
    upstream = upstream_client(b.upstream_url)
    b.pause_flush()
    shards = write_shards(trio, bucket, "ckpt/9/", 4)
    a.client().put_object(Bucket=bucket, Key="ckpt/9/.metadata", Body=b"meta")
    # The holder of b's streamed shard checked it by its CRC32C, with no MD5 pass.
    streamed = "ckpt/9/b_3"
    [(md5, crc)] = [
        row for gw in (a, c) for row in staged_sums(gw, streamed)
    ]  # fmt: skip
    assert (md5, crc) == ("", crt_checksums.crc32c(shards[streamed]))
    b.kill()
    shutil.rmtree(b.data_dir)  # the node is gone with its disk
    landed_marker_last(upstream, bucket, "ckpt/9/", shards)
    taken = a.metric("gateway_takeovers") + c.metric("gateway_takeovers")
    assert taken == 4  # b's four shards, each by exactly one holder


def test_two_replicas_survive_two_writers_lost_with_their_disks_at_once(
    moto_server: str, tmp_path: Path, bucket: str
) -> None:
    """``--replicas 2`` over three gateways: every write is on all three before its ack.
    Two writers are killed and wiped at the same moment with their shards unflushed; the
    one left takes them all over, each once, and the marker lands after them."""
    two = ("--replicas", "2", "--peer-timeout", "4.5")
    trio = fleet_of(tmp_path, moto_server, ("a", "b", "c"), two)
    try:
        start_all(trio)
        wait_joined(trio, ("a", "b", "c"))
        a, b, c = trio
        upstream = upstream_client(a.upstream_url)
        b.pause_flush()
        c.pause_flush()
        shards = write_shards(trio, bucket, "ckpt/7/", 3)
        b.client().put_object(Bucket=bucket, Key="ckpt/7/.metadata", Body=b"meta")
        held = replicas_held(a)
        assert {k for o, k in held if o == "b"} >= {k for k in shards if "/b_" in k}
        assert {k for o, k in held if o == "c"} >= {k for k in shards if "/c_" in k}
        b.kill()
        c.kill()
        shutil.rmtree(b.data_dir)
        shutil.rmtree(c.data_dir)
        landed_marker_last(upstream, bucket, "ckpt/7/", shards)
        # b's and c's shards and b's marker, each once (counted after its done mark,
        # which may follow the upload by a moment)
        until(lambda: a.metric("gateway_takeovers") >= 7, 10)
        time.sleep(1.0)
        assert a.metric("gateway_takeovers") == 7
    finally:
        stop_all(trio)


def test_versions_committed_beside_the_writers_own_take_over_as_the_newest_only(
    trio: list[GatewayProcess], bucket: str
) -> None:
    """A PutObject's holder commits it beside the writer's own commit (early): the older
    version of the key stays beside it there (the early one might never have committed on
    the writer). A takeover uploads the newest of the key, once, and drops the older."""
    a, b, c = trio
    upstream = upstream_client(b.upstream_url)
    b.pause_flush()
    versions = [payload(4000 + i, f"v{i}") for i in range(3)]
    for body in versions:
        b.client().put_object(Bucket=bucket, Key="early/k", Body=body)
    holder = next(gw for gw in (a, c) if ("b", "early/k") in replicas_held(gw))
    conn = sqlite3.connect(f"file:{holder.data_dir / 'journal.db'}?mode=ro", uri=True)
    try:
        held = conn.execute("SELECT seq, is_early FROM replicas WHERE key = 'early/k'").fetchall()
    finally:
        conn.close()
    assert len(held) == 3 and all(early for _, early in held), held
    b.kill()
    shutil.rmtree(b.data_dir)
    until(lambda: "early/k" in data_objects(upstream, bucket), 60)
    until(lambda: not replicas_held(holder), 30)
    got = upstream.get_object(Bucket=bucket, Key="early/k")
    assert read_body(got) == versions[-1] and got["ETag"] == quoted_md5(versions[-1])
    assert a.metric("gateway_takeovers") + c.metric("gateway_takeovers") == 1


def test_a_writer_back_with_its_disk_does_not_upload_what_was_taken_over(
    trio: list[GatewayProcess], bucket: str
) -> None:
    _, b, _ = trio
    upstream = upstream_client(b.upstream_url)
    b.pause_flush()
    b.client().put_object(Bucket=bucket, Key="back/k", Body=b"from b")
    b.kill()
    until(lambda: "back/k" in data_objects(upstream, bucket), 60)
    b.start()  # its flusher resumes (the pause is not kept across a restart)
    until(lambda: b.object_state(bucket, "back/k")["state"] == "durable", 30)
    assert "was uploaded by another gateway" in b.logged("was uploaded by another gateway")
    assert read_body(upstream.get_object(Bucket=bucket, Key="back/k")) == b"from b"


def test_reads_of_a_lost_writers_objects_come_from_its_replicas(
    trio: list[GatewayProcess], bucket: str
) -> None:
    a, b, c = trio
    b.pause_flush()
    data = payload(200_000, "lost-read")
    b.client().put_object(Bucket=bucket, Key="lr/k", Body=data)
    b.kill()
    until(lambda: a.admin_get("/admin/v1/fleet")["members"][0]["state"] == "unreachable", 20)
    got = c.client().get_object(Bucket=bucket, Key="lr/k", Range="bytes=100-199")
    assert read_body(got) == data[100:200]
    whole = a.client().get_object(Bucket=bucket, Key="lr/k")
    assert read_body(whole) == data and whole["ETag"] == quoted_md5(data)


def test_a_lost_writers_newer_version_is_read_over_an_older_one_held_here(
    trio: list[GatewayProcess], bucket: str
) -> None:
    """a holds an older unflushed version of the key, b a newer one, and b is lost. Reads
    and copies through a and c get b's version from its replica, from the kill on (before
    the takeover): a served its own older version (found by loadtest/fleet_soak.py)."""
    a, b, c = trio
    a.pause_flush()
    b.pause_flush()
    old, new = payload(3000, "older"), payload(5000, "newer")
    a.client().put_object(Bucket=bucket, Key="nv/k", Body=old)
    b.client().put_object(Bucket=bucket, Key="nv/k", Body=new)
    b.kill()
    # b still a candidate here: it does not answer. c may also have chosen b to hold the
    # copy's replica, before it noticed b is gone: that write is answered 500 (committed
    # here, short of its replica, topped up later), and an SDK retries it, as this client
    # does (the harness's clients used to retry once without saying so).
    copied = c.client(retries=3).copy_object(
        Bucket=bucket, Key="nv/copy-c", CopySource={"Bucket": bucket, "Key": "nv/k"}
    )
    assert copied["CopyObjectResult"]["ETag"] == quoted_md5(new)
    for gw in (a, c, a):
        assert gw.client().head_object(Bucket=bucket, Key="nv/k")["ETag"] == quoted_md5(new)
        assert read_body(gw.client().get_object(Bucket=bucket, Key="nv/k")) == new
    copied = a.client().copy_object(
        Bucket=bucket, Key="nv/copy", CopySource={"Bucket": bucket, "Key": "nv/k"}
    )
    assert copied["CopyObjectResult"]["ETag"] == quoted_md5(new)
    with pytest.raises(ClientError) as stale:  # a conditional write sees b's version too
        a.client().put_object(Bucket=bucket, Key="nv/k", Body=b"x", IfMatch=quoted_md5(old))
    assert error_status(stale.value) == 412
    a.resume_flush()  # its older version may go up first: b's is taken over after it

    def newest_there() -> bool:
        there = data_objects(upstream_client(a.upstream_url), bucket, "nv/")
        return there.get("nv/k", {}).get("ETag") == quoted_md5(new)

    until(newest_there, 60)
    until(lambda: a.status()["pending_objects"] == 0 == c.status()["pending_objects"], 30)
    assert newest_there()  # and nothing older went up after it


def test_a_writer_back_with_an_empty_disk_is_read_from_its_replicas_until_taken_over(
    trio: list[GatewayProcess], bucket: str
) -> None:
    """a is wiped and back at once: it answers again, holding nothing, and its versions
    live only in replicas until taken over. Reads through b and c found nothing there for
    a few seconds, and answered 404 (found by loadtest/fleet_soak.py)."""
    a, b, c = trio
    a.pause_flush()
    bodies = {f"wb/k{i}": payload(2000, f"wb{i}") for i in range(3)}
    for key, body in bodies.items():
        a.client().put_object(Bucket=bucket, Key=key, Body=body)
    a.kill()
    shutil.rmtree(a.data_dir)
    a.start()
    for gw in (b, c, b):
        for key, body in bodies.items():
            assert gw.client().head_object(Bucket=bucket, Key=key)["ETag"] == quoted_md5(body)


def test_older_versions_pending_anywhere_give_way_to_a_version_taken_over(
    moto_server: str, tmp_path: Path, bucket: str
) -> None:
    """a and c hold older unflushed versions of a key, b the newest, and b is lost; its
    holder takes b's version over before a and c flush (the holder's own is kept by a
    write-back delay, the other's by a paused flusher: a paused holder takes nothing
    over). Neither older version may go up after it: they went over it (found on a busy
    machine by the test above, when the takeover came before the holder's own older
    upload). The takeover now asks the key's candidates, and its own row, to give way
    first, as b's own upload would have."""
    gateways = fleet_of(tmp_path, moto_server, ("a", "b", "c"), REPLICAS)
    by_name = dict(zip(("a", "b", "c"), gateways, strict=True))
    key = "tk/k"
    holder_name = max(("a", "c"), key=lambda n: rank(n, bucket, key))  # b's choice
    holder = by_name[holder_name]
    other = by_name["c" if holder_name == "a" else "a"]
    holder.extra_args += ["--write-back-delay", "20"]
    start_all(gateways)
    try:
        wait_joined(gateways, ("a", "b", "c"))
        b = by_name["b"]
        other.pause_flush()
        b.pause_flush()
        holder.client().put_object(Bucket=bucket, Key=key, Body=b"oldest, on the holder")
        other.client().put_object(Bucket=bucket, Key=key, Body=b"older, on the other")
        b.client().put_object(Bucket=bucket, Key=key, Body=b"newest, on b")
        assert ("b", key) in replicas_held(holder)
        newest = quoted_md5(b"newest, on b")
        b.kill()
        upstream = upstream_client(holder.upstream_url)
        until(lambda: data_objects(upstream, bucket, "tk/").get(key, {}).get("ETag") == newest, 30)
        other.resume_flush()
        for gw in (holder, other):  # withdrawn: nothing of theirs left to go up
            until(lambda gw=gw: gw.status()["pending_objects"] == 0, 10)
        assert data_objects(upstream, bucket, "tk/")[key]["ETag"] == newest
        for gw in (holder, other):
            assert read_body(gw.client().get_object(Bucket=bucket, Key=key)) == b"newest, on b"
    finally:
        for gw in gateways:
            gw.kill()


def test_strict_refuses_what_cannot_be_replicated_and_degrade_acknowledges_it(
    moto_server: str, tmp_path: Path, bucket: str
) -> None:
    pair = fleet_of(tmp_path / "strict", moto_server, ("a", "b"), REPLICAS)
    start_all(pair)
    try:
        wait_joined(pair, ("a", "b"))
        pair[1].kill()
        until(lambda: pair[0].admin_get("/admin/v1/fleet")["members"][0]["state"] == "unreachable")
        with pytest.raises(ClientError) as refused:
            pair[0].client().put_object(Bucket=bucket, Key="s/k", Body=b"x")
        assert error_code(refused.value) == "SlowDown" and error_status(refused.value) == 503
        with pytest.raises(ClientError):
            pair[0].client().head_object(Bucket=bucket, Key="s/k")  # nothing committed
    finally:
        stop_all(pair)
    degrade = fleet_of(
        tmp_path / "degrade", moto_server, ("a", "b"), [*REPLICAS, "--replica-policy", "degrade"]
    )
    start_all(degrade)
    try:
        wait_joined(degrade, ("a", "b"))
        writer, holder = degrade
        writer.pause_flush()
        holder.kill()
        until(lambda: writer.admin_get("/admin/v1/fleet")["members"][0]["state"] == "unreachable")
        writer.client().put_object(Bucket=bucket, Key="d/k", Body=b"x")
        assert writer.metric("gateway_replica_degraded_acks") >= 1
        # Its state says so, on reads and in the admin's object state...
        head = writer.client().head_object(Bucket=bucket, Key="d/k")
        assert head["ResponseMetadata"]["HTTPHeaders"]["x-gateway-replicas"] == "0/1"
        assert writer.object_state(bucket, "d/k")["replicas"] == "0/1"
        # ... until the holder is back and the writer has sent it the version after all.
        holder.start()
        until(lambda: writer.object_state(bucket, "d/k")["replicas"] is None, 30)
        assert ("a", "d/k") in replicas_held(holder)
        head = writer.client().head_object(Bucket=bucket, Key="d/k")
        assert "x-gateway-replicas" not in head["ResponseMetadata"]["HTTPHeaders"]
    finally:
        stop_all(degrade)


def test_a_holder_killed_a_moment_before_the_commit_is_replaced_by_the_next(
    moto_server: str, tmp_path: Path, bucket: str
) -> None:
    """b is killed; before a notices (its renewals here are 5 s apart), small PUTs and a
    delete through a whose rendezvous holder is b commit on c instead and are answered
    200, not 500 (committed here, short of its replica; found by loadtest/fleet_soak.py:
    each node loss answered 500 to the writes then committing on it)."""
    slow_renewals = ("--replicas", "1", "--peer-lease", "15", "--peer-timeout", "45")
    trio = fleet_of(tmp_path, moto_server, ("a", "b", "c"), slow_renewals)
    start_all(trio)
    a, b, c = trio
    try:
        wait_joined(trio, ("a", "b", "c"))
        s3 = a.client()
        keys = [
            f"sub/{i}"
            for i in range(40)
            if rank("b", bucket, f"sub/{i}") > rank("c", bucket, f"sub/{i}")
        ]
        doomed = keys[2]
        s3.put_object(Bucket=bucket, Key=doomed, Body=b"to be deleted")
        a.pause_flush()
        b.kill()
        for key in keys[:2]:
            s3.put_object(Bucket=bucket, Key=key, Body=payload(3000, key))
        s3.delete_object(Bucket=bucket, Key=doomed)
        members = {m["node"]: m["state"] for m in a.admin_get("/admin/v1/fleet")["members"]}
        held = replicas_held(c)
        assert {("a", keys[0]), ("a", keys[1]), ("a", doomed)} <= set(held), held
        if members["b"] != "unreachable":  # a had not noticed: the commits were moved
            moved = "instead (a holder could not be reached)"
            until(lambda: a.log_path.read_text().count(moved) == 3, 5, "three commits moved")
        for key in keys[:2]:
            assert a.object_state(bucket, key).get("replicas") is None  # not short
        a.resume_flush()
        upstream = upstream_client(moto_server)
        landed = lambda: data_objects(upstream, bucket, "sub/").keys() == set(keys[:2])  # noqa: E731
        until(landed, 30, "a's writes upstream (b is down: the fleet's drain waits for it)")
        for key in keys[:2]:
            assert read_body(upstream.get_object(Bucket=bucket, Key=key)) == payload(3000, key)
        assert doomed not in data_objects(upstream, bucket)
    finally:
        stop_all(trio)


def test_multipart_uploads_are_replicated_and_taken_over(
    trio: list[GatewayProcess], bucket: str
) -> None:
    _, b, _ = trio
    upstream = upstream_client(b.upstream_url)
    b.pause_flush()
    s3 = b.client()
    parts = [payload(5 << 20, "p1"), payload(1000, "p2")]
    etag = multipart_put(s3, bucket, "mp/obj", parts)
    b.kill()
    shutil.rmtree(b.data_dir)
    until(lambda: "mp/obj" in data_objects(upstream, bucket), 60)
    head = upstream.head_object(Bucket=bucket, Key="mp/obj")
    assert head["ETag"] == etag  # same part boundaries
    assert read_body(upstream.get_object(Bucket=bucket, Key="mp/obj")) == b"".join(parts)


def test_a_holder_lost_with_its_disk_is_replicated_again_before_the_writer_goes(
    trio: list[GatewayProcess], bucket: str
) -> None:
    """Two failures apart: b's holder is wiped and comes back empty; b sends what it held
    again (small bodies, files, a multipart object's parts); then b is lost with its disk
    too, and every object still lands from the new copies."""
    a, b, c = trio
    upstream = upstream_client(b.upstream_url)
    b.pause_flush()
    s3 = b.client()
    bodies = {f"rr/small{i}": payload(3000 + i, f"s{i}") for i in range(6)}
    bodies |= {f"rr/big{i}": payload(200_000 + i, f"b{i}") for i in range(2)}
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    parts = [payload(5 << 20, "rp1"), payload(1000, "rp2")]
    mp_etag = multipart_put(s3, bucket, "rr/mp", parts)
    keys = {*bodies, "rr/mp"}

    def held_for_b() -> set[str]:
        return {k for gw in (a, c) for owner, k in replicas_held(gw) if owner == "b"}

    assert held_for_b() == keys
    holder = max((a, c), key=lambda gw: sum(owner == "b" for owner, _ in replicas_held(gw)))
    lost = {k for owner, k in replicas_held(holder) if owner == "b"}
    holder.kill()
    shutil.rmtree(holder.data_dir)
    holder.start()  # back, empty: b answers its new data dir with the versions again
    until(lambda: held_for_b() == keys, 60)
    assert b.metric("gateway_replicas_remade") == len(lost)
    b.kill()
    shutil.rmtree(b.data_dir)
    until(lambda: keys <= set(data_objects(upstream, bucket, "rr/")), 90)
    for key, body in bodies.items():
        got = upstream.get_object(Bucket=bucket, Key=key)
        assert read_body(got) == body and got["ETag"] == quoted_md5(body), key
    assert upstream.head_object(Bucket=bucket, Key="rr/mp")["ETag"] == mp_etag
    assert read_body(upstream.get_object(Bucket=bucket, Key="rr/mp")) == b"".join(parts)


def test_the_control_prefix_is_never_listed_or_served(
    trio: list[GatewayProcess], bucket: str
) -> None:
    a, _, _ = trio
    a.client().put_object(Bucket=bucket, Key="visible", Body=b"v")
    a.drained(bucket=bucket)
    upstream = upstream_client(a.upstream_url)
    assert any(
        o["Key"].startswith(CONTROL) for o in upstream.list_objects_v2(Bucket=bucket)["Contents"]
    )
    listed = a.client().list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listed["Contents"]] == ["visible"]
    top = a.client().list_objects_v2(Bucket=bucket, Delimiter="/")
    assert "CommonPrefixes" not in top
    claim = next(
        o["Key"]
        for o in upstream.list_objects_v2(Bucket=bucket)["Contents"]
        if o["Key"].startswith(CONTROL)
    )
    for call in (
        lambda: a.client().get_object(Bucket=bucket, Key=claim),
        lambda: a.client().put_object(Bucket=bucket, Key=CONTROL + "x", Body=b"x"),
        lambda: a.client().delete_object(Bucket=bucket, Key=claim),
    ):
        with pytest.raises(ClientError) as denied:
            call()
        assert error_code(denied.value) == "AccessDenied"


def _commit_request(
    gw: GatewayProcess, doc: dict[str, Any], body: bytes, secret: bytes | None
) -> tuple[int, Any]:
    """``PUT replica/commit`` (a small body with its commit) as a peer sends it."""
    path = "/_gateway/peer/v1/replica/commit"
    query = "commit=" + base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()
    headers = (
        {} if secret is None else auth.sign(secret, "PUT", path, query, "x", time.time(), None)
    )
    resp = http_request("PUT", f"{gw.endpoint}{path}?{query}", body=body, headers=headers)
    return resp.status, json.loads(resp.body) if resp.body else None


def test_a_small_body_with_its_commit_refuses_what_is_not_one(
    trio: list[GatewayProcess], bucket: str, upstream: Any
) -> None:
    """A small body travels with its replica commit: unsigned, malformed, too large or
    damaged requests are refused and hold nothing; a good one is held and, its writer
    being no member (lost), taken over into the bucket with its ETag."""
    a, _, _ = trio
    secret = auth.derive_secret(UPSTREAM_SECRET_KEY)
    body = b"a small body"
    meta = ObjectMeta(bucket, "ghost/k", len(body), hashlib.md5(body).hexdigest(), time.time())
    doc = ReplicaCommit("ghost", "d0", 1, meta, False, ("s1",), (), time.time()).to_json()
    assert _commit_request(a, doc, body, None)[0] == 403
    assert _commit_request(a, {"owner": "ghost"}, body, secret)[0] == 400
    assert _commit_request(a, doc, bytes(65 * 1024), secret)[0] == 400
    assert _commit_request(a, doc, b"a damaged body", secret) == (200, {"missing": ["s1"]})
    assert not replicas_held(a)
    assert _commit_request(a, doc, body, secret) == (200, {"missing": []})
    assert replicas_held(a) == [("ghost", "ghost/k")]
    until(lambda: "ghost/k" in data_objects(upstream, bucket, "ghost/"), 30)
    assert data_objects(upstream, bucket, "ghost/")["ghost/k"]["ETag"] == quoted_md5(body)
