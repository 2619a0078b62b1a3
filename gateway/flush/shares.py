"""The fleet's shares of a bucket: a gateway that stops sending to a bucket hands what it
got through to the gateways still sending to it (pure, clock-injected; docs/fleet.md,
"Shares of a bucket's rate").

Gateways sharing one of S3's partitions each find their share of its limit from their own
answers (``control.py``). When one of them finishes its part of a checkpoint, the limit
it was using is free, but the others find it only by probing past what they know (the
cubic's slow start, seconds at a few requests a second each), and the drain ends at the
pace of the last one: with 8 gateways at 60 requests/s the simulator drained in 1.14-1.40x
the minimum over 8 seeds, with the hand-over in 1.03-1.18x (BENCHMARKS.md 7.9).

Every member tells the others, with each lease renewal (about once a second), what it got
through lately to each bucket it sends to (``Gate.shares``). When a bucket leaves a peer's
report, the peer's last figure is split among the members still sending to that bucket,
in proportion to what each gets through, by each one for itself from the reports it
heard: this node takes ``freed * mine / (mine + others')`` (``Gate.take_share``, only
while work waits for its rate). A peer that falls silent hands nothing over (it may
still be sending, cut off from this node but not from S3); its figures are forgotten.

Each report also carries, per bucket, the sender's own congestion events so far and the
factor its last one cut its rate to (``Gate.cuts``). When a peer's count grows, this node
cuts its budget of that bucket by the same factor (``Gate.follow_cut``; ``control.py``,
"A fleet's congestion event, followed"), if it was throttled there itself lately and gets
at least the fair share through (``admission.py``): one 503 then cuts the fleet's rate on
a shared partition, where each gateway used to need 503s of its own (64 gateways at 60
requests/s: 10.9 % of their requests refused after the first 3 s; 3.7-4.9 % now). The
members also split the probe of the rate among those sending (``note_senders``). A count
that falls is a budget started again (after idle): the new count is the base.

It only ever raises a rate by what a peer measured as going through. Where the peers do
not share a partition (S3 partitions by prefix and does not say how), the raise is
refused by this node's own partition, and the first 503 cuts it back as any other
overshoot is: one congestion event per hand-over, no more.

Each report also gives the fair share of a bucket: what the members sending to it got
through together, divided by them. A budget keeps the one measured with the most senders
at once (the latest of those), and its next start (after a restart, or between two
checkpoints: ``admission.py``, "A start after idle") aims for it at least: where the
members' own shares came out uneven (48, 82 and 80 of 200 requests/s at one bench's
first congestion event), the one with the least finished the next checkpoint last.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gateway import metrics

STALE_S = 5.0  # a peer not heard from this long counts for nothing (reports every ~1 s)


class ShareGate(Protocol):
    """What the shares need of a gateway's request gate (``RequestGate``)."""

    def shares(self) -> dict[str, float]:
        """Bucket -> requests/s got through lately, for the buckets sent to now."""
        ...

    def take_share(self, bucket: str, extra_per_s: float) -> bool:
        """Raise the bucket's rate by ``extra_per_s`` if work waits for it."""
        ...

    def note_fair_share(self, bucket: str, fair_per_s: float, senders: int) -> None:
        """What ``senders`` gateways (this one too) get through to the bucket together,
        divided by them: the share the next start of its budget aims for at least."""
        ...

    def cuts(self) -> dict[str, tuple[int, float]]:
        """Bucket -> (own congestion events so far, the factor of the last), for the
        buckets sent to now."""
        ...

    def follow_cut(self, bucket: str, factor: float) -> bool:
        """A peer cut its rate of ``bucket`` to ``factor``: cut this node's too, if its
        own answers say they share a partition. True if it cut."""
        ...

    def note_senders(self, bucket: str, senders: int) -> None:
        """How many members (this one too) send to the bucket now: they split the probe
        of its rate (``control.py``)."""
        ...


@dataclass(slots=True)
class _Peer:
    heard_s: float
    shares: dict[str, float] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)  # bucket -> its own cuts so far


