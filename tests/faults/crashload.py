"""Concurrent PUT + multipart load against a gateway that is SIGKILLed and restarted, with a
model of what each client was told; shared by tests/faults/test_crash_kill.py (CI size) and
loadtest/crash_soak.py (long runs).

Each worker thread owns its keys, so per key the writes are sequential and the model is exact:
a key's readable version must be the last acknowledged one, or the one whose request was
cut by the kill (then it becomes the acknowledged baseline), or absent if nothing was ever
acknowledged. Kill points are chosen by acknowledgement counts (a random number of acks after
the previous restart), never by sleeping.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from harness import GatewayProcess, error_code

PART_BYTES = 5 * 1024 * 1024  # S3's (and moto's) smallest non-last part
WAIT_S = 60.0  # generous ceiling for any poll; never a pacing sleep


@dataclass(frozen=True)
class Version:
    """One version of an object a client wrote in full: its MD5 and S3 ETag."""

    md5: str
    etag: str
    size: int


def single_version(data: bytes) -> Version:
    md5 = hashlib.md5(data).hexdigest()
    return Version(md5, f'"{md5}"', len(data))


def multipart_version(parts: list[bytes]) -> Version:
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    etag = f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'
    return Version(hashlib.md5(b"".join(parts)).hexdigest(), etag, sum(len(p) for p in parts))


@dataclass
class KeyModel:
    """What the clients know about one key."""

    acked: Version | None = None
    uncertain: list[Version] = field(default_factory=list)  # cut by a kill: may or may not be

    def allowed(self) -> list[Version | None]:
        return [self.acked, *self.uncertain]

    def observe(self, seen: Version | None) -> None:
        """After a restart: ``seen`` must be allowed; it becomes the baseline."""
        assert seen in self.allowed(), f"read {seen}, allowed {self.allowed()}"
        if seen is not None:
            self.acked = seen
        self.uncertain.clear()


@dataclass
class Upload:
    key: str
    upload_id: str
    parts: list[bytes]
    etags: dict[int, str] = field(default_factory=dict)
    is_completing: bool = False  # a CompleteMultipartUpload was sent (its answer may be lost)
    is_interrupted: bool = False  # a kill cut one of its requests; continued after restart


@dataclass
class Stats:
    acks: int = 0
    puts: int = 0
    multiparts: int = 0
    continued_uploads: int = 0
    kills: int = 0
    verified_reads: int = 0


class Pauser:
    """Workers park here while the gateway is down: ``pause()`` then ``wait_parked(n)`` gives
    the main thread a quiet gateway (no request in flight) to restart and verify."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._paused = False
        self._parked = 0

    def pause(self) -> None:
        with self._cond:
            self._paused = True
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def wait_parked(self, workers: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self._parked == workers, WAIT_S), "workers stuck"

    def park(self, *, until_paused: bool) -> None:
        """Block while paused. ``until_paused``: after a failure, first wait for the pause the
        main thread is about to announce (the failure came from its kill)."""
        with self._cond:
            if until_paused:
                assert self._cond.wait_for(lambda: self._paused, WAIT_S), "failure without kill"
            if not self._paused:
                return
            self._parked += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._paused)
            self._parked -= 1


