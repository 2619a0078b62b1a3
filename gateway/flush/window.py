"""How many requests the flusher keeps in flight (pure, clock-injected).

The bucket's request rate is one limit (``control.py``); the other is how much the node and
the network carry at once: a request takes a round trip plus its body's time on one
connection (S3 serves ~85-90 MB/s per connection), so filling a link of several GB/s with
large parts takes hundreds of requests in flight, and a high request rate takes ``rate x
round trip`` of them. Neither a fixed default nor the operator can know that figure, so the
window finds it, as TCP's congestion window does, by what more in flight bring:

- **It grows only while it is the limit**: a request that left while the window was full
  and work was waiting (``bound``) is the evidence it may be too small. In slow start each
  such request that comes back accepted adds one: the window doubles per round.
- **A request on its way counts ahead of its answer**: a large body takes seconds on its
  connection, and a slow start that waited for answers would step once per body's time.
  A request that left while the window was the limit and has not been refused when a
  refusal would have come back (``on_progress``) adds one too, but the window grows so
  no further than ``_AHEAD`` times the largest window answers have confirmed: whether
  the link had room for them is only known from their answers.
- **It stops when more in flight no longer add throughput.** Answers are counted in
  rounds (a window's worth of them, at least ``_MIN_ROUND``). A round in which the window
  was the limit is compared with the last such round at a window at least ``_STEP``
  smaller: if the window grew by a factor ``f`` and neither the accepted requests per
  second nor the accepted bytes per second grew by ``gain`` of ``f - 1``, the link, the
  node or the upstream is full: the window goes back to the smaller size (plus what the
  growth got) and holds.
- **Holding, it probes**: after ``_HOLD_ROUNDS`` rounds as the limit it tries ``_STEP``
  times more for a round, and keeps it if it paid (slow start again if it paid nearly in
  full: the link or the limit has grown), else goes back. A window that is not the limit
  does not move: the rate, not the window, is what holds the requests back then.
- **A throttle** (a new congestion event of the bucket's budget) while the window is the
  limit cuts it by ``beta``: many requests at once can themselves be the overload.
- It never leaves ``[min_size, max_size]``.
"""

from __future__ import annotations

from dataclasses import dataclass

_MIN_ROUND = 8  # answers in a round at least (a smaller one measures noise)
_STEP = 1.25  # windows compared differ by this factor at least (smaller: noise)
_HOLD_ROUNDS = 4  # rounds as the limit before a probe upwards
_AHEAD = 4  # requests on their way grow the window to this times what answers confirmed


@dataclass(frozen=True, slots=True)
class WindowConfig:
    """``initial`` requests in flight, adapted within ``[min_size, max_size]`` (the module
    docstring); ``max_size`` is also the connection pool's size."""

    initial: int = 32
    min_size: int = 4
    max_size: int = 1024
    gain: float = 0.25  # of the proportional gain: less is a plateau
    beta: float = 0.8  # the cut on a throttle while the window is the limit


@dataclass(frozen=True, slots=True)
class _Round:
    size: float  # the window the round's requests were sent under
    requests_per_s: float  # accepted
    bytes_per_s: float  # accepted


class Window:
    """The requests-in-flight limit. The owner MUST call ``on_answer`` once for every
    request it admitted (``bound``: whether it was sent while the window was the limit)
    and ``on_congestion`` for a new congestion event of the bucket's budget."""

    def __init__(self, config: WindowConfig, now_s: float = 0.0) -> None:
        self.config = config
        self._size = float(min(max(config.initial, config.min_size), config.max_size))
        self.is_slow_start = True
        self._base: _Round | None = None  # the round the next one is compared with
        self._held = 0  # rounds as the limit since the window last changed (holding)
        self._probing = False
        self._confirmed = self._size  # the largest window answers confirmed so far
        self._begin(now_s)

    @property
    def size(self) -> int:
        return int(self._size)

    def on_progress(self, *, bound: bool) -> None:
        """A request sent while the window was the limit (``bound``) was not refused when
        a refusal would have come back: it is on its way (module docstring)."""
        if bound and self.is_slow_start:
            self._set(min(self._size + 1, _AHEAD * self._confirmed))

    def on_answer(self, now_s: float, size_bytes: int, *, accepted: bool, bound: bool) -> None:
        """A request of ``size_bytes`` was answered: ``accepted``, or refused or failed."""
        self._answers += 1
        self._bound += bound
        if accepted:
            self._accepted += 1
            self._bytes += size_bytes
            if bound and self.is_slow_start:
                self._confirmed = max(self._confirmed, self._size)
                self._set(self._size + 1)
        if self._answers >= max(_MIN_ROUND, self._round_size):
            self._end_round(now_s)

    def on_congestion(self, now_s: float, *, bound: bool) -> None:
        """The bucket's budget was cut (S3 throttled); ``bound``: the window is the limit."""
        if bound:
            self._hold(self._size * self.config.beta, now_s)

    def _begin(self, now_s: float) -> None:
        self._start_s = now_s
        self._round_size = self._size
        self._answers = self._bound = self._accepted = self._bytes = 0

    def _end_round(self, now_s: float) -> None:
        elapsed_s = max(now_s - self._start_s, 1e-6)
        # The answers of a round are those of requests sent about a round trip earlier:
        # under the window the round began with, not the one it grew to meanwhile.
        this = _Round(self._round_size, self._accepted / elapsed_s, self._bytes / elapsed_s)
        was_bound = 2 * self._bound >= self._answers
        self._begin(now_s)
        if not was_bound:
            return
        base = self._base
        if base is not None and this.size >= base.size * _STEP:
            self._judge(this, base, now_s)
        elif base is None or not (self.is_slow_start or self._probing):
            self._base = this  # (slow start and a probe keep theirs until far enough)
            self._count_held(now_s)

    def _judge(self, this: _Round, base: _Round, now_s: float) -> None:
        """``this`` round at a window ``_STEP`` or more times ``base``'s: did it pay?"""
        wanted = this.size / base.size - 1
        got = max(
            _growth(this.requests_per_s, base.requests_per_s),
            _growth(this.bytes_per_s, base.bytes_per_s),
        )
        if got >= 0.5 * wanted and (self.is_slow_start or self._probing):
            self.is_slow_start, self._probing = True, False
            self._base = this  # it paid nearly in full: on doubling
        elif got >= self.config.gain * wanted:
            self._hold(self._size, now_s)  # it paid, a little: keep it
        else:  # a plateau: back to the last size worth it, plus what the growth got
            self._hold(base.size * (1 + max(got, 0.0)), now_s)

    def _count_held(self, now_s: float) -> None:
        """Holding: after ``_HOLD_ROUNDS`` rounds as the limit, probe ``_STEP`` higher."""
        if self.is_slow_start or self._probing:
            return
        self._held += 1
        if self._held >= _HOLD_ROUNDS:
            self._probing = True
            self._set(self._size * _STEP)
            self._begin(now_s)

    def _hold(self, size: float, now_s: float) -> None:
        self.is_slow_start = self._probing = False
        self._held = 0
        self._base = None
        self._set(size)
        self._begin(now_s)

    def _set(self, size: float) -> None:
        self._size = min(max(size, float(self.config.min_size)), float(self.config.max_size))


def _growth(now: float, before: float) -> float:
    """Relative growth from ``before`` to ``now`` (0 when there was nothing before)."""
    return now / before - 1 if before > 0 else 0.0
