"""Conditional writes decided once for the fleet (docs/fleet.md, "Conditional writes").

S3 lets exactly one of several concurrent ``If-None-Match: *`` (or ``If-Match``) writes of a
key win: Delta Lake's and Iceberg's commit files, leader elections and locks rely on it.
Each gateway checks a condition against its peers' unflushed versions, but two nodes
checking at the same moment both saw no version and both acknowledged (tried: 40 keys
written at once through three nodes, every one of them with two or three winners).

So in a fleet a conditional write holds the key's lock from its check to its commit: a
small object ``<control-prefix>locks/<sha256 of bucket/key>`` in the key's bucket, taken
with the bucket's own conditional writes (after OpenTofu's S3 lock, as the claims are):
``If-None-Match: *`` when there is none, else ``If-Match`` the ETag of a released or
expired one. Its body names the holder and a lease (``until``, wall seconds, plus a skew
allowance for the others' clocks); the holder releases it by overwriting it, ``If-Match``
its own. A holder that dies leaves it to expire; a write waiting longer than ``wait_s``
is answered 409 ConditionalRequestConflict, S3's answer to a conflicting conditional
write in progress (clients retry it). A conditional write through a gateway alone takes
no lock: its journal's commit decides.

The lock costs a conditional write three requests to the bucket (a lock object exists once
a key was written conditionally: its PUT fails, a GET, then the ``If-Match`` PUT) and one
after its commit, sent at once (not through the flusher's request gate: a paused flusher
must not hold a client's write).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Protocol

from gateway.clock import Clock
from gateway.errors import ConditionalRequestConflict, SlowDown
from gateway.upstream.classify import FlushError, Retryable

log = logging.getLogger(__name__)

LEASE_S = 30.0  # a holder commits within milliseconds of taking it; this is for one that died
SKEW_S = 5.0  # the others' clocks may be this far behind the holder's
WAIT_S = 10.0  # a write waits this long for another's lock, then 409
POLL_S = 0.02


class LockBucket(Protocol):
    """The bucket's conditional writes (``AiobotocoreUpstream``); FlushError on failure."""

    async def put_if_absent(self, bucket: str, key: str, body: bytes) -> bool: ...

    async def put_if_match(self, bucket: str, key: str, body: bytes, etag: str) -> bool: ...

    async def get_small(self, bucket: str, key: str) -> bytes | None: ...


class ConditionalLocks:
    """One lock per key, held by ``held``. Loop-bound."""

    def __init__(
        self,
        store: LockBucket,
        node_id: str,
        control_prefix: str,
        clock: Clock,
        *,
        lease_s: float = LEASE_S,
        wait_s: float = WAIT_S,
    ) -> None:
        self._store = store
        self._node_id = node_id
        self._prefix = control_prefix
        self._clock = clock
        self._lease_s = lease_s
        self._wait_s = wait_s
        self.waits = 0  # lock objects found held (metrics, tests)

    def lock_key(self, bucket: str, key: str) -> str:
        digest = hashlib.sha256(f"{bucket}/{key}".encode()).hexdigest()
        return f"{self._prefix}locks/{digest}"

    @contextlib.asynccontextmanager
    async def held(self, bucket: str, key: str) -> AsyncIterator[None]:
        """Hold ``key``'s lock for the block (409 ConditionalRequestConflict after
        ``wait_s`` held by another; 503 SlowDown when the bucket cannot be asked)."""
        name = self.lock_key(bucket, key)
        mine = await self._acquire(bucket, name)
        try:
            yield
        finally:
            await asyncio.shield(self._release(bucket, name, mine))

    async def _acquire(self, bucket: str, name: str) -> bytes:
        deadline_s = self._clock.monotonic() + self._wait_s
        while True:
            mine = self._body(released=False)
            try:
                if await self._take(bucket, name, mine):
                    return mine
            except Retryable as exc:  # (409: another conditional write of the lock; 5xx)
                if self._clock.monotonic() > deadline_s:
                    raise SlowDown("The bucket did not answer this conditional write.") from exc
            except FlushError as exc:
                log.warning("conditional write's lock %s/%s: %s", bucket, name, exc)
                raise SlowDown("The bucket refused this conditional write's lock.") from exc
            if self._clock.monotonic() > deadline_s:
                raise ConditionalRequestConflict()
            await asyncio.sleep(POLL_S)

    async def _take(self, bucket: str, name: str, mine: bytes) -> bool:
        """One try: True when ``mine`` is the lock now."""
        if await self._store.put_if_absent(bucket, name, mine):
            return True
        found = await self._store.get_small(bucket, name)
        if found is None:  # (the control prefix's lifecycle rule expired it meanwhile)
            return await self._store.put_if_absent(bucket, name, mine)
        if self._is_free(found):
            return await self._store.put_if_match(bucket, name, mine, _etag(found))
        self.waits += 1
        return False

    async def _release(self, bucket: str, name: str, mine: bytes) -> None:
        try:
            if not await self._store.put_if_match(
                bucket, name, self._body(released=True), _etag(mine)
            ):
                log.warning("lock %s/%s was taken from this node (its lease ran out)", bucket, name)
        except FlushError as exc:  # it expires
            log.warning("lock %s/%s not released (it expires): %s", bucket, name, exc)

    def _body(self, *, released: bool) -> bytes:
        until_s = 0.0 if released else self._clock.wall() + self._lease_s
        doc = {"holder": self._node_id, "until": until_s, "nonce": secrets.token_hex(8)}
        return json.dumps(doc, sort_keys=True).encode()

    def _is_free(self, raw: bytes) -> bool:
        """Released (``until`` 0), expired (with the skew allowance), or not a lock."""
        try:
            until_s = float(json.loads(raw)["until"])
        except (ValueError, KeyError, TypeError):
            return True
        return until_s + SKEW_S < self._clock.wall()


def _etag(body: bytes) -> str:
    """A single PUT's ETag: its body's MD5 (the lock objects are never encrypted with KMS)."""
    return hashlib.md5(body).hexdigest()
