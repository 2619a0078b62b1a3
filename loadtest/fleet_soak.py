"""Fleet soak: the same keys written, overwritten, copied and deleted through every node of
a fleet (3 gateways, ``--replicas 1``; ``--nodes`` and ``--replicas`` change both) while
nodes are killed (``kill -9``), some with their
disk wiped, and come back. What it checks, as a client of S3 would:

- read-after-write across nodes: after each acknowledged write or delete, a GET through
  another live node sees it (an owner that is down is read from its replica);
- last writer wins across the fleet: in the end each key in the bucket is what its last
  acknowledged operation made it (a write whose answer was lost with its node may or may
  not have happened, until the next acknowledged one supersedes it; one answered with an
  S3 error never happened);
- conditional writes across the fleet: a PUT with ``If-None-Match: *`` or ``If-Match``, or
  a DELETE with ``If-Match``, through any node is carried out or refused (412, or 404) as
  S3 would, by the key's last acknowledged state, whichever node wrote it and whichever
  is down;
- the same through each node's GET and LIST, and nothing under the control prefix.

Every key is operated on by one client thread at a time (so "last" is well defined), through
a node chosen at random for each operation; at most ``--at-once`` nodes are down at once
(killed together), and the next are killed only once the last loss is repaired (N replicas
cover the loss of N nodes: every lost writer's versions taken over, every lost holder's
sent again; as in the replica simulator). Two wipes closer than that lose what only the
first one's holder had (found: a stale read of a version whose writer and then holder were
wiped 1 s apart).

    .venv/bin/python loadtest/fleet_soak.py --rounds 30 --seed 1
    .venv/bin/python loadtest/fleet_soak.py --nodes 4 --replicas 2 --at-once 2

Prints each round and a summary line with the counts of violations (target: 0).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from botocore.exceptions import ClientError  # noqa: E402
from fleetutil import fleet_of, stop_keeping_logs, until, wait_joined  # noqa: E402
from harness import GatewayProcess, payload, start_moto, upstream_client  # noqa: E402

PEER_TIMEOUT_S = 4.5
CONTROL = ".gateway/"
NAMES = tuple("abcdefgh")  # the first --nodes of them
PART_BYTES = 5 << 20
ABSENT = "absent"


def say(text: str) -> None:
    print(text, flush=True)


def etag_of(body: bytes) -> str:
    return f'"{hashlib.md5(body).hexdigest()}"'


@dataclass
class Key:
    """What the bucket may hold for one key: a set of ETags (``ABSENT``: no object)."""

    possible: set[str] = field(default_factory=lambda: {ABSENT})
    settled: bool = True  # the last operation was acknowledged (or answered an S3 error)


@dataclass
class Tally:
    ops: int = 0
    acked: int = 0
    refused: int = 0  # an S3 error answer: the operation did not happen
    unknown: int = 0  # no answer (the node died under it): may or may not have happened
    reads: int = 0
    stale_reads: list[str] = field(default_factory=list)
    failed_reads: int = 0
    stale_copies: list[str] = field(default_factory=list)  # a copy of an older source
    conditional: int = 0  # conditional PUTs and deletes answered (200/204, 412, 404)
    wrong_conditions: list[str] = field(default_factory=list)  # 200 where S3 says 412, or not
    final_wrong: list[str] = field(default_factory=list)


class Soak:
    def __init__(
        self, fleet: list[GatewayProcess], bucket: str, keys: int, seed: int, at_once: int = 1
    ) -> None:
        self.fleet = fleet
        self.at_once = at_once  # nodes lost together (at most --replicas)
        self.bucket = bucket
        self.keys = {f"soak/k{i:03d}": Key() for i in range(keys)}
        self.alive = [True] * len(fleet)
        self.lock = threading.Lock()
        self.tally = Tally()
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.clients = [gw.client() for gw in fleet]
        self.round = 0
        self.down = ""  # the nodes killed this round, while they are down

    def live_nodes(self) -> list[int]:
        with self.lock:
            return [i for i, up in enumerate(self.alive) if up]

    # -- one operation ----------------------------------------------------------------

    def operate(self, rng: random.Random, name: str, mine: Sequence[str]) -> None:
        node = rng.choice(self.live_nodes())
        source = ""
        s3 = self.clients[node]
        state = self.keys[name]
        roll = rng.random()
        expect: bool | None = None  # a conditional PUT: whether S3 would write it
        try:
            if roll < 0.1:
                if not state.settled:
                    return
                condition, expect = _condition(rng, next(iter(state.possible)))
                if "IfMatch" in condition and rng.random() < 0.4:  # a conditional delete
                    intended = got = ABSENT
                    s3.delete_object(Bucket=self.bucket, Key=name, **condition)
                else:
                    body = payload(rng.choice((700, 30_000)), f"{name}/{rng.random()}")
                    intended = etag_of(body)
                    out = s3.put_object(Bucket=self.bucket, Key=name, Body=body, **condition)
                    got = out["ETag"]
            elif roll < 0.55:
                body = payload(rng.choice((700, 30_000, 400_000)), f"{name}/{rng.random()}")
                intended = etag_of(body)
                got = s3.put_object(Bucket=self.bucket, Key=name, Body=body)["ETag"]
            elif roll < 0.65:
                first = payload(PART_BYTES, f"{name}/p1/{rng.random()}")
                last = payload(rng.choice((1000, 100_000)), f"{name}/p2/{rng.random()}")
                digest = hashlib.md5(hashlib.md5(first).digest() + hashlib.md5(last).digest())
                intended = f'"{digest.hexdigest()}-2"'
                got = self._multipart(s3, name, first, last)
            elif roll < 0.82:
                intended = ABSENT
                s3.delete_object(Bucket=self.bucket, Key=name)
                got = ABSENT
            else:
                source = rng.choice([k for k in mine if k != name])
                src = self.keys[source]
                if not src.settled or src.possible == {ABSENT}:
                    return
                (intended,) = src.possible
                if intended.endswith('-2"'):  # a copy's ETag is its body's MD5, not this
                    return
                out = s3.copy_object(
                    Bucket=self.bucket, Key=name, CopySource={"Bucket": self.bucket, "Key": source}
                )
                got = out["CopyObjectResult"]["ETag"]
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            with self.lock:
                self.tally.ops += 1
                if status >= 500 and status != 503:
                    self.tally.unknown += 1
                    state.possible.add(intended)
                    state.settled = False
                else:
                    self.tally.refused += 1
                if expect is not None and status in (404, 412):
                    self._conditional(name, node, expect, status)
            return
        except Exception:  # no answer: the node died under it
            with self.lock:
                self.tally.ops += 1
                self.tally.unknown += 1
                state.possible.add(intended)
                state.settled = False
            return
        with self.lock:
            self.tally.ops += 1
            self.tally.acked += 1
            if expect is not None:
                self._conditional(name, node, expect, 200)
            state.possible = {got}
            state.settled = True
            if got != intended and intended != ABSENT:
                self.tally.stale_copies.append(
                    f"{name}: acked {got} through {NAMES[node]}, sent {intended} "
                    f"(round {self.round}, {self.down or 'none'} down, copy of {source})"
                )
        self._read_back(rng, node, name, got)

    def _conditional(self, name: str, node: int, expect: bool, status: int) -> None:
        """A conditional PUT's answer against what S3 would answer (under ``self.lock``)."""
        self.tally.conditional += 1
        if (status == 200) != expect:
            self.tally.wrong_conditions.append(
                f"{name}: conditional write through {NAMES[node]} answered {status}, S3 would "
                f"{'write it' if expect else 'refuse it'} "
                f"(round {self.round}, {self.down or 'none'} down)"
            )

    def _multipart(self, s3: Any, name: str, first: bytes, last: bytes) -> str:
        upload = s3.create_multipart_upload(Bucket=self.bucket, Key=name)["UploadId"]
        parts = []
        for n, body in ((1, first), (2, last)):
            out = s3.upload_part(
                Bucket=self.bucket, Key=name, UploadId=upload, PartNumber=n, Body=body
            )
            parts.append({"PartNumber": n, "ETag": out["ETag"]})
        done = s3.complete_multipart_upload(
            Bucket=self.bucket, Key=name, UploadId=upload, MultipartUpload={"Parts": parts}
        )
        return str(done["ETag"])

    def _read_back(self, rng: random.Random, writer: int, name: str, want: str) -> None:
        """A GET of ``name`` through another live node sees what was just acknowledged."""
        others = [i for i in self.live_nodes() if i != writer]
        if not others:
            return
        reader = rng.choice(others)
        try:
            got = self.clients[reader].head_object(Bucket=self.bucket, Key=name)["ETag"]
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            got = ABSENT if status == 404 else f"error {status}"
        except Exception:  # the reader died under it
            return
        with self.lock:
            if not self.alive[reader]:
                return
            self.tally.reads += 1
            if got.startswith("error"):
                self.tally.failed_reads += 1
            elif got != want:
                self.tally.stale_reads.append(
                    f"{name}: wrote {want} through {NAMES[writer] if writer >= 0 else 'a node'}, "
                    f"{NAMES[reader]} read {got} "
                    f"(round {self.round}, {self.down or 'none'} down)"
                )

    def worker(self, w: int, workers: int, seed: int) -> None:
        rng = random.Random(seed)
        mine = [k for i, k in enumerate(sorted(self.keys)) if i % workers == w]
        while not self.stop.is_set():
            name = rng.choice(mine)
            if rng.random() < 0.15:
                self.read_any(rng, name)
            else:
                self.operate(rng, name, mine)

    def read_any(self, rng: random.Random, name: str) -> None:
        """A HEAD of a settled key through any live node, at any time (during a loss too)."""
        state = self.keys[name]
        if not state.settled:
            return
        (want,) = state.possible
        self._read_back(rng, -1, name, want)

    # -- faults -----------------------------------------------------------------------

    def fault(self, rnd: int) -> str:
        """Kill ``at_once`` nodes at the same moment (each half the time wiping its disk),
        keep them down a while, bring them back; the others keep serving."""
        rng = self.rng
        self.round = rnd
        time.sleep(rng.uniform(0.5, 3.0))
        victims = rng.sample(range(len(self.fleet)), self.at_once)
        wipes = [rng.random() < 0.5 for _ in victims]
        down_s = rng.choice((0.0, 1.0, PEER_TIMEOUT_S + 2.0))
        with self.lock:
            for victim in victims:
                self.alive[victim] = False
            self.down = "+".join(NAMES[v] for v in victims)
        for victim, wipe in zip(victims, wipes, strict=True):
            self.fleet[victim].kill()
            if wipe:
                shutil.rmtree(self.fleet[victim].data_dir, ignore_errors=True)
        time.sleep(down_s)
        for victim in victims:
            self.fleet[victim].start(timeout=60)
        wait_joined(self.fleet, NAMES[: len(self.fleet)])
        with self.lock:
            self.alive = [True] * len(self.fleet)
            self.down = ""
        until(self.repaired, 60, "the loss repaired (taken over, sent again)")
        what = ", ".join(
            f"{NAMES[v]} killed{' and wiped' if w else ''}"
            for v, w in zip(victims, wipes, strict=True)
        )
        return f"round {rnd}: {what}, down {down_s:.0f} s"

    def repaired(self) -> bool:
        """No member holds a lost writer's versions not taken over, or is sending a lost
        holder's versions again (``/admin/v1/fleet`` ``replicas``)."""
        for gw in self.fleet:
            replicas = gw.admin_get("/admin/v1/fleet")["replicas"]
            if replicas["remaking"] or any(h["writer_lost"] for h in replicas["held_for"]):
                return False
        return True

    # -- the end ----------------------------------------------------------------------

    def check_final(self, upstream: Any, timeout_s: float) -> None:
        """Every key in the bucket, and through every node, is one its history allows."""

        def bucket_view() -> dict[str, str]:
            out: dict[str, str] = {}
            for page in upstream.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                for obj in page.get("Contents", []):
                    out[obj["Key"]] = obj["ETag"]
            return out

        def wrong(view: dict[str, str]) -> list[str]:
            return [
                f"{k}: bucket has {view.get(k, ABSENT)}, allowed {sorted(s.possible)}"
                for k, s in self.keys.items()
                if view.get(k, ABSENT) not in s.possible
            ]

        deadline = time.monotonic() + timeout_s
        while True:
            view = bucket_view()
            bad = wrong(view)
            if not bad or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        self.tally.final_wrong.extend(f"bucket {b}" for b in bad)
        for i, s3 in enumerate(self.clients):
            listed = {
                obj["Key"]: obj["ETag"]
                for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
                for obj in page.get("Contents", [])
            }
            if any(k.startswith(CONTROL) for k in listed):
                self.tally.final_wrong.append(f"{NAMES[i]} lists the control prefix")
            self.tally.final_wrong.extend(f"{NAMES[i]} LIST {b}" for b in wrong(listed))
        extra = [k for k in view if k not in self.keys and not k.startswith(CONTROL)]
        self.tally.final_wrong.extend(f"bucket has a stray key {k}" for k in extra)


