"""Claims: one uploader per replicated version, decided by the bucket's conditional writes
(docs/fleet.md, "Takeover"; after OpenTofu's S3 lock: 200 acquired, 412 held, 409 retry).

A version is named by its key, its acknowledgement time (microseconds) and its writer's
node id, data-dir id and sequence number. Whoever uploads it (its writer, or a member
holding its replica after the writer was lost) first claims it:
``PUT <control-prefix>claims/<key hash>/<acked µs>/<writer>/<data-dir>/<seq>.<epoch>``
with ``If-None-Match: *`` in the version's bucket. Epoch 1 first; a claim whose claimant
is itself lost is taken over at the next epoch. After the upload the uploader writes
``...<seq>.done``: nobody uploads a version whose ``.done`` exists.

All claims of one key share a prefix, so a taker-over can list them (``newer_claimed``):
a version claimed after the one it holds (the same writer's later sequence number, or a
later acknowledgement by another writer, as the fleet orders writes) is on its way or in
the bucket, and the older one is never put over it. Claim objects hold their claimant and
epoch (JSON); they are small, and the control prefix is never listed to clients (an S3
lifecycle rule on it can expire them).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.upstream.classify import Retryable

_MAX_EPOCHS = 64  # a version taken over this many times is left for an operator


class ClaimBucket(Protocol):
    """What claims need of the bucket (``AiobotocoreUpstream``)."""

    async def put_if_absent(self, bucket: str, key: str, body: bytes) -> bool: ...

    async def get_small(self, bucket: str, key: str) -> bytes | None: ...

    async def list_keys(self, bucket: str, prefix: str) -> list[str]: ...


class Outcome(enum.Enum):
    WON = "won"  # this node uploads it
    DONE = "done"  # it was uploaded (by whoever): nothing to send
    HELD = "held"  # another node, not lost, holds the claim: it uploads


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: Outcome
    epoch: int = 0
    holder: str | None = None  # the claimant, when HELD


@dataclass(frozen=True, slots=True)
class Version:
    """A replicated version's identity: its key, when it was acknowledged, its writer's."""

    bucket: str
    key: str
    acked_s: float
    owner: str
    datadir_id: str
    seq: int

    @property
    def acked_us(self) -> int:
        return round(self.acked_s * 1e6)

    def is_newer_than(self, other: Version) -> bool:
        """The fleet's order of two versions of a key: one writer's by sequence number,
        different writers' by acknowledgement time (then node id), as reads pick them."""
        if (self.owner, self.datadir_id) == (other.owner, other.datadir_id):
            return self.seq > other.seq
        return (self.acked_us, self.owner) > (other.acked_us, other.owner)


def key_prefix(control_prefix: str, key: str) -> str:
    """Where every claim of ``key`` lives (a hash: keys may be 1,024 bytes long)."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{control_prefix}claims/{digest}/"


def _parse(bucket: str, key: str, name: str) -> Version | None:
    """The version a claim object's name (below its key prefix) stands for."""
    try:
        acked_us, owner, datadir, last = name.split("/")
        seq = int(last.partition(".")[0])
        return Version(bucket, key, int(acked_us) / 1e6, owner, datadir, seq)
    except ValueError:
        return None


class Claims:
    """Claims for ``me`` (see the module docstring). ``is_lost(node)``: whether a claimant
    may be taken over (lost by this node's view: unreachable past ``--peer-timeout``, or
    back with a new data dir)."""

    def __init__(
        self,
        bucket_client: ClaimBucket,
        me: str,
        control_prefix: str,
        is_lost: Callable[[str], bool],
    ) -> None:
        self._bucket = bucket_client
        self._me = me
        self._prefix = control_prefix
        self._is_lost = is_lost

    def _key(self, v: Version, suffix: str) -> str:
        return (
            f"{key_prefix(self._prefix, v.key)}{v.acked_us:017d}/{v.owner}/{v.datadir_id}/"
            f"{v.seq}.{suffix}"
        )

    async def claim(self, v: Version) -> Claim:
        """Claim ``v`` (FlushError when the bucket cannot be asked: try again later)."""
        for epoch in range(1, _MAX_EPOCHS + 1):
            body = json.dumps({"claimant": self._me, "epoch": epoch}).encode()
            # Nobody claimed this epoch before: nobody uploaded it since (every upload is
            # claimed first), so no done mark can exist yet. Two requests in the usual case.
            if await self._bucket.put_if_absent(v.bucket, self._key(v, str(epoch)), body):
                return Claim(Outcome.WON, epoch)
            if await self._bucket.get_small(v.bucket, self._key(v, "done")) is not None:
                return Claim(Outcome.DONE)
            holder = await self._claimant(v, epoch)
            if holder == self._me:
                # Ours (a try that lost its answer, or from before a restart) unless a later
                # epoch shows it was taken over from us meanwhile.
                if await self._claimant(v, epoch + 1) is None:
                    return Claim(Outcome.WON, epoch)
                continue
            if holder is not None and not self._is_lost(holder):
                return Claim(Outcome.HELD, epoch, holder)
        raise Retryable(f"claims of {v}: more than {_MAX_EPOCHS} epochs")

    async def _claimant(self, v: Version, epoch: int) -> str | None:
        raw = await self._bucket.get_small(v.bucket, self._key(v, str(epoch)))
        if raw is None:
            return None
        try:
            return str(json.loads(raw)["claimant"])
        except (ValueError, KeyError, TypeError):
            return None  # unreadable: treated as lost, taken over at the next epoch

    async def done(self, v: Version) -> None:
        """Record that ``v`` is uploaded (idempotent)."""
        await self._bucket.put_if_absent(v.bucket, self._key(v, "done"), b"{}")

    async def newer_claimed(self, v: Version) -> bool:
        """Whether a newer version of ``v``'s key was claimed (it is being uploaded or is
        in the bucket): then ``v`` must not be put over it."""
        prefix = key_prefix(self._prefix, v.key)
        for name in await self._bucket.list_keys(v.bucket, prefix):
            other = _parse(v.bucket, v.key, name[len(prefix) :])
            if other is not None and other.is_newer_than(v):
                return True
        return False