class FleetShares:
    """This node's side (module docstring). ``clock``: monotonic seconds."""

    def __init__(self, gate: ShareGate, clock: Callable[[], float]) -> None:
        self._gate = gate
        self._clock = clock
        self._peers: dict[str, _Peer] = {}
        self.taken_per_s = 0.0  # what this node took over so far (a figure for status)
        self.handovers = 0
        self.cuts_followed = 0

    def report(self) -> tuple[tuple[str, float], ...]:
        """What this node tells its peers: (bucket, requests/s) of each bucket it sends to."""
        return tuple(sorted(self._gate.shares().items()))

    def report_cuts(self) -> tuple[tuple[str, int, float], ...]:
        """What this node tells its peers of its cuts: (bucket, own congestion events so
        far, the factor of the last) of each bucket it sends to."""
        return tuple(sorted((b, n, f) for b, (n, f) in self._gate.cuts().items()))

    def on_report(
        self,
        peer: str,
        shares: Mapping[str, float],
        cuts: Mapping[str, tuple[int, float]] | None = None,
    ) -> None:
        """``peer``'s report: the buckets it stopped sending to since its last one are
        handed over; a cut of its own since then is followed (``cuts``: absent from an
        older gateway's report)."""
        now_s = self._clock()
        self._forget_stale(now_s)
        before = self._peers.get(peer)
        heard = _Peer(now_s, {b: max(0.0, float(r)) for b, r in shares.items()})
        heard.events = {b: int(n) for b, (n, _) in (cuts or {}).items()}
        self._peers[peer] = heard
        self._note_fair_shares()
        if before is None:
            return
        for bucket, (events, factor) in (cuts or {}).items():
            if events > before.events.get(bucket, events) and self._gate.follow_cut(
                bucket, float(factor)
            ):
                self.cuts_followed += 1
                metrics.FLOW_CUTS_FOLLOWED.labels(bucket).inc()
        for bucket, freed_per_s in before.shares.items():
            if bucket not in shares and freed_per_s > 0:
                self._hand_over(bucket, freed_per_s)

    def status(self) -> dict[str, object]:
        """Who sends to which bucket at what rate, as the last reports said (this node's
        too), and what this node took over (status page, ``gateway fleet``)."""
        self._forget_stale(self._clock())
        sending: dict[str, dict[str, float]] = {}
        for peer, heard in self._peers.items():
            for bucket, rate in heard.shares.items():
                sending.setdefault(bucket, {})[peer] = round(rate, 2)
        return {
            "mine": {bucket: round(rate, 2) for bucket, rate in self.report()},
            "peers": sending,
            "handovers": self.handovers,
            "taken_per_s": round(self.taken_per_s, 2),
            "cuts_followed": self.cuts_followed,
        }

    def forget(self, peer: str) -> None:
        """``peer`` left the fleet: it hands nothing over (it drained before it left)."""
        self._peers.pop(peer, None)

    def _hand_over(self, bucket: str, freed_per_s: float) -> None:
        mine = self._gate.shares().get(bucket)
        if not mine:
            return
        others = sum(p.shares.get(bucket, 0.0) for p in self._peers.values())
        extra_per_s = freed_per_s * mine / (mine + others)
        if self._gate.take_share(bucket, extra_per_s):
            self.taken_per_s += extra_per_s
            self.handovers += 1
            metrics.FLOW_SHARES_TAKEN.labels(bucket).inc()
            metrics.FLOW_SHARES_TAKEN_RATE.labels(bucket).inc(extra_per_s)

    def _note_fair_shares(self) -> None:
        """For each bucket this node sends to with peers: the fleet's total through it,
        divided by the senders (``ShareGate.note_fair_share``)."""
        for bucket, mine in self._gate.shares().items():
            others = [p.shares[bucket] for p in self._peers.values() if bucket in p.shares]
            senders = len(others) + 1
            self._gate.note_senders(bucket, senders)
            if others:
                self._gate.note_fair_share(bucket, (mine + sum(others)) / senders, senders)

    def _forget_stale(self, now_s: float) -> None:
        for peer in [p for p, v in self._peers.items() if v.heard_s < now_s - STALE_S]:
            del self._peers[peer]