def _condition(rng: random.Random, current: str) -> tuple[dict[str, str], bool]:
    """A conditional PUT's condition on a key whose bucket state is ``current`` (an ETag
    or ``ABSENT``), and whether S3 writes it: ``If-None-Match: *``, ``If-Match`` the
    current ETag, or ``If-Match`` one it never had (412; 404 when there is no object)."""
    pick = rng.random()
    if pick < 0.4:
        return {"IfNoneMatch": "*"}, current == ABSENT
    if pick < 0.8 and current != ABSENT:
        return {"IfMatch": current}, True
    return {"IfMatch": etag_of(f"never {rng.random()}".encode())}, False


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=30, help="kill-and-restart rounds")
    p.add_argument("--keys", type=int, default=24)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=3, help=f"gateways (2 to {len(NAMES)})")
    p.add_argument("--replicas", type=int, default=1, help="the gateways' --replicas (>= 1)")
    p.add_argument("--at-once", type=int, default=1, help="nodes lost together (<= --replicas)")
    p.add_argument("--logs", default="", help="copy the gateways' logs here at the end")
    p.add_argument(
        "--log-level",
        default="info",
        help="the gateways' (debug: each version committed and where each read was served from)",
    )
    args = p.parse_args(argv)
    if not 2 <= args.nodes <= len(NAMES) or not 1 <= args.replicas < args.nodes:
        p.error("--nodes 2 to 8, --replicas 1 to nodes - 1 (without one, a wipe loses writes)")
    if not 1 <= args.at_once <= args.replicas:
        p.error("--at-once 1 to --replicas (N replicas cover the loss of N nodes)")
    names = NAMES[: args.nodes]
    moto, url = start_moto()
    upstream = upstream_client(url)
    bucket = "fleet-soak"
    upstream.create_bucket(Bucket=bucket)
    extra = (
        *("--replicas", str(args.replicas), "--peer-timeout", str(PEER_TIMEOUT_S)),
        *("--write-back-delay", "0.2", "--log-level", args.log_level),
    )
    with TemporaryDirectory(prefix="gw-fleet-soak-") as tmp:
        fleet = fleet_of(Path(tmp), url, names, extra)
        for gw in fleet:
            gw.start(timeout=60)
        wait_joined(fleet, names)
        soak = Soak(fleet, bucket, args.keys, args.seed, args.at_once)
        workers = [
            threading.Thread(target=soak.worker, args=(w, args.workers, args.seed * 100 + w))
            for w in range(args.workers)
        ]
        started = time.monotonic()
        try:
            for t in workers:
                t.start()
            for rnd in range(args.rounds):
                say(soak.fault(rnd))
            time.sleep(1.0)
            soak.stop.set()
            for t in workers:
                t.join()
            drain = "/admin/v1/drain?wait=true&timeout=60"
            for gw in fleet:
                until(lambda gw=gw: gw.admin_get(drain)["drained"], 120, "the fleet's drain")
            soak.check_final(upstream, timeout_s=60)
        finally:
            soak.stop.set()
            stop_keeping_logs(fleet, args.logs)
            moto.stop()
    t = soak.tally
    for line in t.stale_reads + t.stale_copies + t.wrong_conditions + t.final_wrong:
        say(f"  VIOLATION {line}")
    say(
        f"fleet soak ({args.nodes} nodes, --replicas {args.replicas}, {args.at_once} lost at "
        f"once): {args.rounds} rounds "
        f"in {time.monotonic() - started:.0f} s, {t.ops} "
        f"operations ({t.acked} acknowledged, {t.refused} refused, {t.unknown} unanswered), "
        f"{t.reads} cross-node reads ({len(t.stale_reads)} stale, {t.failed_reads} failed), "
        f"{len(t.stale_copies)} copies of an older source, "
        f"{t.conditional} conditional writes ({len(t.wrong_conditions)} answered wrong), "
        f"{len(t.final_wrong)} keys wrong at the end"
    )
    return 1 if t.stale_reads or t.stale_copies or t.wrong_conditions or t.final_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
