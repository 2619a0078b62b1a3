"""The adaptive request rate of a budget shared by many requests (pure, clock-injected).

One ``AdaptiveRate`` paces everything this gateway sends to one bucket, whatever S3's
hidden partitioning of that bucket is (a lane that S3 throttles on its own gets one of its
own: see ``admission.py``). It is TCP's congestion control transposed to a request rate,
after botocore's adaptive retry mode (``botocore/retries/adaptive.py``, ``throttling.py``)
and CUBIC (RFC 8312):

- **Slow start.** A fresh budget starts at ``initial_per_s``; while it holds work back each
  success adds 1 request/s (TCP's +1 segment per ACK): the rate doubles per second at most.
  It ends at the first throttle.
- **One cut per congestion event.** A throttle of a request sent more than a round trip
  after the last cut is a new event; one sent before belongs to the same event and
  changes nothing (a burst of 503s answers a burst of requests: one signal, as a window's
  losses are in TCP; and requests sent within a round trip of the cut still meet the
  overload of those sent before it, as TCP's NewReno waits for the data outstanding at
  its cut). The rate drops to ``beta`` times ``w_max``, the rate the upstream was
  accepting (acceptances per second lately, never more than the rate allowed): slow start
  overshoots before the first 503 comes back, and what got through is the figure of the
  limit, not what was sent. When those seconds hold a slow start's ramp they measure it
  low; so once the requests sent while S3 refused (from the refused one to the cut) are
  answered, what they got through (the partition's bucket is empty then: its rate) raises
  ``w_max`` if it is higher.
- **A cut as deep as the overload** (after DCTCP, RFC 8257, which cuts by the share of
  marked packets): once out of slow start, the cut is the share of the last second's
  answers that were refused, and ``beta`` at most (and ``beta`` when a second holds too
  few answers to measure a share: under 20 requests a second the cut is as before).
  Every sender of a shared partition sees about the same share, so each gives up the
  same fraction and the probing that follows (equal for all) evens their shares out; a
  cut of ``beta`` for whoever drew a 503 and none for the rest left a few gateways far
  behind the others, and slow at the end.
- **Recovery and probing (CUBIC).** After a cut the rate climbs back to ``w_max`` along a
  cubic: quickly while far below it, flat near it, reaching it ``recovery_s`` after a
  ``beta`` cut at any scale. Past ``w_max`` it grows faster and faster: the periodic gentle
  probe that finds a raised limit, in absolute requests/s (at least ``probe_c`` req/s per
  s**3: a budget with a small share probes as fast as a large one, which is what makes
  independent gateways converge to fair shares; split among the fleet's ``senders`` to the
  bucket, so that 64 gateways at a few requests a second each do not probe 64 times as
  fast together as one). Once the probe is ``_ACCELERATE`` times
  ``w_max`` with no throttle the limit has risen (a partition split, a raised quota): slow
  start again finds it in seconds. Growth counts only time the budget held work back.
- **Fast convergence.** A cut below the previous ``w_max`` lowers ``w_max`` a little more
  (RFC 8312 4.6), so gateways sharing one limit give way to each other and converge to
  fair shares without talking to each other.
- **Not enough, or an outage.** A throttle of a request sent after the cut, before anything
  sent after it got through, means the cut did not bite (a partition's burst had hidden the
  overload): the rate is cut again, ``w_max`` kept. If nothing got through at all lately
  (the last 3 s, or the last second's answers: S3 refusing everything for a while), the
  budget keeps sending ``outage_per_s`` to see the outage end, and slow-starts back to
  ``w_max`` once answers come back, doubling per round trip (``_KNOWN_ROUND_S`` at
  least): that rate worked before the outage, as TCP's slow start below ssthresh.
- **A limit remembered.** A budget started with ``known_per_s`` (what this gateway's last
  run learnt of the bucket: ``flush/memory.py``) slow-starts from ``initial_per_s`` to
  it as back from an outage, doubling per round trip, then probes past it as usual: a
  restarted gateway is back at the bucket's rate in a fraction of a second where a fresh
  one takes ``log2(rate / initial_per_s)`` seconds, the fixed cost of a fresh start
  (BENCHMARKS.md 7.11). Where the limit fell meanwhile, the first 503 cuts as it would
  a fresh slow start's overshoot.
- **A fleet's congestion event, followed** (``follow_cut``; ``shares.py`` carries it).
  Gateways sharing a partition each learn of its limit from their own 503s only: with
  many of them each at a few requests a second, each drew one 503 per cycle of its own,
  and 64 of them at 60 requests/s drew 15 % of their requests refused. So each tells its
  peers of its own cuts (``own_events``, ``last_cut_factor``), and a budget that was
  throttled itself lately (and gets its fair share through: ``admission.py``) cuts by
  the same factor when a peer was: one 503 cuts the fleet's rate at once. A budget
  cuts, or follows, once per ``_FOLLOW_QUIET_S`` (a report takes up to a second to reach
  every peer, and the peers refused at one overshoot report it one after another); its
  own throttles are never held back by a followed cut.
- **Slow start counts fresh evidence only.** An acceptance grows a slow start only if its
  request left after the last cut: with slow bodies (large parts), acceptances of requests
  sent before a cut arrive long after it and say nothing about the rate since.

The rate never leaves ``[floor_per_s, ceiling_per_s]``; only slow start sends more than
what was accepted a moment ago (at most twice, for at most a second).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

_ANSWER_WINDOW_S = 3.0  # answers counted for the accepted rate (at least _MIN_ANSWERS)
_MIN_ANSWERS = 8
_MAX_ANSWERS = 1 << 16  # 3 s of 20,000 answers/s
_ACCELERATE = 1.2  # a probe this far over w_max without a throttle: slow start again
_MIN_THROUGH = 16  # acceptances that measure a limit (fewer: noise)
_MIN_SHARE_ANSWERS = 20  # answers in a second that measure a refused share
_KNOWN_ROUND_S = 0.1  # below a rate known to work, a slow start doubles this often at most
_FOLLOW_QUIET_S = 2.0  # after a cut, a peer's cut is the same congestion event for this long


@dataclass(slots=True)
class _Through:
    """The requests sent while the upstream was refusing: from the send of the request
    that opened a congestion event to its cut. The partition's bucket is empty then, so
    what it accepts of them arrives at its rate (this sender's share of it)."""

    from_s: float
    to_s: float
    accepted: int = 0
    last_s: float = 0.0  # the last send among them answered so far

    def rate_per_s(self) -> float | None:
        span_s = self.last_s - self.from_s
        if self.accepted < _MIN_THROUGH or span_s <= 0:
            return None
        return self.accepted / span_s


class Answers:
    """Acceptances per second among the recent answers: over the last few seconds, or
    over the last few answers when they are further apart. Its memory is what came in
    that time (trimmed as answers come), at most ``_MAX_ANSWERS``."""

    def __init__(self, window_s: float = _ANSWER_WINDOW_S) -> None:
        self._answers: deque[tuple[float, bool]] = deque(maxlen=_MAX_ANSWERS)
        self._accepted = 0
        self._window_s = window_s

    def copy(self, window_s: float | None = None) -> Answers:
        """The same answers (those within ``window_s``, if given, at the next trim)."""
        twin = Answers(self._window_s if window_s is None else window_s)
        twin._answers.extend(self._answers)
        twin._accepted = self._accepted
        return twin

    def add(self, now_s: float, accepted: bool) -> None:
        if len(self._answers) == self._answers.maxlen:
            self._accepted -= self._answers[0][1]
        self._answers.append((now_s, accepted))
        self._accepted += accepted
        self._trim(now_s)

    def accepted_per_s(self, now_s: float) -> float:
        """What the upstream let through lately (0.0 before any answer)."""
        self._trim(now_s)
        answers = self._answers
        if not answers:
            return 0.0
        span_s = now_s - answers[0][0]
        if len(answers) == answers.maxlen:  # a full memory is a shorter time: exact
            return self._accepted / max(span_s, 1e-3)
        return self._accepted / max(span_s, self._window_s / 4)

    def counts(self, now_s: float) -> tuple[int, int]:
        """The recent answers: (accepted, refused)."""
        self._trim(now_s)
        return self._accepted, len(self._answers) - self._accepted

    def _trim(self, now_s: float) -> None:
        answers = self._answers
        while len(answers) > _MIN_ANSWERS and answers[0][0] < now_s - self._window_s:
            self._accepted -= answers.popleft()[1]


@dataclass(frozen=True, slots=True)
class RateConfig:
    """``ceiling_per_s`` is a hard cap (inf: none); ``floor_per_s`` the lowest rate S3's
    answers can drive it to (far below any real limit: a limit under the floor would be
    overrun for ever); ``outage_per_s`` what it still sends while S3 accepts nothing, so
    that the outage's end is seen (never more than ``w_max``). ``beta`` (a 20 % cut;
    botocore and RFC 8312 use 30 %), ``recovery_s`` and ``probe_c`` shape the curve (module
    docstring); they were chosen with the simulator in tests/sim (BENCHMARKS.md section 2
    has the figures)."""

    initial_per_s: float = 10.0
    floor_per_s: float = 0.1
    ceiling_per_s: float = math.inf
    beta: float = 0.8
    recovery_s: float = 10.0
    probe_c: float = 0.02
    outage_per_s: float = 1.0


class AdaptiveRate:
    """One shared request budget's rate. Every method takes the time it happens at.

    The owner MUST report each answer (``on_success``/``on_throttle``, with the time the
    request was sent), and call
    ``tick(now, binding)`` whenever it consults ``rate_per_s``: ``binding`` says whether
    the budget holds work back from now on (growth counts only such time).
    """

    def __init__(
        self,
        config: RateConfig,
        now_s: float,
        *,
        w_max_per_s: float | None = None,
        answers: Answers | None = None,
        known_per_s: float | None = None,
    ):
        """``w_max_per_s``: start at this rate, out of slow start (an isolated lane's);
        ``known_per_s``: slow-start to this rate, quickly (module docstring)."""
        self.config = config
        self.w_max_per_s = w_max_per_s  # what the upstream accepted when last throttled
        self.events = 0  # congestion events (cuts) so far
        self.own_events = 0  # of them, driven by this budget's own throttles (told to peers)
        self.last_cut_factor = config.beta  # what the last of those left of the rate
        self._ssthresh = math.inf if w_max_per_s is None else 0.0
        self._rate = self._clamp(config.initial_per_s if w_max_per_s is None else w_max_per_s)
        self._k_s = 0.0  # binding seconds from the last cut back to w_max
        self._grown_s = 0.0  # binding seconds since the last cut
        self._tick_s = now_s
        self._binding = False
        self._last_cut_s = -math.inf
        self._recovered_s = -math.inf  # send time of the first acceptance since the last cut
        self._through: _Through | None = None
        # What got through lately: a rate started for requests already on their way (an
        # isolated lane's) starts from their answers, or its first cut would take a few
        # answers of its first milliseconds for the figure of a second (hundreds of
        # requests a second measured as a few: BENCHMARKS.md 7.10).
        self._answers = Answers() if answers is None else answers.copy()
        self._last_second = Answers(1.0) if answers is None else answers.copy(1.0)
        self._lent_per_s = 0.0  # of w_max: fleet peers' shares taken over (``take_share``)
        self._quiet_until_s = -math.inf  # a peer's cut before this is one already made
        # Fleet members sending to this bucket, this one too (``shares.py``): the absolute
        # probe is split among them, so that together they probe as one budget does.
        self.senders = 1
        if w_max_per_s is None and known_per_s is not None and known_per_s > 0:
            known_per_s = self._clamp(known_per_s)  # (a slow start to past the cap never ends)
            self.w_max_per_s = self._ssthresh = known_per_s
            if self._rate >= known_per_s:  # (a limit below the initial rate: start at it)
                self._start_epoch(now_s, known_per_s, known_per_s)

    @property
    def rate_per_s(self) -> float:
        return self._rate

    @property
    def is_slow_start(self) -> bool:
        return self._rate < self._ssthresh

    # -- inputs -------------------------------------------------------------------------

    def tick(self, now_s: float, binding: bool) -> float:
        """Advance to ``now_s`` (growth for the time since the last tick, if the budget
        was holding work back then); ``binding`` is the state from now on. The rate."""
        if self._binding and now_s > self._tick_s and not self.is_slow_start:
            self._grown_s += now_s - self._tick_s
            self._rate = self._clamp(self._cubic(self._grown_s))
            if self.w_max_per_s and self._rate >= _ACCELERATE * self.w_max_per_s:
                self._ssthresh = math.inf  # the limit has risen: find it as at the start
        self._tick_s = max(self._tick_s, now_s)
        self._binding = binding
        return self._rate

    def on_success(self, sent_s: float, now_s: float, *, grown: bool = False) -> None:
        """A request sent at ``sent_s`` was accepted (``grown``: its ``on_progress`` grew
        a slow start already)."""
        self._answers.add(now_s, True)
        self._last_second.add(now_s, True)
        self._note_through(sent_s, now_s, accepted=True)
        if self._last_cut_s < sent_s < self._recovered_s:
            self._recovered_s = sent_s
        if not grown:
            self.on_progress(sent_s, now_s)

    def on_progress(self, sent_s: float, now_s: float) -> None:
        """A request sent at ``sent_s`` is on its way, not refused after longer than a
        refusal takes (a large body, still being sent): as good as an acceptance for a
        slow start, which would otherwise wait a whole body's time for each step."""
        if self.is_slow_start and self._binding and sent_s > self._last_cut_s:
            # Up to a rate known to have worked (back from an outage) it doubles per round
            # trip, as TCP's does below ssthresh; past it, no faster than a partition's
            # bucket (a second's worth) hides an overload.
            floor_s = 1.0 if self._ssthresh == math.inf else _KNOWN_ROUND_S
            round_trip_s = max(now_s - sent_s, floor_s)
            self._rate = self._clamp(self._rate + min(self._rate, 1.0 / round_trip_s))
            if self._rate >= self._ssthresh:  # back at the rate known to work: its plateau
                self._start_epoch(now_s, self._ssthresh, self._ssthresh)

    def event_of(self, sent_s: float) -> int:
        """The congestion event a throttle of a request sent at ``sent_s`` belongs to:
        the last one if the request left before its cut, else the next."""
        return self.events if sent_s <= self._last_cut_s else self.events + 1

    def on_throttle(self, sent_s: float, now_s: float) -> bool:
        """A request sent at ``sent_s`` was throttled. True if this was a new congestion
        event and the rate was cut."""
        self._answers.add(now_s, False)
        self._last_second.add(now_s, False)
        self._note_through(sent_s, now_s, accepted=False)
        if self.event_of(sent_s) == self.events:
            return False  # sent before the last cut: the same congestion event
        accepted = self._answers.accepted_per_s(now_s)
        beta, floor = self.config.beta, self.config.floor_per_s
        self.events += 1
        self.own_events += 1
        self._quiet_until_s = now_s + _FOLLOW_QUIET_S
        # Requests sent within a round trip of the cut meet the overload of those sent
        # before it (the partition's bucket is still empty): they are this event's too.
        until_s = now_s + (now_s - sent_s)
        if self._recovered_s < math.inf or self.w_max_per_s is None:
            w_max = max(min(self._rate, accepted) if accepted > 0 else self._rate, floor)
            if self.w_max_per_s is not None:  # (a slow start's overshoot: the deepest cut)
                beta = max(beta, 1 - self._refused_share(now_s))
            if self.w_max_per_s is not None and w_max < self.w_max_per_s:
                w_max *= (1 + beta) / 2  # fast convergence: give way to the others
            self._ssthresh = 0.0
            self._start_epoch(now_s, w_max, beta * w_max, until_s)
            self._through = _Through(sent_s, now_s, last_s=sent_s)
            self.last_cut_factor = beta
        elif accepted == 0 or self._last_second.counts(now_s)[0] == 0:
            # Nothing got through lately (the last 3 s, or the last second's answers, at
            # least 8): an outage, not a lower limit. A storm of 503s shorter than the
            # 3 s window was cut as a limit, 0.8x per round trip, and the cubic took 12 s
            # to climb back from 5 % of the rate it had (BENCHMARKS.md 7.10).
            self._ssthresh = self.w_max_per_s
            outage = min(self.config.outage_per_s, self.w_max_per_s)
            self._start_epoch(now_s, self.w_max_per_s, max(beta * self._rate, outage), until_s)
        else:
            self._start_epoch(now_s, self.w_max_per_s, beta * self._rate, until_s)
            self.last_cut_factor = beta
        return True

    def follow_cut(self, now_s: float, factor: float) -> bool:
        """A fleet peer sending to the same bucket cut its rate to ``factor`` of it on a
        throttle of its own (module docstring): cut by the same factor, ``w_max`` the rate
        the upstream accepted, unless this budget cut or followed within
        ``_FOLLOW_QUIET_S``, or has no limit learnt (a slow start: its own 503 ends it).
        Throttles of requests sent before now belong to this cut. True if it cut."""
        if now_s < self._quiet_until_s or self.w_max_per_s is None or self.is_slow_start:
            return False
        self.tick(now_s, self._binding)
        factor = min(max(factor, self.config.beta), 1.0)  # (never deeper than a cut of its own)
        accepted = self._answers.accepted_per_s(now_s)
        w_max = self._clamp(min(self._rate, accepted) if accepted > 0 else self._rate)
        self.events += 1
        self._quiet_until_s = now_s + _FOLLOW_QUIET_S
        self._start_epoch(now_s, w_max, factor * w_max, now_s)
        self._through = None
        return True

    def _refused_share(self, now_s: float) -> float:
        """The share of the last second's answers that were refused (1.0 when they are too
        few to tell a share: a budget of a few requests a second cuts by ``beta``)."""
        ok, refused = self._last_second.counts(now_s)
        if ok + refused < _MIN_SHARE_ANSWERS:
            return 1.0
        return refused / (ok + refused)

    def _note_through(self, sent_s: float, now_s: float, *, accepted: bool) -> None:
        """Count an answer of a request sent during the last congestion event; once the
        requests sent after its cut answer, what got through during it is known: a limit
        the accepted rate of the last seconds measured low (a slow start's ramp is in
        them) is raised to it, and the curve recovers to that."""
        through = self._through
        if through is None:
            return
        if sent_s > through.to_s:
            self._through = None
            measured = through.rate_per_s()
            if measured is not None and self.w_max_per_s and measured > self.w_max_per_s:
                self._start_epoch(now_s, measured, self._rate)
        elif sent_s >= through.from_s:
            through.accepted += accepted
            through.last_s = max(through.last_s, sent_s)

    def take_share(self, now_s: float, extra_per_s: float) -> None:
        """A gateway of the fleet stopped sending to this bucket: ``extra_per_s`` of what
        it got through falls to this budget (``shares.py``). The rate and the limit it
        knows grow by it at once, and the curve starts over from there, flat (the figure
        was measured by the peer, not probed): without it, the rate a finished peer used
        is found again only by probing, at the end of every drain that many gateways
        share. In a slow start with no limit known, only the rate grows."""
        if extra_per_s <= 0:
            return
        self.tick(now_s, self._binding)
        if self.w_max_per_s is None:
            self._rate = self._clamp(self._rate + extra_per_s)
            return
        lent = self._lent_per_s + extra_per_s
        self._start_epoch(now_s, self.w_max_per_s + extra_per_s, self._rate + extra_per_s)
        self._lent_per_s = lent

    @property
    def own_per_s(self) -> float | None:
        """The limit learnt (``w_max``) without the shares taken over from fleet peers
        that had finished (scaled with every change of ``w_max`` since): this gateway's
        own share when they send too. It is what the next start of the budget, or of
        the gateway, aims for: with the shares in it, the last gateways of a fleet to
        finish a checkpoint started the next one at up to 1.6 times the partition's
        limit together, and a node that joined fresh found it full and finished last
        (1.27x in 3 of 4 seeds of 8 gateways at 3,500/s: BENCHMARKS.md 7.11)."""
        if self.w_max_per_s is None:
            return None
        return max(self.config.floor_per_s, self.w_max_per_s - self._lent_per_s)

    def forget_limit(self) -> None:
        """What was learnt about the limit was not this budget's (a lane throttled on its
        own drove the cuts): find it again by slow start from the current rate."""
        self._ssthresh = math.inf

    # -- the curve ----------------------------------------------------------------------

    def _relative_c(self) -> float:
        """CUBIC's constant relative to w_max: a ``beta`` cut recovers in ``recovery_s``."""
        return (1 - self.config.beta) / self.config.recovery_s**3

    def _start_epoch(
        self, now_s: float, w_max: float, rate: float, cut_until_s: float | None = None
    ) -> None:
        """A new epoch of the curve from ``rate`` towards ``w_max``; with ``cut_until_s``
        a cut, whose event takes throttles of requests sent until then."""
        self._rate = self._clamp(rate)
        if self._lent_per_s and self.w_max_per_s:  # the lent part of w_max, in proportion
            self._lent_per_s = min(w_max, self._lent_per_s * w_max / self.w_max_per_s)
        self.w_max_per_s = w_max
        below = max(0.0, w_max - self._rate) / max(w_max, 1e-9)
        self._k_s = math.cbrt(below / self._relative_c())
        self._grown_s = 0.0
        self._tick_s = max(self._tick_s, now_s)
        if cut_until_s is not None:
            self._last_cut_s = cut_until_s
            self._recovered_s = math.inf

    def _cubic(self, t_s: float) -> float:
        assert self.w_max_per_s is not None
        w_max, c = self.w_max_per_s, self._relative_c()
        if t_s < self._k_s:
            return w_max - c * w_max * (self._k_s - t_s) ** 3
        probe_c = self.config.probe_c / self.senders
        return w_max + max(c * w_max, probe_c) * (t_s - self._k_s) ** 3

    def _clamp(self, rate: float) -> float:
        return min(self.config.ceiling_per_s, max(self.config.floor_per_s, rate))
