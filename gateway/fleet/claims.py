"""Claims: one uploader per replicated version, decided by the bucket's conditional writes
(docs/fleet.md, "Takeover"; after OpenTofu's S3 lock: 200 acquired, 412 held, 409 retry).

A version is named by its key, its acknowledgement time (microseconds) and its writer's
node id, data-dir id and sequence number. Whoever uploads it (its writer, or a member
holding its replica after the writer was lost) first claims it:
``PUT <control-prefix>claims/<key hash>/<acked µs>/<writer>/<data-dir>/<seq>.<etag>.<epoch>``
with ``If-None-Match: *`` in the version's bucket. Epoch 1 first; a claim whose claimant
is itself lost is taken over at the next epoch. After the upload the uploader writes
``...<seq>.<etag>.done``: nobody uploads a version whose ``.done`` exists.

A claim names its claimant's incarnation (node id, data dir, start). Only the run that
made a claim resumes it (a try that lost its answer); a claim of an earlier run, this
node's or another's, is taken over at the next epoch like a lost claimant's. So a writer
back from a restart and a member taking over from it race for the same new epoch, and the
bucket picks one.

All claims of one key share a prefix, so a taker-over can list them (``claimed``): a
version claimed after the one it holds (the same writer's later sequence number, or a
later acknowledgement by another writer, as the fleet orders writes) is on its way or in
the bucket, and the older one is never put over it; and the ETags in the names say
whether what the bucket holds came through the fleet at all. Claim objects hold their claimant and
epoch (JSON); they are small, and the control prefix is never listed to clients (an S3
lifecycle rule on it can expire them).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gateway.models import LocalObject
from gateway.upstream.classify import Retryable

_MAX_EPOCHS = 64  # a version taken over this many times is left for an operator
T = TypeVar("T")


class SendGate(Protocol):
    """The flusher's flow control (``flush/gate.py``) for a request of no claimed row."""

    def early_request(
        self, bucket: str, key: str, order: int, size_bytes: int, send: Callable[[], Awaitable[T]]
    ) -> Awaitable[T]: ...


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
class Claimant:
    node_id: str
    datadir_id: str
    started_s: float

    def to_json(self) -> dict[str, object]:
        return {
            "claimant": self.node_id,
            "datadir_id": self.datadir_id,
            "started_s": self.started_s,
        }

    @classmethod
    def parse(cls, raw: bytes) -> Claimant | None:
        """None: unreadable (treated as lost: taken over at the next epoch)."""
        try:
            doc = json.loads(raw)
            return cls(str(doc["claimant"]), str(doc["datadir_id"]), float(doc["started_s"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True, slots=True)
class Version:
    """A replicated version's identity: its key, when it was acknowledged, its writer's."""

    bucket: str
    key: str
    acked_s: float
    owner: str
    datadir_id: str
    seq: int
    etag: str  # "" for a delete

    @classmethod
    def of_row(cls, obj: LocalObject, node_id: str, datadir_id: str) -> Version:
        """The version ``obj`` is, acknowledged by ``node_id`` on its data dir."""
        meta = obj.meta
        etag = "" if obj.is_delete else meta.etag
        return cls(meta.bucket, meta.key, obj.acked_s, node_id, datadir_id, obj.seq, etag)

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


def _parse_name(bucket: str, key: str, name: str) -> tuple[Version, str] | None:
    """(version, suffix: an epoch or ``done``) of a claim object's name."""
    try:
        acked_us, owner, datadir, last = name.split("/")
        seq, etag, suffix = last.split(".")
        version = Version(bucket, key, int(acked_us) / 1e6, owner, datadir, int(seq), etag)
    except ValueError:
        return None
    if suffix != "done" and not suffix.isdigit():
        return None
    return version, suffix


class Claims:
    """Claims for ``me`` (see the module docstring). ``is_lost(node, datadir, started)``:
    whether a claimant (an incarnation) may be taken over: lost by this node's view
    (unreachable past ``--peer-timeout``, back with another data dir) or restarted since."""

    def __init__(
        self,
        bucket_client: ClaimBucket,
        me: Claimant,
        control_prefix: str,
        is_lost: Callable[[str, str | None, float | None], bool],
    ) -> None:
        self._bucket = bucket_client
        self._me = me
        self._prefix = control_prefix
        self.is_lost = is_lost  # (the composition root may set the takeover's later)
        # The node's request gate, once the composition root has built it: a claim's
        # requests go to the bucket like its data's (paced with them, throttles counted
        # and retried); three of them per version, they would otherwise overrun a bucket
        # the data requests are kept just under.
        self.gate: SendGate | None = None

    async def _send(
        self, v: Version, call: Callable[[], Awaitable[T]], *, direct: bool = False
    ) -> T:
        """One request about ``v``'s claims: through the gate, in the lane of ``v``'s key
        (its claims are part of its upload), ahead of that lane's data; else (or
        ``direct``: for a read, never held behind a paused flusher) at once."""
        if self.gate is None or direct:
            return await call()
        return await self.gate.early_request(v.bucket, v.key, 0, 0, call)

    def _key(self, v: Version, suffix: str) -> str:
        return (
            f"{key_prefix(self._prefix, v.key)}{v.acked_us:017d}/{v.owner}/{v.datadir_id}/"
            f"{v.seq}.{v.etag}.{suffix}"
        )

    async def claim(self, v: Version) -> Claim:
        """Claim ``v`` (FlushError when the bucket cannot be asked: try again later)."""
        body = json.dumps(self._me.to_json()).encode()
        for epoch in range(1, _MAX_EPOCHS + 1):
            # Nobody claimed this epoch before: nobody uploaded it since (every upload is
            # claimed first), so no done mark can exist yet. Two requests in the usual case.
            if await self._put_if_absent(v, self._key(v, str(epoch)), body):
                return Claim(Outcome.WON, epoch)
            if await self._get(v, self._key(v, "done")) is not None:
                return Claim(Outcome.DONE)
            holder = await self._claimant(v, epoch)
            if holder == self._me:
                # Ours, this run's (a try that lost its answer), unless a later epoch shows
                # it was taken over from us meanwhile.
                if await self._claimant(v, epoch + 1) is None:
                    return Claim(Outcome.WON, epoch)
                continue
            if holder is not None and not self.is_lost(
                holder.node_id, holder.datadir_id, holder.started_s
            ):
                return Claim(Outcome.HELD, epoch, holder.node_id)
            # Lost, an earlier run's (this node's too) or unreadable: the next epoch.
        raise Retryable(f"claims of {v}: more than {_MAX_EPOCHS} epochs")

    async def _claimant(self, v: Version, epoch: int, *, direct: bool = False) -> Claimant | None:
        raw = await self._get(v, self._key(v, str(epoch)), direct=direct)
        return None if raw is None else Claimant.parse(raw)

    async def _get(self, v: Version, key: str, *, direct: bool = False) -> bytes | None:
        return await self._send(v, lambda: self._bucket.get_small(v.bucket, key), direct=direct)

    async def _put_if_absent(self, v: Version, key: str, body: bytes) -> bool:
        return await self._send(v, lambda: self._bucket.put_if_absent(v.bucket, key, body))

    async def done(self, v: Version) -> None:
        """Record that ``v`` is uploaded (idempotent)."""
        await self._put_if_absent(v, self._key(v, "done"), b"{}")

    async def look(self, v: Version, *, direct: bool = False) -> tuple[bool, set[Version]]:
        """One listing of the claims of ``v``'s key: whether a newer version is on its way
        (``newer_on_its_way``), and every version claimed (``claimed``). ``direct``: not
        through the request gate (``_send``)."""
        names = await self._names(v, direct=direct)
        return await self._on_its_way(v, names, direct=direct), set(names)

    async def newer_on_its_way(self, v: Version, *, direct: bool = False) -> bool:
        """Whether a version of ``v``'s key newer than ``v`` is in the bucket or on its way
        there: marked done, or claimed (its latest epoch) by a claimant that is not lost.
        A newer version claimed only by claimants lost since (a writer wiped mid-upload,
        whose version may never have been acknowledged, so nobody holds a replica of it)
        is neither: ``v`` goes up (guarded), and that version follows if a member still
        holds it and takes it over."""
        names = await self._names(v, direct=direct)
        return await self._on_its_way(v, names, direct=direct)

    async def claimed(self, v: Version) -> set[Version]:
        """Every version of ``v``'s key claimed so far, by any writer or taker-over."""
        return set(await self._names(v))

    async def _names(self, v: Version, *, direct: bool = False) -> dict[Version, set[str]]:
        """The versions claimed of ``v``'s key, each with its claims' suffixes (epochs and
        ``done``)."""
        prefix = key_prefix(self._prefix, v.key)
        found: dict[Version, set[str]] = {}
        listing = await self._send(
            v, lambda: self._bucket.list_keys(v.bucket, prefix), direct=direct
        )
        for name in listing:
            parsed = _parse_name(v.bucket, v.key, name[len(prefix) :])
            if parsed is not None:
                found.setdefault(parsed[0], set()).add(parsed[1])
        return found

    async def _on_its_way(
        self, v: Version, names: dict[Version, set[str]], *, direct: bool = False
    ) -> bool:
        for other, suffixes in names.items():
            if not other.is_newer_than(v):
                continue
            if "done" in suffixes:
                return True
            holder = await self._claimant(other, max(int(n) for n in suffixes), direct=direct)
            if holder is not None and not self.is_lost(
                holder.node_id, holder.datadir_id, holder.started_s
            ):
                return True
        return False