class CrashLoad:
    """Drive ``workers`` threads of boto3 load at ``gw`` and kill it ``kills`` times."""

    def __init__(
        self,
        gw: GatewayProcess,
        bucket: str,
        *,
        workers: int = 4,
        keys_per_worker: int = 6,
        multipart_every: int = 5,
        seed: int = 0,
        log: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.gw = gw
        self.bucket = bucket
        self.workers = workers
        self.keys_per_worker = keys_per_worker
        self.multipart_every = multipart_every
        self.rng = random.Random(seed)
        self.log = log
        self.model: dict[str, KeyModel] = {}
        self.stats = Stats()
        self.pauser = Pauser()
        self._lock = threading.Lock()
        self._acked = threading.Condition(self._lock)
        self._stop = False
        self._errors: list[BaseException] = []

    # ---- the kill loop

    def run(self, kills: int, max_acks_between: int = 12) -> Stats:
        threads = [
            threading.Thread(target=self._worker, args=(w,), name=f"load-{w}", daemon=True)
            for w in range(self.workers)
        ]
        for t in threads:
            t.start()
        try:
            for _ in range(kills):
                self._wait_acks(self.rng.randint(1, max_acks_between))
                self._kill_restart_verify()
        finally:
            self._stop = True
            self.pauser.resume()
            for t in threads:
                t.join(WAIT_S)
        if self._errors:
            raise self._errors[0]
        return self.stats

    def _wait_acks(self, n: int) -> None:
        with self._acked:
            target = self.stats.acks + n
            ok = self._acked.wait_for(lambda: self.stats.acks >= target or self._errors, WAIT_S)
            assert ok, "the load made no progress"
        if self._errors:
            raise self._errors[0]

    def _kill_restart_verify(self) -> None:
        self.gw.kill()
        self.stats.kills += 1
        self.pauser.pause()
        self.pauser.wait_parked(self.workers)
        self.gw.start()
        self.verify()
        self.log(f"kill {self.stats.kills}: {self.stats}")
        self.pauser.resume()

    # ---- checks

    def verify(self) -> None:
        """Every key reads as an allowed version (bytes and ETag); no temp file remains."""
        tmp = self.gw.data_dir / "tmp"
        assert not tmp.exists() or os.listdir(tmp) == [], os.listdir(tmp)
        s3 = self.gw.client()
        with self._lock:
            items = list(self.model.items())
        for key, km in items:
            km.observe(self.read(s3, key))
            self.stats.verified_reads += 1

    def read(self, s3: Any, key: str) -> Version | None:
        try:
            got = s3.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            assert error_code(exc) == "NoSuchKey", exc
            return None
        data = got["Body"].read()
        md5 = hashlib.md5(data).hexdigest()
        return Version(md5, got["ETag"], len(data))

    # ---- workers

    def _worker(self, w: int) -> None:
        rng = random.Random(self.rng.random())
        s3 = self.gw.client()
        upload: Upload | None = None
        op = 0
        try:
            while not self._stop:
                self.pauser.park(until_paused=False)
                key = f"w{w}/k{rng.randrange(self.keys_per_worker)}"
                try:
                    if upload is not None:
                        upload = self._continue_upload(s3, upload)
                    elif op % self.multipart_every == self.multipart_every - 1:
                        # Held before its parts go up: a kill during them leaves it to continue.
                        upload = self._create_upload(s3, key, rng)
                        upload = self._continue_upload(s3, upload)
                    else:
                        self._put(s3, key, rng)
                    op += 1
                except (BotoCoreError, ClientError, ConnectionError):
                    # The gateway died under the request; the model already lists the version
                    # as uncertain. Continue an interrupted upload after the restart.
                    if upload is not None:
                        upload.is_interrupted = True
                    self.pauser.park(until_paused=True)
                    s3 = self.gw.client()
        except BaseException as exc:  # surfaced in run()
            with self._acked:
                self._errors.append(exc)
                self._acked.notify_all()

    def _ack(self, key: str, version: Version) -> None:
        with self._acked:
            km = self.model[key]
            km.acked = version
            km.uncertain.clear()
            self.stats.acks += 1
            self._acked.notify_all()

    def _attempt(self, key: str, version: Version) -> None:
        with self._lock:
            self.model.setdefault(key, KeyModel()).uncertain.append(version)

    def _put(self, s3: Any, key: str, rng: random.Random) -> None:
        data = rng.randbytes(rng.choice((0, 1, 100, 4096, 65536, 300_000)))
        version = single_version(data)
        self._attempt(key, version)
        resp = s3.put_object(Bucket=self.bucket, Key=key, Body=data)
        assert resp["ETag"] == version.etag
        self.stats.puts += 1
        self._ack(key, version)

    def _create_upload(self, s3: Any, key: str, rng: random.Random) -> Upload:
        parts = [rng.randbytes(PART_BYTES), rng.randbytes(rng.randint(1, 200_000))]
        created = s3.create_multipart_upload(Bucket=self.bucket, Key=key)
        return Upload(key, created["UploadId"], parts)

    def _continue_upload(self, s3: Any, upload: Upload) -> Upload | None:
        """Upload the parts not yet acknowledged, then complete. Raises on a kill, with
        ``upload`` still held by the worker, which resumes it after the restart."""
        if upload.is_interrupted:
            upload.is_interrupted = False
            self.stats.continued_uploads += 1
        for number, data in enumerate(upload.parts, start=1):
            if number not in upload.etags:
                resp = s3.upload_part(
                    Bucket=self.bucket,
                    Key=upload.key,
                    UploadId=upload.upload_id,
                    PartNumber=number,
                    Body=data,
                )
                assert resp["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
                upload.etags[number] = resp["ETag"]
        version = multipart_version(upload.parts)
        self._attempt(upload.key, version)
        parts = [{"PartNumber": n, "ETag": e} for n, e in sorted(upload.etags.items())]
        was_completing, upload.is_completing = upload.is_completing, True
        try:
            resp = s3.complete_multipart_upload(
                Bucket=self.bucket,
                Key=upload.key,
                UploadId=upload.upload_id,
                MultipartUpload={"Parts": parts},
            )
            assert resp["ETag"] == version.etag, (resp["ETag"], version)
        except ClientError as exc:
            # A completion acknowledged just before the kill: its answer was lost.
            if error_code(exc) != "NoSuchUpload" or not was_completing:
                raise
            assert self.read(s3, upload.key) == version
        self.stats.multiparts += 1
        self._ack(upload.key, version)
        return None


def drain_and_check_upstream(
    load: CrashLoad, upstream: Any, timeout_s: float = WAIT_S, uploads_wait_s: float = 10.0
) -> tuple[dict[str, Version], list[str]]:
    """After the last restart: drain, then the upstream holds exactly the acknowledged
    versions (bytes and ETag). Returns them and the keys of upstream multipart uploads still
    open after ``uploads_wait_s`` (the gateway aborts, when it starts, the ones it recorded
    and those matching an intent recorded before CreateMultipartUpload)."""
    gw, bucket = load.gw, load.bucket
    result = gw.drain(bucket=bucket, timeout=timeout_s)
    assert result["drained"] is True, result
    expected = {k: m.acked for k, m in load.model.items() if m.acked is not None}
    for key, version in expected.items():
        got = upstream.get_object(Bucket=bucket, Key=key)
        data = got["Body"].read()
        assert hashlib.md5(data).hexdigest() == version.md5, key
        assert got["ETag"] == version.etag, key
    listed = {
        o["Key"] for o in upstream.list_objects_v2(Bucket=bucket, MaxKeys=1000).get("Contents", [])
    }
    assert listed == set(expected)
    deadline = time.monotonic() + uploads_wait_s
    while True:
        open_keys = [
            u["Key"] for u in upstream.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        ]
        if not open_keys or time.monotonic() > deadline:
            return expected, open_keys
        time.sleep(0.2)


def count_blob_files(gw: GatewayProcess) -> int:
    blobs = gw.data_dir / "blobs"
    return sum(len(files) for _, _, files in os.walk(blobs))
